"""The network graph (views/network_graph.py): one node per neuron of each enabled Dense layer
(one per other layer), one edge per non-zero weight, drawn wider, more opaque and on top the
larger its |w|, green for +, red for -. Oracle: the layers' own weight matrices."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.layers.base import make_layer
from loomlab.core.network import VolumetricNetwork
from loomlab.views.network_graph import (
    MAX_NEURONS,
    NEGATIVE,
    POSITIVE,
    NetworkGraph,
    edge_pens,
    network_graph,
)

W1 = np.array([[0.5, -2.0, 0.0], [1.0, 0.25, -0.75]], np.float32)  # [out 2, in 3]: one zero weight
W2 = np.array([[3.0, -0.1], [0.0, 1.5], [-1.25, 0.6]], np.float32)  # [out 3, in 2]


def chain(*layers) -> VolumetricNetwork:
    net = VolumetricNetwork(1, 1, 1, len(layers))
    for l, layer in enumerate(layers):  # noqa: E741
        net[0, 0, 0, l] = layer
    return net


def dense(w: np.ndarray, activation: str = "Tanh", disabled: bool = False):
    layer = make_layer("Dense", input_height=w.shape[1], output_height=w.shape[0], activation=activation,
                       weights=w.reshape(-1))
    layer.cfg.is_disabled = disabled
    return layer


def expected_edges(columns: list[list[int]], matrices) -> dict[tuple[int, int], float]:
    """(from node, to node) -> weight, from each Dense layer's W[out][in] between its columns."""
    return {(columns[c][i], columns[c + 1][o]): float(w[o, i])
            for c, w in enumerate(matrices) for o, i in zip(*np.nonzero(w), strict=True)}


def test_edges_are_the_non_zero_weights_of_the_enabled_dense_layers():
    skipped = dense(np.ones((3, 3), np.float32), disabled=True)  # skipped by the forward pass and the graph
    g = network_graph(chain(dense(W1), skipped, dense(W2, "Linear")))
    assert g.kinds == ("input",) * 3 + ("hidden",) * 2 + ("output",) * 3
    assert [text for _, text in g.labels] == ["inputs 3", "Dense 2 · Tanh", "Dense 3 · Linear"]
    columns = [[0, 1, 2], [3, 4], [5, 6, 7]]
    for x, nodes in enumerate(columns):
        assert list(g.positions[nodes, 0]) == [x] * len(nodes)
        assert list(g.positions[nodes, 1]) == [(len(nodes) - 1) / 2 - j for j in range(len(nodes))]
    assert len(g.edges) == np.count_nonzero(W1) + np.count_nonzero(W2) == 10
    drawn = {(int(a), int(b)): w for (a, b), w in zip(g.edges, g.weights, strict=True)}
    assert drawn == expected_edges(columns, [W1, W2])
    assert list(np.abs(g.weights)) == sorted(np.abs(g.weights))  # the strongest drawn last, on top
    assert len(g.links) == 0


def test_a_layer_that_is_not_dense_is_one_node_joined_by_links():
    g = network_graph(chain(dense(W1), make_layer("Softmax"), dense(W2)))
    assert g.kinds == ("input",) * 3 + ("hidden",) * 2 + ("layer",) + ("output",) * 3
    assert [text for _, text in g.labels] == ["inputs 3", "Dense 2 · Tanh", "Softmax", "Dense 3 · Tanh"]
    assert {tuple(e) for e in g.links} == {(3, 5), (4, 5), (5, 6), (5, 7), (5, 8)}
    assert len(g.edges) == np.count_nonzero(W1)  # only the first Dense layer's weights map onto a column
    wide = dense(np.ones((MAX_NEURONS + 1, 2), np.float32))
    assert network_graph(chain(wide)).kinds == ("input", "layer")  # too wide: one node, and one for its input


def test_width_and_alpha_rise_with_the_magnitude_and_the_colour_is_the_sign():
    weights = np.array([0.1, -3.0, 0.0, 2.0, -0.5, 3.0])
    pens = edge_pens(weights)
    for a, b in itertools.permutations(range(len(weights)), 2):
        if abs(weights[a]) > abs(weights[b]):
            assert pens["width"][a] > pens["width"][b] and pens["alpha"][a] > pens["alpha"][b]
        if abs(weights[a]) == abs(weights[b]):
            assert pens["width"][a] == pens["width"][b]
    for w, pen in zip(weights, pens, strict=True):
        assert (pen["red"], pen["green"], pen["blue"]) == (POSITIVE if w >= 0 else NEGATIVE)


def test_the_widget_draws_the_graph_with_a_pen_per_edge(qtbot):
    view = NetworkGraph()
    qtbot.addWidget(view)
    view.resize(500, 300)
    view.show()
    net = get_task("cartpole").seed_network()  # Dense 4 -> 4 -> 2
    view.set_network(net)
    g = view.graph
    weights = [layer.weights.master.reshape(layer.cfg.output_height, -1) for _, layer in net.layers()]
    assert len(view.edges.adjacency) == sum(np.count_nonzero(w) for w in weights) == 24
    np.testing.assert_array_equal(view.edges.adjacency, g.edges)
    drawn = {(int(a), int(b)): w for (a, b), w in zip(view.edges.adjacency, g.weights, strict=True)}
    assert drawn == pytest.approx(expected_edges([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]], weights))
    # what is painted: an edge of larger |w| with a wider pen, in the sign's colour
    widths = view.edges.pen["width"]
    for a, b in itertools.combinations(range(len(g.weights)), 2):
        if abs(g.weights[a]) != abs(g.weights[b]):
            assert (widths[a] > widths[b]) == (abs(g.weights[a]) > abs(g.weights[b]))
    assert [tuple(p)[:3] for p in view.edges.pen] == [POSITIVE if w >= 0 else NEGATIVE for w in g.weights]
    assert [item.toPlainText() for item in view.column_labels] == ["inputs 4", "Dense 4 · Tanh",
                                                                   "Dense 2 · Linear"]
    assert view.caption.text().startswith("24 weights")
    view.set_network(None)
    assert view.graph is None and view.edges.adjacency is None and view.column_labels == []
