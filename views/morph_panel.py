"""The Morph panel: switch a network's layers between numeric types and see what it costs.

A table lists every weighted layer (nested ones too: a language model's layers sit inside its
blocks) with its dtype, parameters, bytes and the error of its weights against the float32
master. A dtype chosen per row, or for all rows at once, is applied in a background job, layer by
layer (a language model's master is built lazily from the file's blocks, which is slow for big
layers), and then measured: bytes saved against the network as it was set, and output drift on a
probe against the unmorphed network (MSE for a network, KL divergence and top-1 agreement of the
next-token distributions for a language model). Revert morphs every layer back to the dtype it had
when the network was set; that is lossless because morphing never changes the master. Jobs run one
at a time, and only while the panel is visible: hidden behind another tab it costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from loomlab.core import dtypes, save_network
from loomlab.core.layers.base import Layer
from loomlab.core.morph import MorphReport, morph_sublayer, probe_input, weighted_cells
from loomlab.core.morph_probe import compare, current_report, llm_probe, net_drift, net_outputs
from loomlab.core.network import VolumetricNetwork

from .workers import Job, JobRunner

COLUMNS = ("Cell", "Path", "Type", "dtype", "Parameters", "Bytes", "Rel. error", "Rel. MSE", "Cosine")
CELL, PATH, TYPE, DTYPE, PARAMS, BYTES, REL_ERROR, REL_MSE, COSINE = range(len(COLUMNS))
DTYPES = tuple(dtypes.FORMATS)
NO_CHOICE = "—"
MORPHED_TINT = QColor(255, 160, 0, 48)  # translucent: readable on light and dark palettes
DEFAULT_PROBE_TEXT = "The quick brown fox jumps over the lazy dog while the old cat sleeps in the warm sun."


@dataclass
class _Row:
    index: int
    layer: Layer
    original: str  # the dtype when the network was set: what Revert goes back to

    @property
    def key(self) -> tuple[int, str]:
        return self.index, getattr(self.layer, "path", "")


class MorphPanel(QWidget):
    """Per-layer precision morphing of a network or a language model, measured.

    Hand it a :class:`~loomlab.views.workers.JobRunner`, then :meth:`set_network` or
    :meth:`set_model`. Every morph, measurement and save runs as a job, one at a time.
    """

    morphed = Signal(list)  # the MorphReports of the layers an Apply or Revert changed
    measured = Signal(dict)  # bytes and output drift after an Apply or Revert
    reported = Signal(list)  # the table's MorphReports, after set_network / refresh
    saved = Signal(str)  # the path of a finished save

    def __init__(self, runner: JobRunner, parent: QWidget | None = None):
        super().__init__(parent)
        self._runner = runner
        self._net: VolumetricNetwork | None = None
        self._rows: list[_Row] = []
        self._row_of: dict[tuple[int, str], int] = {}
        self._reports: dict[tuple[int, str], MorphReport] = {}
        self._bytes_original = 0
        self._drift: Callable[[], dict] | None = None  # set once the unmorphed reference exists
        self._queue: list[tuple[str, Callable, dict]] = []
        self._pending_show: Callable[[], None] | None = None  # a network to show once on screen
        self._shown = True  # see set_shown
        self._job: Job | None = None
        self._generation = 0  # bumped by set_network: results of older jobs are dropped
        self._closed = False
        self._build_ui()

    # ----- layout ----------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.title = QLabel("No network")
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(PATH, QHeaderView.ResizeMode.Stretch)

        self.all_combo = QComboBox()
        self.all_combo.addItems([NO_CHOICE, *DTYPES])
        self.all_combo.setToolTip("Choose one dtype for every layer (then Apply)")
        self.all_combo.textActivated.connect(self.set_all_dtype)
        self.apply_button = QPushButton("Apply")
        self.apply_button.clicked.connect(self.apply)
        self.revert_button = QPushButton("Revert")
        self.revert_button.setToolTip("Morph every layer back to the dtype it had when loaded (lossless)")
        self.revert_button.clicked.connect(self.revert)
        self.save_button = QPushButton("Save as .loom…")
        self.save_button.clicked.connect(self._ask_save_path)
        controls = QHBoxLayout()
        controls.addWidget(QLabel("All layers:"))
        for w in (self.all_combo, self.apply_button, self.revert_button):
            controls.addWidget(w)
        controls.addStretch(1)
        controls.addWidget(self.save_button)

        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.status = QLabel("")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        busy = QHBoxLayout()
        busy.addWidget(self.progress, 1)
        busy.addWidget(self.status, 2)
        busy.addWidget(self.cancel_button)

        self.memory_label, self.error_label, self.drift_label = QLabel("—"), QLabel("—"), QLabel("—")
        summary = QGridLayout()
        for row, (name, label) in enumerate((("Memory", self.memory_label), ("Worst layer", self.error_label),
                                             ("Output drift", self.drift_label))):
            summary.addWidget(QLabel(f"<b>{name}</b>"), row, 0)
            summary.addWidget(label, row, 1)
        summary.setColumnStretch(1, 1)

        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.table, 1)
        layout.addLayout(controls)
        layout.addLayout(summary)
        layout.addLayout(busy)
        self._sync_controls()

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
        self._rows, self._row_of, self._bytes_original = [], {}, 0
        self.table.setRowCount(0)
        self.title.setText("No network")
        self._sync_controls()

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
        show, self._pending_show = self._pending_show, None
        if show is not None:
            show()
        self._start_next()

    def _set_network(self, net: VolumetricNetwork) -> None:
        self._show(net, f"Network {net.depth}×{net.rows}×{net.cols}×{net.layers_per_cell}")

        def reference(job: Job):
            probe = probe_input(net)
            return probe, net_outputs(net, probe)

        def use(result) -> None:
            probe, outputs = result
            self._drift = lambda: {"mse": net_drift(outputs, net, probe)}

        self._submit("reference outputs", reference, on_success=use)

    def _set_model(self, model: Any, probe_text: str, max_probe_tokens: int) -> None:
        self._show(model.net, f"Model {getattr(model, 'name', '') or type(model.net).__name__}")

        def use(reference) -> None:
            self._drift = lambda: compare(reference, llm_probe(model, probe_text, max_probe_tokens))

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
                out.append(current_report(row.layer, row.index))
            return out

        self._submit("weight errors", reports, on_success=self._show_reports)

    def set_all_dtype(self, dtype: str) -> None:
        """Choose ``dtype`` in every row (nothing changes until :meth:`apply`)."""
        if dtype == NO_CHOICE:
            return
        for i in range(len(self._rows)):
            self._choose(i, dtype)
        self._sync_controls()

    def apply(self) -> None:
        """Morph every layer whose chosen dtype differs from its current one, then measure."""
        plan = [(row, self._combo(i).currentText()) for i, row in enumerate(self._rows)
                if self._combo(i).currentText() != row.layer.cfg.dtype]
        self._morph(plan, "morph")

    def revert(self) -> None:
        """Morph every layer back to the dtype it had when the network was set, then measure."""
        self._morph([(row, row.original) for row in self._rows if row.layer.cfg.dtype != row.original],
                    "revert")

    def save_as(self, path: str) -> None:
        """Save the network (in its current dtypes) to ``path`` in a job; :attr:`saved` follows."""
        net = self._net
        self._submit("save", lambda job: save_network(net, path), on_success=lambda _: self._saved(path))

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
        self._net, self._drift, self._reports = net, None, {}
        for label in (self.memory_label, self.error_label, self.drift_label):
            label.setText("—")

    def _show(self, net: VolumetricNetwork, title: str) -> None:
        self._forget(net)
        self._rows = [_Row(index, layer, layer.cfg.dtype) for index, layer in weighted_cells(net)]
        self._row_of = {row.key: i for i, row in enumerate(self._rows)}
        self._bytes_original = net.memory_bytes()
        params = sum(len(row.layer.weights) for row in self._rows)
        self.title.setText(f"<b>{title}</b> · {len(self._rows)} weighted layers · {params:,} parameters · "
                           f"{_human(self._bytes_original)}")
        with self._bulk_update():
            self.table.setRowCount(len(self._rows))
            for i, row in enumerate(self._rows):
                self._fill_row(i, row)
        self.all_combo.setCurrentText(NO_CHOICE)
        self.refresh()

    def _fill_row(self, i: int, row: _Row) -> None:
        path = getattr(row.layer, "path", "")
        self._set(i, CELL, str(row.index), row.index)
        self._set(i, PATH, _short_path(path) or "·", path).setToolTip(path or "the grid cell itself")
        self._set(i, TYPE, row.layer.type_name)
        combo = QComboBox()
        combo.addItems(DTYPES)
        combo.setMinimumContentsLength(8)  # room for the longest name in bold (a pending choice)
        combo.currentTextChanged.connect(lambda _, r=i: self._on_user_choice(r))
        self.table.setCellWidget(i, DTYPE, combo)

    def _show_cheap_all(self) -> None:
        with self._bulk_update():
            for i, row in enumerate(self._rows):
                self._show_cheap(i, row)
        self._sync_controls()

    @contextmanager
    def _bulk_update(self):
        """Resize columns once after many cell changes: with ResizeToContents each setItem
        re-measured every row (1.5 s of GUI-thread stall for SmolLM2's 123 layers)."""
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        try:
            yield
        finally:
            header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)

    def _show_cheap(self, i: int, row: _Row) -> None:
        """What needs no weights read: the dtype, parameters and bytes (errors come from a job)."""
        store, dtype = row.layer.weights, row.layer.cfg.dtype
        self._choose(i, dtype)
        self._set(i, PARAMS, f"{len(store):,}", len(store))
        self._set(i, BYTES, f"{store.nbytes(dtype):,}", store.nbytes(dtype))
        if self._reports.get(row.key) is None or self._reports[row.key].dtype != dtype:
            for col in (REL_ERROR, REL_MSE, COSINE):
                self._set(i, col, "…")
        self._paint_row(i)

    def _show_report(self, r: MorphReport) -> None:
        i = self._row_of.get((r.index, r.path))
        if i is None:
            return
        self._reports[(r.index, r.path)] = r
        self._choose(i, r.dtype)
        self._set(i, BYTES, f"{r.native_bytes:,}", r.native_bytes)
        self._set(i, REL_ERROR, f"{r.rel_error:.3e}", r.rel_error)
        self._set(i, REL_MSE, f"{r.rel_error ** 2:.3e}", r.rel_error ** 2)
        self._set(i, COSINE, f"{r.cosine:.6f}", r.cosine)
        self._paint_row(i)

    def _show_reports(self, reports: list[MorphReport]) -> None:
        with self._bulk_update():
            for r in reports:
                self._show_report(r)
        self._show_worst()
        self.reported.emit(reports)

    def _set(self, i: int, col: int, text: str, value: Any = None) -> QTableWidgetItem:
        item = QTableWidgetItem(text)
        item.setData(Qt.ItemDataRole.UserRole, value)
        if col not in (PATH, TYPE):
            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.table.setItem(i, col, item)
        return item

    def _combo(self, i: int) -> QComboBox:
        return self.table.cellWidget(i, DTYPE)

    def _choose(self, i: int, dtype: str) -> None:
        """Show ``dtype`` in row ``i``'s combo without echoing it back as a user's choice."""
        combo = self._combo(i)
        combo.blockSignals(True)
        combo.setCurrentText(dtype)
        combo.blockSignals(False)
        self._style_choice(i)

    def _on_user_choice(self, i: int) -> None:
        self._style_choice(i)
        self._sync_controls()

    def _paint_row(self, i: int) -> None:
        """Tint the rows no longer in their original dtype, so they stand out among many."""
        row = self._rows[i]
        brush = QBrush(MORPHED_TINT) if row.layer.cfg.dtype != row.original else QBrush()
        for col in range(len(COLUMNS)):
            item = self.table.item(i, col)
            if item is not None:
                item.setBackground(brush)

    def _style_choice(self, i: int) -> None:
        """A chosen dtype that differs from the layer's is pending: shown bold until applied."""
        combo = self._combo(i)
        font = combo.font()
        font.setBold(combo.currentText() != self._rows[i].layer.cfg.dtype)
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
                job.report(f"{stage} {row.layer.type_name} {row.key[0]} {_short_path(row.key[1])} → {dtype}",
                           k, len(plan))
                reports.append(morph_sublayer(row.layer, row.index, dtype))
                job.emit_item(reports[-1])
            if job.is_cancelled():
                return None  # the job ends as cancelled: its result is not delivered
            job.report("measuring drift", 0, 0)
            now = net.memory_bytes()
            measures = {"bytes_original": bytes_original, "bytes_now": now,
                        "bytes_saved": bytes_original - now, **(drift() if drift is not None else {})}
            return {"reports": reports, "measures": measures}

        self._submit(stage, work, on_item=self._show_report, on_success=self._morph_done)

    def _morph_done(self, result: dict) -> None:
        measures = {**result["measures"], **self._show_worst()}
        self.all_combo.setCurrentText(NO_CHOICE)
        self._show_measures(measures)
        self.morphed.emit(result["reports"])
        self.measured.emit(measures)

    def _show_worst(self) -> dict:
        """The largest weight error over the table's layers (relative MSE and cosine)."""
        if not self._reports:
            return {}
        worst = {"rel_mse_max": max(r.rel_error ** 2 for r in self._reports.values()),
                 "cosine_min": min(r.cosine for r in self._reports.values())}
        self.error_label.setText(f"rel. MSE {worst['rel_mse_max']:.3e} · cosine {worst['cosine_min']:.6f}")
        return worst

    def _show_measures(self, m: dict) -> None:
        share = m["bytes_saved"] / m["bytes_original"] if m["bytes_original"] else 0.0
        self.memory_label.setText(f"{_human(m['bytes_original'])} → {_human(m['bytes_now'])} "
                                  f"(saved {_human(m['bytes_saved'])}, {share:.1%})")
        if "kl_mean" in m:
            self.drift_label.setText(f"KL mean {m['kl_mean']:.4g} · max {m['kl_max']:.4g} nats · "
                                     f"top-1 agreement {m['top1_agreement']:.1%}")
        elif "mse" in m:
            self.drift_label.setText(f"MSE {m['mse']:.4g} on the probe input")
        else:
            self.drift_label.setText("no unmorphed reference to compare with")

    def _ask_save_path(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save network as", "", "Loom checkpoint (*.loom)")
        if path:
            self.save_as(path if path.lower().endswith(".loom") else path + ".loom")

    def _saved(self, path: str) -> None:
        self.status.setText(f"saved {path}")
        self.saved.emit(path)

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
            on_success, generation = slots.pop("on_success", None), self._generation
            self._job = self._runner.start(
                fn, name=name, on_progress=self._on_progress, on_item=slots.get("on_item"),
                on_success=lambda result: self._ended(None, on_success, result),
                on_failure=lambda message: self._ended(f"{name} failed: {message}"),
                on_cancel=lambda: self._cancelled(name, generation))
        self._sync_controls()

    def _cancelled(self, name: str, generation: int) -> None:
        # Cancelled from outside too (runner.shutdown() when the window closes): start nothing
        # more, unless the job belonged to a network the panel has since been given.
        if generation == self._generation:
            self._queue.clear()
        self._ended(f"{name} cancelled")

    def _ended(self, message: str | None, slot: Callable | None = None, result: Any = None) -> None:
        if self._closed:
            return
        self._job = None
        self.status.setText(message or "")
        if slot is not None:
            slot(result)
        if message is not None:  # a morph stopped half-way has changed some layers: show which
            self._show_cheap_all()
        self._start_next()

    def _on_progress(self, stage: str, done: int, total: int) -> None:
        if self._closed:
            return
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        self.status.setText(f"{stage} ({done}/{total})" if total else stage)

    def _sync_controls(self) -> None:
        idle, has = not self.is_busy(), bool(self._rows)
        pending = any(self._combo(i).currentText() != row.layer.cfg.dtype for i, row in enumerate(self._rows))
        changed = any(row.layer.cfg.dtype != row.original for row in self._rows)
        self.apply_button.setEnabled(idle and pending)
        self.revert_button.setEnabled(idle and changed)
        self.save_button.setEnabled(idle and has)
        self.all_combo.setEnabled(idle and has)
        self.table.setEnabled(idle)
        self.cancel_button.setEnabled(not idle)
        self.progress.setVisible(not idle)
        if idle:
            self.progress.setRange(0, 1)
            self.progress.setValue(1)


def _short_path(path: str) -> str:
    """A nested layer's path in fewer letters: ``seq[2].seq[1]``."""
    return path.replace("sequential_layers", "seq").replace("parallel_branches", "par")


def _human(n: float) -> str:
    for unit in ("B", "KB", "MB"):
        if abs(n) < 1024:
            return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GB"
