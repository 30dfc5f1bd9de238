"""The Run panel: run a Loom network forward on an input, or train it for a few epochs.

Forward: the input is the golden-style probe (the recipe of Loom's goldens, core/run_inputs.py),
a seeded random input, or a .npy / .json file; the output's shape, first values and statistics
are shown. Training: a small task chosen from the network's sizes (core/train_tasks.py), core's
training loop with the loss, optimizer, learning rate and epochs chosen here, a live loss curve
and Stop. Both run in a job, one at a time, on the network itself: training changes its weights
in place, so observers attached to it (the Telemetry panel) see forward and backward passes, and
panels that show its weights see the trained ones once :attr:`RunPanel.trained` is emitted.

Language models are refused: they run in the Chat panel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from loomlab.core.errors import LoomError
from loomlab.core.llm.model.causal_lm import CausalLM
from loomlab.core.network import VolumetricNetwork
from loomlab.core.run_inputs import fit_input, golden_probe, input_spec, random_input, read_input_file
from loomlab.core.train import LOSSES, OPTIMIZERS, TrainConfig, train
from loomlab.core.train_tasks import make_task

from .scrolling import scrolling
from .workers import Job, JobRunner

SOURCES = {"golden": "Golden-style probe", "random": "Random (seeded)", "file": "File (.npy / .json)"}
LANGUAGE_MODEL_NOTICE = "Language models run in the Chat panel."
SHOWN_VALUES = 8  # the output's first values listed
MAX_EPOCHS = 100_000  # the whole curve is handed to the plot on every redraw: keep it small
DEFAULT_PLOT_RATE_HZ = 10.0  # the loss curve is redrawn at most this often, whatever the epoch rate


class RunPanel(QWidget):
    """Forward runs and small training runs of a :class:`~loomlab.core.VolumetricNetwork`.

    Hand it a :class:`~loomlab.views.workers.JobRunner`, then :meth:`set_network`.
    """

    ran = Signal(object)  # the forward output (a numpy array) of a finished run
    trained = Signal(list)  # the epoch losses once training ends (finished or stopped): weights changed

    def __init__(self, runner: JobRunner, parent: QWidget | None = None, *,
                 plot_rate_hz: float = DEFAULT_PLOT_RATE_HZ):
        super().__init__(parent)
        if not 0 < plot_rate_hz <= 30:
            raise ValueError(f"plot_rate_hz must be in (0, 30], got {plot_rate_hz}")
        self._runner = runner
        self._net: VolumetricNetwork | None = None
        self._job: Job | None = None
        self._pending: Callable[[], None] | None = None  # what to start once the running job has ended
        self._generation = 0  # bumped by set_network: results of older jobs are dropped
        self._closed = False
        self._live: list[float] = []  # the running training's losses, appended by the worker
        self.losses: list[float] = []  # the loss curve's points
        self.last_input: np.ndarray | None = None
        self.last_output: np.ndarray | None = None
        self.task_name = ""
        self.plot_timer = QTimer(self)  # drains the losses into the curve while training
        self.plot_timer.setInterval(round(1000 / plot_rate_hz))
        self.plot_timer.timeout.connect(self._draw_losses)
        self._build_ui()
        self._sync_controls()

    # ----- layout ----------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.title = QLabel("No network")
        self.title.setWordWrap(True)

        self.source_box = QComboBox()
        for key, text in SOURCES.items():
            self.source_box.addItem(text, key)
        self.source_box.currentIndexChanged.connect(self._sync_controls)
        self.seed_box = QSpinBox()
        self.seed_box.setRange(0, 2**31 - 1)
        self.seed_box.setToolTip("Seed of the random input and of the training task's data")
        self.batch_box = QSpinBox()
        self.batch_box.setRange(1, 256)
        self.batch_box.setToolTip("Samples in a probe or random input (a KMeans network reads one)")
        self.path_edit = QLineEdit()
        self.path_edit.setPlaceholderText("input file: .npy or .json")
        self.browse_button = QPushButton("Browse…")
        self.browse_button.clicked.connect(self._ask_input_file)
        self.run_button = QPushButton("Run")
        self.run_button.clicked.connect(self.run_forward)
        path_row = QHBoxLayout()
        path_row.addWidget(self.path_edit, 1)
        path_row.addWidget(self.browse_button)
        self.output_view = QPlainTextEdit()
        self.output_view.setReadOnly(True)
        self.output_view.setPlaceholderText("the output of a run shows here")
        forward_form = QFormLayout()
        forward_form.addRow("Input", self.source_box)
        forward_form.addRow("Seed", self.seed_box)
        forward_form.addRow("Batch", self.batch_box)
        forward_form.addRow("File", path_row)
        forward_form.addRow("", self.run_button)
        # each form beside what it shows, and scrolling: docked along the bottom the panel is short
        forward = QGroupBox("Forward")
        forward_layout = QHBoxLayout(forward)
        forward_layout.addWidget(scrolling(forward_form))
        forward_layout.addWidget(self.output_view, 1)

        self.task_label = QLabel("—")
        self.task_label.setWordWrap(True)
        self.loss_box = QComboBox()
        self.loss_box.addItems(list(LOSSES))
        self.optimizer_box = QComboBox()
        self.optimizer_box.addItems(list(OPTIMIZERS))
        self.lr_box = QDoubleSpinBox()
        self.lr_box.setDecimals(5)
        self.lr_box.setRange(1e-5, 10.0)
        self.lr_box.setSingleStep(0.01)
        self.lr_box.setValue(0.05)
        self.epochs_box = QSpinBox()
        self.epochs_box.setRange(1, MAX_EPOCHS)
        self.epochs_box.setValue(200)
        self.train_button = QPushButton("Train")
        self.train_button.clicked.connect(self.train)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        buttons = QHBoxLayout()
        buttons.addWidget(self.train_button)
        buttons.addWidget(self.stop_button)
        train_form = QFormLayout()
        train_form.addRow("Task", self.task_label)
        train_form.addRow("Loss", self.loss_box)
        train_form.addRow("Optimizer", self.optimizer_box)
        train_form.addRow("Learning rate", self.lr_box)
        train_form.addRow("Epochs", self.epochs_box)
        train_form.addRow("", buttons)
        self.loss_plot = pg.PlotWidget()
        self.loss_plot.setLabel("bottom", "epoch")
        self.loss_plot.setLabel("left", "loss")
        self.loss_curve = self.loss_plot.plot([], [], pen=pg.mkPen("#f0a030", width=2))
        self.loss_curve.setDownsampling(auto=True, method="peak")  # a long run draws as fast as a short one
        self.loss_curve.setClipToView(True)
        training = QGroupBox("Training")
        training_layout = QHBoxLayout(training)
        training_layout.addWidget(scrolling(train_form))
        training_layout.addWidget(self.loss_plot, 1)

        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.status = QLabel("")
        self.status.setWordWrap(True)
        groups = QHBoxLayout()
        groups.addWidget(forward, 1)
        groups.addWidget(training, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addLayout(groups, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)

    # ----- public API ------------------------------------------------------------------------------
    @property
    def network(self) -> VolumetricNetwork | None:
        return self._net

    def set_network(self, net: VolumetricNetwork | None) -> None:
        """Run and train ``net`` from now on (None: nothing). A language model is refused."""
        if isinstance(getattr(net, "net", None), CausalLM):  # a loaded TextModel
            net = net.net
        if net is not None and not isinstance(net, VolumetricNetwork):
            raise TypeError(f"expected a VolumetricNetwork or None, got {type(net).__name__}")
        self._forget()
        self.output_view.clear()
        self._set_losses([])
        self.task_label.setText("—")
        self.task_name = ""
        if net is None:
            self.title.setText("No network")
        elif isinstance(net, CausalLM):
            self.title.setText(f"<b>{LANGUAGE_MODEL_NOTICE}</b> The Run panel runs and trains Loom networks.")
        else:
            self._show_network(net)
        self._sync_controls()

    def run_forward(self) -> None:
        """Run the network on the chosen input in a job; :attr:`ran` follows."""
        if not self._can_start():
            return
        source, net = self.source_box.currentData(), self._net
        seed, batch, path = self.seed_box.value(), self.batch_box.value(), self.path_edit.text().strip()
        if source == "file" and not path:
            self.status.setText("Choose an input file first.")
            return
        make_input: Callable[[], np.ndarray] = {
            "golden": lambda: golden_probe(net, batch),
            "random": lambda: random_input(net, seed, batch),
            "file": lambda: read_input_file(path),
        }[source]

        def work(job: Job):
            x = fit_input(net, make_input())
            net.reset_state()  # each run is a sequence of its own (attention keeps a KV cache)
            return x, net.backend.to_numpy(net.forward(x))

        self._start("run", work, self._show_output)

    def run_from_file(self, path: str) -> None:
        """Run the network on the input in ``path`` (.npy or .json)."""
        self.source_box.setCurrentIndex(self.source_box.findData("file"))
        self.path_edit.setText(str(path))
        self.run_forward()

    def train(self) -> None:
        """Train the network in place on its task with the chosen settings; :attr:`trained` follows."""
        if not self._can_start():
            return
        net, seed = self._net, self.seed_box.value()
        try:
            config = TrainConfig(epochs=self.epochs_box.value(), learning_rate=self.lr_box.value(),
                                 loss=self.loss_box.currentText(), optimizer=self.optimizer_box.currentText())
        except LoomError as e:
            self.status.setText(str(e))
            return
        live: list[float] = []
        self._live = live
        self._set_losses([])

        def on_epoch(job: Job, epoch: int, loss: float) -> None:
            live.append(loss)  # list.append is atomic: the GUI's timer reads it without a lock
            job.report("epoch", epoch + 1, config.epochs)

        def work(job: Job):
            task = make_task(net, seed, config.loss)
            job.emit_item(task)
            return train(net, task.batches, config, on_epoch=lambda e, loss: on_epoch(job, e, loss),
                         cancel=job.is_cancelled)

        self._start("train", work, self._trained, on_item=self._show_task,
                    on_end=lambda outcome: self._training_ended(live, outcome))
        self.plot_timer.start()

    def stop(self) -> None:
        """Stop the running job: training stops before its next batch."""
        if self._job is not None:
            self._job.cancel()

    @property
    def epochs_done(self) -> int:
        """Epochs the current (or last) training run has finished, counted by the worker."""
        return len(self._live)

    def is_busy(self) -> bool:
        return self._job is not None

    def shutdown(self) -> None:
        """Cancel and join this panel's job for good (the runner itself belongs to the caller)."""
        self._closed = True
        self.plot_timer.stop()
        self.stop()
        if self._job is not None:
            self._job.wait()
            self._job = None

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self.shutdown()
        super().closeEvent(event)

    # ----- network -----------------------------------------------------------------------------------
    def _show_network(self, net: VolumetricNetwork) -> None:
        shape = "×".join(str(n) for n in net.shape)
        try:
            reads = input_spec(net).describe()
        except LoomError as e:
            self.title.setText(f"<b>Network {shape}</b> · {e}")
            return
        self._net = net
        self.title.setText(f"<b>Network {shape}</b> · {net.parameter_count():,} parameters · reads {reads}")
        seed = self.seed_box.value()
        # the task depends on the output's size, known once the network has run: a quick job, after
        # the job of the previous network (cancelled) has ended
        self._pending = lambda: self._start("choose task", lambda job: make_task(net, seed), self._show_task)
        if self._can_start():
            self._start_pending()

    def _forget(self) -> None:
        self._generation += 1
        self._pending = None
        self.plot_timer.stop()
        self.stop()
        self._net, self._live = None, []
        self.last_input = self.last_output = None

    # ----- results -----------------------------------------------------------------------------------
    def _show_output(self, result: tuple[np.ndarray, np.ndarray]) -> None:
        x, y = result
        self.last_input, self.last_output = x, y
        self.output_view.setPlainText(describe_output(x, y))
        self.status.setText(f"ran on an input of shape {list(x.shape)}")
        self.ran.emit(y)

    def _show_task(self, task) -> None:
        self.task_name = task.name
        self.task_label.setText(task.description)

    def _trained(self, history) -> None:
        self.status.setText(f"trained {len(history)} epochs · loss {history[0]:.4g} → {history[-1]:.4g}"
                            if len(history) else "trained 0 epochs")

    def _training_ended(self, live: list[float], outcome: str) -> None:
        """Finished, stopped or failed: the curve shows every epoch that finished."""
        self.plot_timer.stop()
        self._set_losses(list(live))
        if outcome == "cancelled":
            self.status.setText(f"stopped after {len(live)} epochs")
        if live:
            self.trained.emit(list(live))

    def _draw_losses(self) -> None:
        if len(self._live) != len(self.losses):
            self._set_losses(self._live[:])

    def _set_losses(self, losses: list[float]) -> None:
        self.losses = losses
        self.loss_curve.setData(np.arange(len(losses)), np.asarray(losses, np.float64))

    def _ask_input_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Input for the network", "",
                                              "Arrays (*.npy *.json);;All files (*)")
        if path:
            self.run_from_file(path)

    # ----- jobs: one at a time, on the network the panel was given -----------------------------------
    def _can_start(self) -> bool:
        return self._job is None and not self._closed and self._net is not None

    def _start_pending(self) -> None:
        start, self._pending = self._pending, None
        if start is not None:
            start()

    def _start(self, name: str, fn: Callable[[Job], Any], on_success: Callable[[Any], None], *,
               on_item: Callable[[Any], None] | None = None,
               on_end: Callable[[str], None] | None = None) -> None:
        generation = self._generation

        def current(slot: Callable | None) -> Callable:
            """``slot``, dropped when the panel has since been given another network or closed."""
            return lambda *args: None if slot is None or self._closed or generation != self._generation \
                else slot(*args)

        def ended(outcome: str, message: str | None = None, result: Any = None) -> None:
            if self._closed:
                return
            self._job = None
            if generation == self._generation:
                self.status.setText(message or "")
                if on_end is not None:
                    on_end(outcome)
                if outcome == "succeeded":
                    on_success(result)
            self._sync_controls()
            self._start_pending()

        self._job = self._runner.start(
            fn, name=name, on_progress=current(self._on_progress), on_item=current(on_item),
            on_success=lambda result: ended("succeeded", result=result),
            on_failure=lambda message: ended("failed", f"{name} failed: {message}"),
            on_cancel=lambda: ended("cancelled", f"{name} stopped"))
        self.status.setText(f"{name}…")
        self._sync_controls()

    def _on_progress(self, stage: str, done: int, total: int) -> None:
        self.progress.setRange(0, total)
        self.progress.setValue(done)

    def _sync_controls(self) -> None:
        idle, has = not self.is_busy(), self._net is not None
        file_source = self.source_box.currentData() == "file"
        for w in (self.run_button, self.train_button, self.source_box, self.loss_box, self.optimizer_box,
                  self.lr_box, self.epochs_box, self.seed_box):
            w.setEnabled(idle and has)
        self.batch_box.setEnabled(idle and has and not file_source)
        self.path_edit.setEnabled(idle and has and file_source)
        self.browse_button.setEnabled(idle and has)
        self.stop_button.setEnabled(not idle)
        self.progress.setVisible(not idle)
        if idle:
            self.progress.setRange(0, 1)
            self.progress.setValue(1)


def describe_output(x: np.ndarray, y: np.ndarray) -> str:
    """The output's shape, first values and statistics (over its finite values), as shown."""
    flat = np.asarray(y, np.float64).ravel()
    first = ", ".join(f"{v:.6g}" for v in flat[:SHOWN_VALUES]) + (", …" if flat.size > SHOWN_VALUES else "")
    lines = [f"input shape  {list(x.shape)}", f"output shape {list(y.shape)} ({y.dtype})",
             f"first values [{first}]"]
    finite = flat[np.isfinite(flat)]
    if finite.size:
        lines.append(f"min {finite.min():.6g} · max {finite.max():.6g} · mean {finite.mean():.6g} · "
                     f"std {finite.std():.6g}")
    if finite.size < flat.size:
        lines.append(f"{flat.size - finite.size} of {flat.size} values are NaN or infinite")
    return "\n".join(lines)
