"""The Topology 3D panel: a network's grid drawn in a ``GLViewWidget``, with live activity colouring
and a layer inspector.

Every layer (grid cells and the children nested in Parallel / Sequential containers) is one point:
grid cells sit at their ``(z, y, x, l)`` place, nested children rise above their cell as an outline
(one step up per layer, indented by nesting depth, joined to their container), so branches stay
visible.
Points are coloured by layer type (:data:`TYPE_COLOURS`) or by the activity the network reports
(the panel watches every network it is given), and sized by parameter count on a log scale. A
language model's layers are named by their file tensors (``core.layer_names``), in hover tooltips
and the inspector, and its block numbers stand on the floor.

Threading: the observer callback runs on whatever thread runs the network (a chat worker, say).
It only stores the latest event per layer under a lock; a QTimer on the GUI thread drains that
buffer at most 30 times a second and recolours.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import pyqtgraph as pg
import pyqtgraph.opengl as gl
from pyqtgraph.opengl.GLGraphicsItem import GLGraphicsItem
from pyqtgraph.opengl.GLViewWidget import GLViewMixin
from PySide6.QtCore import QPoint, QPointF, QRectF, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QImage, QMatrix4x4, QPainter, QVector3D
from PySide6.QtOpenGL import QOpenGLBuffer, QOpenGLWindow
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSplitter,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from loomlab.core import CallbackObserver, Layer, LayerEvent, LayerStats, VolumetricNetwork
from loomlab.core.layer_names import LayerKey, LayerName, layer_name, model_parts
from loomlab.core.llm.model.llm_layers import LLMGatedMLP
from loomlab.core.llm.model.moe_layer import LLMMixtureOfExperts
from loomlab.core.network import BlueprintRow
from loomlab.core.observe import LIVE_SAMPLE_HZ, check_rate

from .workers import Job, JobRunner

Colour = tuple[float, float, float, float]

# One fixed colour per Loom layer type, so the same type looks the same in every network.
TYPE_COLOURS: dict[str, Colour] = {
    "Dense": (0.30, 0.60, 1.00, 1.0),
    "MultiHeadAttention": (1.00, 0.50, 0.15, 1.0),
    "SwiGLU": (0.35, 0.85, 0.35, 1.0),
    "RMSNorm": (0.80, 0.80, 0.88, 1.0),
    "CNN1": (0.00, 0.80, 0.80, 1.0),
    "CNN2": (0.10, 0.65, 0.65, 1.0),
    "CNN3": (0.05, 0.50, 0.50, 1.0),
    "RNN": (0.90, 0.40, 0.90, 1.0),
    "LSTM": (0.65, 0.35, 0.95, 1.0),
    "LayerNorm": (0.62, 0.62, 0.70, 1.0),
    "ConvTransposed1D": (0.60, 0.85, 1.00, 1.0),
    "ConvTransposed2D": (0.45, 0.75, 0.95, 1.0),
    "ConvTransposed3D": (0.35, 0.60, 0.85, 1.0),
    "Embedding": (1.00, 0.85, 0.20, 1.0),
    "KMeans": (1.00, 0.60, 0.70, 1.0),
    "Softmax": (0.95, 0.30, 0.30, 1.0),
    "Parallel": (0.70, 0.55, 0.35, 1.0),
    "Sequential": (0.55, 0.50, 0.45, 1.0),
    "Residual": (0.40, 0.70, 0.55, 1.0),
    "Metacognition": (1.00, 1.00, 1.00, 1.0),
}
UNKNOWN_COLOUR: Colour = (0.5, 0.5, 0.5, 1.0)
SHIFT_COLOUR: Colour = (0.25, 1.0, 0.45, 0.95)  # logic-shift arrows
ARROW_HEAD = 0.35  # world length of an arrow's head strokes
IDLE_COLOUR: Colour = (0.35, 0.35, 0.40, 0.6)  # activity mode: a layer that has not run yet

ACTIVITY_METRICS = {"rms": "Activity: RMS", "active": "Activity: active fraction"}
ACTIVITY_COLORMAP = "viridis"

MIN_POINT = 0.3  # world diameter of a layer without parameters (layers are >= 1 apart)
PER_DECADE = 0.09  # diameter growth per factor 10 of parameters: 28M weights -> 0.97
NODE_GAP = 1.0  # z rise from one nested layer to the next, in traversal order
INDENT = 0.35  # y shift per nesting level, so a container's children stand out from it
CELL_GAP = 0.6  # free space between neighbouring cells
CLICK_SLOP_PX = 4  # a press and release closer than this is a click, not an orbit
PICK_MARGIN_PX = 3.0
FIT_MARGIN = 0.04  # fraction of the view left free around the network when framing it
FIT_STEPS = 20  # doublings, then halvings, of the camera distance when framing: 1e-6 of it
FIT_ROUNDS = 4  # centre the picture and fit the distance again: the extent's centre settles within a pixel

SAMPLE_LIMIT = 100_000  # weights a histogram looks at, however big the layer
HISTOGRAM_BINS = 64
REFRESH_MS = 33  # <= 30 Hz
# Passes a second whose statistics colour the points: Telemetry's rate, so both panels show the
# same passes (and a decoding model computes one pass's statistics for both)
DEFAULT_SAMPLE_HZ = LIVE_SAMPLE_HZ

VIEW_BACKGROUND = (18, 20, 26)  # dark in both themes, as the plots' canvases
LABEL_COLOUR = (200, 205, 215)  # block numbers on that background (contrast ~12:1)
VIEW_MIN_WIDTH = 240
INSPECTOR_MIN_WIDTH = 260  # the inspector's longest lines ("Last stats") wrap, never clip
HISTOGRAM_MIN_HEIGHT = 140


def type_colour(type_name: str) -> Colour:
    return TYPE_COLOURS.get(type_name, UNKNOWN_COLOUR)


def point_size(parameters: int) -> float:
    """Point diameter in world units: logarithmic in the parameter count, so a 28M-weight
    embedding and a 576-weight norm both stay readable. World units (not pixels) keep points
    from swallowing each other in a big network and let them grow as the user zooms in."""
    return MIN_POINT + PER_DECADE * math.log10(1 + max(parameters, 0))


# ----- geometry --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pitch:
    """World distance between neighbouring layers along each grid axis."""

    x: float
    y: float
    z: float
    l: float = 1.0  # noqa: E741 - Loom's name for the layer-in-cell coordinate

    def place(self, coord: tuple[int, int, int, int]) -> np.ndarray:
        """World position of grid coordinate ``(z, y, x, l)``: layers of a cell follow each other
        along x, like the cells themselves."""
        z, y, x, l = coord  # noqa: E741
        return np.array([x * self.x + l * self.l, y * self.y, z * self.z], dtype=np.float32)


@dataclass
class Topology:
    """What the 3-D view draws: one point per blueprint row, in traversal order."""

    rows: list[BlueprintRow]
    layers: list[Layer]
    parents: list[int]  # index of the enclosing container's point, -1 for a grid cell
    positions: np.ndarray  # [N, 3]
    sizes: np.ndarray  # [N] world diameters
    colours: np.ndarray  # [N, 4] by type
    pitch: Pitch
    flow: np.ndarray  # [M, 3] grid cells in traversal order
    links: np.ndarray  # [L, 2, 3] remote link -> target cell
    keys: dict[tuple, int] = field(default_factory=dict)  # (z, y, x, l, path) -> point

    def index_of(self, layer: Layer) -> int | None:
        for i, candidate in enumerate(self.layers):
            if candidate is layer:
                return i
        return None

    def tree_edges(self) -> np.ndarray:
        """``[K, 3]`` pairs of points: each nested child and its container."""
        pairs = [(self.positions[p], self.positions[i]) for i, p in enumerate(self.parents) if p >= 0]
        return np.asarray(pairs, dtype=np.float32).reshape(-1, 3)


def _walk(layer: Layer, parent: int, depth: int, out: list) -> None:
    """Preorder (the blueprint's order): (layer, parent point, depth)."""
    me = len(out)
    out.append((layer, parent, depth))
    for child in layer.children:
        _walk(child, me, depth + 1, out)


def build_topology(net: VolumetricNetwork) -> Topology:
    """Lay out every layer of ``net`` and collect its lines.

    A grid layer sits at its ``(z, y, x, l)`` place; what it nests rises above it as an outline:
    one step up per layer in traversal order, indented along y by nesting depth. Every transformer
    block of a language model thus becomes a column with its attention and MLP at the same heights.
    """
    rows = net.blueprint()
    trees = []
    for _, top in net.layers():
        nodes: list = []
        _walk(top, -1, 0, nodes)
        trees.append(nodes)
    tallest = max((len(t) for t in trees), default=1)
    deepest = max((d for t in trees for _, _, d in t), default=0)
    pitch = Pitch(x=net.layers_per_cell + CELL_GAP, y=max(1.0, deepest * INDENT + CELL_GAP),
                  z=tallest * NODE_GAP + 1.0)  # a full free step above the tallest column
    layers, parents, positions = [], [], []
    cell_rows = iter(rows)
    for nodes in trees:
        base = len(layers)
        for k, (layer, parent, depth) in enumerate(nodes):
            row = next(cell_rows)
            layers.append(layer)
            parents.append(parent + base if parent >= 0 else -1)
            cell = pitch.place((row.z, row.y, row.x, row.l))
            positions.append(cell + np.float32([0, depth * INDENT, k * NODE_GAP]))
    positions = np.asarray(positions, dtype=np.float32).reshape(-1, 3)
    return Topology(
        rows=rows, layers=layers, parents=parents, positions=positions,
        sizes=np.array([point_size(r.parameters) for r in rows], dtype=np.float32),
        colours=np.array([type_colour(r.type) for r in rows], dtype=np.float32).reshape(-1, 4),
        pitch=pitch,
        flow=np.array([positions[i] for i, r in enumerate(rows) if not r.path and not r.disabled],
                      dtype=np.float32).reshape(-1, 3),
        links=_link_segments(net, rows, positions, pitch),
        keys={(r.z, r.y, r.x, r.l, r.path): i for i, r in enumerate(rows)},
    )


def _arrow_segments(start: np.ndarray, end: np.ndarray, lift: float) -> np.ndarray:
    """``[2K, 3]`` line pairs of an arrow from ``start`` to ``end``: up to a point between them
    ``lift`` above the higher end, down to ``end``, and a head of two short strokes there."""
    top = (start + end) / 2
    top[2] = max(start[2], end[2]) + lift
    back = top - end
    back = back / max(float(np.linalg.norm(back)), 1e-6) * ARROW_HEAD
    side = np.float32([0, ARROW_HEAD * 0.6, 0])
    return np.asarray([start, top, top, end, end, end + back + side, end, end + back - side], np.float32)


def _link_segments(net: VolumetricNetwork, rows: list[BlueprintRow], positions: np.ndarray,
                   pitch: Pitch) -> np.ndarray:
    segments = [(positions[i], pitch.place(r.remote_target)) for i, r in enumerate(rows)
                if r.remote_target is not None and net.layer_at(r.remote_target) is not None]
    return np.asarray(segments, dtype=np.float32).reshape(-1, 2, 3)


# ----- weights and activity --------------------------------------------------------------------
def sample_weights(layer: Layer, limit: int = SAMPLE_LIMIT, seed: int = 0) -> np.ndarray:
    """Up to ``limit`` of the layer's master weights, as float32 (see ``WeightStore.sample``: a
    language model's store samples its file's rows without dequantizing a whole table)."""
    if layer.weights is None:
        return np.empty(0, np.float32)
    return np.asarray(layer.weights.sample(limit, np.random.default_rng(seed)), dtype=np.float32)


@dataclass(frozen=True)
class Histogram:
    counts: np.ndarray
    edges: np.ndarray
    sampled: int  # weights looked at
    total: int  # weights the layer has


def weight_histogram(layer: Layer, limit: int = SAMPLE_LIMIT, bins: int = HISTOGRAM_BINS) -> Histogram:
    sample = sample_weights(layer, limit)
    finite = sample[np.isfinite(sample)]
    counts, edges = np.histogram(finite, bins=bins) if finite.size else (np.zeros(0, int), np.zeros(0))
    total = len(layer.weights) if layer.weights is not None else 0
    return Histogram(counts, edges, int(finite.size), total)


def activity(stats: LayerStats, metric: str) -> float:
    """One number per layer for colouring: ``rms`` (root mean square of the output, from its mean
    and std) or ``active`` (fraction of outputs away from zero)."""
    if metric == "active":
        return stats.active / stats.total if stats.total else 0.0
    return math.sqrt(stats.avg * stats.avg + stats.std * stats.std)


def activity_colours(values: dict[int, float], metric: str, n: int) -> np.ndarray:
    """Colours of ``n`` points: those with a value on the colormap, the others idle grey. RMS
    spans orders of magnitude between layers, so it is compared on a log scale."""
    colours = np.tile(np.float32(IDLE_COLOUR), (n, 1))
    if not values:
        return colours
    idx = np.fromiter(values, dtype=np.int64)
    v = np.fromiter(values.values(), dtype=np.float64)
    if metric == "rms":
        v = np.log10(v + 1e-12)
        lo, hi = v.min(), v.max()
        v = (v - lo) / (hi - lo) if hi > lo else np.full_like(v, 0.5)
    cmap = pg.colormap.get(ACTIVITY_COLORMAP)
    colours[idx] = cmap.map(np.clip(v, 0, 1), mode=pg.ColorMap.FLOAT)
    return colours


# ----- widgets ---------------------------------------------------------------------------------
class _ProgramPerView:
    """pyqtgraph caches each item class's shader program once for the whole process, but a program
    belongs to the GL context that compiled it, and every GLViewWidget (or a dock floated into its
    own window) has its own context: drawing in a second one fails (pyqtgraph #1822, #3455).
    These items keep their program in their :class:`PickingView`, which forgets it whenever it
    gets a new context; pyqtgraph's own cache is left as it was, for other views' plain items."""

    _base: ClassVar[type]
    _data_keys: ClassVar[tuple[str, ...]]  # what setData takes again to re-upload everything

    def getShaderProgram(self):
        cache = self.view().shader_programs
        program = cache.get(self._base)
        if program is None:
            saved, self._base._shaderProgram = self._base._shaderProgram, None
            try:
                program = cache[self._base] = self._base.getShaderProgram()
            finally:
                self._base._shaderProgram = saved
        return program


    def renew_buffers(self) -> None:
        """For a new GL context: the old context's vertex buffers went with it, and the item
        would bind their dead names (GL_INVALID_OPERATION). Make new ones and upload the data again."""
        for name, value in list(vars(self).items()):
            if isinstance(value, QOpenGLBuffer):
                setattr(self, name, QOpenGLBuffer(value.type()))
        if self.pos is not None:
            self.setData(**{key: getattr(self, key) for key in self._data_keys})


class ScatterItem(_ProgramPerView, gl.GLScatterPlotItem):
    _base = gl.GLScatterPlotItem
    _data_keys = ("pos", "color", "size")


class LineItem(_ProgramPerView, gl.GLLinePlotItem):
    _base = gl.GLLinePlotItem
    _data_keys = ("pos", "color")


def floor_grid(lo: np.ndarray, hi: np.ndarray, pitch: Pitch) -> np.ndarray:
    """Line segments ``[K, 3]`` of a floor under the network, one line per grid column and row."""
    z = float(lo[2]) - 0.5
    x0, x1, y0, y1 = lo[0] - pitch.x / 2, hi[0] + pitch.x / 2, lo[1] - pitch.y / 2, hi[1] + pitch.y / 2
    xs = np.arange(x0, x1 + 1e-6, pitch.x)
    ys = np.arange(y0, y1 + 1e-6, pitch.y)
    segments = [((x, y0, z), (x, ys[-1], z)) for x in xs] + [((x0, y, z), (xs[-1], y, z)) for y in ys]
    return np.asarray(segments, dtype=np.float32).reshape(-1, 3)


class PickingView(GLViewMixin, QOpenGLWindow):
    """pyqtgraph's 3-D view in a window of its own (``container`` is the widget that holds it),
    telling a click (press and release in place) from an orbit drag.

    A window, not pyqtgraph's ``GLViewWidget`` (a QOpenGLWidget): one QOpenGLWidget in a
    top-level window makes Qt compose every repaint of that window through OpenGL, which a
    software renderer (llvmpipe: Xvfb, VMs, remote desktops) does on the CPU. Each streamed chat
    token then cost both cores ~30 ms of compositing and the chat decoded at half the engine's
    speed (tests/bench/bench_gui_chat.py). A native child window is drawn on its own.
    """

    clicked = Signal(float, float)
    hovered = Signal(float, float)  # the pointer moved over the view with no button held
    resized = Signal()
    steered = Signal()  # the user turned or zoomed the camera (a drag or the wheel)

    def __init__(self):
        super().__init__()  # a QWindow delivers moves without a button too, for hover tooltips
        self.container = QWidget.createWindowContainer(self)
        self.container.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self._press: QPointF | None = None
        self._tooltip = ""
        self.shader_programs: dict[type, object] = {}  # item class -> program in this view's context

    def devicePixelRatioF(self) -> float:  # noqa: N802 - the QWidget name GLViewMixin calls
        return self.devicePixelRatio()

    def paintGL(self, *args, **kwargs) -> None:  # noqa: N802 - Qt's name
        if self.width() < 1 or self.height() < 1:
            return  # not laid out yet (pyqtgraph's projection divides by the size)
        super().paintGL(*args, **kwargs)

    def grabFramebuffer(self) -> QImage:  # noqa: N802 - Qt's name
        """The view as it looks now. A QOpenGLWindow's own grab reads whatever frame it last
        drew (a QOpenGLWidget's draws one): draw the scene first, then read it back."""
        if not self.isValid():
            return QImage()
        self.makeCurrent()
        self.paintGL()
        return super().grabFramebuffer()

    def toolTip(self) -> str:  # noqa: N802 - as QWidget names it
        return self._tooltip

    def setToolTip(self, text: str) -> None:  # noqa: N802
        self._tooltip = text
        self.container.setToolTip(text)

    def initializeGL(self):
        self.shader_programs = {}  # a new context: programs of the old one are gone with it
        for item in self.items:
            if isinstance(item, _ProgramPerView):
                item.renew_buffers()
        super().initializeGL()

    def mousePressEvent(self, ev):
        self._press = ev.position() if ev.button() == Qt.MouseButton.LeftButton else None
        super().mousePressEvent(ev)

    def mouseMoveEvent(self, ev):
        if ev.buttons() == Qt.MouseButton.NoButton:
            self.hovered.emit(ev.position().x(), ev.position().y())
        else:
            self.steered.emit()
        super().mouseMoveEvent(ev)

    def wheelEvent(self, ev):  # noqa: N802 - Qt's name
        self.steered.emit()
        super().wheelEvent(ev)

    def resizeEvent(self, ev):  # noqa: N802 - Qt's name
        super().resizeEvent(ev)
        self.resized.emit()

    def mouseReleaseEvent(self, ev):
        press, self._press = self._press, None
        if press is not None and ev.button() == Qt.MouseButton.LeftButton:
            if (ev.position() - press).manhattanLength() <= CLICK_SLOP_PX:
                self.clicked.emit(ev.position().x(), ev.position().y())
        super().mouseReleaseEvent(ev)

    def release(self) -> None:
        """Free the items' GL buffers now, on the GUI thread with this view's context current, and
        break the view <-> item reference cycles. Left to the garbage collector, they could be
        freed on whatever thread it happens to run in (a model's worker), which crashes in GL."""
        if self.isValid():
            self.makeCurrent()
            for item in self.items:
                for value in vars(item).values():
                    if isinstance(value, QOpenGLBuffer):
                        value.destroy()
            self.doneCurrent()
        self.clear()

    def world_to_screen(self) -> QMatrix4x4:
        """The matrix taking world points to clip space, as paint uses it."""
        viewport = self.getViewport()
        return self.projectionMatrix(viewport, viewport) * self.viewMatrix()

    def project(self, points: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Widget pixel coordinates ``[N, 2]``, depth ``[N]`` and in-front mask of world points."""
        m = np.array(self.world_to_screen().data(), dtype=np.float64).reshape(4, 4).T  # column-major
        homo = np.c_[np.asarray(points, dtype=np.float64).reshape(-1, 3), np.ones(len(points))]
        clip = homo @ m.T
        w = clip[:, 3]
        front = w > 1e-9
        ndc = clip[:, :3] / np.where(front, w, 1.0)[:, None]
        xy = np.c_[(ndc[:, 0] + 1) * 0.5 * self.width(), (1 - ndc[:, 1]) * 0.5 * self.height()]
        return xy, ndc[:, 2], front


def encoding_text(layer: Layer, name: LayerName) -> str:
    """The layer's weight encoding as forward reads it: one type when every part shares it, else
    each part's. A language model's layer shows the parts its file holds, by tensor stem
    (``attn_v Q6_K``); the zero biases its builder added for absent ones are no encoding of the file."""
    if layer.weights is None:
        return layer.cfg.dtype
    encodings = layer.weights.encodings(layer.cfg.dtype)
    if name.tensors:
        tensors = name.tensors
        encodings = {_stem(tensors[part]): kind for part, kind in encodings.items() if part in tensors}
    kinds = set(encodings.values())
    if len(kinds) == 1:
        return kinds.pop()
    return ", ".join(f"{part} {kind}" for part, kind in encodings.items())


def _stem(tensor: str) -> str:
    """``attn_q`` of ``blk.9.attn_q.weight``."""
    return tensor.rsplit(".", 2)[-2]


# The activation a layer type applies to its output: the configured one, or a rule of the type.
# A type missing here applies none (attention, norms, containers, softmax, recurrent cells):
# its configured activation is a dead field, so the inspector hides the row.
ACTIVATION_SHOWN = {
    **dict.fromkeys(("Dense", "CNN1", "CNN2", "CNN3", "ConvTransposed1D", "ConvTransposed2D",
                     "ConvTransposed3D", "Embedding", "KMeans"), lambda layer: layer.cfg.activation),
    # Loom's SwiGLU gate is always SiLU; a language model's gated MLP uses its configured gate
    "SwiGLU": lambda layer: f"{layer.cfg.activation if isinstance(layer, LLMGatedMLP) else 'Silu'} (gate)",
}


def experts_text(layer: Layer) -> str:
    """A mixture of experts' experts, how many each token goes to, and the tokens routed to each
    so far (its experts are drawn above it, one point each); "" for any other layer."""
    if not isinstance(layer, LLMMixtureOfExperts):
        return ""
    return (f"{layer.n_experts}, {layer.k} per token; tokens routed so far: "
            f"{' · '.join(f'{n:,}' for n in layer.load.tolist())}")


def activation_text(layer: Layer) -> str | None:
    shown = ACTIVATION_SHOWN.get(layer.type_name)
    return None if shown is None else shown(layer)


class TextLabels(GLGraphicsItem):
    """Short texts centred on world points, all drawn by one QPainter a frame (a ``GLTextItem``
    each would open and close a painter on the GL widget per label, every frame)."""

    def __init__(self, colour: QColor):
        super().__init__()
        self.setGLOptions("additive")
        self.colour = colour
        self.points = np.zeros((0, 3), np.float32)
        self.texts: list[str] = []
        self.drawn: list[QRectF] = []  # widget boxes of the labels the last frame drew

    def set_labels(self, points: np.ndarray, texts: list[str]) -> None:
        self.points = np.asarray(points, np.float32).reshape(-1, 3)
        self.texts = list(texts)
        self.update()

    def paint(self):
        if not self.texts:
            return
        self.setupGLState()
        view = self.view()
        xy, _, front = view.project(self.points)
        painter = QPainter(view)
        painter.setPen(self.colour)
        painter.setRenderHints(QPainter.RenderHint.Antialiasing | QPainter.RenderHint.TextAntialiasing)
        metrics = painter.fontMetrics()
        self.drawn = []
        for (x, y), shown, text in zip(xy, front, self.texts, strict=True):
            box = QRectF(metrics.boundingRect(text)).translated(-metrics.horizontalAdvance(text) / 2,
                                                                 metrics.ascent() / 2)
            box.translate(x, y)
            # a label that would run into one already drawn is left out: from far away every
            # few blocks are numbered, zoomed in all of them
            if shown and not any(box.adjusted(-2, 0, 2, 0).intersects(other) for other in self.drawn):
                painter.drawText(QPointF(box.left(), y + metrics.ascent() / 2), text)
                self.drawn.append(box)
        painter.end()


class LayerInspector(QWidget):
    """The selected layer: its name, place, type, encoding, activation, shapes, parameters, the
    latest forward stats and a weight histogram. Everything is read from the layer itself when
    shown, so a morph since the network was opened shows (see :meth:`TopologyPanel.refresh`)."""

    FIELDS = ("Layer", "Cell", "Type", "DType", "Activation", "Experts", "Input shape", "Output shape",
              "Parameters", "Last stats")

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.form = QFormLayout()
        self.form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        self.fields: dict[str, QLabel] = {}
        for name in self.FIELDS:
            label = QLabel("—")
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            label.setWordWrap(True)
            self.fields[name] = label
            self.form.addRow(name, label)
        self.plot = pg.PlotWidget()
        self.plot.setLabel("bottom", "weight")
        self.plot.setLabel("left", "count")
        self.plot.setMinimumHeight(HISTOGRAM_MIN_HEIGHT)
        self.curve = self.plot.plot(stepMode="center", fillLevel=0, brush=(90, 150, 255, 120),
                                    pen=pg.mkPen((120, 170, 255), width=1))
        self.plot_title = QLabel("click a layer to inspect it")
        self.plot_title.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addLayout(self.form)
        layout.addWidget(self.plot_title)
        layout.addWidget(self.plot, 1)
        self.histogram: Histogram | None = None

    def show_layer(self, layer: Layer | None, row: BlueprintRow | None, name: LayerName | None,
                   total_parameters: int) -> None:
        self.form.setRowVisible(self.fields["Activation"], True)
        self.form.setRowVisible(self.fields["Experts"], isinstance(layer, LLMMixtureOfExperts))
        if layer is None or row is None or name is None:
            for label in self.fields.values():
                label.setText("—")
            self.plot_title.setText("click a layer to inspect it")
            self.show_histogram(None)
            return
        ins, outs = layer.describe_shapes()
        params = f"{row.parameters:,}"
        if total_parameters != row.parameters:
            params += f"  (with children: {total_parameters:,})"
        activation = activation_text(layer)
        for field_name, text in (
                ("Layer", name.label), ("Cell", _cell_text(row)), ("Type", row.type),
                ("DType", encoding_text(layer, name)), ("Activation", activation or ""),
                ("Experts", experts_text(layer)),
                ("Input shape", _shape(ins)), ("Output shape", _shape(outs)), ("Parameters", params),
                ("Last stats", "—")):
            self.fields[field_name].setText(text)
        self.form.setRowVisible(self.fields["Activation"], activation is not None)
        self.plot_title.setText("computing weight histogram…" if layer.weights is not None else "no weights")
        self.show_histogram(None)

    def show_histogram(self, hist: Histogram | None) -> None:
        self.histogram = hist
        if hist is None or not hist.counts.size:
            self.curve.clear()
            return
        self.curve.setData(hist.edges, hist.counts)
        scope = "all" if hist.sampled == hist.total else f"a sample of {hist.sampled:,} of"
        self.plot_title.setText(f"weight histogram: {scope} {hist.total:,} master weights")

    def show_stats(self, event: LayerEvent | None) -> None:
        if event is None:
            self.fields["Last stats"].setText("—")
            return
        s = event.stats
        self.fields["Last stats"].setText(
            f"avg {s.avg:.4g}  std {s.std:.4g}\nmin {s.min:.4g}  max {s.max:.4g}\n"
            f"active {s.active:,}/{s.total:,}  (step {event.step_count})")


def _cell_text(row: BlueprintRow) -> str:
    return f"({row.z}, {row.y}, {row.x}, {row.l})" + (f"  {row.path}" if row.path else "")


def _shape(dims: list[int]) -> str:
    return "×".join(str(d) for d in dims) if dims else "—"


class TopologyPanel(QWidget):
    """A network's layers in 3-D, coloured by type or live activity, with an inspector.

    Args:
        parent: the parent widget.
        runner: where weight histograms are computed; without one they are computed on the GUI
            thread (cheap: at most :data:`SAMPLE_LIMIT` weights are sampled).
        sample_hz: passes a second whose layer statistics the activity colours take (None:
            every pass); ``clock`` times them.

    ``set_network(net)`` shows a network and watches its layer events (detaching from the
    previous one); a click on a point selects a layer and emits :attr:`layer_selected` with its
    key ``(z, y, x, l, path)``; ``select_layer_key(key)`` selects one without emitting (for
    panels linked to this one); ``refresh()`` re-reads the selected layer (after a morph);
    ``shutdown()`` stops the timer, detaches, waits for a pending histogram job and frees the GL
    resources (call it when the panel goes).
    """

    layer_selected = Signal(object)  # the key (z, y, x, l, path) of a layer the user picked

    def __init__(self, parent: QWidget | None = None, runner: JobRunner | None = None, *,
                 sample_hz: float | None = DEFAULT_SAMPLE_HZ, clock=None):
        super().__init__(parent)
        self._runner = runner
        self._sample_hz = check_rate(sample_hz, "sample_hz")
        self._clock = clock
        self._net: VolumetricNetwork | None = None
        self.topology: Topology | None = None
        self.names: list[LayerName] = []  # per point: what people call the layer
        self._selected: int | None = None
        self._observer: CallbackObserver | None = None
        self._lock = threading.Lock()
        self._pending: dict[tuple, LayerEvent] = {}  # filled by worker threads
        self._last: dict[int, LayerEvent] = {}  # point -> latest forward event (GUI thread)
        self._hist_job: Job | None = None
        self._hist_request = 0
        self._fit_on_show = False
        self._framed = False  # the camera is as reset_camera left it: a resize frames again
        self._shown = True  # see set_shown
        self._timer = QTimer(self)
        self._timer.setInterval(REFRESH_MS)
        self._timer.timeout.connect(self._drain)
        self._build_ui()

    # ----- construction ------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.view = PickingView()
        self.view.setBackgroundColor(VIEW_BACKGROUND)
        self.view.clicked.connect(self._on_click)
        self.view.hovered.connect(self._on_hover)
        self.view.steered.connect(lambda: setattr(self, "_framed", False))
        self.view.resized.connect(lambda: self._framed and self.reset_camera())
        self.grid = LineItem(mode="lines", color=(1, 1, 1, 0.1), width=1.0, glOptions="translucent")
        self.flow_line = LineItem(mode="line_strip", color=(0.85, 0.85, 0.95, 0.45), width=1.5,
                                           antialias=True, glOptions="translucent")
        self.tree_lines = LineItem(mode="lines", color=(0.7, 0.7, 0.75, 0.35), width=1.0,
                                            antialias=True, glOptions="translucent")
        self.link_lines = LineItem(mode="lines", color=(1.0, 0.3, 0.8, 0.9), width=2.0,
                                            antialias=True, glOptions="translucent")
        self.scatter = ScatterItem(pxMode=False, glOptions="translucent")
        # logic shifts (the DNA panel's): arcs from a layer to where its best match sits in another net
        self.shift_lines = LineItem(mode="lines", color=SHIFT_COLOUR, width=2.5, antialias=True,
                                    glOptions="translucent")
        self.shift_arrows: list[tuple[np.ndarray, np.ndarray, float]] = []  # (from, to, overlap) drawn
        # additive: no depth test, so the selection cross shows through its own point
        self.marker = LineItem(mode="lines", color=(1, 1, 1, 1), width=2.0, glOptions="additive")
        self.block_labels = TextLabels(QColor(*LABEL_COLOUR))
        for item in (self.grid, self.flow_line, self.tree_lines, self.link_lines, self.scatter, self.marker,
                     self.block_labels, self.shift_lines):
            self.view.addItem(item)
        self._warm_up_shaders()

        self.colour_mode = QComboBox()
        self.colour_mode.addItem("Colour: layer type", "type")
        for key, text in ACTIVITY_METRICS.items():
            self.colour_mode.addItem(text, key)
        self.colour_mode.currentIndexChanged.connect(self._recolour)
        reset = QPushButton("Reset view")
        reset.clicked.connect(self.reset_camera)
        self.summary = QLabel("no network")
        self.summary.setWordWrap(True)
        bar = QHBoxLayout()
        bar.addWidget(self.colour_mode)
        bar.addWidget(reset)
        bar.addWidget(self.summary, 1)

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addLayout(bar)
        left_layout.addWidget(self.view.container, 1)

        self.inspector = LayerInspector()
        self.legend = QLabel()
        self.legend.setWordWrap(True)
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 0, 0, 0)
        right_layout.addWidget(self.inspector, 1)
        right_layout.addWidget(self.legend)
        # a short dock scrolls the inspector instead of squeezing its rows into each other
        self.inspector_area = QScrollArea()
        self.inspector_area.setWidgetResizable(True)
        self.inspector_area.setFrameShape(QFrame.Shape.NoFrame)
        self.inspector_area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.inspector_area.setWidget(right)

        splitter = QSplitter(Qt.Orientation.Horizontal)
        splitter.addWidget(left)
        splitter.addWidget(self.inspector_area)
        splitter.setStretchFactor(0, 2)
        splitter.setStretchFactor(1, 1)
        splitter.setCollapsible(0, False)
        splitter.setCollapsible(1, False)
        left.setMinimumWidth(VIEW_MIN_WIDTH)
        self.inspector_area.setMinimumWidth(INSPECTOR_MIN_WIDTH)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(splitter)

    def _warm_up_shaders(self) -> None:
        """Give every item an invisible shape (a zero-length segment, a zero-size point) until a
        network comes, so the empty view's first frame compiles their shaders. A software GL
        (llvmpipe) spends ~60 ms compiling them on an item's first draw; left to the frame that
        first shows a model, that froze the window just as the model finished loading."""
        nowhere = np.zeros((2, 3), np.float32)
        for item in (self.grid, self.flow_line, self.tree_lines, self.link_lines, self.marker,
                     self.shift_lines):
            item.setData(pos=nowhere)
        self.scatter.setData(pos=nowhere[:1], size=np.float32(0), color=(0, 0, 0, 0))

    # ----- the model ---------------------------------------------------------------------------
    @property
    def network(self) -> VolumetricNetwork | None:
        return self._net

    @property
    def selected_layer(self) -> Layer | None:
        if self._selected is None or self.topology is None:
            return None
        return self.topology.layers[self._selected]

    @property
    def selected_key(self) -> LayerKey | None:
        if self._selected is None or self.topology is None:
            return None
        r = self.topology.rows[self._selected]
        return (r.z, r.y, r.x, r.l, r.path)

    def set_network(self, net: VolumetricNetwork | None) -> None:
        """Show ``net`` (None clears the view) and colour it by the activity its passes report
        from now on; the previous network is let go (its observer detached)."""
        self._detach_observer()
        self._net = net
        self._selected = None
        self._last.clear()
        self._hist_request += 1  # a histogram still being computed is for the old network
        self.topology = build_topology(net) if net is not None else None
        self.show_logic_shifts([])  # another network's shifts mean nothing here
        rows = self.topology.rows if self.topology is not None else []
        self.names = [layer_name(net, (r.z, r.y, r.x, r.l, r.path)) for r in rows]
        self._draw()
        self.inspector.show_layer(None, None, None, 0)
        self.reset_camera()
        if self._on_screen():
            self._attach_observer()

    def show_logic_shifts(self, shifts) -> int:
        """Draw an arrow for each logic shift ``(source_pos, target_pos, overlap)`` (positions as
        ``"z,y,x,l"`` or tuples; :class:`~loomlab.core.evolve.genetics.dna.LogicShift` objects too): an arc
        over the grid from the source layer to the target. Positions this network lacks are
        skipped; ``[]`` clears them (as does :meth:`set_network`). Returns how many were drawn."""
        self.shift_arrows = []
        segments = []
        for shift in shifts:
            src, dst, overlap = (shift.source_pos, shift.target_pos, shift.overlap) \
                if hasattr(shift, "source_pos") else shift
            ends = [self._grid_point(pos) for pos in (src, dst)]
            if any(p is None for p in ends):
                continue
            self.shift_arrows.append((ends[0], ends[1], float(overlap)))
            segments.append(_arrow_segments(*ends, lift=0.5 * self.topology.pitch.z))
        points = np.concatenate(segments) if segments else np.zeros((0, 3), np.float32)
        self._set_lines(self.shift_lines, points)
        return len(self.shift_arrows)

    def _grid_point(self, pos) -> np.ndarray | None:
        if self.topology is None:
            return None
        try:
            coord = tuple(int(v) for v in (pos.split(",") if isinstance(pos, str) else pos))
        except (TypeError, ValueError):
            return None
        index = self.topology.keys.get((*coord, "")) if len(coord) == 4 else None
        return None if index is None else self.topology.positions[index]

    def set_shown(self, shown: bool) -> None:
        """Whether the panel is on screen: a dock behind another dock's tab is not, though Qt
        still calls it visible (the window reports its dock's ``visibilityChanged`` here). Off
        screen it does not watch the network, which then computes no statistics for it."""
        self._shown = shown
        if self._on_screen():
            self._attach_observer()
        else:
            self._detach_observer()

    def _on_screen(self) -> bool:
        return self._shown and self.isVisible()

    def _attach_observer(self) -> None:
        """Watch the network while the panel is on screen: colours show the latest sampled pass
        (passes in between cost the engine nothing), and a hidden panel costs it nothing at all
        (the statistics of a sampled pass were ~6% of a chat's decode speed)."""
        if self._observer is None and self._net is not None:
            self._observer = self._net.attach(CallbackObserver(self._on_event, max_rate_hz=self._sample_hz,
                                                               clock=self._clock))
            self._timer.start()

    def _detach_observer(self) -> None:
        self._timer.stop()
        if self._observer is not None and self._net is not None and self._observer in self._net.observers:
            self._net.detach(self._observer)
        self._observer = None
        with self._lock:
            self._pending.clear()

    def select_layer_key(self, key: LayerKey | None) -> None:
        """Select the layer at ``key`` = (z, y, x, l, path), or nothing for None or a key this
        network lacks, without emitting :attr:`layer_selected` (a linked panel's selection)."""
        index = None if key is None or self.topology is None else self.topology.keys.get(tuple(key))
        self._select_index(index, emit=False)

    def refresh(self) -> None:
        """Show the selected layer again as it is now (its encoding after a morph, say)."""
        index, self._selected = self._selected, None
        self._select_index(index, emit=False)

    def shutdown(self) -> None:
        """Stop the refresh timer, detach from the network, join a pending histogram job and free
        the 3-D view's GL resources. The panel is done afterwards (closing it calls this)."""
        self._detach_observer()
        self.view.release()
        job, self._hist_job = self._hist_job, None
        if job is not None:
            job.stop()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)

    # ----- drawing -----------------------------------------------------------------------------
    def _draw(self) -> None:
        topo = self.topology
        items = (self.grid, self.flow_line, self.tree_lines, self.link_lines, self.scatter)
        for item in items:
            item.setVisible(topo is not None and len(topo.rows) > 0)
        self.marker.setVisible(False)
        if topo is None or not topo.rows:
            self.block_labels.set_labels(np.zeros((0, 3), np.float32), [])
            self.summary.setText("no network")
            self.legend.setText("")
            return
        self.scatter.setData(pos=topo.positions, size=topo.sizes, color=self.point_colours())
        self._set_lines(self.flow_line, topo.flow)
        self._set_lines(self.tree_lines, topo.tree_edges())
        self._set_lines(self.link_lines, topo.links.reshape(-1, 3))
        lo, hi = topo.positions.min(axis=0), topo.positions.max(axis=0)
        self._set_lines(self.grid, floor_grid(lo, hi, topo.pitch))
        self._label_blocks(float(lo[2]))
        net = self._net
        self.summary.setText(f"{model_parts(net)} · grid {'×'.join(map(str, net.shape))} · "
                             f"{net.parameter_count():,} parameters")
        self._update_legend()

    def _label_blocks(self, floor_z: float) -> None:
        """A language model's block numbers on the floor in front of each block's column."""
        topo = self.topology
        cells = [i for i, (r, n) in enumerate(zip(topo.rows, self.names, strict=True))
                 if not r.path and n.block is not None]
        at = topo.positions[cells] - np.float32([0, topo.pitch.y * 0.45, 0])
        at[:, 2] = floor_z - 0.5
        self.block_labels.set_labels(at, [str(self.names[i].block) for i in cells])

    @staticmethod
    def _set_lines(item: LineItem, points: np.ndarray) -> None:
        item.setVisible(len(points) >= 2)
        if len(points) >= 2:
            item.setData(pos=points)

    def point_colours(self) -> np.ndarray:
        """The colours the scatter shows now: by type, or by the chosen activity metric."""
        topo = self.topology
        if topo is None:
            return np.zeros((0, 4), np.float32)
        metric = self.colour_mode.currentData()
        if metric == "type":
            return topo.colours
        return activity_colours({i: activity(e.stats, metric) for i, e in self._last.items()},
                                metric, len(topo.rows))

    def _recolour(self) -> None:
        if self.topology is not None and self.topology.rows:
            sizes = self.topology.sizes.copy()
            if self._selected is not None:
                sizes[self._selected] *= 1.5
            self.scatter.setData(color=self.point_colours(), size=sizes)
        self._update_legend()

    def _update_legend(self) -> None:
        if self.topology is None:
            return
        if self.colour_mode.currentData() != "type":
            self.legend.setText("Activity: dark = low, yellow = high; grey = not run yet.")
            return
        present = dict.fromkeys(r.type for r in self.topology.rows)
        swatches = []
        for name in present:
            r, g, b, _ = (int(c * 255) for c in type_colour(name))
            swatches.append(f"<span style='color:rgb({r},{g},{b})'>&#9679;</span>&nbsp;{name}")
        self.legend.setText("&nbsp;&nbsp; ".join(swatches) + "<br><span style='color:rgb(255,77,204)'>"
                            "&#8212;</span> remote link &nbsp; size: log(parameters)")

    def reset_camera(self) -> None:
        """Frame the whole network from a three-quarter view: the nearest camera distance at
        which every point (with its radius) lies inside the view, so the network fills it
        (to :data:`FIT_MARGIN`) along its wider side, whatever its size."""
        topo = self.topology
        if topo is None or not topo.rows:
            return
        lo, hi = topo.positions.min(axis=0), topo.positions.max(axis=0)
        far = max(float(np.linalg.norm(hi - lo)) * 0.5, 3.0)
        self.view.setCameraPosition(pos=QVector3D(*map(float, (lo + hi) / 2)), distance=far,
                                    elevation=28, azimuth=-75)
        if self.view.width() < 1 or self.view.height() < 1:  # not laid out yet: fit once shown
            self._fit_on_show = True
            return
        # in perspective the grid's centre is not its picture's: centre the picture, fit again
        for _ in range(FIT_ROUNDS):
            far = self._fit_distance(far)
            left, right, top, bottom = self._extent()
            self.view.pan(-((left + right) / 2 - self.view.width() / 2),
                          -((top + bottom) / 2 - self.view.height() / 2), 0, relative="view")
        self._fit_distance(far)
        self._fit_on_show = not self.isVisible()
        self._framed = True

    def _fit_distance(self, far: float) -> float:
        """Leave the camera at the nearest distance that frames every point; ``far`` is a guess."""
        near = 0.0
        for _ in range(FIT_STEPS):
            if self._frames_all(far):
                break
            near, far = far, far * 2
        for _ in range(FIT_STEPS):  # bisect between a distance that clips and one that frames
            mid = (near + far) / 2
            near, far = (near, mid) if self._frames_all(mid) else (mid, far)
        self.view.setCameraPosition(distance=far)
        return far

    def _extent(self) -> tuple[float, float, float, float]:
        """The points' discs' extent on screen in pixels: left, right, top, bottom."""
        topo = self.topology
        xy, _, _ = self.view.project(topo.positions)
        r = topo.sizes / 2 / self.view.pixelSize(topo.positions)
        return (float((xy[:, 0] - r).min()), float((xy[:, 0] + r).max()), float((xy[:, 1] - r).min()),
                float((xy[:, 1] + r).max()))

    def _frames_all(self, distance: float) -> bool:
        """Whether every point (with its radius) lies in front of the camera and inside the view,
        margins kept, with the camera at ``distance`` (where it is left)."""
        self.view.setCameraPosition(distance=distance)
        w, h = self.view.width(), self.view.height()
        if not self.view.project(self.topology.positions)[2].all():
            return False
        left, right, top, bottom = self._extent()
        return left >= FIT_MARGIN * w and right <= (1 - FIT_MARGIN) * w and top >= FIT_MARGIN * h \
            and bottom <= (1 - FIT_MARGIN) * h

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if self._shown:
            self._attach_observer()
        if self._fit_on_show:  # the view had no real size when the network arrived
            self.reset_camera()

    def hideEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().hideEvent(event)
        self._detach_observer()

    # ----- picking -----------------------------------------------------------------------------
    def pick(self, x: float, y: float) -> int | None:
        """The point drawn at widget pixel (x, y): of the points whose disc covers it, a layer
        with weights before a weightless one (a block's residual sits over its attention at a
        docked size), then the one nearest the camera."""
        topo = self.topology
        if topo is None or not topo.rows:
            return None
        xy, depth, front = self.view.project(topo.positions)
        dist = np.hypot(xy[:, 0] - x, xy[:, 1] - y)
        radius = topo.sizes / 2 / self.view.pixelSize(topo.positions)
        hit = front & (dist <= radius + PICK_MARGIN_PX)
        if not hit.any():
            return None
        candidates = np.flatnonzero(hit)
        weightless = np.array([topo.rows[i].parameters == 0 for i in candidates])
        return int(candidates[np.lexsort((depth[candidates], weightless))[0]])

    def tooltip_text(self, index: int) -> str:
        """What hovering over point ``index`` tells: its name, type and parameters."""
        row = self.topology.rows[index]
        return f"{self.names[index].label}\n{row.type} · {row.parameters:,} parameters"

    def _on_click(self, x: float, y: float) -> None:
        index = self.pick(x, y)
        if index is not None:
            self._select_index(index, emit=True)

    def _on_hover(self, x: float, y: float) -> None:
        index = self.pick(x, y)
        text = "" if index is None else self.tooltip_text(index)
        if text != self.view.toolTip():
            self.view.setToolTip(text)
            if text:
                where = self.view.mapToGlobal(QPoint(round(x), round(y)))
                QToolTip.showText(where, text, self.view.container)
            else:
                QToolTip.hideText()

    def _select_index(self, index: int | None, *, emit: bool) -> None:
        if index == self._selected:
            return  # no echo when another panel hands back the layer it got from us
        self._selected = index
        topo = self.topology
        if index is None or topo is None:
            self.marker.setVisible(False)
            self.inspector.show_layer(None, None, None, 0)
            self._recolour()
            return
        layer, row = topo.layers[index], topo.rows[index]
        subtree = sum(len(la.weights) for la in layer.walk() if la.weights is not None)
        self.inspector.show_layer(layer, row, self.names[index], subtree)
        self.inspector.show_stats(self._last.get(index))
        self._show_marker(topo.positions[index], float(topo.sizes[index]))
        self._recolour()
        self._request_histogram(layer)
        if emit:
            self.layer_selected.emit((row.z, row.y, row.x, row.l, row.path))

    def _show_marker(self, p: np.ndarray, size: float) -> None:
        arm = 1.2 * size
        ends = [p + s * arm * axis for axis in np.eye(3, dtype=np.float32) for s in (-1, 1)]
        self.marker.setData(pos=np.asarray(ends, dtype=np.float32))
        self.marker.setVisible(True)

    def _request_histogram(self, layer: Layer) -> None:
        self._hist_request += 1
        request = self._hist_request
        if layer.weights is None:
            return
        if self._runner is None:
            self._show_histogram(request, weight_histogram(layer))
            return
        self._hist_job = self._runner.start(
            lambda job: weight_histogram(layer), name="topology-histogram",
            on_success=lambda hist: self._show_histogram(request, hist),
            on_failure=lambda msg: self.inspector.plot_title.setText(f"histogram failed: {msg}"))

    def _show_histogram(self, request: int, hist: Histogram) -> None:
        if request == self._hist_request:  # else the selection moved on meanwhile
            self.inspector.show_histogram(hist)

    # ----- live activity -----------------------------------------------------------------------
    def _on_event(self, event: LayerEvent) -> None:
        """Observer callback, on the network's thread: buffer only, never touch Qt here."""
        if event.type == "forward":
            with self._lock:
                self._pending[(event.z, event.y, event.x, event.l, event.path)] = event

    def _drain(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
        if not pending or self.topology is None:
            return
        for key, event in pending.items():
            index = self.topology.keys.get(key)
            if index is not None:
                self._last[index] = event
        if self.colour_mode.currentData() != "type":
            # only the colours move between passes: sizes and legend change with the selection
            # and the mode (_recolour), and re-sending sizes re-uploads their buffer every tick
            self.scatter.setData(color=self.point_colours())
        if self._selected is not None and self._selected in self._last:
            self.inspector.show_stats(self._last[self._selected])
