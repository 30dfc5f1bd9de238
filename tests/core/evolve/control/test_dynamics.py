"""The batched classic-control dynamics against Gymnasium itself: from the same seeded resets and
the same actions, every copy's observation, reward and termination equal ``gymnasium.make(id)``'s
bit for bit, step after step to the time limit, and a batch of copies equals each copy alone."""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core.evolve.control.dynamics import DYNAMICS
from loomlab.core.evolve.control.environments import Environment, GymnasiumCopies

gym = pytest.importorskip("gymnasium")


def random_actions(environment: Environment, rng, steps: int) -> np.ndarray:
    """Actions of every kind the task gives: discrete choices, or box values beyond the bounds
    (clipped by the task's mapping: MountainCarContinuous' clipped branch is Python floats)."""
    space = environment.action
    if space.kind == "discrete":
        return rng.integers(space.size, size=steps)
    y = rng.uniform(-3, 3, size=(steps, space.size)).astype(np.float32)
    return space.actions(y)


@pytest.mark.parametrize("env_id", sorted(DYNAMICS))
def test_each_step_equals_gymnasiums(env_id):
    environment = Environment.of(env_id)
    rng = np.random.default_rng(7)
    checked = 0
    for seed in range(4):
        env = gym.make(env_id)
        obs, _ = env.reset(seed=seed)
        batch = environment.start([seed], 1)
        np.testing.assert_array_equal(batch.observe()[0], obs)
        for action in random_actions(environment, rng, environment.max_steps):
            obs, reward, terminated, truncated, _ = env.step(int(action) if np.ndim(action) == 0 else action)
            rewards, ended = batch.step(np.asarray([action]))
            assert batch.observe()[0].tobytes() == obs.tobytes()
            assert rewards[0] == reward and bool(ended[0]) == terminated
            np.testing.assert_array_equal(batch.state[0], np.asarray(env.unwrapped.state, batch.state.dtype))
            checked += 1
            if terminated or truncated:
                break
    assert checked > 4 * 15  # whole episodes, not a step or two


@pytest.mark.parametrize("env_id", sorted(DYNAMICS))
def test_a_batch_of_copies_equals_gymnasium_copies_and_drops_rows(env_id):
    """Many seeds at once, rows dropped as they end (:meth:`keep`), against one Gymnasium
    environment per copy (the generic path)."""
    environment = Environment.of(env_id)
    seeds = [3, 4, 5, 6, 7, 8]
    batch = environment.start(seeds, 2)
    copies = GymnasiumCopies(environment, [s for s in seeds for _ in range(2)])
    rng = np.random.default_rng(1)
    for step in range(environment.max_steps):
        np.testing.assert_array_equal(batch.observe(), copies.observe())
        actions = random_actions(environment, rng, len(batch.state))
        got, want = batch.step(actions), copies.step(actions)
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_array_equal(got[1], want[1] & (step + 1 < environment.max_steps))
        keep = np.flatnonzero(~want[1])
        if step % 17 == 5:  # drop a copy that goes on, too
            keep = keep[1:]
        batch.keep(keep)
        copies.keep(keep)
        if len(keep) == 0:
            break
    copies.close()
