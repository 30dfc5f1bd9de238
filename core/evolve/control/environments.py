"""Gymnasium environments as a control task sees them: what an id's spaces are, how a network's
outputs become actions, where episodes start, and a batch of copies to step.

Gymnasium is an optional extra (``pip install 'loomlab[control]'``; Box2D's LunarLander needs
``'loomlab[box2d]'``): it is imported on first use, and a missing one is a
:class:`LoomConfigError` naming the extra. An environment with batched numpy dynamics
(:mod:`.dynamics`) steps its copies as arrays; any other id with Box or Discrete spaces steps one
Gymnasium environment per copy (:class:`GymnasiumCopies`).

Actions from outputs ``y`` (float32): a ``Discrete(n)`` action is ``start + argmax(y[:n])`` (the
first of equal maxima; a NaN counts as the maximum, numpy's rule); a ``Box`` action is
``y[:size]`` with NaN as 0 and clipped to the box. A Discrete observation is one-hot.
"""

from __future__ import annotations

import functools
import reprlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import LoomConfigError
from .dynamics import DYNAMICS, BatchDynamics

#: environments that need Box2D, and the extra that brings it
BOX2D_ENVS = ("LunarLander-v3", "LunarLanderContinuous-v3", "BipedalWalker-v3", "BipedalWalkerHardcore-v3",
              "CarRacing-v3")


def gymnasium():
    """The ``gymnasium`` module, or a :class:`LoomConfigError` saying how to install it."""
    try:
        import gymnasium
    except ImportError:
        raise LoomConfigError("control tasks need Gymnasium: pip install 'loomlab[control]'") from None
    return gymnasium


@dataclass(frozen=True)
class Space:
    """A Box or Discrete space as the task uses it: ``size`` values in or out of the network."""

    kind: str  # "box" or "discrete"
    size: int  # values: a box's element count, a discrete space's choices
    low: np.ndarray | None = None  # a box's bounds, float32 flat
    high: np.ndarray | None = None
    start: int = 0  # a discrete space's first value
    shape: tuple[int, ...] = ()  # a box's shape
    dtype: Any = np.float32

    @classmethod
    def of(cls, space: Any, env_id: str, what: str) -> Space:
        gym = gymnasium()
        if isinstance(space, gym.spaces.Discrete):
            return cls("discrete", int(space.n), start=int(space.start), dtype=np.int64)
        if isinstance(space, gym.spaces.Box):
            return cls("box", int(np.prod(space.shape)), space.low.astype(np.float32).ravel(),
                       space.high.astype(np.float32).ravel(), shape=tuple(space.shape), dtype=space.dtype)
        raise LoomConfigError(f"{env_id}: its {what} space is {type(space).__name__}; control tasks "
                              "take Box and Discrete spaces")

    def actions(self, y: np.ndarray) -> np.ndarray:
        """The actions for outputs ``y`` ``[rows, >= size]``: ints ``[rows]`` or floats ``[rows, size]``."""
        y = y[:, : self.size]
        if self.kind == "discrete":
            return self.start + np.argmax(y, axis=1)
        return np.clip(np.nan_to_num(y, nan=0.0), self.low, self.high).astype(self.dtype)

    def action(self, y: np.ndarray):
        """One action for one output row, as Gymnasium's ``step`` takes it."""
        a = self.actions(y.reshape(1, -1))[0]
        return int(a) if self.kind == "discrete" else a.reshape(self.shape)

    def observations(self, obs: np.ndarray) -> np.ndarray:
        """Observations ``[rows, ...]`` as network input rows, float32 (Discrete: one-hot)."""
        if self.kind == "discrete":
            return np.eye(self.size, dtype=np.float32)[np.asarray(obs, np.int64) - self.start]
        return np.asarray(obs, np.float32).reshape(len(obs), -1)


@dataclass(frozen=True)
class Environment:
    """A Gymnasium id's spaces and limits, and the factory of its batches."""

    env_id: str
    observation: Space
    action: Space
    max_steps: int  # the id's time limit (its spec's max_episode_steps)

    @staticmethod
    @functools.cache
    def of(env_id: str) -> Environment:
        env = make(env_id)
        try:
            steps = env.spec.max_episode_steps if env.spec is not None else None
            return Environment(env_id, Space.of(env.observation_space, env_id, "observation"),
                               Space.of(env.action_space, env_id, "action"), int(steps or 1000))
        finally:
            env.close()

    @property
    def batched(self) -> bool:
        """Whether the copies step as numpy arrays (:mod:`.dynamics`) rather than one by one."""
        return self.env_id in DYNAMICS

    def start(self, seeds: list[int], copies: int, *,
              render: bool = False) -> BatchDynamics | GymnasiumCopies:
        """``copies`` copies of each seed's episode (seed-major: row ``k * copies + c``), reset."""
        if self.batched and not render:
            env = make(self.env_id)
            states = []
            for seed in seeds:
                env.reset(seed=seed)
                states.append(np.array(env.unwrapped.state))
            env.close()  # its constants stay readable: the dynamics read them
            return DYNAMICS[self.env_id](env.unwrapped, np.repeat(np.stack(states), copies, axis=0))
        return GymnasiumCopies(self, [s for s in seeds for _ in range(copies)], render=render)


class GymnasiumCopies:
    """One Gymnasium environment per copy, stepped in a loop: any id, and the replay of a built-in
    one with frames (``render``: each copy's ``rgb_array`` frame after reset and each step)."""

    def __init__(self, environment: Environment, seeds: list[int], *, render: bool = False):
        self.environment = environment
        self.envs = [make(environment.env_id, render_mode="rgb_array" if render else None) for _ in seeds]
        self._obs = [env.reset(seed=seed)[0] for env, seed in zip(self.envs, seeds, strict=True)]
        self.frames: list[list[np.ndarray]] = [[env.render()] for env in self.envs] if render else []

    @property
    def state(self) -> np.ndarray:
        """Each copy's state where the environment has one as an array (else empty rows)."""
        states = [getattr(env.unwrapped, "state", None) for env in self.envs]
        if all(isinstance(s, np.ndarray | tuple) for s in states):
            return np.array([np.asarray(s, np.float64) for s in states])
        return np.zeros((len(self.envs), 0))

    def keep(self, rows: np.ndarray) -> None:
        for i in sorted(set(range(len(self.envs))) - set(int(r) for r in rows)):
            self.envs[i].close()
        self.envs = [self.envs[i] for i in rows]
        self._obs = [self._obs[i] for i in rows]
        if self.frames:
            self.frames = [self.frames[i] for i in rows]

    def observe(self) -> np.ndarray:
        return self.environment.observation.observations(np.array(self._obs))

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`.dynamics.BatchDynamics.step`; a copy that Gymnasium truncates ends too."""
        space = self.environment.action
        rewards, ended = np.empty(len(self.envs)), np.empty(len(self.envs), bool)
        for i, env in enumerate(self.envs):
            a = int(actions[i]) if space.kind == "discrete" else actions[i].reshape(space.shape)
            self._obs[i], r, terminated, truncated, _ = env.step(a)
            rewards[i], ended[i] = float(r), terminated or truncated
            if self.frames:
                self.frames[i].append(env.render())
        return rewards, ended

    def close(self) -> None:
        for env in self.envs:
            env.close()


def make(env_id: str, **kwargs: Any):
    """``gymnasium.make(env_id)``, its failures as one :class:`LoomConfigError` naming the id."""
    gym = gymnasium()
    if not isinstance(env_id, str):
        raise LoomConfigError("an environment is a Gymnasium id such as 'CartPole-v1', got "
                              f"{reprlib.repr(env_id)}")
    try:
        return gym.make(env_id, **kwargs)
    except gym.error.DependencyNotInstalled as e:
        extra = "box2d" if env_id in BOX2D_ENVS else None
        hint = f"pip install 'loomlab[{extra}]'" if extra else str(e)
        raise LoomConfigError(f"{env_id} needs a package that is not installed: {hint}") from None
    except gym.error.Error as e:
        raise LoomConfigError(f"{env_id!r} is not a Gymnasium environment this install has: {e}") from None
