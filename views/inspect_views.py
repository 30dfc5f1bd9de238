"""The Inspect panel's views, each showing one result of :mod:`loomlab.core.inspect` as it is:
the token strip, attention patterns, the logit lens table, the attribution bars, the ablation
check grid with its continuations, and the patching heatmap. They compute nothing; the panel
(:mod:`.inspect_panel`) runs the inspections in jobs and hands the results here.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QComboBox,
    QFormLayout,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QStyle,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from loomlab.core.inspect import (
    MODES,
    PATCH_SITES,
    Ablation,
    AblationResult,
    Attribution,
    LogitLens,
    PatchGrid,
)

from .inspect_export import component_label
from .scrolling import scrolling

TokenName = Callable[[int], str]
PROBABILITY_TINT = QColor(70, 130, 230)  # a lens cell's background, stronger the likelier its token
CHANGED_TINT = "rgba(255, 140, 0, 110)"  # an ablated continuation's token that differs
SELECTED_BRUSH, BAR_BRUSH = pg.mkBrush(255, 170, 0, 230), pg.mkBrush(80, 140, 220, 200)
NEGATIVE_BRUSH = pg.mkBrush(220, 90, 80, 200)
TOP_BARS = 20  # the attribution chart's components, largest first
PLOT_MIN = (200, 150)
PATTERN_LEVELS = (0.0, 1.0)
# a diverging map centred on 0: a cell that restores the clean answer is one colour, one that
# pushes the other way the other, nothing restored is neutral
RESTORED_COLORMAP, RESTORED_LEVELS = "CET-D1", (-1.0, 1.0)


def shown_token(text: str) -> str:
    """A token's text as a chip or axis label shows it: spaces and line breaks made visible."""
    return text.replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥") or "∅"


# ----- the sequence ------------------------------------------------------------------------------
class TokenStrip(QScrollArea):
    """The sequence's tokens as a row of chips; clicking one selects its position."""

    position_chosen = Signal(int)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self._holder = QWidget()
        self._row = QHBoxLayout(self._holder)
        self._row.setContentsMargins(0, 0, 0, 0)
        self._row.setSpacing(2)
        self._row.addStretch(1)
        self.setWidget(self._holder)
        self._group = QButtonGroup(self)
        self._group.idClicked.connect(self.position_chosen)
        self.chips: list[QToolButton] = []
        bar = self.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, self)
        self.setFixedHeight(QToolButton().sizeHint().height() + bar + 4)

    def set_tokens(self, texts: Sequence[str]) -> None:
        for chip in self.chips:
            self._group.removeButton(chip)
            chip.deleteLater()
        self.chips = []
        for i, text in enumerate(texts):
            chip = QToolButton(text=shown_token(text), checkable=True)
            chip.setToolTip(f"position {i}: {text!r}")
            self._group.addButton(chip, i)
            self._row.insertWidget(i, chip)
            self.chips.append(chip)

    def select(self, position: int | None) -> None:
        """Show ``position`` selected (from code: nothing is announced)."""
        if position is not None and 0 <= position < len(self.chips):
            self.chips[position].setChecked(True)
            self.ensureWidgetVisible(self.chips[position])

    def selected(self) -> int | None:
        i = self._group.checkedId()
        return None if i < 0 else i


# ----- a heatmap -----------------------------------------------------------------------------------
class Heatmap(pg.PlotWidget):
    """An image of ``values[row, col]`` (row 0 at the top), named rows and columns, a colour bar;
    a left click announces the cell under it."""

    cell_clicked = Signal(int, int)  # row, column

    def __init__(self, title: str, colormap: str = "viridis", levels=PATTERN_LEVELS, parent=None):
        super().__init__(parent)
        self.setMinimumSize(*PLOT_MIN)
        self.image = pg.ImageItem(colorMap=pg.colormap.get(colormap))
        self.addItem(self.image)
        plot = self.getPlotItem()
        plot.invertY(True)
        plot.setTitle(title)
        plot.setMenuEnabled(False)
        self.levels = levels
        self.colorbar = pg.ColorBarItem(colorMap=pg.colormap.get(colormap), interactive=False, width=10,
                                        values=levels)
        self.colorbar.setImageItem(self.image, insert_in=plot)
        self.marker = pg.QtWidgets.QGraphicsRectItem()
        self.marker.setPen(pg.mkPen((255, 170, 0), width=2, cosmetic=True))
        self.marker.setVisible(False)
        self.addItem(self.marker)
        self._values = np.zeros((0, 0), np.float32)
        self._names: tuple[list[str], list[str]] = ([], [])
        self.scene().sigMouseClicked.connect(self._clicked)

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().resizeEvent(event)
        if "_names" in self.__dict__:  # pyqtgraph resizes once inside its own __init__
            self._apply_ticks()

    def _apply_ticks(self) -> None:
        """Name as many rows and columns as fit without running into each other."""
        rows, columns = self._names
        fm, plot = self.fontMetrics(), self.getPlotItem()
        view = plot.getViewBox().sceneBoundingRect()
        height, width = max(view.height(), 1.0), max(view.width(), 1.0)
        widest = max((fm.horizontalAdvance(c) for c in columns if c), default=0) + fm.averageCharWidth() * 2
        plot.getAxis("left").setTicks([_ticks(rows, height, fm.height() + 2)])
        plot.getAxis("bottom").setTicks([_ticks(columns, width, widest)])

    def values(self) -> np.ndarray:
        """What the image shows, ``[rows, columns]``."""
        return self._values

    def show_values(self, values: np.ndarray, rows: Sequence[str], columns: Sequence[str],
                    title: str | None = None, *, row_axis: str = "", column_axis: str = "") -> None:
        self._values = np.asarray(values, np.float32)
        plot = self.getPlotItem()
        if title is not None:
            plot.setTitle(title)
        h, w = self._values.shape
        self.image.setImage(self._values, levels=self.levels)
        self.image.setRect(QRectF(0, 0, w, h))
        plot.getViewBox().setRange(QRectF(0, 0, w, h), padding=0)
        self._names = (list(rows), list(columns))
        self._apply_ticks()
        plot.setLabel("left", row_axis)
        plot.setLabel("bottom", column_axis)

    def mark(self, row: int | None, col: int | None, rows: int = 1, cols: int = 1) -> None:
        """Outline ``rows`` x ``cols`` cells from (row, col), or nothing."""
        self.marker.setVisible(row is not None)
        if row is not None:
            self.marker.setRect(QRectF(col, row, cols, rows))

    def clear_values(self, title: str) -> None:
        self._values = np.zeros((0, 0), np.float32)
        self.image.clear()
        self.marker.setVisible(False)
        self.getPlotItem().setTitle(title)
        self._names = ([], [])
        self._apply_ticks()

    def _clicked(self, event) -> None:
        if event.button() != Qt.MouseButton.LeftButton or not self._values.size:
            return
        pos = self.getPlotItem().getViewBox().mapSceneToView(event.scenePos())
        row, col = int(np.floor(pos.y())), int(np.floor(pos.x()))
        if 0 <= row < self._values.shape[0] and 0 <= col < self._values.shape[1]:
            self.cell_clicked.emit(row, col)


def _ticks(names: Sequence[str], room: float, each: float) -> list[tuple[float, str]]:
    """The named rows (or columns) as ticks at their centres: every k-th, so that labels ``each``
    pixels long do not run into each other along ``room`` pixels."""
    named = [(i + 0.5, name) for i, name in enumerate(names) if name]
    if not named:
        return []
    per_cell = room / max(len(names), 1)
    gap = named[1][0] - named[0][0] if len(named) > 1 else 1.0  # cells between named neighbours
    return named[::max(1, int(np.ceil(each / (per_cell * gap))))]


def mosaic(thumbnails: np.ndarray) -> np.ndarray:
    """``[layers, heads, n, n]`` thumbnails as one image, layer by row and head by column, a NaN
    line between neighbours (drawn blank)."""
    L, H, n, _ = thumbnails.shape
    out = np.full((L * (n + 1) - 1, H * (n + 1) - 1), np.nan, np.float32)
    for i in range(L):
        for h in range(H):
            out[i * (n + 1):i * (n + 1) + n, h * (n + 1):h * (n + 1) + n] = thumbnails[i, h]
    return out


# ----- attention -----------------------------------------------------------------------------------
class AttentionView(QSplitter):
    """Every head's pattern as a thumbnail (layers by row, heads by column), the chosen head's
    full pattern with token labels, and how much each head attends to the selected position."""

    head_chosen = Signal(int, int)  # layer, head

    def __init__(self, parent: QWidget | None = None):
        super().__init__(Qt.Orientation.Horizontal, parent)
        self.thumbnails = Heatmap("layer × head patterns")
        self.pattern = Heatmap("head pattern")
        self.attending = Heatmap("heads attending to a position")
        for i, w in enumerate((self.thumbnails, self.pattern, self.attending)):
            self.addWidget(w)
            self.setCollapsible(i, False)
        self._n = 0
        self.thumbnails.cell_clicked.connect(self._thumbnail_clicked)
        self.attending.cell_clicked.connect(self.head_chosen)
        self.clear()

    def clear(self) -> None:
        self._n = 0
        self.thumbnails.clear_values("layer × head patterns")
        self.pattern.clear_values("head pattern (click a thumbnail)")
        self.attending.clear_values("heads attending to a position")

    def show_thumbnails(self, thumbnails: np.ndarray) -> None:
        L, H, n, _ = thumbnails.shape
        self._n = n
        rows = [""] * (L * (n + 1) - 1)
        for i in range(L):
            rows[i * (n + 1) + n // 2] = str(i)
        cols = [""] * (H * (n + 1) - 1)
        for h in range(H):
            cols[h * (n + 1) + n // 2] = str(h)
        self.thumbnails.show_values(mosaic(thumbnails), rows, cols, row_axis="layer",
                                    column_axis="head")

    def thumbnail(self, layer: int, head: int) -> np.ndarray:
        """The thumbnail the mosaic shows for ``layer`` and ``head``."""
        n, step = self._n, self._n + 1
        return self.thumbnails.values()[layer * step:layer * step + n, head * step:head * step + n]

    def show_pattern(self, weights: np.ndarray, layer: int, head: int, texts: Sequence[str]) -> None:
        labels = [f"{i} {shown_token(t)}" for i, t in enumerate(texts)]
        self.pattern.show_values(weights, labels, labels, f"layer {layer} head {head}",
                                 row_axis="query position", column_axis="key position")
        n = self._n
        self.thumbnails.mark(layer * (n + 1), head * (n + 1), n, n)
        self.attending.mark(layer, head)

    def show_attending(self, weights: np.ndarray, position: int, texts: Sequence[str]) -> None:
        L, H = weights.shape
        self.attending.show_values(weights, [str(i) for i in range(L)], [str(h) for h in range(H)],
                                   f"heads attending to position {position} {shown_token(texts[position])}",
                                   row_axis="layer", column_axis="head")

    def _thumbnail_clicked(self, row: int, col: int) -> None:
        n = self._n
        if n and row % (n + 1) < n and col % (n + 1) < n:
            self.head_chosen.emit(row // (n + 1), col // (n + 1))


# ----- the logit lens --------------------------------------------------------------------------------
class LensView(QTableWidget):
    """The logit lens: a row per layer (``embed``, ``block 0`` ...), a column per position; each
    cell the top token there, tinted by its probability; the tooltip the top k and the target."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 6)
        self.setMinimumSize(*PLOT_MIN)

    def show_lens(self, lens: LogitLens, texts: Sequence[str], name: TokenName, position: int | None) -> None:
        L1, T, k = lens.top_ids.shape
        self.clear()
        self.setRowCount(L1)
        self.setColumnCount(T)
        self.setVerticalHeaderLabels(lens.row_names)
        self.setHorizontalHeaderLabels([f"{t} {shown_token(texts[t])}" for t in range(T)])
        target = name(lens.target)
        for j in range(L1):
            for t in range(T):
                p = float(lens.top_probs[j, t, 0])
                item = QTableWidgetItem(shown_token(name(int(lens.top_ids[j, t, 0]))))
                item.setData(Qt.ItemDataRole.UserRole, p)
                tint = QColor(PROBABILITY_TINT)
                tint.setAlpha(int(140 * p))
                item.setBackground(QBrush(tint))
                top = "\n".join(f"  {name(int(i))!r}  {q:.3f}"
                                for i, q in zip(lens.top_ids[j, t], lens.top_probs[j, t], strict=True))
                item.setToolTip(f"{lens.row_names[j]}, position {t} {texts[t]!r}\ntop {k}:\n{top}\n"
                                f"target {target!r}: probability {lens.target_probs[j, t]:.4f}, "
                                f"rank {int(lens.target_ranks[j, t])}")
                self.setItem(j, t, item)
        self.mark_position(position)

    def mark_position(self, position: int | None) -> None:
        """The selected position's column header in bold (the target is predicted there)."""
        for t in range(self.columnCount()):
            header = self.horizontalHeaderItem(t)
            font = QFont(header.font())
            font.setBold(t == position)
            header.setFont(font)

    def cell(self, row: int, position: int) -> tuple[str, float]:
        """A cell's text and the probability it is tinted by."""
        item = self.item(row, position)
        return item.text(), float(item.data(Qt.ItemDataRole.UserRole))


# ----- attribution -------------------------------------------------------------------------------------
class AttributionView(pg.PlotWidget):
    """The components (heads, MLPs, biases, the embedding) with the largest shares of the target's
    logit, as horizontal bars, largest at the top; a click on a bar chooses its component."""

    component_chosen = Signal(str, int, object)  # kind, layer, head (None but for a head)

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.setMinimumSize(*PLOT_MIN)
        plot = self.getPlotItem()
        plot.invertY(True)
        plot.setMenuEnabled(False)
        plot.setLabel("bottom", "share of the target's logit")
        plot.getAxis("left").setWidth(self.fontMetrics().horizontalAdvance("L29 MLP") + 16)
        plot.addLine(x=0, pen=pg.mkPen((150, 150, 150), width=1))
        self.bars = pg.BarGraphItem(x0=[], y=[], height=0.8, width=[])
        self.addItem(self.bars)
        self.rows: list[tuple[str, int, int | None, float]] = []
        self._highlight: int | None = None
        self.scene().sigMouseClicked.connect(self._clicked)
        self.clear_bars()

    def clear_bars(self) -> None:
        self.rows = []
        self.bars.setOpts(x0=[], y=[], width=[], brushes=[])
        self.getPlotItem().setTitle("attribution of the target (computing when shown)")
        self.getPlotItem().getAxis("left").setTicks([[]])

    def show_attribution(self, attribution: Attribution, title: str) -> None:
        self.rows = attribution.components()[:TOP_BARS]
        shares = np.array([r[3] for r in self.rows], np.float64)
        self.bars.setOpts(x0=np.minimum(shares, 0.0), width=np.abs(shares), y=np.arange(len(shares)),
                          height=0.8)
        self._paint()
        plot = self.getPlotItem()
        plot.setTitle(title)
        plot.getAxis("left").setTicks([[(i, component_label(*r[:3])) for i, r in enumerate(self.rows)]])
        if len(shares):
            span = max(float(np.abs(shares).max()), 1e-6)
            plot.getViewBox().setRange(xRange=(min(0.0, shares.min()) - 0.05 * span,
                                               max(0.0, shares.max()) + 0.05 * span),
                                       yRange=(-0.6, len(shares) - 0.4), padding=0)

    def heights(self) -> list[tuple[str, float]]:
        """Each bar's component and its signed length, top to bottom."""
        x0, width = self.bars.opts["x0"], self.bars.opts["width"]
        return [(component_label(*r[:3]), float(w if x >= 0 else -w))
                for r, x, w in zip(self.rows, x0, width, strict=True)]

    def highlight_layer(self, layer: int | None) -> None:
        """Bars of ``layer`` (a block) drawn in the selection colour."""
        self._highlight = layer
        self._paint()

    def _paint(self) -> None:
        brushes = [SELECTED_BRUSH if r[1] == self._highlight and r[0] != "embed"
                   else BAR_BRUSH if r[3] >= 0 else NEGATIVE_BRUSH for r in self.rows]
        self.bars.setOpts(brushes=brushes)

    def _clicked(self, event) -> None:
        if event.button() != Qt.MouseButton.LeftButton or not self.rows:
            return
        pos = self.getPlotItem().getViewBox().mapSceneToView(event.scenePos())
        i = int(round(pos.y()))
        if 0 <= i < len(self.rows) and abs(pos.y() - i) <= 0.4:
            self.choose(i)

    def choose(self, i: int) -> None:
        """Choose bar ``i`` (from the top), as a click on it does."""
        kind, layer, head, _ = self.rows[i]
        self.component_chosen.emit(kind, layer, head)


# ----- ablation ------------------------------------------------------------------------------------
class AblationView(QSplitter):
    """Tick heads (a layer x head grid) or a layer's attention, MLP or whole block, choose how
    they are switched off, Rerun: the greedy continuation before and after, changes marked."""

    rerun_requested = Signal()
    HALVES = ("attention", "mlp", "block")

    def __init__(self, parent: QWidget | None = None):
        super().__init__(Qt.Orientation.Horizontal, parent)
        self.grid = QTableWidget()
        self.grid.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.grid.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.grid.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 6)
        self.grid.setMinimumSize(*PLOT_MIN)
        self.grid.setToolTip("Tick the heads, attention halves, MLP halves or whole blocks to switch off")
        self.mode_box = QComboBox()
        self.mode_box.addItems(list(MODES))
        self.mode_box.setToolTip("zero: replace by 0; mean: by its mean over the prompt's positions; "
                                 "disable: skip the block (Loom's is_disabled; blocks only)")
        self.new_tokens = QSpinBox(minimum=0, maximum=64, value=8)
        self.rerun_button = QPushButton("Rerun")
        self.rerun_button.clicked.connect(self.rerun_requested)
        self.clear_button = QPushButton("Clear ticks")
        self.clear_button.clicked.connect(self.clear_ticks)
        self.logprob_label = QLabel("—", wordWrap=True)
        self.before_label = QLabel("—", wordWrap=True)
        self.after_label = QLabel("—", wordWrap=True)
        for label in (self.logprob_label, self.before_label, self.after_label):
            label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form = QFormLayout()
        form.addRow("Mode", self.mode_box)
        form.addRow("New tokens", self.new_tokens)
        buttons = QHBoxLayout()
        buttons.addWidget(self.rerun_button)
        buttons.addWidget(self.clear_button)
        buttons.addStretch(1)
        side = QVBoxLayout()
        side.addLayout(form)
        side.addLayout(buttons)
        for title, label in (("Target log-probability", self.logprob_label),
                             ("Continuation before", self.before_label),
                             ("Continuation after", self.after_label)):
            side.addWidget(QLabel(f"<b>{title}</b>"))
            side.addWidget(label)
        side.addStretch(1)
        self.addWidget(self.grid)
        self.addWidget(scrolling(side))
        self.setStretchFactor(0, 1)
        self.setStretchFactor(1, 1)
        for i in range(2):
            self.setCollapsible(i, False)
        self._heads = 0
        self.result: AblationResult | None = None

    def set_shape(self, layers: int, heads: int) -> None:
        """One row per layer (block): a tick per head, then attention, MLP, block."""
        self._heads = heads
        self.grid.clear()
        self.grid.setRowCount(layers)
        self.grid.setColumnCount(heads + len(self.HALVES))
        self.grid.setHorizontalHeaderLabels([f"H{h}" for h in range(heads)] + ["attn", "MLP", "block"])
        self.grid.setVerticalHeaderLabels([f"block {i}" for i in range(layers)])
        for i in range(layers):
            for c in range(heads + len(self.HALVES)):
                item = QTableWidgetItem()
                item.setFlags(Qt.ItemFlag.ItemIsUserCheckable | Qt.ItemFlag.ItemIsEnabled)
                item.setCheckState(Qt.CheckState.Unchecked)
                self.grid.setItem(i, c, item)
        self.grid.resizeColumnsToContents()

    def tick(self, layer: int, what: int | str, on: bool = True) -> None:
        """Tick head ``what`` (an int) or ``"attention"`` / ``"mlp"`` / ``"block"`` of ``layer``."""
        col = what if isinstance(what, int) else self._heads + self.HALVES.index(what)
        self.grid.item(layer, col).setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)

    def clear_ticks(self) -> None:
        for i in range(self.grid.rowCount()):
            for c in range(self.grid.columnCount()):
                self.grid.item(i, c).setCheckState(Qt.CheckState.Unchecked)

    def ablations(self) -> list[Ablation]:
        """What is ticked, as the :class:`Ablation` list the Rerun computes, in the chosen mode."""
        mode, out = self.mode_box.currentText(), []
        for i in range(self.grid.rowCount()):
            for c in range(self.grid.columnCount()):
                if self.grid.item(i, c).checkState() != Qt.CheckState.Checked:
                    continue
                if c < self._heads:
                    out.append(Ablation("head", i, c, mode))
                else:
                    out.append(Ablation(self.HALVES[c - self._heads], i, None, mode))
        return out

    def show_result(self, result: AblationResult, name: TokenName) -> None:
        self.result = result
        self.logprob_label.setText(f"{name(result.target)!r}: {result.logprob_before:.4f} → "
                                   f"{result.logprob_after:.4f} (Δ {result.delta:+.4f})")
        before = [name(t) for t in result.greedy_before]
        after = [name(t) for t in result.greedy_after]
        self.before_label.setText(_continuation(before, [False] * len(before)))
        self.after_label.setText(_continuation(after, result.changed))

    def clear_result(self, hint: str = "—") -> None:
        self.result = None
        for label in (self.logprob_label, self.before_label, self.after_label):
            label.setText(hint)


def _continuation(texts: list[str], changed: list[bool]) -> str:
    """Rich text of a continuation, each changed token on an orange tint and underlined."""
    if not texts:
        return "(no new tokens)"
    parts = []
    for text, diff in zip(texts, changed, strict=True):
        shown = html.escape(text).replace("\n", "↵")
        parts.append(f'<u style="background-color: {CHANGED_TINT}">{shown}</u>' if diff else shown)
    return "<span style='white-space: pre-wrap'>" + "".join(parts) + "</span>"


# ----- patching ------------------------------------------------------------------------------------
class PatchingView(QSplitter):
    """A corrupted prompt (as long as the clean one, in tokens), a site, Run: the share of the
    clean answer each patched cell restores, layers x positions (layers x heads for ``z``)."""

    run_requested = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(Qt.Orientation.Horizontal, parent)
        self.corrupted_edit = QLineEdit()
        self.corrupted_edit.setPlaceholderText("the prompt with a word changed, same token count")
        self.site_box = QComboBox()
        self.site_box.addItems(list(PATCH_SITES))
        self.site_box.setToolTip("resid_pre: the residual entering a block; attn_out / mlp_out: what a "
                                 "half adds; z: one head's values (a layers x heads grid)")
        self.run_button = QPushButton("Run patching")
        self.run_button.clicked.connect(self.run_requested)
        self.corrupted_edit.returnPressed.connect(self.run_requested)
        self.summary_label = QLabel("—", wordWrap=True)
        self.error_label = QLabel("", wordWrap=True)
        form = QFormLayout()
        form.addRow("Corrupted prompt", self.corrupted_edit)
        form.addRow("Site", self.site_box)
        side = QVBoxLayout()
        side.addLayout(form)
        side.addWidget(self.run_button, 0, Qt.AlignmentFlag.AlignLeft)
        side.addWidget(self.error_label)
        side.addWidget(self.summary_label)
        side.addStretch(1)
        self.corrupted_edit.setMinimumWidth(self.fontMetrics().horizontalAdvance("x" * 24))
        self.heatmap = Heatmap("restored share", RESTORED_COLORMAP, RESTORED_LEVELS)
        self.addWidget(scrolling(side))
        self.addWidget(self.heatmap)
        self.setStretchFactor(1, 1)
        for i in range(2):
            self.setCollapsible(i, False)
        self.grid: PatchGrid | None = None
        self.clear_grid()

    def clear_grid(self, title: str = "restored share (Run patching)") -> None:
        self.grid = None
        self.heatmap.clear_values(title)

    def show_grid(self, grid: PatchGrid, texts: Sequence[str], name: TokenName) -> None:
        self.grid = grid
        L, cells = grid.diffs.shape
        by_head = grid.site == "z"
        columns = [f"H{h}" for h in range(cells)] if by_head else [f"{t} {shown_token(texts[t])}"
                                                                  for t in range(cells)]
        self.heatmap.show_values(grid.restored, [str(i) for i in range(L)], columns,
                                 f"restored share, {grid.site}", row_axis="layer",
                                 column_axis="head" if by_head else "position")
        self.summary_label.setText(
            f"answer {name(grid.answer)!r} vs {name(grid.wrong)!r}: logit difference clean "
            f"{grid.clean_diff:.3f}, corrupted {grid.corrupted_diff:.3f}")

    def show_error(self, message: str) -> None:
        self.error_label.setText(message)
