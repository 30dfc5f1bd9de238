"""Live per-layer statistics of a running network: a layer x step heatmap, and the selected
layer's histogram and latest :class:`~loomlab.core.observe.LayerStats`.

The panel attaches a core :class:`~loomlab.core.observe.CallbackObserver` whose callback only
appends to a ring buffer: it runs on whatever thread drives the network (a chat or generation
worker), so it never touches Qt. The observer samples at most ``sample_hz`` passes a second (each
one whole: every layer, forward and backward); the passes in between cost the engine nothing,
which is what keeps a decoding LLM within a few percent of its speed (bench_telemetry.py).
A :class:`QTimer` on the GUI thread drains the buffer at most ``rate_hz`` times a second and
redraws once per tick, however many events arrived.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from loomlab.core.layer_names import LayerKey, layer_name
from loomlab.core.llm.model.moe_layer import LLMMixtureOfExperts
from loomlab.core.observe import LIVE_SAMPLE_HZ, CallbackObserver, LayerEvent, LayerStats, check_rate

STATISTICS = ("mean", "std", "max", "active fraction")  # the heatmap's planes, in this order
DIRECTIONS = ("forward", "backward")
MAX_RATE_HZ = 30.0
# Each refresh holds the GIL for a few ms (drain, pyqtgraph's redraw, mostly Python), and while it
# does the decoding thread cannot launch its next kernel: at 10 Hz that cost an LLM's decode a few
# percent, at 30 Hz several times more (bench_telemetry); in the window at 5 Hz the refreshes
# were 60% of the GUI thread's Python time during a chat reply (bench_gui_chat). Once a second,
# as system monitors refresh their graphs (htop, GNOME's), is live enough: the passes are still
# recorded at sample_hz, one column each, so nothing is lost between refreshes.
DEFAULT_RATE_HZ = 1.0
# Passes a second the heatmap records, one column each (128 columns: the last 64 s); the Topology
# panel samples at the same rate, so both show the same passes.
DEFAULT_SAMPLE_HZ = LIVE_SAMPLE_HZ
EMPTY_HINT = "No passes yet: run the network (a chat, Generate or Run) to see each layer's statistics here"
LEVEL_PERCENTILES = (1, 99)
HISTOGRAM_BINS = 20
LABELLED_ROWS = 40  # up to this many rows the heatmap's axis names every layer
LABELLED_BLOCKS = 10  # beyond that, a language model's blocks are named, at most this many
# Where the histogram's x axis is labelled, as fractions of its range: three labels never run
# into each other, however narrow the plot (pyqtgraph's own ticks did: five long numbers in 200 px)
HISTOGRAM_TICK_AT = (0.1, 0.5, 0.9)
# Docked at the bottom of a 1600x1000 window the panel gets about 1600x310: the three columns
# (heatmap, layer list, selected layer) keep these widths side by side, each the full height.
LIST_MIN_WIDTH = 220
DETAIL_MIN_WIDTH = 260
HEATMAP_MIN_WIDTH = 320


class EventBuffer:
    """A bounded FIFO of layer events, filled by the engine's thread, drained by the GUI thread.

    The observer's callback is the deque's own ``append``: the engine's thread pays for nothing
    but that. ``append`` and ``popleft`` are atomic, so no lock is needed; when the GUI falls
    behind, the oldest events are dropped rather than letting memory grow.
    """

    def __init__(self, capacity: int):
        self._items: deque[LayerEvent] = deque(maxlen=capacity)
        self.append = self._items.append

    def drain(self) -> list[LayerEvent]:
        items = self._items
        return [items.popleft() for _ in range(len(items))]


class StepHistory:
    """One direction's last ``steps`` steps of every layer: ``values[statistic, row, column]``,
    oldest column first, NaN where a layer did not report; plus each row's latest stats and the
    step they are of."""

    def __init__(self, rows: int, steps: int):
        self.values = np.full((len(STATISTICS), rows, steps), np.nan, np.float32)
        self.latest: list[LayerStats | None] = [None] * rows
        self.latest_step: list[int | None] = [None] * rows
        self.last_step: int | None = None

    def add(self, rows: list[int], steps: list[int], stats: list[LayerStats]) -> None:
        """Record samples (in arrival order): a change of step number opens a new column."""
        steps_a = np.asarray(steps)
        opens = np.empty(len(steps_a), bool)
        opens[0] = steps_a[0] != self.last_step
        opens[1:] = steps_a[1:] != steps_a[:-1]
        column_no = np.cumsum(opens)  # 0: continues the newest column
        self._shift(int(column_no[-1]))
        n = self.values.shape[2]
        cols = n - 1 - int(column_no[-1]) + column_no
        keep = cols >= 0  # a burst longer than the history keeps only its last steps
        self.values[:, np.asarray(rows)[keep], cols[keep]] = _planes(stats)[:, keep]
        for row, s, step in zip(rows, stats, steps, strict=True):
            self.latest[row] = s
            self.latest_step[row] = step
        self.last_step = steps[-1]

    def _shift(self, k: int) -> None:
        """Scroll the columns ``k`` steps left and blank the new ones."""
        if k == 0:
            return
        k = min(k, self.values.shape[2])
        self.values[:, :, :-k] = self.values[:, :, k:]
        self.values[:, :, -k:] = np.nan


def _planes(stats: list[LayerStats]) -> np.ndarray:
    """``[statistic, sample]``: each sample's mean, std, max and active fraction."""
    avg, std, top, active, total = np.array([(s.avg, s.std, s.max, s.active, s.total) for s in stats]).T
    fraction = np.divide(active, total, out=np.full_like(active, np.nan), where=total > 0)
    return np.stack([avg, std, top, fraction]).astype(np.float32)


class TelemetryPanel(QWidget):
    """Live telemetry of a :class:`~loomlab.core.VolumetricNetwork` (a small net or a CausalLM).

    Parameters
    ----------
    history:
        How many sampled passes (forward or backward) the heatmap shows, one column each.
    rate_hz:
        How often the view is refreshed (at most 30 times a second).
    capacity:
        How many events the buffer holds between refreshes before dropping the oldest.
    sample_hz:
        How many passes a second are recorded (None: every pass); ``clock`` times them.
    """

    layer_selected = Signal(object)  # the (z, y, x, l, path) of a layer the user picked

    def __init__(self, parent: QWidget | None = None, *, history: int = 128, rate_hz: float = DEFAULT_RATE_HZ,
                 capacity: int = 1 << 16, sample_hz: float | None = DEFAULT_SAMPLE_HZ, clock=None):
        super().__init__(parent)
        if not 0 < rate_hz <= MAX_RATE_HZ:
            raise ValueError(f"rate_hz must be in (0, {MAX_RATE_HZ:g}], got {rate_hz}")
        if history < 1 or capacity < 1:
            raise ValueError("history and capacity must be >= 1")
        check_rate(sample_hz, "sample_hz")  # here, not first when a network is set
        pg.setConfigOptions(imageAxisOrder="row-major")
        self._history_len = history
        self._capacity = capacity
        self._sample_hz = sample_hz
        self._clock = clock
        self._net = None
        self._observer: CallbackObserver | None = None
        self._buffer = EventBuffer(capacity)
        self._keys: list[LayerKey] = []
        self._rows: dict[LayerKey, int] = {}
        self._experts: dict[int, tuple[int, list[int], int]] = {}  # see _expert_rows
        self._histories = {d: StepHistory(0, history) for d in DIRECTIONS}
        self._selected: int | None = None
        self._levels: tuple[float, float] | None = None  # what the colour bar shows
        self._histogram_view: tuple | None = None  # ((x0, x1), y1) the histogram shows
        self._showing_none = False  # the selected-layer column shows "no layer selected"
        self._shown = True  # see set_shown
        self.timer = QTimer(self)  # the refresh clock: every redraw happens on its tick
        self.timer.setInterval(round(1000 / rate_hz))
        self.timer.timeout.connect(self._tick)
        self._build()

    # ----- public API ------------------------------------------------------------------------
    @property
    def network(self):
        return self._net

    def set_network(self, net) -> None:
        """Show ``net`` (or nothing, for None): detach from the previous one, attach to it."""
        self._detach()
        self._net = net
        blueprint = [] if net is None else net.blueprint()
        self._keys = [(r.z, r.y, r.x, r.l, r.path) for r in blueprint]
        self._rows = {k: i for i, k in enumerate(self._keys)}
        self._experts = _expert_rows(net, self._rows)
        self._histories = {d: StepHistory(len(self._keys), self._history_len) for d in DIRECTIONS}
        self._fill_layer_list(net, self._keys)
        self._selected = None
        self._watch()
        self._render()
        self._frame_heatmap()

    def set_shown(self, shown: bool) -> None:
        """Whether the panel is on screen (the window reports its dock's ``visibilityChanged``
        here: a dock behind another dock's tab is hidden, though Qt still calls it visible). Off
        screen it neither refreshes nor watches the network, which then computes no statistics
        for it; the heatmap resumes with the passes after it is shown again."""
        if shown != self._shown:
            self._shown = shown
            self._detach()
            self._watch()

    def _watch(self) -> None:
        """Attach to the network and refresh while there is one and the panel is shown."""
        if self._net is None or not self._shown:
            self.timer.stop()
            return
        # a fresh buffer per attachment: events of the old one still in flight land in the old one
        self._buffer = EventBuffer(self._capacity)
        self._observer = self._net.attach(CallbackObserver(self._buffer.append, max_rate_hz=self._sample_hz,
                                                           clock=self._clock))
        self.timer.start()

    def shutdown(self) -> None:
        """Stop refreshing and detach from the network (call before dropping the panel)."""
        self.timer.stop()
        self._detach()

    def select_layer_key(self, key: LayerKey | None) -> None:
        """Select the layer at ``key`` = (z, y, x, l, path), or nothing for None or a key this
        network lacks, without emitting :attr:`layer_selected` (a linked panel's selection)."""
        self._select_row(None if key is None else self._rows.get(tuple(key)), emit=False)

    def _select_row(self, row: int | None, *, emit: bool) -> None:
        """Show the histogram and stats of the layer in heatmap row ``row``; a user's pick
        (``emit``) tells linked panels, a linked panel's own selection is not echoed back."""
        if row == self._selected:
            return
        self._selected = row
        self.layer_list.blockSignals(True)
        self.layer_list.setCurrentRow(-1 if row is None else row)
        self.layer_list.blockSignals(False)
        self._show_selected()
        if row is not None and emit:
            self.layer_selected.emit(self._keys[row])

    @property
    def selected_key(self) -> LayerKey | None:
        """The selected layer's (z, y, x, l, path), as the topology panel's ``selected_key``."""
        return None if self._selected is None else self._keys[self._selected]

    def layer_keys(self) -> list[LayerKey]:
        """The heatmap's rows: every layer, nested children included, in traversal order."""
        return list(self._keys)

    def statistic(self) -> str:
        return self.statistic_box.currentText()

    def direction(self) -> str:
        return self.direction_box.currentText()

    def heatmap_values(self) -> np.ndarray:
        """What the heatmap shows: ``[layer, step]`` of the chosen statistic and direction."""
        return self._histories[self.direction()].values[STATISTICS.index(self.statistic())]

    def expert_load(self, key: LayerKey) -> np.ndarray | None:
        """Tokens routed to each expert of the mixture of experts at ``key`` (or holding the expert
        at ``key``) in its latest sampled forward pass: the rows of each expert's output (an
        expert no token chose did not run); None for any other layer."""
        found = self._experts.get(self._rows.get(tuple(key)))
        if found is None:
            return None
        moe, experts, width = found
        history = self._histories["forward"]
        step = history.latest_step[moe]
        ran = [step is not None and history.latest_step[e] == step for e in experts]
        return np.array([history.latest[e].total // width if r else 0
                         for e, r in zip(experts, ran, strict=True)], np.int64)

    def latest_stats(self, key: LayerKey, direction: str = "forward") -> LayerStats | None:
        row = self._rows.get(key)
        return None if row is None else self._histories[direction].latest[row]

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self.shutdown()
        super().closeEvent(event)

    # ----- building ----------------------------------------------------------------------------
    def _build(self) -> None:
        self.statistic_box = QComboBox()
        self.statistic_box.addItems(STATISTICS)
        self.direction_box = QComboBox()
        self.direction_box.addItems(list(DIRECTIONS))
        for box in (self.statistic_box, self.direction_box):
            box.currentIndexChanged.connect(lambda _: self._render())
        controls = QHBoxLayout()
        for text, box in (("Statistic", self.statistic_box), ("Direction", self.direction_box)):
            controls.addWidget(QLabel(text))
            controls.addWidget(box)
        controls.addStretch(1)

        self.heatmap = pg.PlotWidget()
        self.heatmap.setMinimumWidth(HEATMAP_MIN_WIDTH)
        self.image = pg.ImageItem(colorMap=pg.colormap.get("viridis"))
        self.heatmap.addItem(self.image)
        self.row_marker = pg.LinearRegionItem(orientation="horizontal", movable=False,
                                              brush=(255, 255, 255, 40), pen=pg.mkPen("w", width=1))
        self.row_marker.setVisible(False)
        self.heatmap.addItem(self.row_marker)
        plot = self.heatmap.getPlotItem()
        plot.invertY(True)  # first layer at the top, as in the list
        plot.setLabel("bottom", _columns_label(self._sample_hz))
        plot.setLabel("left", "layer")
        self.colorbar = pg.ColorBarItem(colorMap=pg.colormap.get("viridis"), interactive=False, width=12)
        self.colorbar.setImageItem(self.image, insert_in=plot)
        self.empty_hint = pg.TextItem(EMPTY_HINT, anchor=(0.5, 0.5))
        self.empty_hint.setTextWidth(HEATMAP_MIN_WIDTH)
        plot.addItem(self.empty_hint, ignoreBounds=True)
        self._empty: bool | None = None  # whether the hint shows instead of axes
        self._show_empty(True)
        self.heatmap.scene().sigMouseClicked.connect(self._heatmap_clicked)

        self.layer_list = QListWidget()
        self.layer_list.setMinimumWidth(LIST_MIN_WIDTH)
        self.layer_list.currentRowChanged.connect(lambda row: self._select_row(row if row >= 0 else None,
                                                                               emit=True))

        self.histogram = pg.PlotWidget()
        self.histogram.getAxis("bottom").enableAutoSIPrefix(False)  # the ticks print the values themselves
        self.histogram.setLabel("bottom", self.statistic())
        self.statistic_box.currentTextChanged.connect(lambda text: self.histogram.setLabel("bottom", text))
        self.histogram_curve = self.histogram.plot([0, 1], [0], stepMode="center", fillLevel=0,
                                                   brush=(80, 140, 220, 160))
        self.histogram_title = QLabel(f"last {self._history_len} sampled passes")
        self.layer_title = QLabel("no layer selected")
        self.layer_title.setWordWrap(True)
        self.stats_labels = {name: QLabel("–") for name in ("avg", "std", "min", "max", "active")}
        # two name/value pairs a row: five stats in three short rows beside each other
        stats = QGridLayout()
        for i, (name, label) in enumerate(self.stats_labels.items()):
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            row, col = divmod(i, 2)
            stats.addWidget(QLabel(name), row, 2 * col)
            stats.addWidget(label, row, 2 * col + 1)
        stats.setColumnStretch(1, 1)
        stats.setColumnStretch(3, 1)

        detail = QWidget()
        detail.setMinimumWidth(DETAIL_MIN_WIDTH)
        detail_layout = QVBoxLayout(detail)
        detail_layout.setContentsMargins(0, 0, 0, 0)
        detail_layout.addWidget(self.layer_title)
        detail_layout.addLayout(stats)
        detail_layout.addWidget(self.histogram_title)
        detail_layout.addWidget(self.histogram, 1)
        # a mixture of experts' load: shown while it or one of its experts is selected
        self.load_title = QLabel("tokens per expert (latest sampled pass)")
        self.load_plot = pg.PlotWidget()
        self.load_plot.setLabel("bottom", "expert")
        self.load_bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=(80, 140, 220, 200))
        self.load_plot.addItem(self.load_bars)
        for widget in (self.load_title, self.load_plot):
            widget.setVisible(False)
            detail_layout.addWidget(widget)
        splitter = QSplitter()
        for i, (part, stretch) in enumerate(((self.heatmap, 5), (self.layer_list, 2), (detail, 2))):
            splitter.addWidget(part)
            splitter.setStretchFactor(i, stretch)
            splitter.setCollapsible(i, False)
        layout = QVBoxLayout(self)
        layout.addLayout(controls)
        layout.addWidget(splitter, 1)

    def _fill_layer_list(self, net, keys: list[LayerKey]) -> None:
        names = [layer_name(net, key) for key in keys]
        labels = [f"{i} {name.label}" for i, name in enumerate(names)]
        self.layer_list.blockSignals(True)
        self.layer_list.clear()
        self.layer_list.addItems(labels)
        self.layer_list.blockSignals(False)
        axis = self.heatmap.getPlotItem().getAxis("left")
        if 0 < len(labels) <= LABELLED_ROWS:
            axis.setTicks([[(i + 0.5, label) for i, label in enumerate(labels)]])
            return
        # too many rows to name: a language model's blocks, at the row of each block's own cell,
        # called "block N" as every panel calls them (a few of them, evenly)
        blocks = [(i + 0.5, name.label) for i, (key, name) in enumerate(zip(keys, names, strict=True))
                  if not key[4] and name.block is not None]
        step = max(1, math.ceil(len(blocks) / LABELLED_BLOCKS))
        axis.setTicks([blocks[::step]] if blocks else None)

    # ----- updating ----------------------------------------------------------------------------
    def _tick(self) -> None:
        events = self._buffer.drain()
        if not events:
            return
        batches: dict[str, tuple[list, list, list]] = {d: ([], [], []) for d in DIRECTIONS}
        for e in events:
            row = self._rows.get((e.z, e.y, e.x, e.l, e.path))
            if row is not None:
                rows, steps, values = batches[e.type]
                rows.append(row)
                steps.append(e.step_count)
                values.append(e.stats)
        for direction, (rows, steps, values) in batches.items():
            if rows:
                self._histories[direction].add(rows, steps, values)
        self._render()

    def _render(self) -> None:
        values = self.heatmap_values()
        self._show_empty(not np.isfinite(values).any())
        self.colorbar.getAxis("left").setLabel(f"{self.statistic()} ({self.direction()})")
        if values.shape[0] == 0:
            self.image.clear()
        else:
            levels = _nice_range(*_percentile_range(values))
            self.image.setImage(values, levels=levels)
            if levels != self._levels:  # the bar's axis is redrawn only when its range moves
                self._levels = levels
                self.colorbar.setLevels(levels, update_items=False)  # the image has them already
        self._show_selected()

    def _show_empty(self, empty: bool) -> None:
        """With nothing recorded, a hint in place of the heatmap's axes and colour bar (which
        would number an empty range); the axes return with the first sampled pass."""
        if empty == self._empty:
            return
        self._empty = empty
        plot = self.heatmap.getPlotItem()
        for side in ("left", "bottom"):
            plot.showAxis(side, not empty)
        self.colorbar.setVisible(not empty)
        self.empty_hint.setVisible(empty)
        if empty:
            plot.getViewBox().setRange(QRectF(0, 0, 1, 1), padding=0)
            self.empty_hint.setPos(0.5, 0.5)
        else:
            self._frame_heatmap()

    def _frame_heatmap(self) -> None:
        """Place the image at steps -(history-1)..0 and rows 0..n, and fix the view on it: a view
        that does not follow the data spares redrawing the axes on every refresh."""
        rows, steps = self.heatmap_values().shape
        if rows and not self._empty:
            rect = QRectF(-steps + 0.5, 0, steps, rows)
            self.image.setRect(rect)
            self.heatmap.getPlotItem().getViewBox().setRange(rect, padding=0)

    def _show_selected(self) -> None:
        row = self._selected
        if row is None and self._showing_none:
            return  # already shown: re-setting texts and an empty curve every refresh repaints them
        self._showing_none = row is None
        self.row_marker.setVisible(row is not None)
        self._show_load(row)
        stats = None if row is None else self._histories[self.direction()].latest[row]
        texts = _stats_texts(stats)
        for name, label in self.stats_labels.items():
            label.setText(texts[name])
        if row is None:
            self.layer_title.setText("no layer selected")
            self.histogram_curve.setData([0, 1], [0])
            return
        self.row_marker.setRegion((row, row + 1))
        self.layer_title.setText(self.layer_list.item(row).text())
        recent = self.heatmap_values()[row]
        recent = recent[np.isfinite(recent)]
        span = _nice_range(float(recent.min()), float(recent.max())) if recent.size else (0.0, 1.0)
        counts, edges = np.histogram(recent, bins=HISTOGRAM_BINS, range=span)
        self.histogram_curve.setData(edges, counts)
        # the y range grows in powers of two, so the axes are redrawn only now and then
        view = (span, float(2 ** np.ceil(np.log2(max(counts.max(), 1)))))
        if view != self._histogram_view:
            self._histogram_view = view
            # 5% headroom keeps the top tick's label inside the plot
            self.histogram.setRange(xRange=span, yRange=(0, view[1] * 1.05), padding=0)
            # x inside the ends (pyqtgraph hides a label that would stick out of its axis); y at
            # whole counts up to the top, which the headroom keeps inside
            xs = span[0] + (span[1] - span[0]) * np.array(HISTOGRAM_TICK_AT)
            self.histogram.getAxis("bottom").setTicks([[(float(v), f"{v:.3g}") for v in xs]])
            ys = np.unique([0, view[1] // 2, view[1]])
            self.histogram.getAxis("left").setTicks([[(float(v), f"{v:g}") for v in ys]])

    def _show_load(self, row: int | None) -> None:
        load = None if row is None else self.expert_load(self._keys[row])
        for widget in (self.load_title, self.load_plot):
            widget.setVisible(load is not None)
        if load is not None:
            self.load_bars.setOpts(x=np.arange(len(load)), height=load)

    def _heatmap_clicked(self, event) -> None:
        pos = self.heatmap.getPlotItem().getViewBox().mapSceneToView(event.scenePos())
        row = int(np.floor(pos.y()))
        if 0 <= row < len(self._keys) and event.button() == Qt.MouseButton.LeftButton:
            self._select_row(row, emit=True)

    def _detach(self) -> None:
        if self._observer is not None and self._observer in self._net.observers:
            self._net.detach(self._observer)
        self._observer = None


def _expert_rows(net, rows: dict[LayerKey, int]) -> dict[int, tuple[int, list[int], int]]:
    """Each mixture of experts' row and each of its experts' rows -> (its row, its experts' rows,
    their output width)."""
    out = {}
    for layer in net.all_layers() if net is not None else ():
        if isinstance(layer, LLMMixtureOfExperts):
            found = (rows[(*layer.coords, layer.path)], [rows[(*c.coords, c.path)] for c in layer.children],
                     layer.cfg.output_height)
            out.update(dict.fromkeys([found[0], *found[1]], found))
    return out


def _columns_label(sample_hz: float | None) -> str:
    """The heatmap's x axis: its columns are the sampled passes (a reply's tokens are passes, but
    only some are sampled), newest at 0."""
    if sample_hz is None:
        return "pass (0 = latest; every pass)"
    return f"sampled pass (0 = latest; at most {sample_hz:g} a second)"


def _percentile_range(values: np.ndarray) -> tuple[float, float]:
    """The 1st-99th percentiles of the reported values, so that a few extreme cells (an LLM's
    prefill step) do not flatten the colours of the rest."""
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return 0.0, 1.0
    lo, hi = np.percentile(finite, LEVEL_PERCENTILES)
    return float(lo), float(hi)


def _nice_range(lo: float, hi: float) -> tuple[float, float]:
    """[lo, hi] widened to multiples of a round step (a fifth of the span's decade): a range that
    stays put while the data wobble keeps axes and colours steady (and cheap to draw)."""
    if not hi > lo:
        lo, hi = lo - 0.5, hi + 0.5
    step = 10.0 ** np.floor(np.log10(hi - lo)) / 5
    return float(np.floor(lo / step) * step), float(np.ceil(hi / step) * step)


def _stats_texts(stats: LayerStats | None) -> dict[str, str]:
    if stats is None:
        return dict.fromkeys(("avg", "std", "min", "max", "active"), "–")
    return {"avg": f"{stats.avg:.6g}", "std": f"{stats.std:.6g}", "min": f"{stats.min:.6g}",
            "max": f"{stats.max:.6g}", "active": f"{stats.active}/{stats.total}"}
