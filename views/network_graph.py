"""A network's structure drawn as a graph, as neat-python's ``visualize.draw_net`` draws a genome
with graphviz, but live: the inputs in a column on the left, then one column per enabled layer, in
the order the forward pass runs them. A Dense layer's column is its neurons, and each of its
non-zero weights is an edge from the column before, coloured by sign (green +, red -) and drawn
wider and more opaque the larger its magnitude; a layer of another type (or a Dense layer wider
than :data:`MAX_NEURONS`) is one node, joined to its neighbours by thin dashed links.

:func:`network_graph` lays the graph out without Qt (the tests compare it with the weights);
:class:`NetworkGraph` draws it (a pyqtgraph ``GraphItem``, one pen per edge).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from loomlab.core.network import VolumetricNetwork

MAX_NEURONS = 64  # a wider Dense layer is drawn as one node: 64 x 64 edges is already a thicket
POSITIVE, NEGATIVE = (44, 160, 44), (214, 39, 40)  # green and red, the fitness plot's best and worst
MIN_WIDTH, MAX_WIDTH = 0.5, 4.0  # pixels: the weakest and the strongest edge
MIN_ALPHA, MAX_ALPHA = 70, 255
NODE_SIZE = 12
NODE_STYLES = {  # kind: (symbol, brush)
    "input": ("s", "#bab0ac"), "hidden": ("o", "#ffffff"), "output": ("o", "#76b7b2"),
    "layer": ("d", "#f28e2b"),
}
LINK_COLOUR = "#9a9a9a"
LABEL_ROOM = 0.8  # rows of room under the lowest node for the columns' labels
COLOURS_NOTE = "green +, red −; wider and bolder = larger |w|"


@dataclass(frozen=True)
class NetGraph:
    """A network as nodes in columns and edges between neighbouring columns."""

    positions: np.ndarray  # [nodes, 2]: x the column, y the place in it (columns centred on 0)
    kinds: tuple[str, ...]  # per node: "input", "hidden", "output" (neurons) or "layer" (a whole layer)
    labels: tuple[tuple[float, str], ...]  # (x, text) under each column
    edges: np.ndarray  # [edges, 2] node indices, weakest first: a Dense layer's non-zero weights
    weights: np.ndarray  # [edges] the weight of each edge
    links: np.ndarray  # [links, 2] node indices joined without a weight (around a layer drawn as one node)


def _neurons(layer) -> int | None:
    """How many neurons ``layer``'s column shows: a Dense layer's outputs, else None (one node)."""
    if layer.type_name == "Dense" and layer.weights is not None and layer.cfg.output_height <= MAX_NEURONS:
        return layer.cfg.output_height
    return None


def _caption(layer) -> str:
    """A column's label: a Dense layer's width and activation, another layer's type."""
    if layer.type_name == "Dense":
        return f"Dense {layer.cfg.output_height} · {layer.cfg.activation}"
    return layer.type_name


def network_graph(net: VolumetricNetwork) -> NetGraph:
    """``net``'s enabled grid layers as a :class:`NetGraph` (disabled layers are skipped, as the
    forward pass skips them)."""
    layers = [layer for _, layer in net.layers() if not layer.cfg.is_disabled]
    positions: list[tuple[float, float]] = []
    kinds: list[str] = []
    labels: list[tuple[float, str]] = []

    def column(n: int, kind: str, label: str) -> list[int]:
        x = float(len(labels))
        first = len(positions)
        positions.extend((x, (n - 1) / 2 - j) for j in range(n))
        kinds.extend([kind] * n)
        labels.append((x, label))
        return list(range(first, first + n))

    edges: list[tuple[int, int]] = []
    weights: list[float] = []
    links: list[tuple[int, int]] = []
    if layers:
        first = layers[0]
        n_in = first.cfg.input_height if _neurons(first) is not None else 1
        previous = column(n_in, "input", f"inputs {first.cfg.input_height}")
        for i, layer in enumerate(layers):
            n = _neurons(layer)
            kind = "layer" if n is None else "output" if i == len(layers) - 1 else "hidden"
            current = column(n or 1, kind, _caption(layer))
            if n is not None and len(previous) == layer.cfg.input_height:
                w = layer.weights.dequantized(layer.cfg.dtype).reshape(n, layer.cfg.input_height)
                for o, j in zip(*np.nonzero(w), strict=True):
                    edges.append((previous[j], current[o]))
                    weights.append(float(w[o, j]))
            else:
                links.extend((a, b) for a in previous for b in current)
            previous = current
    w = np.array(weights, np.float64)
    order = np.argsort(np.abs(w), kind="stable")  # the strongest drawn last, on top
    return NetGraph(np.array(positions, np.float64).reshape(-1, 2), tuple(kinds), tuple(labels),
                    np.array(edges, np.int64).reshape(-1, 2)[order], w[order],
                    np.array(links, np.int64).reshape(-1, 2))


def edge_pens(weights: np.ndarray) -> np.ndarray:
    """A ``GraphItem`` pen per edge (a record array: red, green, blue, alpha, width): colour by
    sign, width and alpha rising with ``|w|`` relative to the largest."""
    pens = np.empty(len(weights), dtype=[("red", np.ubyte), ("green", np.ubyte), ("blue", np.ubyte),
                                         ("alpha", np.ubyte), ("width", np.float64)])
    magnitude = np.abs(weights)
    scale = magnitude / magnitude.max() if len(weights) and magnitude.max() > 0 else np.zeros(len(weights))
    rgb = np.where((weights >= 0)[:, None], POSITIVE, NEGATIVE)
    pens["red"], pens["green"], pens["blue"] = rgb[:, 0], rgb[:, 1], rgb[:, 2]
    pens["alpha"] = np.round(MIN_ALPHA + (MAX_ALPHA - MIN_ALPHA) * scale)
    pens["width"] = MIN_WIDTH + (MAX_WIDTH - MIN_WIDTH) * scale
    return pens


class NetworkGraph(QWidget):
    """Draws a network's :class:`NetGraph` (see the module docstring); :meth:`set_network` shows
    another network, None clears the view."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.graph: NetGraph | None = None
        self.plot = pg.PlotWidget()
        self.plot.hideAxis("left")
        self.plot.hideAxis("bottom")
        self.plot.setMenuEnabled(False)
        self.plot.setMinimumSize(120, 80)
        self.links = pg.PlotCurveItem(connect="pairs", pen=pg.mkPen(LINK_COLOUR, width=1,
                                                                     style=Qt.PenStyle.DashLine))
        self.edges = pg.GraphItem()
        self.plot.addItem(self.links)
        self.plot.addItem(self.edges)
        self.column_labels: list[pg.TextItem] = []
        self.caption = QLabel("")
        self.caption.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.plot, 1)
        layout.addWidget(self.caption)

    def set_network(self, net: VolumetricNetwork | None) -> None:
        """Draw ``net`` (None: nothing)."""
        for item in self.column_labels:
            self.plot.removeItem(item)
        self.column_labels = []
        self.graph = None if net is None else network_graph(net)
        g = self.graph
        if g is None or not len(g.positions):
            self.edges.setData(pos=np.zeros((0, 2)), adj=np.zeros((0, 2), np.int64))
            self.links.setData([], [])
            self.caption.setText("")
            return
        symbols = [NODE_STYLES[k][0] for k in g.kinds]
        brushes = [pg.mkBrush(NODE_STYLES[k][1]) for k in g.kinds]
        self.edges.setData(pos=g.positions, adj=g.edges, pen=edge_pens(g.weights), symbol=symbols,
                           symbolBrush=brushes, symbolPen=pg.mkPen("#303030"), size=NODE_SIZE, pxMode=True)
        ends = g.positions[g.links.reshape(-1)]
        self.links.setData(ends[:, 0], ends[:, 1])
        colour = pg.mkColor(pg.getConfigOption("foreground"))  # on the plot's canvas, not the window's
        bottom = g.positions[:, 1].min() - 0.4
        for x, text in g.labels:
            item = pg.TextItem(text, color=colour, anchor=(0.5, 0))
            item.setPos(x, bottom)
            self.plot.addItem(item)
            self.column_labels.append(item)
        top = g.positions[:, 1].max()
        self.plot.setRange(xRange=(-0.5, len(g.labels) - 0.5), yRange=(bottom - LABEL_ROOM, top + 0.5),
                           padding=0)
        self.caption.setText(f"{len(g.edges)} weights ({COLOURS_NOTE}); dashed: a layer drawn as one node"
                             if len(g.links) else f"{len(g.edges)} weights ({COLOURS_NOTE})")


__all__ = ["NetGraph", "NetworkGraph", "edge_pens", "network_graph"]
