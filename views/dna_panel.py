"""The DNA panel: how two networks or two language models differ, and their children.

Two pickers name the pair: a Loom network (``.json`` / ``.loom``), a language model (a GGUF file,
an HF folder or a model's name), or an object the window hands over with :meth:`DNAPanel.set_pair`
or :meth:`DNAPanel.add_choice` (the loaded model and its morphed copy, the Models panel's items).
Compare runs in a job (:mod:`loomlab.core.evolve.llm.dna_table`: ``compare_dna`` for networks, the
count sketches for language models, progress per layer) and shows the overall overlap, a per-layer
heatmap (grid cells x layer slots; blocks x sub-layers for a language model), a table of overlaps
that sorts numbers as numbers, and the logic shifts (also announced by
:attr:`DNAPanel.logic_shifts_changed` for the Topology panel's arrows).

Splice (two networks, Loom's ``SpliceDNA``) and merge (two language models into an HF folder)
run in jobs too; the child is announced by :attr:`DNAPanel.child_ready`. One job at a time; a
failure is one line in the panel's status, never a traceback.
"""

from __future__ import annotations

import html
import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from loomlab.core import VolumetricNetwork, load_network
from loomlab.core.evolve.genetics.splicing import MODES as SPLICE_MODES
from loomlab.core.evolve.genetics.splicing import SpliceConfig, splice
from loomlab.core.evolve.llm.dna_table import DNAReport, kind_of, model_path, model_report, network_report
from loomlab.core.llm.quality.merge import METHODS as MERGE_METHODS
from loomlab.core.llm.quality.merge import merge_models

from .scrolling import scrolling
from .sort_items import SORT_ROLE, SortItem
from .workers import Job, JobRunner

OVERLAP_COLUMNS = ("Position", "Layer", "Overlap")
POSITION, LAYER, OVERLAP = range(len(OVERLAP_COLUMNS))
SHIFT_COLUMNS = ("From", "To", "Overlap")
HEATMAP_COLORMAP = "viridis"
MIN_HEATMAP_HEIGHT = 160
ROW_LABEL_PX = 18  # the heatmap's row labels at least this far apart: every k-th row is labelled
ERROR_COLOUR = QColor(220, 60, 60)
NETWORK_FILTER = "Loom networks (*.json *.loom)"
MODEL_FILTER = "Language models (*.gguf);;All files (*)"
RANDOM_SEED = -1  # the seed box's "random" value


@dataclass
class Choice:
    """A picker's entry: a loaded object (network or language model) or text naming a file,
    folder or model, and the name shown for it."""

    value: Any
    name: str

    @property
    def kind(self) -> str:
        return kind_of(self.value)


class Picker(QWidget):
    """An editable combo of choices (objects handed over, files browsed, names typed) and a
    Browse… button."""

    def __init__(self, label: str, parent: QWidget | None = None):
        super().__init__(parent)
        self.combo = QComboBox()
        self.combo.setEditable(True)
        self.combo.setInsertPolicy(QComboBox.InsertPolicy.NoInsert)
        self.combo.setMinimumContentsLength(16)
        self.combo.lineEdit().setPlaceholderText("a .json / .loom network, a model file, folder or name")
        self.browse_button = QPushButton("Browse…")
        self.browse_button.clicked.connect(self._browse)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(QLabel(label))
        layout.addWidget(self.combo, 1)
        layout.addWidget(self.browse_button)

    def add(self, value: Any, name: str, select: bool = True) -> None:
        """Offer ``value`` (shown as ``name``); an entry of the same name is replaced."""
        i = self.combo.findText(name)
        if i >= 0:
            self.combo.removeItem(i)
        self.combo.addItem(name, Choice(value, name))
        if select:
            self.combo.setCurrentIndex(self.combo.count() - 1)

    def remove(self, name: str) -> None:
        """Stop offering the entry ``name`` (the text shown stays, as typed)."""
        text = self.combo.currentText()
        i = self.combo.findText(name)
        if i >= 0:
            self.combo.removeItem(i)
        self.combo.setEditText(text)

    def set_text(self, text: str) -> None:
        self.combo.setEditText(text)

    def choice(self) -> Choice | None:
        """The entry shown: an object handed over when its name is shown, else the text typed."""
        text = self.combo.currentText().strip()
        if not text:
            return None
        i = self.combo.findText(text)
        if i >= 0 and isinstance(self.combo.itemData(i), Choice):
            return self.combo.itemData(i)
        return Choice(text, os.path.basename(text.rstrip("/\\")) or text)

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a network or model", "",
                                              f"{NETWORK_FILTER};;{MODEL_FILTER}")
        if path:
            self.set_text(path)


class DNAPanel(QWidget):
    """Compare two networks or language models by their DNA; splice or merge them.

    Hand it a :class:`~loomlab.views.workers.JobRunner`; give it a pair with :meth:`set_pair`
    (or let the user pick), then :meth:`compare`, :meth:`splice` or :meth:`merge`.
    """

    compared = Signal(object)  # the DNAReport of a finished comparison
    logic_shifts_changed = Signal(list)  # [(source_pos, target_pos, overlap)], "z,y,x,l" positions
    child_ready = Signal(object, str)  # a spliced VolumetricNetwork or a merged folder's path, a name
    failed = Signal(str)  # the one line shown for bad input or a failed job

    def __init__(self, runner: JobRunner, parent: QWidget | None = None):
        super().__init__(parent)
        self._runner = runner
        self._job: Job | None = None
        self._report: DNAReport | None = None
        self._closed = False
        self._shown = True
        self.heatmap_values = np.zeros((0, 0))
        pg.setConfigOptions(imageAxisOrder="row-major")
        self._build_ui()

    # ----- layout ------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.picker_a, self.picker_b = Picker("A"), Picker("B")
        for picker in (self.picker_a, self.picker_b):
            picker.combo.currentTextChanged.connect(lambda _: self._sync_controls())
        self.across_dtypes = QCheckBox("Across dtypes")
        self.across_dtypes.setToolTip("Compare the weights each layer computes with, so a morph scores near "
                                      "its original (language models are always compared so)")
        self.compare_button = QPushButton("Compare")
        self.compare_button.clicked.connect(self.compare)
        pick = QVBoxLayout()
        pick.addWidget(self.picker_a)
        pick.addWidget(self.picker_b)
        actions = QHBoxLayout()
        actions.addWidget(self.across_dtypes)
        actions.addStretch(1)
        actions.addWidget(self.compare_button)
        pick.addLayout(actions)

        self.overall_label = QLabel("—")
        self.overall_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        self.heatmap = pg.PlotWidget()
        self.heatmap.setMinimumSize(200, MIN_HEATMAP_HEIGHT)
        self.image = pg.ImageItem(colorMap=pg.colormap.get(HEATMAP_COLORMAP))
        self.heatmap.addItem(self.image)
        plot = self.heatmap.getPlotItem()
        plot.invertY(True)  # the first layer at the top, as in the table
        plot.setMouseEnabled(False, False)
        self.colorbar = pg.ColorBarItem(colorMap=pg.colormap.get(HEATMAP_COLORMAP), interactive=False,
                                        width=12, values=(0, 1))
        self.colorbar.setImageItem(self.image, insert_in=plot)

        self.table = self._make_table(OVERLAP_COLUMNS)
        self.table.horizontalHeader().setSectionResizeMode(LAYER, QHeaderView.ResizeMode.Stretch)
        self.shifts_table = self._make_table(SHIFT_COLUMNS)
        tables = QTabWidget()
        tables.addTab(self.table, "Layers")
        tables.addTab(self.shifts_table, "Logic shifts")
        self.tables = tables

        results = QSplitter(Qt.Orientation.Horizontal)
        results.addWidget(self.heatmap)
        results.addWidget(tables)
        results.setStretchFactor(0, 3)
        results.setStretchFactor(1, 2)
        for i in range(2):
            results.setCollapsible(i, False)

        children = QVBoxLayout()
        children.addWidget(self._build_splice(), 1)
        children.addWidget(self._build_merge(), 1)

        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.status = QLabel("", wordWrap=True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        busy = QHBoxLayout()
        busy.addWidget(self.progress, 1)
        busy.addWidget(self.cancel_button)

        # the choices, progress and forms in a column that scrolls, the results beside it: docked
        # along the bottom the panel is wide and short, and the forms would otherwise set its height
        forms = QWidget()
        form_column = QVBoxLayout(forms)
        form_column.setContentsMargins(0, 0, 0, 0)
        form_column.addLayout(pick)
        form_column.addLayout(busy)
        form_column.addWidget(self.status)
        form_column.addLayout(children)
        form_column.addStretch(1)
        shown = QVBoxLayout()
        shown.addWidget(self.overall_label)
        shown.addWidget(results, 1)
        layout = QHBoxLayout(self)
        layout.addWidget(scrolling(forms))
        layout.addLayout(shown, 1)
        self._sync_controls()

    def _make_table(self, columns: tuple[str, ...]) -> QTableWidget:
        table = QTableWidget(0, len(columns))
        table.setHorizontalHeaderLabels(columns)
        table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        table.verticalHeader().setVisible(False)
        table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        table.horizontalHeader().setSortIndicator(0, Qt.SortOrder.AscendingOrder)  # the grid's order first
        table.setSortingEnabled(True)
        return table

    def _build_splice(self) -> QGroupBox:
        box = QGroupBox("Splice (two networks)")
        self.mode_box = QComboBox()
        self.mode_box.addItems(SPLICE_MODES)
        self.alpha_box = self._number(0.5, 0.0, 1.0, "B's share in a blend")
        self.split_box = self._number(0.5, 0.0, 1.0, "where point mode cuts each layer's weights")
        self.fitness_a_box = self._number(0.0, 0.0, 1e9, "with fitnesses, blend and uniform weigh the "
                                          "parents by them (0 and 0: not used)")
        self.fitness_b_box = self._number(0.0, 0.0, 1e9, self.fitness_a_box.toolTip())
        self.seed_box = QSpinBox()
        self.seed_box.setRange(RANDOM_SEED, 2**31 - 1)
        self.seed_box.setSpecialValueText("random")
        self.seed_box.setValue(0)
        self.seed_box.setToolTip("the draws of uniform mode")
        self.splice_button = QPushButton("Splice")
        self.splice_button.clicked.connect(self.splice)
        form = QFormLayout(box)
        for label, w in (("Mode", self.mode_box), ("Alpha", self.alpha_box), ("Split", self.split_box),
                         ("Fitness A", self.fitness_a_box), ("Fitness B", self.fitness_b_box),
                         ("Seed", self.seed_box)):
            form.addRow(label, w)
        form.addRow(self.splice_button)
        self.splice_group = box
        return box

    def _build_merge(self) -> QGroupBox:
        box = QGroupBox("Merge (two language models)")
        self.method_box = QComboBox()
        self.method_box.addItems(MERGE_METHODS)
        self.method_box.currentTextChanged.connect(lambda _: self._sync_controls())
        self.t_edit = QLineEdit("0.5")
        self.t_edit.setToolTip("B's weight, in [0, 1]: one number, or several separated by commas spread "
                               "over the blocks first to last (one per block, or fewer to interpolate)")
        self.base_edit = QLineEdit()
        self.base_edit.setPlaceholderText("the model A and B were tuned from")
        base_browse = QPushButton("Browse…")
        base_browse.clicked.connect(lambda: self._browse_into(self.base_edit, folder=False))
        self.weights_edit = QLineEdit("1, 1")
        self.weights_edit.setToolTip("the weights of A's and B's task vectors")
        self.out_edit = QLineEdit()
        self.out_edit.setPlaceholderText("a folder to write the merged model into")
        out_browse = QPushButton("Choose…")
        out_browse.clicked.connect(lambda: self._browse_into(self.out_edit, folder=True))
        self.merge_button = QPushButton("Merge")
        self.merge_button.clicked.connect(self.merge)
        form = QFormLayout(box)
        form.addRow("Method", self.method_box)
        form.addRow("t", self.t_edit)
        form.addRow("Base", _row(self.base_edit, base_browse))
        form.addRow("Weights", self.weights_edit)
        form.addRow("Output", _row(self.out_edit, out_browse))
        form.addRow(self.merge_button)
        self.merge_group = box
        return box

    @staticmethod
    def _number(value: float, lo: float, hi: float, tip: str) -> QDoubleSpinBox:
        box = QDoubleSpinBox()
        box.setRange(lo, hi)
        box.setDecimals(3)
        box.setSingleStep(0.05)
        box.setValue(value)
        box.setToolTip(tip)
        return box

    def _browse_into(self, edit: QLineEdit, folder: bool) -> None:
        if folder:
            path = QFileDialog.getExistingDirectory(self, "Write the merged model into")
        else:
            path, _ = QFileDialog.getOpenFileName(self, "Open a model", "", MODEL_FILTER)
        if path:
            edit.setText(path)

    # ----- public API --------------------------------------------------------------------------
    def set_pair(self, a: Any, b: Any, names: tuple[str, str] = ("A", "B")) -> None:
        """Pick ``a`` and ``b`` (networks or language models already loaded, or paths / names)."""
        self.picker_a.add(a, names[0])
        self.picker_b.add(b, names[1])
        self._sync_controls()

    def add_choice(self, value: Any, name: str) -> None:
        """Offer ``value`` (a loaded network or model) in both pickers, selecting nothing."""
        for picker in (self.picker_a, self.picker_b):
            text = picker.combo.currentText()
            picker.add(value, name, select=False)
            picker.combo.setEditText(text)

    def remove_choice(self, name: str) -> None:
        """Stop offering the choice ``name`` (an unloaded model: the pickers must not keep it)."""
        for picker in (self.picker_a, self.picker_b):
            picker.remove(name)
        self._sync_controls()

    @property
    def report(self) -> DNAReport | None:
        """The comparison shown, or None."""
        return self._report

    def compare(self) -> None:
        """Compare the two picked in a job (language models: progress per layer, cancellable)."""
        pair = self._pair()
        if pair is None:
            return
        a, b = pair
        across = self.across_dtypes.isChecked()

        def work(job: Job) -> DNAReport:
            if a.kind == "model":
                return model_report(a.value, b.value, progress=job.report, cancel=job.is_cancelled)
            job.report("reading networks", 0, 0)
            return network_report(_network(a.value), _network(b.value), across_dtypes=across)

        self._start("compare", work, self.show_report)

    def splice(self) -> None:
        """Splice the two networks picked with the form's settings in a job; :attr:`child_ready`
        follows with the child."""
        pair = self._pair()
        if pair is None:
            return
        a, b = pair
        if a.kind != "network":
            self._fail("splice takes two networks; merge two language models instead")
            return
        config = self.splice_config()

        def work(job: Job):
            job.report("splicing", 0, 0)
            return splice(_network(a.value), _network(b.value), config)

        name = f"{a.name} × {b.name} ({config.mode})"
        self._start("splice", work, lambda result: self._spliced(result, name))

    def splice_config(self) -> SpliceConfig:
        """The form's splice settings."""
        seed = self.seed_box.value()
        return SpliceConfig(mode=self.mode_box.currentText(), blend_alpha=self.alpha_box.value(),
                            split_ratio=self.split_box.value(), fitness_a=self.fitness_a_box.value(),
                            fitness_b=self.fitness_b_box.value(), seed=None if seed == RANDOM_SEED else seed)

    def merge(self) -> None:
        """Merge the two language models picked into the output folder in a job (the models are
        read from their files, so a loaded model that is morphed is refused with the reason);
        :attr:`child_ready` follows with the folder's path."""
        pair = self._pair()
        if pair is None:
            return
        a, b = pair
        if a.kind != "model":
            self._fail("merge takes two language models; splice two networks instead")
            return
        out = self.out_edit.text().strip()
        if not out:
            self._fail("choose a folder to write the merged model into")
            return
        try:
            options = self.merge_options()
            refs = model_path(a.value), model_path(b.value)
        except ValueError as e:
            self._fail(str(e))
            return
        method = self.method_box.currentText()

        def work(job: Job):
            return merge_models(*refs, out, method=method, progress=job.report, cancel=job.is_cancelled,
                                **options)

        name = f"{a.name} + {b.name} ({method})"
        self._start("merge", work, lambda path: self._merged(path, name))

    def merge_options(self) -> dict:
        """The form's merge settings as :func:`merge_models` takes them (ValueError when unreadable)."""
        if self.method_box.currentText() == "task":
            base = self.base_edit.text().strip()
            if not base:
                raise ValueError("task arithmetic needs a base: the model A and B were tuned from")
            return {"base": base, "weights": _numbers(self.weights_edit.text(), "weights")}
        t = _numbers(self.t_edit.text(), "t")
        return {"t": t[0] if len(t) == 1 else t}

    def show_report(self, report: DNAReport) -> None:
        """Show ``report`` (the overall overlap, heatmap, tables) and announce its logic shifts."""
        self._report = report
        c = report.comparison
        kind = "language models (sketches, across dtypes)" if report.kind == "model" else "networks"
        counts = f"{len(c.layer_overlaps)} positions · {len(c.logic_shifts)} logic shifts"
        self.overall_label.setText(f"<b>Overall overlap {c.overall_overlap:.6f}</b> · {counts} · {kind}")
        self._show_heatmap(report)
        self._fill(self.table, [(r.key, r.name, r.overlap) for r in report.rows])
        self._fill(self.shifts_table, [(s.source_pos, s.target_pos, s.overlap) for s in c.logic_shifts])
        self.compared.emit(report)
        self.logic_shifts_changed.emit([(s.source_pos, s.target_pos, s.overlap) for s in c.logic_shifts])

    def show_example(self, a: VolumetricNetwork, b: VolumetricNetwork,
                     names: tuple[str, str] = ("A", "B")) -> None:
        """Pick two small networks and show their comparison at once, on this thread (for a
        screenshot; only for networks small enough to compare in a moment)."""
        self.set_pair(a, b, names)
        self.show_report(network_report(a, b, across_dtypes=self.across_dtypes.isChecked()))
        self.status.setText(f"compared {names[0]} with {names[1]}")

    @staticmethod
    def example_pair(seed: int = 1) -> tuple[VolumetricNetwork, VolumetricNetwork]:
        """The XOR task's seed network and a NEAT mutant of it (``seed``): a pair to show."""
        from loomlab.core.evolve import NEATConfig, get_task, neat_mutate

        net = get_task("xor").seed_network()
        return net, neat_mutate(net, NEATConfig(seed=seed, weight_perturb_scale=0.5))

    def is_busy(self) -> bool:
        return self._job is not None

    def cancel(self) -> None:
        """Stop the running job (between layers or tensors)."""
        if self._job is not None:
            self._job.cancel()

    def set_shown(self, shown: bool) -> None:
        """Whether the panel is on screen (it only runs what the user asks for, so nothing waits)."""
        self._shown = shown

    def shutdown(self) -> None:
        """Cancel and join this panel's job for good (the runner itself belongs to the caller)."""
        self._closed = True
        job, self._job = self._job, None
        if job is not None:
            job.cancel()
            job.wait()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)

    # ----- showing -----------------------------------------------------------------------------
    def _show_heatmap(self, report: DNAReport) -> None:
        h = report.heatmap
        self.heatmap_values = np.asarray(h.values, dtype=float)
        levels = heatmap_levels(self.heatmap_values)
        self.image.setImage(self.heatmap_values, autoLevels=False, levels=levels)
        self.colorbar.setLevels(levels)
        plot = self.heatmap.getPlotItem()
        rows, cols = self.heatmap_values.shape
        left, bottom = plot.getAxis("left"), plot.getAxis("bottom")
        step = row_label_step(rows, self.heatmap.getPlotItem().getViewBox().height())
        left.setTicks([[(i + 0.5, h.row_labels[i]) for i in range(0, rows, step)]])
        bottom.setTicks([[(i + 0.5, t) for i, t in enumerate(h.col_labels)]])
        plot.setLabel("left", "block" if report.kind == "model" else "cell z,y,x")
        plot.setLabel("bottom", "sub-layer" if report.kind == "model" else "layer slot")
        plot.setRange(xRange=(0, max(cols, 1)), yRange=(0, max(rows, 1)), padding=0)

    def _fill(self, table: QTableWidget, rows: list[tuple[str, str, float]]) -> None:
        table.setSortingEnabled(False)
        table.setRowCount(len(rows))
        for r, values in enumerate(rows):
            for c, v in enumerate(values):
                item = SortItem(f"{v:.6f}" if isinstance(v, float) else str(v))
                item.setData(Qt.ItemDataRole.UserRole, v)
                item.setData(SORT_ROLE, (v, r) if isinstance(v, float) else (_position_sort(v), r))
                if isinstance(v, float):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                table.setItem(r, c, item)
        table.setSortingEnabled(True)

    def _spliced(self, result, name: str) -> None:
        self.status.setText(f"spliced {html.escape(name)}: {result.blended_count} of "
                            f"{len(result.similarities)} layers similar (> 0)")
        self.child_ready.emit(result.child, name)

    def _merged(self, path, name: str) -> None:
        self.status.setText(f"merged into {html.escape(str(path))}")
        self.child_ready.emit(str(path), name)

    def _fail(self, message: str) -> None:
        self.status.setText(f'<span style="color:{ERROR_COLOUR.name()}">{html.escape(message)}</span>')
        self.failed.emit(message)

    # ----- the pair and the jobs ---------------------------------------------------------------
    def _pair(self) -> tuple[Choice, Choice] | None:
        """The two picked, both networks or both language models; else None and a message."""
        a, b = self.picker_a.choice(), self.picker_b.choice()
        if a is None or b is None:
            self._fail("pick two networks or two language models (A and B)")
            return None
        try:
            kinds = a.kind, b.kind
        except ValueError as e:
            self._fail(str(e))
            return None
        if kinds[0] != kinds[1]:
            self._fail(f"A is a {_kind_text(kinds[0])} and B a {_kind_text(kinds[1])}: pick two networks "
                       "or two language models")
            return None
        return a, b

    def _start(self, name: str, fn: Callable[[Job], Any], on_success: Callable[[Any], None]) -> None:
        if self._job is not None or self._closed:
            return
        self.status.setText(f"{name}…")
        self._job = self._runner.start(
            fn, name=f"dna {name}", on_progress=self._on_progress,
            on_success=lambda result: self._ended(None, on_success, result),
            on_failure=lambda message: self._ended(f"{name} failed: {message}"),
            on_cancel=lambda: self._ended(f"{name} cancelled", error=False))
        self._sync_controls()

    def _ended(self, message: str | None, slot: Callable | None = None, result: Any = None,
               error: bool = True) -> None:
        if self._closed:
            return
        self._job = None
        self._sync_controls()
        if message is not None:
            if error:
                self._fail(message)
            else:
                self.status.setText(html.escape(message))
        elif slot is not None:
            self.status.setText("")
            slot(result)

    def _on_progress(self, stage: str, done: int, total: int) -> None:
        if self._closed:
            return
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        self.status.setText(html.escape(f"{stage} ({done}/{total})" if total else stage))

    def _sync_controls(self) -> None:
        idle = self._job is None
        kind = self._picked_kind()
        self.compare_button.setEnabled(idle)
        self.splice_button.setEnabled(idle and kind != "model")
        self.merge_button.setEnabled(idle and kind != "network")
        task = self.method_box.currentText() == "task"
        self.t_edit.setEnabled(not task)
        self.base_edit.setEnabled(task)
        self.weights_edit.setEnabled(task)
        self.cancel_button.setEnabled(not idle)
        self.progress.setVisible(not idle)
        if idle:
            self.progress.setRange(0, 1)
            self.progress.setValue(1)

    def _picked_kind(self) -> str | None:
        """Both pickers' kind when they agree, else None (then both actions stay available and
        pressing one says what is wrong)."""
        try:
            kinds = {c.kind for c in (self.picker_a.choice(), self.picker_b.choice()) if c is not None}
        except ValueError:
            return None
        return kinds.pop() if len(kinds) == 1 else None


def _network(value: Any) -> VolumetricNetwork:
    """A network handed over, or read from its file (in a job)."""
    if isinstance(value, VolumetricNetwork):
        return value
    return load_network(os.fspath(value))


def _numbers(text: str, what: str) -> list[float]:
    try:
        values = [float(v) for v in text.replace(";", ",").split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"{what} takes numbers separated by commas, got {text!r}") from None
    if not values or not all(math.isfinite(v) for v in values):
        raise ValueError(f"{what} takes finite numbers separated by commas, got {text!r}")
    return values


def heatmap_levels(values: np.ndarray) -> tuple[float, float]:
    """The colour scale of the overlaps: their own range, so a layer at 0.9999 among layers at
    exactly 1 stands out; (0, 1) when they are all alike or none were compared."""
    finite = values[np.isfinite(values)]
    if finite.size == 0 or finite.min() == finite.max():
        return (min(0.0, float(finite.min())) if finite.size else 0.0), 1.0
    return float(finite.min()), float(finite.max())


def row_label_step(rows: int, height_px: float) -> int:
    """Label every k-th of ``rows`` heatmap rows, so labels are :data:`ROW_LABEL_PX` apart in a
    plot ``height_px`` tall (before it is laid out, as if it were its minimum height)."""
    per_row = max(height_px, MIN_HEATMAP_HEIGHT) / max(rows, 1)
    return max(1, math.ceil(ROW_LABEL_PX / per_row))


def _position_sort(text: str) -> tuple:
    """A ``"z,y,x,l"`` position sorts as numbers; other text as text."""
    try:
        return (0, tuple(int(p) for p in text.split(",")), "")
    except ValueError:
        return (1, (), text)


def _kind_text(kind: str) -> str:
    return "language model" if kind == "model" else "network"


def _row(*widgets: QWidget) -> QWidget:
    w = QWidget()
    layout = QHBoxLayout(w)
    layout.setContentsMargins(0, 0, 0, 0)
    for i, widget in enumerate(widgets):
        layout.addWidget(widget, 1 if i == 0 else 0)
    return w
