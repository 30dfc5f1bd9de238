"""The Morph panel: switch a network's layers between numeric types and see what it costs.

A table lists every weighted layer (nested ones too: a language model's layers sit inside its
blocks) with its dtype, parameters, bytes and the error of its weights against its master (a
network's float32 weights; a language model's, its file's weights as loaded). A dtype chosen per
row, or for all rows at once, is applied in a background job, layer by layer (a language model's
master is built lazily from the file's blocks, which is slow for big layers), and then measured:
bytes saved against the network as it was set, and output drift on a probe against the unmorphed
network (for a network the relative drift ``net morph-report`` prints, for a language model the KL
divergence and top-1 agreement of the next-token distributions over a probe text, shown with its
token count and called a quick check: the Sensitivity tab and ``quant-report`` measure a long text).
Revert morphs every layer back to the dtype it had when the network was set; that is lossless
because morphing never changes the master. Jobs run one at a time, and only while the panel is
visible: hidden behind another tab it costs nothing.

A language model's layers can also be ranked by how sensitive they are to the formats chosen (the
Sensitivity tab, :mod:`~loomlab.views.sensitivity_view`: each layer morphed alone and its KL
measured, as ``loomlab quant-report --per-layer`` does), and the chosen formats saved and loaded
as a JSON recipe ``{layer name: format}`` that ``quant-report --recipe`` and ``resolve_recipe`` read.

The table sorts by any column (numbers as numbers). Rows are keyed by the layer key observer events
carry, ``(z, y, x, l, path)``: a row the user selects is announced (:attr:`MorphPanel.layer_selected`)
and another panel's selection is shown with :meth:`MorphPanel.select_layer_key`, without an echo.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QBoxLayout,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidgetItem,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from loomlab.core import save_network
from loomlab.core.errors import LoomConfigError
from loomlab.core.io.atomic import write_atomic
from loomlab.core.layer_names import LayerKey, layer_label, model_parts
from loomlab.core.layers.base import Layer
from loomlab.core.morph import MorphReport, layer_report, morph_sublayer, probe_input, weighted_cells
from loomlab.core.morph_probe import compare, llm_probe, net_drift, net_outputs
from loomlab.core.network import Coord, VolumetricNetwork
from loomlab.core.units import format_bytes, format_count, format_size_change

from .scrolling import scrolling
from .sensitivity_view import SensitivityView
from .sort_items import SORT_ROLE, SortItem, row_table
from .workers import Job, JobRunner

COLUMNS = ("Cell", "Layer", "Type", "dtype", "Parameters", "Bytes", "Rel. error", "Rel. MSE", "Cosine")
CELL, LAYER, TYPE, DTYPE, PARAMS, BYTES, REL_ERROR, REL_MSE, COSINE = range(len(COLUMNS))
WIDE = 1.6  # width / height above which the controls sit beside the table, not under it
NO_CHOICE = "—"
FRAME_MS = 50  # reports a job streams are drawn together, this often
MORPHED_TINT = QColor(255, 160, 0, 48)  # translucent: readable on light and dark palettes
FLOAT32_MASTER = "its float32 master"
AS_LOADED = "as loaded"  # a recipe's dtype meaning the layer's format as loaded (an evolved recipe's "keep")
NAMES_SHOWN = 3  # a status line names at most this many layers and counts the rest
QUICK_CHECK_TIP = ("A quick check after every change, on the short probe text above. The Sensitivity tab "
                   "and loomlab quant-report measure a long probe text: their KL and top-1 are the ones "
                   "to compare between recipes.")
DEFAULT_PROBE_TEXT = "The quick brown fox jumps over the lazy dog while the old cat sleeps in the warm sun."


@dataclass
class _Row:
    index: int  # flat index of the grid cell holding the layer
    coord: Coord
    layer: Layer
    original: str  # the encoding when the network was set: what Revert goes back to
    name: str  # the layer as people know it (core.layer_names)

    @property
    def current(self) -> str:
        """The layer's encoding now: its dtype, or for a language model's layer the GGUF encoding
        of its matrices (the file's, e.g. Q4_1, or a block format it was morphed to)."""
        return self.layer.weights.encoding(self.layer.cfg.dtype)

    @property
    def path(self) -> str:
        return getattr(self.layer, "path", "")

    @property
    def report_key(self) -> tuple[int, str]:
        """How a MorphReport names its layer."""
        return self.index, self.path

    @property
    def key(self) -> LayerKey:
        return (*self.coord, self.path)


class MorphPanel(QWidget):
    """Per-layer precision morphing of a network or a language model, measured.

    Hand it a :class:`~loomlab.views.workers.JobRunner`, then :meth:`set_network` or
    :meth:`set_model`. Every morph, measurement and save runs as a job, one at a time.
    """

    morphed = Signal(list)  # the MorphReports of the layers an Apply or Revert changed
    measured = Signal(dict)  # bytes and output drift after an Apply or Revert
    reported = Signal(list)  # the table's MorphReports, after set_network / refresh
    saved = Signal(str)  # the path of a finished save
    layer_selected = Signal(object)  # the (z, y, x, l, path) key of a row the user selected

    def __init__(self, runner: JobRunner, parent: QWidget | None = None):
        super().__init__(parent)
        self._runner = runner
        self._net: VolumetricNetwork | None = None
        self._model: Any = None  # the language model shown (None for a Loom network): sensitivity needs it
        self._rows: list[_Row] = []
        self._anchors: list[QTableWidgetItem] = []  # each row's Cell item: finds the row however sorted
        self._row_of: dict[tuple[int, str], int] = {}  # a report's (index, path) -> row in _rows
        self._row_of_key: dict[LayerKey, int] = {}
        self._selected: LayerKey | None = None  # the last selection shown or announced
        self._quiet = False  # selecting rows from code: announce nothing
        self._bulk = False
        self._reports: dict[tuple[int, str], MorphReport] = {}
        self._bytes_original = 0
        self._drift: Callable[[], dict] | None = None  # set once the unmorphed reference exists
        self._queue: list[tuple[str, Callable, dict]] = []
        self._pending_show: Callable[[], None] | None = None  # a network to show once on screen
        self._shown = True  # see set_shown
        self._job: Job | None = None
        self._generation = 0  # bumped by set_network: results of older jobs are dropped
        self._reference = FLOAT32_MASTER
        self._closed = False
        self._new_reports: list[MorphReport] = []  # streamed by a job, drawn once a frame
        self._report_timer = QTimer(self)
        self._report_timer.setSingleShot(True)
        self._report_timer.setInterval(FRAME_MS)
        self._report_timer.timeout.connect(self._draw_new_reports)
        self._build_ui()

    # ----- layout ----------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.title = QLabel("No network", wordWrap=True)
        self.probe_label = QLabel("", wordWrap=True)  # what drift is measured on
        self.probe_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = row_table(COLUMNS)
        # rows as tall as a dtype combo needs, no taller: a docked panel shows more of them
        self.table.verticalHeader().setDefaultSectionSize(QComboBox().sizeHint().height())
        self.table.horizontalHeader().setSortIndicator(CELL, Qt.SortOrder.AscendingOrder)
        self.table.setSortingEnabled(True)
        self._resize_columns_to_contents()
        self.table.itemSelectionChanged.connect(self._on_selection)

        self.all_combo = QComboBox()
        self.all_combo.addItem(NO_CHOICE)  # and the targets of the network shown
        self.all_combo.setToolTip("Choose one dtype for every layer (then Apply)")
        self.all_combo.textActivated.connect(self.set_all_dtype)
        self.apply_button = QPushButton("Apply")
        self.apply_button.clicked.connect(self.apply)
        self.revert_button = QPushButton("Revert")
        self.revert_button.setToolTip("Morph every layer back to the dtype it had when loaded (lossless)")
        self.revert_button.clicked.connect(self.revert)
        self.save_button = QPushButton("Save as .loom…")
        self.save_button.clicked.connect(self._ask_save_path)
        self.export_button = QPushButton("Export GGUF…")
        self.export_button.setToolTip("Save the language model in its current formats as a GGUF file that "
                                      "llama.cpp runs (loomlab quantize)")
        self.export_button.clicked.connect(self._ask_export_path)
        self.load_recipe_button = QPushButton("Load recipe…")
        self.load_recipe_button.setToolTip("Choose the formats a JSON recipe names (then Apply)")
        self.load_recipe_button.clicked.connect(self._ask_recipe_to_load)
        self.save_recipe_button = QPushButton("Save recipe…")
        self.save_recipe_button.setToolTip("Save the chosen formats that differ from the layers' formats as "
                                           "loaded, as a JSON recipe (quant-report --recipe reads it)")
        self.save_recipe_button.clicked.connect(self._ask_recipe_save_path)
        choose_all = QHBoxLayout()
        choose_all.addWidget(QLabel("All layers:"))
        choose_all.addWidget(self.all_combo, 1)
        controls = QHBoxLayout()
        for w in (self.apply_button, self.revert_button):
            controls.addWidget(w)
        controls.addStretch(1)
        controls.addWidget(self.save_button)
        controls.addWidget(self.export_button)

        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.status = QLabel("", wordWrap=True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        busy = QHBoxLayout()
        busy.addWidget(self.progress, 1)
        busy.addWidget(self.cancel_button)

        self.memory_label, self.error_label, self.drift_label = (QLabel("—", wordWrap=True) for _ in range(3))
        # a heading above each figure, not beside it: a word-wrapped label in a grid cell was not
        # given the height its text needs once the text grew (the worst layer's name was cut)
        summary = QVBoxLayout()
        for name, label in (("Memory", self.memory_label), ("Worst layer", self.error_label),
                            ("Output drift", self.drift_label)):
            summary.addWidget(QLabel(f"<b>{name}</b>"))
            summary.addWidget(label)

        side = QVBoxLayout()
        side.addWidget(self.title)
        side.addWidget(self.probe_label)
        side.addLayout(choose_all)
        side.addLayout(controls)
        side.addLayout(summary)
        side.addStretch(1)
        side.addLayout(busy)
        side.addWidget(self.status)
        side.setContentsMargins(0, 0, 0, 0)
        # the controls scroll when a short dock cannot give them their height, rather than be
        # squeezed (a wrapped label then loses its second line)
        self._side = scrolling(side)
        self.sensitivity = SensitivityView()
        self.sensitivity.measure_requested.connect(self.measure_sensitivity)
        self.sensitivity.layer_chosen.connect(self._select_by_name)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.table, "Layers")
        self.tabs.addTab(self.sensitivity, "Sensitivity")
        # the recipe buttons beside the tabs, not in the controls: a recipe is the table's choices,
        # and the controls have no height to spare in a dock along the bottom
        recipe = QWidget()
        recipe_row = QHBoxLayout(recipe)
        recipe_row.setContentsMargins(0, 0, 0, 2)
        recipe_row.addWidget(QLabel("Recipe:"))
        recipe_row.addWidget(self.load_recipe_button)
        recipe_row.addWidget(self.save_recipe_button)
        self.tabs.setCornerWidget(recipe)
        # beside each other until the first resize says otherwise: the default dock is along the bottom
        self._layout = QBoxLayout(QBoxLayout.Direction.LeftToRight, self)
        self._layout.addWidget(self.tabs, 1)
        self._layout.addWidget(self._side)
        self._sync_controls()

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        # Docked along the bottom (wide and short) the controls go beside the table, so the table
        # keeps the height for its rows; docked in a column they go under it.
        size = event.size()
        wide = size.width() > WIDE * size.height()
        direction = QBoxLayout.Direction
        self._layout.setDirection(direction.LeftToRight if wide else direction.TopToBottom)
        self._side.setMaximumWidth(max(self._side.minimumWidth(), size.width() // 4) if wide else 16777215)
        super().resizeEvent(event)

    # ----- public API ------------------------------------------------------------------------------
    def set_network(self, net: VolumetricNetwork) -> None:
        """Show ``net``; its current dtypes become what Revert returns to and its outputs on a probe
        input (computed in a job) the reference for drift. A hidden panel does this when shown."""
        self._when_shown(lambda: self._set_network(net))

    def set_model(self, model: Any, probe_text: str = DEFAULT_PROBE_TEXT, max_probe_tokens: int = 64) -> None:
        """Show a language model's network (``model.net``); the reference for drift is its
        next-token distributions over ``probe_text``. A hidden panel does this when shown."""
        self._when_shown(lambda: self._set_model(model, probe_text, max_probe_tokens))

    def clear(self) -> None:
        """Show nothing (the model was unloaded): drop the table, its jobs and what was pending."""
        self._pending_show = None
        self._forget(None)
        self._index_rows([])
        self._bytes_original = 0
        with self._quietly():
            self.table.setRowCount(0)
        self.title.setText("No network")
        self._sync_controls()

    def select_layer_key(self, key: LayerKey) -> bool:
        """Select the row of the layer at ``key`` = (z, y, x, l, path), as another panel's selection,
        without announcing it back (:attr:`layer_selected` stays quiet). False when no row has it
        (a weightless layer, or another network's key): the selection is then cleared."""
        k = self._row_of_key.get(tuple(key))
        with self._quietly():
            if k is None:
                self.table.clearSelection()
            else:
                self.table.selectRow(self._table_row(k))
                self.table.scrollToItem(self._anchors[k])
        self._selected = None if k is None else self._rows[k].key
        self.sensitivity.select_layer(None if k is None else self._rows[k].name)
        return k is not None

    def selected_layer_key(self) -> LayerKey | None:
        """The key of the selected row, or None."""
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        return self._rows[self._data_row(rows[0].row())].key

    def _on_selection(self) -> None:
        key = self.selected_layer_key()
        if self._quiet or key is None or key == self._selected:
            return  # selected from code, or the same layer still (a re-sort moves, not changes, it)
        self._selected = key
        self.sensitivity.select_layer(self._rows[self._row_of_key[key]].name)
        self.layer_selected.emit(key)

    def _select_by_name(self, name: str) -> None:
        """The user chose a layer in the Sensitivity tab: select its row as if clicked there, so the
        other panels follow."""
        k = next((k for k, row in enumerate(self._rows) if row.name == name), None)
        if k is not None:
            self.table.selectRow(self._table_row(k))
            self.table.scrollToItem(self._anchors[k])

    @contextmanager
    def _quietly(self):
        quiet, self._quiet = self._quiet, True
        try:
            yield
        finally:
            self._quiet = quiet

    def _when_shown(self, show: Callable[[], None]) -> None:
        """Run ``show`` now if the panel is visible, else when it is next shown (the latest only):
        filling the table of a 30-block model takes the GUI thread ~60 ms, which a panel behind
        another tab should not cost a model's load."""
        self._pending_show = None
        if self._on_screen():
            show()
        else:
            self._pending_show = show

    def set_shown(self, shown: bool) -> None:
        """Whether the panel is on screen: a dock behind another dock's tab is not, though Qt
        still calls it visible (the window reports its dock's ``visibilityChanged`` here)."""
        self._shown = shown
        if self._on_screen():
            self._catch_up()

    def _on_screen(self) -> bool:
        return self._shown and self.isVisible()

    def _catch_up(self) -> None:
        """Show the network set while hidden, and start the jobs queued meanwhile."""
        self._show_pending()
        self._start_next()

    def _show_pending(self) -> None:
        show, self._pending_show = self._pending_show, None
        if show is not None:
            show()

    def _set_network(self, net: VolumetricNetwork) -> None:
        self._show(net, f"Network {net.depth}×{net.rows}×{net.cols}×{net.layers_per_cell}")
        probe = probe_input(net)  # the input `loomlab net morph-report` uses by default
        shape = "×".join(map(str, probe.shape))
        self.probe_label.setText(f"<b>Probe</b> seeded input (seed 0), shape {shape} — as "
                                 "<tt>loomlab net morph-report</tt>")

        def use(outputs) -> None:
            self._drift = lambda: {"output_drift": net_drift(outputs, net, probe)}

        self._submit("reference outputs", lambda job: net_outputs(net, probe), on_success=use)

    def _set_model(self, model: Any, probe_text: str, max_probe_tokens: int) -> None:
        self._show(model.net, f"Model {getattr(model, 'name', '') or type(model.net).__name__}")
        self._model = model
        # a language model's master is its file's weights dequantized: errors are against those
        self._reference = f"the weights as loaded ({', '.join(sorted({row.original for row in self._rows}))})"
        self._sync_controls()
        quoted = html.escape(probe_text)
        self.probe_label.setText(f"<b>Probe</b> “{quoted}” (counting tokens…)")

        def use(reference) -> None:
            self.probe_label.setText(f"<b>Probe</b> “{quoted}” — {reference.ids.size} tokens"
                                     + (f" (the first {max_probe_tokens})"
                                        if reference.ids.size == max_probe_tokens else ""))
            self._drift = lambda: {**compare(reference, llm_probe(model, probe_text, max_probe_tokens)),
                                   "probe_tokens": int(reference.ids.size)}

        self._submit("reference next-token distributions",
                     lambda job: llm_probe(model, probe_text, max_probe_tokens), on_success=use)

    def refresh(self) -> None:
        """Re-read every layer's dtype and bytes (after the network was morphed elsewhere); the
        weight errors follow from a job (:attr:`reported`)."""
        self._show_cheap_all()
        rows = list(self._rows)

        def reports(job: Job) -> list[MorphReport]:
            out = []
            for k, row in enumerate(rows):
                if job.is_cancelled():
                    break
                job.report("weight error", k, len(rows))
                out.append(layer_report(row.layer, row.index))
            return out

        self._submit("weight errors", reports, on_success=self._show_reports)

    def set_all_dtype(self, dtype: str) -> None:
        """Choose ``dtype`` in every row that takes it (a language model's norms take no block
        format: they stay float32, as in llama.cpp's files; a matrix whose rows are not whole
        blocks of it keeps its format); nothing changes until :meth:`apply`."""
        if dtype == NO_CHOICE:
            return
        with self._bulk_update():
            for k, row in enumerate(self._rows):
                if _takes(row, dtype):
                    self._choose(k, dtype)
        self._sync_controls()

    def choose_recipe(self, recipe: Mapping[str, str]) -> int:
        """Choose each named layer's dtype (``recipe``: layer name as the rows show it -> dtype,
        or :data:`AS_LOADED` for its format as loaded, e.g. a quantization recipe an evolution run
        found); nothing changes until :meth:`apply`. A network set while the panel was hidden is
        shown first, so the choice is not lost. Returns how many rows were chosen; names no row
        has, or dtypes a row cannot take, are summed up in the status line."""
        self._show_pending()
        rows = {row.name: k for k, row in enumerate(self._rows)}
        unknown = sorted(name for name in recipe if name not in rows)
        wanted = {name: self._rows[rows[name]].original if dtype == AS_LOADED else dtype
                  for name, dtype in recipe.items() if name in rows}
        bad = sorted(name for name, dtype in wanted.items() if not _takes(self._rows[rows[name]], dtype))
        with self._bulk_update():
            for name, dtype in wanted.items():
                if name not in bad:
                    self._choose(rows[name], dtype)
        self._sync_controls()
        chosen = len(wanted) - len(bad)
        problems = ([f"no layer named {_some(unknown)}"] if unknown else []) + \
                   ([f"a dtype they cannot take for {_some(bad)}"] if bad else [])
        self.status.setText(f"recipe: {format_count(chosen, 'layer')} chosen; press Apply to morph them"
                            + (f" ({'; '.join(problems)})" if problems else ""))
        return chosen

    def apply(self) -> None:
        """Morph every layer whose chosen dtype differs from its current one, then measure."""
        plan = [(row, self._combo(i).currentText()) for i, row in enumerate(self._rows)
                if self._combo(i).currentText() != row.current]
        self._morph(plan, "morph")

    def revert(self) -> None:
        """Morph every layer back to the dtype it had when the network was set, then measure."""
        self._morph([(row, row.original) for row in self._rows if row.current != row.original],
                    "revert")

    def chosen_recipe(self) -> dict[str, str]:
        """The formats chosen in the table that differ from the layers' formats as loaded, by layer
        name: the whole recipe that takes the file to what the table shows, applied or pending (a
        recipe of only the pending rows would be empty after Apply, and one of every row would name
        the file's own encodings, F32 norms and all, which are no morph)."""
        return {row.name: self._combo(k).currentText() for k, row in enumerate(self._rows)
                if self._combo(k).currentText() != row.original}

    def save_recipe(self, path: str) -> None:
        """Write :meth:`chosen_recipe` to ``path`` as JSON, atomically (a failed save leaves the old
        file or none)."""
        recipe = self.chosen_recipe()
        try:
            write_atomic(path, (json.dumps(recipe, indent=2) + "\n").encode("utf-8"))
        except OSError as e:
            self.status.setText(f"cannot save the recipe to {path}: {e.strerror or e}")
            return
        self.status.setText(f"saved a recipe of {len(recipe)} layers to {path}")

    def load_recipe(self, path: str) -> int:
        """Choose the formats the JSON recipe at ``path`` names, read as ``loomlab quant-report
        --recipe`` reads it (so it may name layers by tensor or position, or set "*"); the other
        rows go back to their current format. Nothing morphs until :meth:`apply`. Returns how many
        rows were chosen; a recipe the engine refuses is reported in the status line, and changes
        nothing."""
        from loomlab.core.llm.quality.drift import (  # the engine's reading of a recipe
            resolve_recipe,
            weighted_layers,
        )

        try:
            plan = resolve_recipe(self._net, path)
        except LoomConfigError as e:
            self.status.setText(f"recipe not loaded: {e}")
            return 0
        layers = weighted_layers(self._net)
        with self._bulk_update():
            for k, row in enumerate(self._rows):
                self._choose(k, row.current)
            return self.choose_recipe({layers[i].name: fmt for i, fmt in plan.items()})

    def measure_sensitivity(self) -> None:
        """Morph each layer whose chosen format differs from its current one (those the Sensitivity
        tab's patterns match) alone and rank them by KL, as ``loomlab quant-report --per-layer``
        does, in a job; the tab shows the result."""
        from loomlab.core.llm.quality.drift import DEFAULT_CTX, measure_drift

        model, view = self._model, self.sensitivity
        if model is None:
            self.status.setText("sensitivity is measured on a language model")
            return
        patterns = view.patterns()
        recipe = {row.name: self._combo(k).currentText() for k, row in enumerate(self._rows)
                  if self._combo(k).currentText() != row.current
                  and (not patterns or any(fnmatchcase(row.name, p) for p in patterns))}
        if not recipe:
            where = f" among the layers matching {' '.join(patterns)}" if patterns else ""
            self.status.setText(f"nothing to measure: choose formats other than the current ones{where}")
            return
        probe, ctx = view.probe, DEFAULT_CTX if view.ctx is None else view.ctx

        def work(job: Job):
            def progress(done: int, total: int, what: str) -> None:
                job.report(f"sensitivity: {what}", done, total)

            return measure_drift(model, recipe, probe, ctx=ctx, per_layer=True, progress=progress,
                                 cancel=job.is_cancelled)

        self._submit("sensitivity", work, on_success=self._sensitivity_measured)

    def _sensitivity_measured(self, report) -> None:
        self.sensitivity.show_report(report)
        worst = report.layers[0]
        self.status.setText(f"sensitivity of {len(report.layers)} layers in {report.seconds:.1f} s; most "
                            f"sensitive: {worst.name} ({worst.format}, KL mean {worst.stats.kl_mean:.6f})")

    def save_as(self, path: str) -> None:
        """Save the network (in its current dtypes) to ``path`` in a job; :attr:`saved` follows."""
        net = self._net
        self._submit("save", lambda job: save_network(net, path), on_success=lambda _: self._saved(path))

    def export_gguf(self, path: str) -> None:
        """Write the language model shown, in its current formats, to ``path`` as GGUF in a job
        (cancellable; a failure or cancel leaves no file); :attr:`saved` follows. Layers in a Loom
        dtype GGUF has no type for are named in the status line and nothing is written."""
        from loomlab.core.llm.quality.gguf_export import export_gguf, export_refusal

        model = self._model
        refusal = export_refusal(model)  # reads names and dtypes only: no need for a job
        if refusal:
            self.status.setText(f"not exported: {refusal}")
            return

        def work(job: Job):
            return export_gguf(model, path, progress=job.report, cancel=job.is_cancelled)

        self._submit("export", work, on_success=lambda result: self._saved(
            f"{result.path} ({format_bytes(result.nbytes)}, {result.changed} of {result.tensors} tensors "
            f"in new encodings)", str(result.path)))

    def is_busy(self) -> bool:
        return self._job is not None or bool(self._queue)

    def cancel(self) -> None:
        """Stop the running job (between layers) and drop the queued ones."""
        self._queue.clear()
        if self._job is not None:
            self._job.cancel()

    def shutdown(self) -> None:
        """Cancel and join this panel's jobs for good (the runner itself belongs to the caller)."""
        self._closed = True
        self._report_timer.stop()
        self.cancel()
        if self._job is not None:
            self._job.wait()
            self._job = None

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if self._on_screen():
            self._catch_up()

    # ----- the table -------------------------------------------------------------------------------
    def _forget(self, net: VolumetricNetwork | None) -> None:
        """Drop what belonged to the network shown so far: its jobs, reference, reports, measures."""
        self._generation += 1
        self.cancel()
        self._report_timer.stop()
        self._net, self._drift, self._reports, self._new_reports = net, None, {}, []
        self._model = None
        self._reference = FLOAT32_MASTER  # what layer errors are against; a language model names its file's
        self.sensitivity.clear()
        self.probe_label.setText("")
        for label in (self.memory_label, self.error_label, self.drift_label):
            label.setText("—")

    def _show(self, net: VolumetricNetwork, title: str) -> None:
        self._forget(net)
        rows = []
        for index, layer in weighted_cells(net):
            coord = net.coord(index)
            rows.append(_Row(index, coord, layer, layer.weights.encoding(layer.cfg.dtype),
                             layer_label(net, (*coord, layer.path))))
        self._bytes_original = net.memory_bytes()
        self.title.setText(f"<b>{html.escape(title)}</b> · {model_parts(net)} · "
                           f"{net.parameter_count():,} parameters · {format_bytes(self._bytes_original)}")
        with self._bulk_update(), self._quietly():
            self.table.setRowCount(0)
            self._index_rows(rows)
            self.table.setRowCount(len(rows))
            for k, row in enumerate(rows):
                self._fill_row(k, row)
        self._selected = None
        self.all_combo.clear()  # every target some row takes, in the rows' order
        targets = dict.fromkeys(t for row in rows for t in row.layer.weights.targets())
        self.all_combo.addItems([NO_CHOICE, *targets])
        self.all_combo.setCurrentText(NO_CHOICE)
        self.refresh()

    def _index_rows(self, rows: list[_Row]) -> None:
        self._rows, self._anchors = rows, []
        self._row_of = {row.report_key: k for k, row in enumerate(rows)}
        self._row_of_key = {row.key: k for k, row in enumerate(rows)}

    def _fill_row(self, k: int, row: _Row) -> None:
        """Row ``k`` of a table being filled in order (sorting is off while it fills)."""
        anchor = SortItem()
        self.table.setItem(k, CELL, anchor)
        self._anchors.append(anchor)
        # ties in a cell (a container's children) keep the traversal order; _data_row reads k back
        self._set(k, CELL, _cell_text(row.coord), row.coord, sort=(*row.coord, k))
        where = row.path or "the grid cell itself"
        self._set(k, LAYER, row.name).setToolTip(f"{where} · flat index {row.index}")
        self._set(k, TYPE, row.layer.type_name)
        combo = QComboBox()
        store, targets = row.layer.weights, row.layer.weights.targets()
        combo.addItems(targets)
        for i, target in enumerate(targets):  # e.g. Q4_K for rows of 576 weights: shown, not chosen
            why = store.refusal(target)
            if why:
                combo.model().item(i).setEnabled(False)
                combo.model().item(i).setToolTip(why)
        combo.setMinimumContentsLength(8)  # room for the longest name in bold (a pending choice)
        combo.currentTextChanged.connect(lambda _, r=k: self._on_user_choice(r))
        self.table.setCellWidget(k, DTYPE, combo)
        # rows as tall as the combo needs in the style now in use (the window may have changed
        # the style since this panel was built)
        header, need = self.table.verticalHeader(), combo.minimumSizeHint().height() + 1  # + the grid line
        if header.defaultSectionSize() < need:
            header.setDefaultSectionSize(need)

    def _show_cheap_all(self) -> None:
        with self._bulk_update():
            for k, row in enumerate(self._rows):
                self._show_cheap(k, row)
        self._sync_controls()

    @contextmanager
    def _bulk_update(self):
        """Resize columns and re-sort once after many cell changes: with ResizeToContents each
        setItem re-measured every row (1.5 s of GUI-thread stall for SmolLM2's 123 layers), and
        with sorting on each changed cell moved its row."""
        if self._bulk:
            yield
            return
        self._bulk = True
        self.table.setSortingEnabled(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        try:
            yield
        finally:
            self._resize_columns_to_contents()
            self.table.setSortingEnabled(True)  # sorts once, by the column last chosen
            self._bulk = False

    def _resize_columns_to_contents(self) -> None:
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(LAYER, QHeaderView.ResizeMode.Stretch)  # the names take the spare width

    def _show_cheap(self, k: int, row: _Row) -> None:
        """What needs no weights read: the dtype, parameters and bytes (errors come from a job)."""
        store, current = row.layer.weights, row.current
        stored = sum(n for _, n in store.stored(row.layer.cfg.dtype).values())
        self._choose(k, current)
        self._set(k, PARAMS, f"{len(store):,}", len(store))
        self._set(k, BYTES, f"{stored:,}", stored)
        if self._reports.get(row.report_key) is None or self._reports[row.report_key].dtype != current:
            for col in (REL_ERROR, REL_MSE, COSINE):
                self._set(k, col, "…")
        self._paint_row(k)

    def _queue_report(self, r: MorphReport) -> None:
        """A layer a job just morphed: drawn with the others of the same frame. Drawn one by one,
        a Revert's 123 reports, which arrive together, re-sorted the table 123 times in a row
        (0.5 s of GUI stall)."""
        self._new_reports.append(r)
        if not self._report_timer.isActive():
            self._report_timer.start()

    def _draw_new_reports(self) -> None:
        reports, self._new_reports = self._new_reports, []
        self._report_timer.stop()
        if reports:
            with self._bulk_update():
                for r in reports:
                    self._show_report(r)

    def _show_report(self, r: MorphReport) -> None:
        k = self._row_of.get((r.index, r.path))
        if k is None:
            return
        self._reports[(r.index, r.path)] = r
        self._choose(k, r.dtype)
        self._set(k, BYTES, f"{r.native_bytes:,}", r.native_bytes)
        self._set(k, REL_ERROR, f"{r.rel_error:.3e}", r.rel_error)
        self._set(k, REL_MSE, f"{r.rel_error ** 2:.3e}", r.rel_error ** 2)
        self._set(k, COSINE, f"{r.cosine:.6f}", r.cosine)
        self._paint_row(k)

    def _show_reports(self, reports: list[MorphReport]) -> None:
        with self._bulk_update():
            for r in reports:
                self._show_report(r)
        self._show_worst()
        self.reported.emit(reports)

    def _table_row(self, k: int) -> int:
        """Where row ``k`` of :attr:`_rows` is in the table as now sorted."""
        return self.table.row(self._anchors[k])

    def _data_row(self, table_row: int) -> int:
        return self.table.item(table_row, CELL).data(SORT_ROLE)[-1]

    def _set(self, k: int, col: int, text: str, value: Any = None, sort: Any = None) -> QTableWidgetItem:
        """Show ``text`` in row ``k``'s column ``col``; ``value`` is the cell's data (UserRole) and,
        unless ``sort`` is given, what it sorts by (text cells sort by their text)."""
        r = self._table_row(k)
        item = self.table.item(r, col)
        if item is None:
            item = SortItem()
            if col not in (LAYER, TYPE):
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.table.setItem(r, col, item)
        item.setText(text)
        item.setData(Qt.ItemDataRole.UserRole, value)
        item.setData(SORT_ROLE, sort if sort is not None else value if value is not None
                     else None if text == "…" else text)
        return item

    def _combo(self, k: int) -> QComboBox:
        return self.table.cellWidget(self._table_row(k), DTYPE)

    def _choose(self, k: int, dtype: str) -> None:
        """Show ``dtype`` in row ``k``'s combo without echoing it back as a user's choice."""
        combo = self._combo(k)
        combo.blockSignals(True)
        combo.setCurrentText(dtype)
        combo.blockSignals(False)
        self._set(k, DTYPE, "", dtype)  # under the combo: what the column sorts by
        self._style_choice(k)

    def _on_user_choice(self, k: int) -> None:
        self._style_choice(k)
        self._sync_controls()

    def _paint_row(self, k: int) -> None:
        """Tint the rows no longer in their original dtype, so they stand out among many."""
        row, r = self._rows[k], self._table_row(k)
        brush = QBrush(MORPHED_TINT) if row.current != row.original else QBrush()
        for col in range(len(COLUMNS)):
            item = self.table.item(r, col)
            if item is not None:
                item.setBackground(brush)

    def _style_choice(self, k: int) -> None:
        """A chosen dtype that differs from the layer's is pending: shown bold until applied."""
        combo = self._combo(k)
        font = combo.font()
        font.setBold(combo.currentText() != self._rows[k].current)
        combo.setFont(font)

    # ----- morphing and measuring --------------------------------------------------------------------
    def _morph(self, plan: list[tuple[_Row, str]], stage: str) -> None:
        if not plan:
            self.status.setText(f"nothing to {stage}")
            return
        net, drift, bytes_original = self._net, self._drift, self._bytes_original

        def work(job: Job) -> dict:
            reports = []
            for k, (row, dtype) in enumerate(plan):
                if job.is_cancelled():
                    break
                job.report(f"{stage} {row.name} → {dtype}", k, len(plan))
                reports.append(morph_sublayer(row.layer, row.index, dtype))
                job.emit_item(reports[-1])
            if job.is_cancelled():
                return None  # the job ends as cancelled: its result is not delivered
            job.report("measuring drift", 0, 0)
            now = net.memory_bytes()
            measures = {"bytes_original": bytes_original, "bytes_now": now,
                        "bytes_saved": bytes_original - now, **(drift() if drift is not None else {})}
            return {"reports": reports, "measures": measures}

        # a morph stopped half-way has changed some layers: on_stop shows which (and drops the
        # choices, now stale); a measurement that stops leaves layers and choices as they were
        self._submit(stage, work, on_item=self._queue_report, on_success=self._morph_done,
                     on_stop=lambda _: self._show_cheap_all())

    def _morph_done(self, result: dict) -> None:
        self._draw_new_reports()  # every layer's row is drawn before the measures go out
        measures = {**result["measures"], **self._show_worst()}
        self.all_combo.setCurrentText(NO_CHOICE)
        self._show_measures(measures)
        self.morphed.emit(result["reports"])
        self.measured.emit(measures)

    def _show_worst(self) -> dict:
        """The layer whose weights moved most from the master (largest relative error), named."""
        if not self._reports:
            return {}
        r = max(self._reports.values(), key=lambda r: r.rel_error)
        row = self._rows[self._row_of[(r.index, r.path)]]
        worst = {"rel_mse_max": r.rel_error ** 2, "cosine_min": min(r.cosine for r in self._reports.values()),
                 "worst_layer": row.key}
        if r.rel_error == 0:
            self.error_label.setText(f"none: every layer's weights equal {self._reference}")
        else:
            self.error_label.setText(f"{html.escape(row.name)} {_cell_text(row.coord)} ({r.dtype}): "
                                     f"rel. MSE {r.rel_error ** 2:.3e} · cosine {r.cosine:.6f} against "
                                     f"{self._reference}")
        return worst

    def _show_measures(self, m: dict) -> None:
        self.memory_label.setText(f"{format_bytes(m['bytes_original'])} → {format_bytes(m['bytes_now'])} "
                                  f"({format_size_change(m['bytes_original'], m['bytes_now'])})")
        if "kl_mean" in m:
            self.drift_label.setText(f"quick check on {m['probe_tokens']} tokens: KL mean {m['kl_mean']:.4g}"
                                     f" · max {m['kl_max']:.4g} nats · top-1 agreement "
                                     f"{m['top1_agreement']:.1%}")
            self.drift_label.setToolTip(QUICK_CHECK_TIP)
        elif "output_drift" in m:
            self.drift_label.setText(f"{m['output_drift']:.3e} relative (‖y − y₀‖ / ‖y₀‖ on the probe)")
        else:
            self.drift_label.setText("no unmorphed reference to compare with")

    def _ask_save_path(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save network as", "", "Loom checkpoint (*.loom)")
        if path:
            self.save_as(path if path.lower().endswith(".loom") else path + ".loom")

    def _ask_export_path(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export as GGUF", "", "GGUF model (*.gguf)")
        if path:
            self.export_gguf(path if path.lower().endswith(".gguf") else path + ".gguf")

    def _ask_recipe_save_path(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save recipe as", "", "Recipe (*.json)")
        if path:
            self.save_recipe(path if path.lower().endswith(".json") else path + ".json")

    def _ask_recipe_to_load(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load recipe", "", "Recipe (*.json);;All files (*)")
        if path:
            self.load_recipe(path)

    def _saved(self, what: str, path: str | None = None) -> None:
        self.status.setText(f"saved {what}")
        self.saved.emit(path or what)

    # ----- jobs: one at a time, so a morph never races the reference it is measured against ----------
    def _submit(self, name: str, fn: Callable[[Job], Any], **slots) -> None:
        self._queue.append((name, fn, {k: self._current(v) for k, v in slots.items()}))
        self._start_next()

    def _current(self, slot: Callable) -> Callable:
        """``slot``, dropped when the panel has since been given another network or closed."""
        generation = self._generation
        return lambda *args: None if self._closed or generation != self._generation else slot(*args)

    def _start_next(self) -> None:
        # Hidden (behind another dock's tab) the panel keeps its jobs queued until it is shown:
        # the weight errors and the reference distributions of a model just loaded would
        # otherwise take the CPU from the first chat reply.
        if self._job is None and self._queue and not self._closed and self._on_screen():
            name, fn, slots = self._queue.pop(0)
            on_success, on_stop = slots.pop("on_success", None), slots.pop("on_stop", None)
            generation = self._generation
            self._job = self._runner.start(
                fn, name=name, on_progress=self._on_progress, on_item=slots.get("on_item"),
                on_success=lambda result: self._ended(None, on_success, result),
                on_failure=lambda message: self._ended(f"{name} failed: {message}", on_stop),
                on_cancel=lambda: self._cancelled(name, generation, on_stop))
        self._sync_controls()

    def _cancelled(self, name: str, generation: int, on_stop: Callable | None) -> None:
        # Cancelled from outside too (runner.shutdown() when the window closes): start nothing
        # more, unless the job belonged to a network the panel has since been given.
        if generation == self._generation:
            self._queue.clear()
        self._ended(f"{name} cancelled", on_stop)

    def _ended(self, message: str | None, slot: Callable | None = None, result: Any = None) -> None:
        if self._closed:
            return
        self._job = None
        self.status.setText(message or "")
        if slot is not None:
            slot(result)
        self._start_next()

    def _on_progress(self, stage: str, done: int, total: int) -> None:
        if self._closed:
            return
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        self.status.setText(f"{stage} ({done}/{total})" if total else stage)

    def _sync_controls(self) -> None:
        idle, has = not self.is_busy(), bool(self._rows)
        pending = any(self._combo(k).currentText() != row.current for k, row in enumerate(self._rows))
        changed = any(row.current != row.original for row in self._rows)
        self.apply_button.setEnabled(idle and pending)
        self.revert_button.setEnabled(idle and changed)
        self.save_button.setEnabled(idle and has)
        self.export_button.setEnabled(idle and self._model is not None)
        self.load_recipe_button.setEnabled(idle and has)
        self.save_recipe_button.setEnabled(idle and has)
        self.sensitivity.set_available(idle and self._model is not None and pending,
                                       "" if self._model is not None else
                                       "Sensitivity is measured on a language model (KL of its next-token "
                                       "distributions)")
        self.all_combo.setEnabled(idle and has)
        self.table.setEnabled(idle)
        self.cancel_button.setEnabled(not idle)
        self.progress.setVisible(not idle)
        if idle:
            self.progress.setRange(0, 1)
            self.progress.setValue(1)


def _cell_text(coord: Coord) -> str:
    return "({}, {}, {}, {})".format(*coord)


def _some(names: list[str]) -> str:
    """The first :data:`NAMES_SHOWN` names, and how many more: a status line, not a list."""
    shown = ", ".join(names[:NAMES_SHOWN])
    return shown if len(names) <= NAMES_SHOWN else f"{shown} and {len(names) - NAMES_SHOWN} more"


def _takes(row: _Row, dtype: str) -> bool:
    """Whether ``row``'s layer can be morphed to ``dtype`` now."""
    store = row.layer.weights
    return dtype in store.targets() and not store.refusal(dtype)
