"""Built-in evolution tasks: data and fitness against their formulas, the floor for broken members,
parameters (rebuilding, validation) and determinism across chunks of a population."""

import json

import numpy as np
import pytest

from loomlab.core import LoomConfigError, VolumetricNetwork, make_layer
from loomlab.core.evolve.search.tasks import TASKS, get_task

from ...mutants import mutate


def chain(*layers, precision="loom"):
    net = VolumetricNetwork(1, 1, 1, len(layers), precision=precision)
    for i, layer in enumerate(layers):
        net[0, 0, 0, i] = layer
    return net


def dense(n_in, n_out, w, act="Linear"):
    return make_layer("Dense", input_height=n_in, output_height=n_out, activation=act,
                      weights=np.asarray(w, np.float32).ravel())


def reference_fitness(task, net):
    """The task's fitness from the member's own forward, written out per task."""
    y = net.forward(task.inputs).astype(np.float64)
    if y.shape[0] != len(task.inputs) or y.size != task.targets.size or not np.isfinite(y).all():
        return task.floor
    y = y.reshape(-1)
    t = task.targets.astype(np.float64).reshape(-1)
    raw = {"xor": lambda: 4 - ((y - t) ** 2).sum(), "sine": lambda: -((y - t) ** 2).mean(),
           "spirals": lambda: np.mean(np.sign(y) == t)}[task.name]()
    return max(raw, task.floor)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_fitness_of_seed_networks_matches_the_formula(name):
    for seed in range(6):
        for precision in ("loom", "fast"):
            task = get_task(name, seed=seed, precision=precision)
            net = task.seed_network()
            assert net.precision == precision
            (fit,) = task.evaluate([net])
            assert fit == pytest.approx(reference_fitness(task, net), rel=1e-6, abs=1e-6)


def test_xor_exact_values():
    task = get_task("xor")
    # |x1 - x2| = relu(x1 - x2) + relu(x2 - x1) solves XOR without biases
    solver = chain(dense(2, 2, [[1, -1], [-1, 1]], "ReLU"), dense(2, 1, [1, 1]))
    zero = chain(dense(2, 1, [0, 0]))
    half = chain(dense(2, 1, [0.5, 0.5]))  # outputs 0, .5, .5, 1: errors 0, .25, .25, 1
    assert task.evaluate([solver, zero, half]) == [4.0, 2.0, 2.5]
    assert task.solved(4.0) and not task.solved(3.89)
    assert get_task("xor", threshold=None).solved(4.0) is False


def test_sine_and_spirals_data_and_exact_values():
    sine = get_task("sine", points=5)
    np.testing.assert_allclose(sine.inputs[:, 0], np.linspace(-np.pi, np.pi, 5), rtol=1e-6)
    (fit,) = sine.evaluate([chain(dense(1, 1, [0.3]))])
    x = sine.inputs[:, 0].astype(np.float64)
    assert fit == pytest.approx(-np.mean((np.float32(0.3) * x - np.sin(x)) ** 2), rel=1e-6)

    spirals = get_task("spirals")
    x = spirals.inputs
    assert x.shape == (194, 2)
    np.testing.assert_allclose(x[0], [0, 1])  # angle 0, radius 6.5 scaled to 1
    np.testing.assert_allclose(x[96], 8 / 104 * np.array([np.sin(6 * np.pi), np.cos(6 * np.pi)]), atol=1e-7)
    np.testing.assert_array_equal(x[97:], -x[:97])
    np.testing.assert_array_equal(spirals.targets[:, 0], [1] * 97 + [-1] * 97)
    by_x2 = chain(dense(2, 1, [0, 1]))  # class by the sign of the second coordinate
    (fit,) = spirals.evaluate([by_x2])
    assert fit == np.mean(np.sign(x[:, 1]) == spirals.targets[:, 0])


def test_broken_members_get_the_floor():
    task = get_task("xor")
    rng = np.random.default_rng(0)
    wrong_input = chain(dense(3, 1, [1, 1, 1]))  # reads 4 rows of 3 from 8 values: LoomShapeError
    wrong_output = chain(dense(2, 2, np.eye(2)))  # 2 outputs per row
    overflow = chain(dense(2, 4, np.full(8, 3e38)), dense(4, 1, np.full(4, 3e38)))
    # [4, 1, 2]: 2 values per row
    rnn = chain(make_layer("RNN", input_height=2, output_height=2, input_channels=2, seq_length=1, rng=rng))
    nan = chain(dense(2, 1, [np.nan, 0]))
    fits = task.evaluate([wrong_input, wrong_output, overflow, rnn, nan, task.seed_network()])
    assert fits[:5] == [task.floor] * 5
    assert fits[5] > task.floor
    far = chain(dense(2, 1, [10, 10]))  # 4 - (0 + 100 + 100 + 400): raised to the floor
    assert task.evaluate([far]) == [0.0]
    assert get_task("sine").evaluate([chain(dense(1, 1, [100]))]) == [-1.0]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_mutated_populations_score_finite_and_chunk_independent(name):
    task = get_task(name)
    rng = np.random.default_rng(11)
    nets = [mutate(get_task(name, seed=s).seed_network(), rng, task.params["hidden"], 0.4) for s in range(40)]
    fits = task.evaluate(nets)
    assert all(np.isfinite(f) and f >= task.floor for f in fits)
    assert any(f > task.floor for f in fits) and any(f == task.floor for f in fits)
    # in-process and on Dask workers in any chunking: bit-identical
    assert [f for i in range(0, 40, 6) for f in task.evaluate(nets[i:i + 6])] == fits
    assert [task.evaluate([n])[0] for n in nets] == fits
    for net, fit in zip(nets, fits, strict=True):
        try:
            ref = reference_fitness(task, net)
        except Exception:
            ref = task.floor
        ref = ref if np.isfinite(ref) else task.floor
        assert fit == pytest.approx(ref, rel=1e-5, abs=1e-5)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_params_rebuild_an_equal_task(name):
    task = get_task(name, seed=3, hidden=5, activation="relu")
    assert task.params["activation"] == "ReLU"  # canonical spelling
    again = get_task(task.name, **json.loads(json.dumps(task.params)))
    assert again == task and hash(again) == hash(task)
    assert again != get_task(name, seed=4, hidden=5, activation="relu")
    a, b = task.seed_network(), again.seed_network()
    for la, lb in zip(a.cells, b.cells, strict=True):
        np.testing.assert_array_equal(la.weights.master, lb.weights.master)
    sizes = [(la.cfg.input_height, la.cfg.output_height) for la in a.cells]
    assert sizes == [(task.n_inputs, 5)] + [(5, 5)] * (task.params["depth"] - 1) + [(5, task.n_outputs)]
    assert [la.cfg.activation for la in a.cells] == ["ReLU"] * task.params["depth"] + ["Linear"]
    assert all(np.abs(la.weights.master).max() <= task.params["init_scale"] for la in a.cells)


@pytest.mark.parametrize("name, params, names", [
    ("nope", {}, ["'nope'", "sine", "spirals", "xor"]),
    ("xor", {"points": 3}, ["'points'", "hidden", "threshold"]),
    ("xor", {"hidden": 0}, ["'hidden'", ">= 1"]),
    ("xor", {"hidden": True}, ["'hidden'", "integer"]),
    ("sine", {"points": 2.5}, ["'points'", "integer"]),
    ("xor", {"seed": -1}, ["'seed'", ">= 0"]),
    ("xor", {"activation": "Swish"}, ["'activation'", "Tanh", "ReLU"]),
    ("xor", {"output_activation": 3}, ["'output_activation'"]),
    ("xor", {"precision": "half"}, ["'precision'", "loom", "fast"]),
    ("xor", {"init_scale": 0}, ["'init_scale'", "> 0"]),
    ("xor", {"threshold": "high"}, ["'threshold'", "number"]),
    ("xor", {"threshold": float("nan")}, ["'threshold'", "finite"]),
])
def test_bad_tasks_and_params_are_named(name, params, names):
    with pytest.raises(LoomConfigError) as err:
        get_task(name, **params)
    for part in names:
        assert part in str(err.value)
