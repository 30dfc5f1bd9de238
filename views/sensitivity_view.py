"""Which layers of a language model are sensitive: each layer of a recipe morphed alone, ranked by
the KL divergence it causes (core/llm/quality/drift.py's ``measure_drift(..., per_layer=True)``, the numbers
``loomlab quant-report --per-layer`` prints).

The view only draws a :class:`~loomlab.core.llm.quality.drift.DriftReport`: a sortable table of its
layers (formatted as the command prints them) and a bar chart of KL mean per layer, most sensitive
first. The Morph panel owns the measurement (a job in its queue, so it never races a morph of the
same layers) and asks for one when :attr:`SensitivityView.measure_requested` fires; a row or a bar
the user clicks is announced as :attr:`SensitivityView.layer_chosen`.
"""

from __future__ import annotations

import html
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from .sort_items import SORT_ROLE, SortItem, row_table

COLUMNS = ("Rank", "Layer", "Format", "KL mean", "KL 99%", "KL max", "Same top", "PPL(Q)/PPL(base)",
           "Δ PPL", "RMS Δp")
RANK, LAYER, FORMAT, KL_MEAN, KL_P99, KL_MAX, SAME_TOP, PPL_RATIO, PPL_DIFF, RMS_DP = range(len(COLUMNS))
BAR = (80, 140, 220, 200)
MIN_CHART_WIDTH = 300
MEASURE_TIP = ("Morph each layer whose chosen format differs from its current one alone, and rank the layers "
               "by the KL divergence it causes")
BAR_SELECTED = (255, 170, 0, 255)


def _cells(la) -> list[tuple[str, Any]]:
    """A ranked layer's cells after Rank, Layer and Format: (text, the value it sorts by), the text
    as ``loomlab quant-report --per-layer`` prints it so the two read the same."""
    s = la.stats
    return [(f"{s.kl_mean:.6f}", s.kl_mean), (f"{s.kl_p99:.6f}", s.kl_p99), (f"{s.kl_max:.6f}", s.kl_max),
            (f"{100 * s.same_top:.2f}%", s.same_top), (f"{s.ppl_ratio:.6f}", s.ppl_ratio),
            (f"{s.ppl_diff:+.4f}", s.ppl_diff), (f"{100 * s.rms_dp:.3f}%", s.rms_dp)]


class SensitivityView(QWidget):
    """A per-layer drift report as a table and a bar chart; the Morph panel runs the measurement."""

    measure_requested = Signal()  # the user pressed "Measure sensitivity"
    layer_chosen = Signal(str)  # the name of a layer whose row or bar the user clicked

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.probe: str | None = None  # None: the text quant-report uses by default
        self.ctx: int | None = None  # None: quant-report's default context
        self.report = None  # the DriftReport shown
        self._names: list[str] = []  # the report's layers, most sensitive first (the bars' order)
        self._selected: str | None = None
        self._build_ui()

    # ----- layout ----------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.measure_button = QPushButton("Measure sensitivity")
        self.measure_button.setToolTip(MEASURE_TIP)
        self.measure_button.clicked.connect(self.measure_requested)
        self.filter_edit = QLineEdit()
        self.filter_edit.setPlaceholderText("every layer with a pending choice, or e.g. blk.1*.ffn*")
        self.filter_edit.setToolTip("Only these layers (shell patterns, separated by commas or spaces): "
                                    "each layer costs one pass over the probe")
        controls = QHBoxLayout()
        controls.addWidget(self.measure_button)
        controls.addWidget(QLabel("Layers:"))
        controls.addWidget(self.filter_edit, 1)
        self.summary = QLabel("", wordWrap=True)
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.set_probe(None, None)

        self.table = row_table(COLUMNS)
        self.table.setWordWrap(False)  # a long layer name is elided, not wrapped into a taller row
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        header.setSortIndicator(RANK, Qt.SortOrder.AscendingOrder)
        self.table.setSortingEnabled(True)
        self.table.itemSelectionChanged.connect(self._on_row_selected)

        self.chart = pg.PlotWidget()
        self.chart.setMinimumSize(200, 120)
        plot = self.chart.getPlotItem()
        plot.setMouseEnabled(False, False)
        plot.hideButtons()
        plot.setLabel("left", "KL mean (nats)")
        plot.setLabel("bottom", "rank (layers, most sensitive first)")
        self.bars = pg.BarGraphItem(x=[], height=[], width=0.8, brush=BAR)
        self.chart.addItem(self.bars)
        self.chart.scene().sigMouseClicked.connect(self._chart_clicked)

        self.results = QSplitter(Qt.Orientation.Horizontal)
        self.results.addWidget(self.table)
        self.results.addWidget(self.chart)
        self.results.setStretchFactor(0, 1)
        self.results.setStretchFactor(1, 1)
        for i in range(2):
            self.results.setCollapsible(i, False)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(controls)
        layout.addWidget(self.summary)
        layout.addWidget(self.results, 1)

    # ----- what the panel sets -----------------------------------------------------------------------
    def set_probe(self, probe: str | None, ctx: int | None) -> None:
        """Measure on ``probe`` in chunks of ``ctx`` tokens (None: quant-report's defaults)."""
        self.probe, self.ctx = probe, ctx
        if self.report is None:
            text = "Loom Lab's English probe text" if probe is None else f"a text of {len(probe):,} chars"
            chunks = "" if ctx is None else f", chunks of {ctx} tokens"
            self.summary.setText(f"Measured on {text}{chunks}, as <tt>loomlab quant-report --per-layer</tt> "
                                 "measures it.")

    def set_available(self, available: bool, why: str = "") -> None:
        """Whether a measurement can start now (a language model is shown and no job runs)."""
        self.measure_button.setEnabled(available)
        self.measure_button.setToolTip(why or MEASURE_TIP)

    def patterns(self) -> list[str]:
        """The layer patterns typed in the Layers box (empty: every layer)."""
        return self.filter_edit.text().replace(",", " ").split()

    def clear(self) -> None:
        self.report, self._names, self._selected = None, [], None
        self.table.setRowCount(0)
        self.bars.setOpts(x=[], height=[], brushes=None)
        self.set_probe(self.probe, self.ctx)

    def show_report(self, report) -> None:
        """Show a per-layer :class:`~loomlab.core.llm.quality.drift.DriftReport`."""
        self.report = report
        self._names = [la.name for la in report.layers]
        s = report.stats
        self.summary.setText(
            f"<b>{len(report.layers)} layers</b>, each morphed alone, over {report.tokens} tokens "
            f"({report.chunks} chunks of {report.ctx}) in {report.seconds:.1f} s · all together: "
            f"KL mean {s.kl_mean:.6f}, 99% {s.kl_p99:.6f}, same top {100 * s.same_top:.2f}%, "
            f"PPL {s.ppl_base:.4f} → {s.ppl_morphed:.4f}")
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(report.layers))
        for row, la in enumerate(report.layers):
            cells = [(str(row + 1), row + 1), (la.name, la.name), (la.format, la.format), *_cells(la)]
            for col, (text, value) in enumerate(cells):
                item = SortItem(text)
                item.setData(SORT_ROLE, value)
                item.setData(Qt.ItemDataRole.UserRole, value)
                if col not in (LAYER, FORMAT):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                if col == LAYER:
                    item.setToolTip(html.escape(la.name))
                self.table.setItem(row, col, item)
        self.table.setSortingEnabled(True)
        self._give_table_its_width()
        # bar k at x = k, the layer's rank, as the table's first column numbers it
        ranks = np.arange(1, len(report.layers) + 1)
        self.bars.setOpts(x=ranks, height=[la.stats.kl_mean for la in report.layers], width=0.8, brushes=None,
                          brush=BAR)
        self.chart.getPlotItem().enableAutoRange()
        self._selected = None
        self._paint_bars()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        self._give_table_its_width()  # a report that came while the tab was hidden had no width to share

    def _give_table_its_width(self) -> None:
        """Let the table show every column without a scroll bar, the chart taking the rest (but
        keeping MIN_CHART_WIDTH)."""
        need = (self.table.horizontalHeader().length() + 2 * self.table.frameWidth()
                + self.table.verticalScrollBar().sizeHint().width())
        total = sum(self.results.sizes())
        if total > 0:
            table = min(need, total - MIN_CHART_WIDTH)
            self.results.setSizes([table, total - table])

    def select_layer(self, name: str | None) -> None:
        """Show ``name`` as the selected layer (row and bar) without announcing it."""
        self._selected = name if name in self._names else None
        self.table.blockSignals(True)
        self.table.clearSelection()
        row = self._table_row(name)
        if row is not None:
            self.table.selectRow(row)
            self.table.scrollToItem(self.table.item(row, LAYER))
        self.table.blockSignals(False)
        self.table.viewport().update()
        self._paint_bars()

    # ----- what the user does ------------------------------------------------------------------------
    def _table_row(self, name: str | None) -> int | None:
        for row in range(self.table.rowCount()):
            if self.table.item(row, LAYER).text() == name:
                return row
        return None

    def _on_row_selected(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        if rows:
            self._choose(self.table.item(rows[0].row(), LAYER).text())

    def _chart_clicked(self, event) -> None:
        if event.button() != Qt.MouseButton.LeftButton or not self._names:
            return
        x = self.chart.getPlotItem().getViewBox().mapSceneToView(event.scenePos()).x()
        rank = int(round(x))
        if 1 <= rank <= len(self._names) and abs(x - rank) <= 0.4:  # on a bar, not between two
            self.select_layer(self._names[rank - 1])
            self._choose(self._names[rank - 1])

    def _choose(self, name: str) -> None:
        self._selected = name
        self._paint_bars()
        self.layer_chosen.emit(name)

    def _paint_bars(self) -> None:
        if self._names:
            self.bars.setOpts(brushes=[pg.mkBrush(BAR_SELECTED if name == self._selected else BAR)
                                       for name in self._names])
