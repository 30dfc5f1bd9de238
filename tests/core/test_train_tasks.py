"""Training tasks chosen from a network's sizes. Oracles: the XOR table and sin(x); for the linear
map, a least-squares fit (one linear map explains every target); shapes from the network's own
forward pass."""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core import LoomConfigError, VolumetricNetwork, make_layer
from loomlab.core.io.loom_json import read_network
from loomlab.core.train import TrainConfig, train
from loomlab.core.train_tasks import LINEAR_MAP_BATCH_SIZE, LINEAR_MAP_BATCHES, SINE_POINTS, make_task

from .goldens import forward_case


def mlp(n_in, n_hidden, n_out, seed=0):
    rng = np.random.default_rng(seed)
    net = VolumetricNetwork(1, 1, 2, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=n_in, output_height=n_hidden, activation="Tanh",
                                 rng=rng)
    net[0, 0, 1, 0] = make_layer("Dense", input_height=n_hidden, output_height=n_out, activation="Linear",
                                 rng=rng)
    return net


def test_a_2_to_1_network_learns_xor():
    task = make_task(mlp(2, 8, 1))
    assert task.name == "xor" and "XOR" in task.description
    [(x, t)] = task.batches
    np.testing.assert_array_equal(np.column_stack([x, t]), [[0, 0, 0], [0, 1, 1], [1, 0, 1], [1, 1, 0]])


def test_a_1_to_1_network_learns_the_sine():
    task = make_task(mlp(1, 8, 1))
    assert task.name == "sine"
    [(x, t)] = task.batches
    assert x.shape == (SINE_POINTS, 1) and x.min() == np.float32(-np.pi) and x.max() == np.float32(np.pi)
    np.testing.assert_array_equal(t, np.sin(x))


def test_other_sizes_learn_one_fixed_linear_map_of_the_input():
    net = mlp(6, 8, 3)
    task = make_task(net, seed=3)
    assert task.name == "linear-map"
    assert len(task.batches) == LINEAR_MAP_BATCHES
    xs = np.concatenate([x for x, _ in task.batches])
    ts = np.concatenate([t for _, t in task.batches])
    assert xs.shape == (LINEAR_MAP_BATCHES * LINEAR_MAP_BATCH_SIZE, 6) and ts.shape == (len(xs), 3)
    m, residual, rank, _ = np.linalg.lstsq(xs.astype(np.float64), ts.astype(np.float64), rcond=None)
    assert rank == 6 and residual.max() < 1e-9 * np.sum(ts.astype(np.float64) ** 2)
    np.testing.assert_array_equal(make_task(net, seed=3).batches[2][1], task.batches[2][1])  # seeded
    assert not np.array_equal(make_task(net, seed=4).batches[0][0], task.batches[0][0])


@pytest.mark.parametrize("name", ["mha_gqa", "cnn2", "lstm", "embedding", "kmeans_feat", "transformer_block",
                                  "parallel_concat"])
def test_every_kind_of_network_gets_targets_shaped_like_its_output(name):
    net = read_network(forward_case(name)["network"])
    task = make_task(net)
    for x, t in task.batches:
        assert t.shape == np.asarray(net.forward(x)).shape
    history = train(net, task.batches, TrainConfig(epochs=3, learning_rate=0.01))
    assert len(history) == 3 and all(np.isfinite(history))


def test_cross_entropy_gets_one_hot_classes_of_the_same_targets():
    net = mlp(6, 8, 3)
    plain, classes = make_task(net, seed=1), make_task(net, seed=1, loss="softmax_crossentropy")
    for (x, t), (xc, tc) in zip(plain.batches, classes.batches, strict=True):
        np.testing.assert_array_equal(x, xc)
        np.testing.assert_array_equal(tc, np.eye(3)[t.argmax(axis=1)])
    assert "one-hot" in classes.description


def test_cross_entropy_on_a_single_output_is_refused():
    with pytest.raises(LoomConfigError, match="crossentropy needs at least 2 outputs per row.*xor.*use mse"):
        make_task(mlp(2, 4, 1), loss="crossentropy")
    with pytest.raises(LoomConfigError, match="unknown loss 'hinge'"):
        make_task(mlp(2, 4, 1), loss="hinge")
