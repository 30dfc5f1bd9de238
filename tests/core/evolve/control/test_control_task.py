"""Control tasks: a population stepped as one batch gives each member exactly what that member
gets alone in the plain Gymnasium environment (same observations, actions and returns); the
fitness is the mean return, a member that cannot act scores the floor; parameters and ids are
checked with one clear error."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from loomlab.core.errors import LoomCancelled, LoomConfigError
from loomlab.core.evolve.control.control_task import ControlTask
from loomlab.core.evolve.control.environments import Environment
from loomlab.core.evolve.genetics.neat import NEATConfig, neat_mutate
from loomlab.core.evolve.search.batched import NetworkStack
from loomlab.core.evolve.search.tasks import get_task

gym = pytest.importorskip("gymnasium")


def mutants(task, n, *, dense_only=True):
    """The seed network and mutants of mutants of it: NEAT's perturbations and activations
    (``dense_only``) or any layer type (members that cannot act)."""
    config = task.neat_config(0) if dense_only else NEATConfig.default(task.params["hidden"], 0)
    members = [task.seed_network()]
    for i in range(n - 1):
        config = type(config)(**{**config.__dict__, "seed": i})
        members.append(neat_mutate(members[i // 2], config))
    return members


def alone(net, env_id, seed, max_steps):
    """The member alone in ``gymnasium.make(id)``: its observations, actions and rewards, with the
    network run on one row at a time."""
    environment = Environment.of(env_id)
    stack, env = NetworkStack([net]), gym.make(env_id)
    obs, _ = env.reset(seed=seed)
    seen, actions, rewards = [], [], []
    for _ in range(max_steps):
        x = environment.observation.observations(np.asarray([obs]))
        (_, y), = stack.forward_rows(x, [0])
        action = environment.action.action(y[0])
        seen.append(x[0])
        actions.append(action)
        obs, reward, terminated, truncated, _ = env.step(action)
        rewards.append(reward)
        if terminated or truncated:
            break
    env.close()
    return np.array(seen), np.array(actions), rewards


@pytest.mark.parametrize("name, n", [("cartpole", 24), ("acrobot", 6), ("mountaincar", 6),
                                     ("mountaincar-continuous", 6), ("pendulum", 8)])
def test_batched_returns_equal_each_member_alone_in_gymnasium(name, n):
    task = get_task(name, episodes=3, hidden=6, init_scale=2.0)
    members = mutants(task, n // 2) + [get_task(name, hidden=6, init_scale=2.0, seed=s).seed_network()
                                       for s in range(1, n - n // 2 + 1)]
    fitness = task.evaluate(members)
    assert len({task.episode(m).actions.tobytes() for m in members}) > 1  # the mutants act differently
    for i, net in enumerate(members):
        totals = []
        for k, seed in enumerate(task.seeds()):
            obs, actions, rewards = alone(net, task.environment.env_id, seed, task.max_steps)
            total = 0.0
            for r in rewards:
                total += r
            totals.append(total)
            if i < 3:  # the recorded episode: the same steps
                episode = task.episode(net, k)
                np.testing.assert_array_equal(episode.observations, obs)
                np.testing.assert_array_equal(episode.actions.reshape(actions.shape), actions)
                np.testing.assert_array_equal(episode.rewards, rewards)
                assert episode.total == total
        assert fitness[i] == max(np.mean(totals), task.floor)


def test_a_member_scores_the_same_in_any_population():
    task = get_task("cartpole", episodes=2)
    members = mutants(task, 12)
    whole = task.evaluate(members)
    assert [task.evaluate([m])[0] for m in members] == whole
    assert task.evaluate(members[::-1]) == whole[::-1]


def test_members_that_cannot_act_score_the_floor():
    task = get_task("acrobot", episodes=2, hidden=4)
    members = mutants(task, 24, dense_only=False)  # other layer types, other widths
    stack = NetworkStack(members)
    x = np.zeros((len(members), task.n_inputs), np.float32)
    fitness = task.evaluate(members)
    for (rows, y) in stack.forward_rows(x, np.arange(len(members)), catch=Exception):
        for i in rows:
            if isinstance(y, Exception) or y.shape[1] < task.n_outputs:
                assert fitness[i] == task.floor == -500.0
    assert task.floor in fitness and max(fitness) > task.floor


def test_the_floor_is_the_lowest_return_of_max_steps():
    assert get_task("cartpole").floor == 0.0
    assert get_task("mountaincar", max_steps=50).floor == -50.0
    pendulum = get_task("pendulum")
    assert pendulum.floor == pytest.approx(-(np.pi**2 + 0.1 * 64 + 0.001 * 4) * 200)
    assert get_task("pendulum", floor=-5.0).floor == -5.0


def test_the_threshold_is_gymnasiums_solved_return():
    assert get_task("cartpole").fitness_threshold == gym.spec("CartPole-v1").reward_threshold == 475.0
    assert get_task("pendulum").fitness_threshold is None
    assert get_task("cartpole", threshold=100).fitness_threshold == 100.0


def test_the_seed_network_fits_the_spaces():
    net = get_task("acrobot", hidden=5, depth=2).seed_network()
    dims = [(la.cfg.input_height, la.cfg.output_height) for _, la in net.layers()]
    assert dims == [(6, 5), (5, 5), (5, 3)]
    net = get_task("mountaincar-continuous").seed_network()
    assert [la.cfg.output_height for _, la in net.layers()][-1] == 1


def test_any_gymnasium_id_with_box_or_discrete_spaces():
    """FrozenLake (discrete observations, one-hot; a seeded slippery lake) through Gymnasium's own
    environments, one per copy."""
    task = get_task("gym", env="FrozenLake-v1", episodes=4, hidden=5)
    assert not task.environment.batched and task.n_inputs == 16 and task.n_outputs == 4
    members = mutants(task, 8)
    fitness = task.evaluate(members)
    for i, net in enumerate(members):
        totals = [sum(alone(net, "FrozenLake-v1", s, task.max_steps)[2]) for s in task.seeds()]
        assert fitness[i] == np.mean(totals)


@pytest.mark.parametrize("params, message", [
    ({"env": "NoSuchEnv-v9"}, "'NoSuchEnv-v9' is not a Gymnasium environment"),
    ({"env": "Blackjack-v1"}, "its observation space is Tuple"),
    ({"env": 3}, "a Gymnasium id such as 'CartPole-v1'"),
    ({}, "needs env"),
])
def test_bad_environments_are_one_config_error(params, message):
    with pytest.raises(LoomConfigError, match=message):
        get_task("gym", **params)


@pytest.mark.parametrize("params, message", [
    ({"episodes": 0}, "'episodes' must be >= 1"),
    ({"episodes": 2.5}, "'episodes' must be an integer"),
    ({"episode_seed": -1}, "'episode_seed' must be >= 0"),
    ({"max_steps": True}, "'max_steps' must be an integer"),
    ({"floor": float("nan")}, "'floor' must be a finite number"),
    ({"env": "CartPole-v1"}, "has no parameter 'env'"),
    ({"points": 3}, "has no parameter 'points'"),
])
def test_bad_parameters_are_one_config_error(params, message):
    with pytest.raises(LoomConfigError, match=message):
        get_task("cartpole", **params)


def test_without_gymnasium_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)
    Environment.of.cache_clear()
    try:
        with pytest.raises(LoomConfigError, match=r"pip install 'loomlab\[control\]'"):
            get_task("cartpole")
    finally:
        Environment.of.cache_clear()


def test_lunarlander_needs_box2d_or_names_its_extra():
    try:
        import Box2D  # noqa: F401
    except ImportError:
        with pytest.raises(LoomConfigError, match=r"pip install 'loomlab\[box2d\]'"):
            get_task("lunarlander")
        return
    task = get_task("lunarlander", episodes=2)
    assert isinstance(task, ControlTask) and task.n_inputs == 8 and task.n_outputs == 4
    members = mutants(task, 3)
    fitness = task.evaluate(members)
    for i, net in enumerate(members):
        totals = [sum(alone(net, "LunarLander-v3", s, task.max_steps)[2]) for s in task.seeds()]
        assert fitness[i] == pytest.approx(np.mean(totals), abs=0, rel=0)


def test_progress_counts_members_whose_episodes_ended_and_cancel_stops_between_steps():
    task = get_task("cartpole", episodes=2, hidden=6, init_scale=2.0)
    members = mutants(task, 6) + [get_task("cartpole", hidden=6, init_scale=2.0, seed=s).seed_network()
                                  for s in range(1, 7)]
    heard = []
    fitness = task.evaluate(members, progress=lambda done, total: heard.append((done, total)))
    assert fitness == task.evaluate(members)
    assert heard[-1] == (12, 12) and all(t == 12 for _, t in heard)
    # a member is done when the longer of its two episodes ends: the counts follow those lengths
    ends = [max(len(task.episode(m, k)) for k in range(2)) for m in members]
    assert [d for d, _ in heard] == [sum(e <= t for e in ends) for t in sorted(set(ends))]
    asked = []
    with pytest.raises(LoomCancelled):
        task.evaluate(members, cancel=lambda: asked.append(1) or len(asked) > 5)
    assert len(asked) == 6  # once a step, and it stopped at the sixth


def test_every_control_task_is_registered_by_name():
    """get_task finds each control task without importing this module first (LAZY_TASKS)."""
    from loomlab.core.evolve.control.control_task import CONTROL_TASKS
    from loomlab.core.evolve.search.tasks import LAZY_TASKS

    lazy = {name for name, (module, _) in LAZY_TASKS.items() if module.endswith(".control_task")}
    assert lazy == set(CONTROL_TASKS)
