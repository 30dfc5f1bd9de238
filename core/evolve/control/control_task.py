"""Control tasks: a network acts in a Gymnasium environment, and its fitness is its mean return
over ``episodes`` seeded episodes (seeds ``episode_seed``, ``episode_seed + 1``, ...).

Built in: ``cartpole`` (CartPole-v1), ``acrobot`` (Acrobot-v1), ``mountaincar`` (MountainCar-v0),
``mountaincar-continuous`` (MountainCarContinuous-v0), ``pendulum`` (Pendulum-v1), whose copies
step as numpy arrays (:mod:`.dynamics`), and ``lunarlander`` (LunarLander-v3, with the ``box2d``
extra). ``gym`` takes any Gymnasium id with Box or Discrete spaces as its ``env`` parameter.

The seed network maps the observation to one output per discrete action (the action is the
largest) or per element of a Box action (clipped to the box): see :mod:`.environments`. Every
member in every episode steps together (:mod:`.rollout`); the episodes are the same for every
member and every generation, so fitness is deterministic and a member's is the same in any
population, in chunks or on a Dask worker. A member whose network cannot act (it raises, or
gives fewer outputs than an action takes) scores the task's floor, the lowest mean return the
environment can give in ``max_steps`` steps.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np

from ...enums import LAYER_TYPES
from ...errors import LoomConfigError
from ...network import VolumetricNetwork
from ..genetics.budget import network_member_bytes
from ..search.tasks import NetworkTask
from .environments import Environment, gymnasium
from .rollout import Episode, play, returns

CONTROL_PARAMS: dict[str, Any] = {"episodes": 5, "episode_seed": 0, "max_steps": None, "floor": None}


class ControlTask(NetworkTask):
    """A Gymnasium environment as a fitness: see the module's docstring."""

    env_id: ClassVar[str | None] = None  # None: the ``env`` parameter names it
    neat_overrides = {"allowed_layer_types": (LAYER_TYPES["dense"].id,)}  # the seed's chain stays Dense
    n_inputs = n_outputs = 0  # per instance, from the environment (set in __init__)
    # the whole population steps together, but an episode can be a thousand steps of Python
    # environments (LunarLander): report members as they finish, stop between steps
    member_by_member = True

    def __init__(self, **params: Any):
        env_id = params.get("env", self.env_id) if self.env_id is None else self.env_id
        if env_id is None:
            raise LoomConfigError(f"task {self.name!r} needs env, a Gymnasium id such as 'CartPole-v1'")
        self.environment = Environment.of(env_id)
        self.n_inputs = self.environment.observation.size
        self.n_outputs = self.environment.action.size
        super().__init__(**params)
        self.max_steps = self.params["max_steps"] or self.environment.max_steps
        self.floor = self.params["floor"] if self.params["floor"] is not None else self.lowest_return()

    @property
    def defaults(self) -> dict[str, Any]:  # type: ignore[override]
        spec_threshold = _reward_threshold(self.environment.env_id)
        own = {"threshold": spec_threshold, **CONTROL_PARAMS}
        return {**own, "env": self.environment.env_id} if self.env_id is None else own

    @property
    def rows(self) -> int:
        return self.params["episodes"]

    def seeds(self) -> list[int]:
        """The evaluation episodes' seeds."""
        return [self.params["episode_seed"] + k for k in range(self.params["episodes"])]

    def lowest_return(self) -> float:
        """The lowest return an episode of ``max_steps`` steps can give (the floor)."""
        per_step = LOWEST_REWARD.get(self.environment.env_id)
        if per_step is None:
            return -1e9
        return per_step(self.environment) * self.max_steps

    def member_bytes(self, config=None) -> int:
        """As a network task's, with the batch's rows: a copy of the environment per episode."""
        return super().member_bytes(config) + network_member_bytes(0, 0, self.rows, 64)

    def evaluate(self, nets: Sequence[VolumetricNetwork], *,
                 progress: Callable[[int, int], None] | None = None,
                 cancel: Callable[[], bool] | None = None) -> list[float]:
        """Each network's mean return over the task's episodes (the floor if it cannot act);
        ``progress`` hears members as their last episode ends, ``cancel`` is asked every step."""
        if not nets:
            return []
        with np.errstate(all="ignore"):
            totals, failed = returns(nets, self.environment, self.seeds(), self.max_steps,
                                     progress=progress, cancel=cancel)
        fitness = np.where(failed, self.floor, np.maximum(totals.mean(axis=1), self.floor))
        return [float(f) for f in fitness]

    def episode(self, net: VolumetricNetwork, k: int = 0, *, render: bool = False) -> Episode:
        """``net``'s ``k``-th evaluation episode, recorded step by step (what a replay shows)."""
        with np.errstate(all="ignore"):
            return play(net, self.environment, self.seeds()[k], self.max_steps, render=render)

    def check_param(self, key: str, value: Any) -> Any:
        if key not in CONTROL_PARAMS and key != "env":
            return super().check_param(key, value)
        where = f"task {self.name!r} parameter {key!r}"
        if key == "env":
            if not isinstance(value, str):
                raise LoomConfigError(f"{where}: a Gymnasium id such as 'CartPole-v1', got "
                                      f"{reprlib.repr(value)}")
            return value
        if value is None and key in ("max_steps", "floor"):
            return None
        if key == "floor":
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise LoomConfigError(f"{where} must be a finite number, got {reprlib.repr(value)}")
            return float(value)
        if isinstance(value, bool) or not isinstance(value, int | np.integer):
            raise LoomConfigError(f"{where} must be an integer, got {reprlib.repr(value)}")
        low = 0 if key == "episode_seed" else 1
        if value < low:
            raise LoomConfigError(f"{where} must be >= {low}, got {value}")
        return int(value)


def _reward_threshold(env_id: str) -> float | None:
    """Gymnasium's own "solved" return for the id (its spec's ``reward_threshold``)."""
    threshold = gymnasium().spec(env_id).reward_threshold
    return None if threshold is None else float(threshold)


#: the lowest reward one step can give, by environment (actions within their spaces)
LOWEST_REWARD = {
    "CartPole-v1": lambda env: 0.0,
    "Acrobot-v1": lambda env: -1.0,
    "MountainCar-v0": lambda env: -1.0,
    "MountainCarContinuous-v0": lambda env: -0.1 * float(np.abs([env.action.low, env.action.high]).max())**2,
    "Pendulum-v1": lambda env: -(math.pi**2 + 0.1 * 8.0**2 + 0.001 * 2.0**2),
}


def _control_task(name: str, env_id: str | None) -> type[ControlTask]:
    return type(f"{name.title().replace('-', '')}Task", (ControlTask,), {"name": name, "env_id": env_id,
                                                                           "__module__": __name__})


#: the built-in control tasks by name
CONTROL_TASKS: dict[str, type[ControlTask]] = {
    name: _control_task(name, env_id) for name, env_id in (
        ("cartpole", "CartPole-v1"), ("acrobot", "Acrobot-v1"), ("mountaincar", "MountainCar-v0"),
        ("mountaincar-continuous", "MountainCarContinuous-v0"), ("pendulum", "Pendulum-v1"),
        ("lunarlander", "LunarLander-v3"), ("gym", None))}
