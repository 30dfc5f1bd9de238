"""Episodes of a whole population stepped together: every member in every seeded episode is one
row; each step the rows' observations go through their members' networks in one call
(:meth:`.search.batched.NetworkStack.forward_rows`) and the environment copies advance as one
batch (:mod:`.environments`). A row leaves the batch when its episode ends.

A member's returns do not depend on the rest of the population: its rows are computed on their
own in the network kernel and in the dynamics, so a member run alone (:func:`play`) gives the
same observations, actions and return as in any population.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...errors import LoomCancelled, LoomError
from ...network import VolumetricNetwork
from ..search.batched import NetworkStack
from .environments import Environment


@dataclass
class Episode:
    """One member's episode, step by step: what a replay shows and a test compares.

    ``observations[t]`` is what the network saw before action ``actions[t]``, which earned
    ``rewards[t]``; ``states`` ``[T + 1, k]`` are the environment's states from the reset to the
    end (what frames are drawn from); ``frames`` are the environment's own ``rgb_array`` frames
    (``T + 1``) for an environment without drawn frames."""

    env_id: str
    seed: int
    observations: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    states: np.ndarray
    outputs: np.ndarray  # the network's outputs at each step, [T, out]
    frames: list[np.ndarray] = field(default_factory=list)

    @property
    def total(self) -> float:
        """The episode's return: its rewards summed in order, as Gymnasium's loop would."""
        total = 0.0
        for r in self.rewards:
            total += float(r)
        return total

    def __len__(self) -> int:
        return len(self.actions)


def returns(nets: Sequence[VolumetricNetwork], environment: Environment, seeds: list[int], max_steps: int,
            *, progress: Callable[[int, int], None] | None = None,
            cancel: Callable[[], bool] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every member's return in every episode: ``(returns [members, episodes], failed [members])``.

    A member whose network raises a :class:`LoomError` on an observation, or whose output has
    fewer values than an action takes, stops there and is ``failed`` (the task scores it its
    floor). ``progress(done, members)`` hears how many members have finished all their episodes
    whenever that number grows; ``cancel`` is asked between steps (a true answer raises
    :class:`LoomCancelled`)."""
    n, episodes = len(nets), len(seeds)
    stack = NetworkStack(nets)
    batch = environment.start(seeds, n)  # seed-major: row k * n + m is member m in episode k
    try:
        member = np.tile(np.arange(n), episodes)
        totals = np.zeros(n * episodes)
        alive = np.arange(n * episodes)
        failed = np.zeros(n, bool)
        done = 0
        for _ in range(max_steps):
            if cancel is not None and cancel():
                raise LoomCancelled("the episodes were cancelled")
            outputs, broken = _outputs(stack, batch.observe(), member[alive], environment)
            if broken.any():
                failed[np.unique(member[alive][broken])] = True
                keep = ~failed[member[alive]]
                alive, outputs = alive[keep], outputs[keep]
                batch.keep(np.flatnonzero(keep))
                if len(alive) == 0:
                    break
            rewards, ended = batch.step(environment.action.actions(outputs))
            totals[alive] += rewards
            if ended.any():
                keep = np.flatnonzero(~ended)
                alive = alive[keep]
                batch.keep(keep)
                if progress is not None and (finished := n - len(np.unique(member[alive]))) > done:
                    done = finished
                    progress(done, n)
                if len(alive) == 0:
                    break
        if progress is not None and done < n:
            progress(n, n)
    finally:
        batch.close()
    return totals.reshape(episodes, n).T, failed


def play(net: VolumetricNetwork, environment: Environment, seed: int, max_steps: int,
         *, render: bool = False) -> Episode:
    """``net`` alone in the episode of ``seed``, recorded (:class:`Episode`); ``render`` takes the
    environment's own frames (ids without drawn frames)."""
    stack = NetworkStack([net])
    batch = environment.start([seed], 1, render=render)
    try:
        observations, actions, rewards, outputs = [], [], [], []
        states = [np.array(batch.state[0], np.float64)]
        member = np.zeros(1, np.int64)
        for _ in range(max_steps):
            obs = batch.observe()
            y, broken = _outputs(stack, obs, member, environment)
            if broken.any():
                break
            action = environment.action.actions(y)
            reward, ended = batch.step(action)
            observations.append(obs[0])
            outputs.append(y[0])
            actions.append(action[0])
            rewards.append(reward[0])
            states.append(np.array(batch.state[0], np.float64))
            if ended[0]:
                break
        frames = batch.frames[0] if render else []
    finally:
        batch.close()
    width = environment.observation.size
    return Episode(environment.env_id, seed, np.array(observations, np.float32).reshape(-1, width),
                   np.array(actions), np.array(rewards, np.float64), np.array(states),
                   np.array(outputs, np.float32).reshape(len(outputs), -1), frames)


def _outputs(stack: NetworkStack, obs: np.ndarray, member: np.ndarray,
             environment: Environment) -> tuple[np.ndarray, np.ndarray]:
    """The rows' outputs (float32 ``[rows, size]``, the action space's size) and which rows'
    members failed (raised, or gave too few values)."""
    size = environment.action.size
    out = np.zeros((len(obs), size), np.float32)
    broken = np.zeros(len(obs), bool)
    for rows, y in stack.forward_rows(obs, member, catch=LoomError):
        if isinstance(y, BaseException) or y.shape[1] < size:
            broken[rows] = True
        else:
            out[rows] = y[:, :size]
    return out, broken
