"""The Evolution panel: set up an evolution run, start, pause, stop and resume it, and watch it.

The form is turned into the same nested settings a ``loomlab evolve`` TOML file holds and built
by :func:`loomlab.core.evolve.search.run_config.plan_from_dict`, so a run started here and one started
from the command line with the same settings and seed give the same history. The form is
validated as it is typed: an invalid value shows why and disables Start.

A run is an :class:`~loomlab.core.evolve.search.run.Evolution` in a child process
(:mod:`loomlab.core.evolve.search.run_process`; a quant-recipe run, which morphs the loaded model, on a
job's thread instead). Its :class:`~loomlab.core.evolve.search.live.LiveReporter` sends live events, which
the job hands a :class:`~loomlab.core.evolve.search.live.LiveBuffer` (every generation's statistics, the
latest population table, the latest best member); a QTimer on the GUI thread drains the buffer a
few times a second and redraws once per tick, however many generations went by. Pause stops
the run after the current generation's checkpoint; Stop stops it at once (the generation being
evaluated is dropped, the last checkpoint stays); either can be resumed from the list of the
workspace's runs, continuing the same history.

Signals: :attr:`EvolutionPanel.best_changed` (the best network so far, for the Topology view)
and :attr:`EvolutionPanel.recipe_chosen` (``{layer: dtype}`` of a quant-recipe member, for the
Morph panel).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from loomlab.core.errors import LoomConfigError, LoomError
from loomlab.core.evolve.genetics.neat import NEATConfig
from loomlab.core.evolve.search.live import (
    KEEP_GENE,
    Event,
    LiveBuffer,
    LiveReporter,
    MemberRow,
    Progress,
    RunStarted,
    run_live,
)
from loomlab.core.evolve.search.reporters import GenerationStats
from loomlab.core.evolve.search.run import Evolution, RunResult
from loomlab.core.evolve.search.run_config import RunPlan, model_source, plan_from_dict
from loomlab.core.evolve.search.run_process import run_in_child
from loomlab.core.evolve.search.tasks import TASKS
from loomlab.core.io import save_network
from loomlab.core.io.checkpoint import checkpoint_from_bytes
from loomlab.core.network import VolumetricNetwork
from loomlab.core.units import format_bytes
from loomlab.core.workspace.evolution_runs import EvolutionRuns
from loomlab.core.workspace.store import Workspace, WorkspaceError

from .morph_panel import AS_LOADED
from .scrolling import scrolling
from .sort_items import row_table
from .workers import Job, JobRunner

RECIPE_TASK = "quant-recipe"
TASK_NAMES = (*TASKS, RECIPE_TASK)
#: the NEAT settings the form shows, with their labels (the rest keep the task's defaults)
NEAT_FIELDS = {
    "weight_perturb_rate": "Weight perturb rate", "weight_perturb_scale": "Weight perturb scale",
    "node_mutate_rate": "Node mutate rate", "connection_add_rate": "Connection add rate",
    "connection_drop_rate": "Connection drop rate", "activation_mut_rate": "Activation mutate rate",
    "layer_toggle_rate": "Layer toggle rate",
}
SCHEDULERS = {"inprocess": "In this process", "local": "Local cluster (Dask)", "address": "Scheduler address"}
COLUMNS = ("Rank", "Species", "Fitness", "Layer types", "Parameters")
RECIPE_SIZE_COLUMN = "Weight size"  # the last column of a recipe run: a member's packed bytes
MIB = 2 ** 20  # the recipe scatter's x axis is in MiB, as sizes are everywhere
COLUMN_WIDTHS = (44, 60, 80, 130)
RUN_BOX_MAX_WIDTH = 380  # the form's column; the plots take the rest
MAX_RATE_HZ = 30.0
DEFAULT_RATE_HZ = 4.0  # redraws a second while a run goes: a generation of XOR takes ~20 ms
NO_MODEL = "Load a language model first: the quant-recipe task evolves its per-layer dtypes."
FITNESS_PENS = {"best": "#2ca02c", "mean": "#1f77b4", "worst": "#d62728"}
SPECIES_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
                   "#ff9da7", "#9c755f", "#bab0ac")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (both minimised: bytes and
    KL), in increasing first coordinate; of equal points, the first."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front, best_y = [], float("inf")
    for i in order:
        if points[i][1] < best_y:
            front.append(i)
            best_y = points[i][1]
    return front


def species_stack(history: Sequence[GenerationStats]) -> tuple[list[int], np.ndarray]:
    """The species plot's data: species ids (ascending) and ``tops[k, g]``, the top edge of species
    ``ids[k]``'s band at generation ``history[g]`` (sizes of species ``ids[:k+1]`` summed)."""
    ids = sorted({sid for s in history for sid in s.species})
    sizes = np.array([[s.species.get(sid, 0) for s in history] for sid in ids], np.float64)
    return ids, np.cumsum(sizes, axis=0) if ids else np.zeros((0, len(history)))


class EvolutionPanel(QWidget):
    """Set up, run and watch evolution experiments (see the module docstring).

    Args:
        runner: the window's job runner.
        workspace: where runs are checkpointed and listed (:meth:`set_workspace`).
        rate_hz: redraws a second while a run goes (at most 30).
    """

    best_changed = Signal(object)  # the best VolumetricNetwork of the run so far
    recipe_chosen = Signal(dict)  # {layer name: dtype} of the chosen quant-recipe member
    run_ended = Signal(object)  # the RunResult of a run that finished, solved or stopped

    def __init__(self, runner: JobRunner, workspace: Workspace | None = None, parent: QWidget | None = None,
                 *, rate_hz: float = DEFAULT_RATE_HZ):
        super().__init__(parent)
        if not 0 < rate_hz <= MAX_RATE_HZ:
            raise ValueError(f"rate_hz must be in (0, {MAX_RATE_HZ:g}], got {rate_hz}")
        self._runner = runner
        self._workspace: Workspace | None = None
        self._model = None
        self._job: Job | None = None
        self._pause: threading.Event | None = None
        self._buffer = LiveBuffer()
        self._closed = False
        self._shown = True
        self._plan: RunPlan | None = None
        self.run_id: int | None = None
        self.task_name = ""
        self.history: list[GenerationStats] = []
        self.rows: list[MemberRow] = []
        self.best: Any = None
        self.best_fitness = float("-inf")
        self.layer_names: tuple[str, ...] = ()
        self.front: list[int] = []  # indices into rows of the recipe scatter's Pareto front
        self.selected_row: int | None = None
        self.timer = QTimer(self)  # drains the buffer while a run goes
        self.timer.setInterval(round(1000 / rate_hz))
        self.timer.timeout.connect(self._tick)
        self._build_ui()
        self.set_workspace(workspace)

    # ----- layout ----------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.task_box = QComboBox()
        for name in TASK_NAMES:
            self.task_box.addItem(name, name)
        self.population_edit = QLineEdit("50")
        self.generations_edit = QLineEdit("50")
        self.generations_edit.setToolTip("Generations to run; for Resume, generations to add")
        self.seed_edit = QLineEdit("1")
        self.seed_edit.setPlaceholderText("random")
        self.seed_edit.setToolTip("Seeds the whole run: the same seed repeats it exactly (empty: random)")
        defaults = NEATConfig.default(1, seed=0)
        self.rate_edits = {name: QLineEdit(f"{getattr(defaults, name):.6g}") for name in NEAT_FIELDS}
        self.speciation_check = QCheckBox("Speciation")
        self.speciation_check.setChecked(True)
        self.threshold_edit = QLineEdit("0.15")
        self.threshold_edit.setToolTip("Where the compatibility threshold starts "
                                       "(it adapts towards 10 species)")
        self.scheduler_box = QComboBox()
        for key, text in SCHEDULERS.items():
            self.scheduler_box.addItem(text, key)
        self.address_edit = QLineEdit()
        self.address_edit.setPlaceholderText("tcp://host:8786")
        self.message = QLabel("")
        self.message.setWordWrap(True)
        # bold in the palette's own text colour: a fixed red fails contrast on one of the themes
        font = self.message.font()
        font.setBold(True)
        self.message.setFont(font)

        form = QFormLayout()
        form.addRow("Task", self.task_box)
        form.addRow("Population", self.population_edit)
        form.addRow("Generations", self.generations_edit)
        form.addRow("Seed", self.seed_edit)
        for name, label in NEAT_FIELDS.items():
            form.addRow(label, self.rate_edits[name])
        threshold_row = QHBoxLayout()
        threshold_row.addWidget(self.speciation_check)
        threshold_row.addWidget(QLabel("threshold"))
        threshold_row.addWidget(self.threshold_edit, 1)
        form.addRow("", threshold_row)
        form.addRow("Scheduler", self.scheduler_box)
        form.addRow("Address", self.address_edit)

        self.start_button = QPushButton("Start")
        self.start_button.clicked.connect(self.start)
        self.pause_button = QPushButton("Pause")
        self.pause_button.setToolTip("Stop after the current generation's checkpoint")
        self.pause_button.clicked.connect(self.pause)
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        buttons = QHBoxLayout()
        for b in (self.start_button, self.pause_button, self.stop_button):
            buttons.addWidget(b)
        self.runs_box = QComboBox()
        self.runs_box.setToolTip("The workspace's runs: Resume continues the chosen one")
        self.resume_button = QPushButton("Resume")
        self.resume_button.clicked.connect(lambda: self.resume())
        resume_row = QHBoxLayout()
        resume_row.addWidget(self.runs_box, 1)
        resume_row.addWidget(self.resume_button)
        self.export_button = QPushButton("Export best…")
        self.export_button.clicked.connect(self._ask_export)
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.status = QLabel("")
        self.status.setWordWrap(True)

        run_box = QGroupBox("Run")
        run_layout = QVBoxLayout(run_box)
        run_layout.addLayout(form)
        run_layout.addWidget(self.message)
        run_layout.addLayout(buttons)
        run_layout.addWidget(QLabel("Past runs"))
        run_layout.addLayout(resume_row)
        run_layout.addWidget(self.export_button)
        run_layout.addWidget(self.progress)
        run_layout.addWidget(self.status)
        run_layout.addStretch(1)

        self.fitness_plot = pg.PlotWidget()
        self.fitness_plot.setLabel("bottom", "generation")
        self.fitness_plot.setLabel("left", "fitness")
        self.fitness_plot.addLegend(offset=(-10, 10))
        self.curves = {k: self.fitness_plot.plot([], [], pen=pg.mkPen(c, width=2), name=k)
                       for k, c in FITNESS_PENS.items()}
        self.species_plot = pg.PlotWidget()
        self.species_plot.setLabel("bottom", "generation")
        self.species_plot.setLabel("left", "members per species")
        self.species_base = pg.PlotCurveItem()  # the zero line the lowest species' area starts at
        self.species_layers: list[tuple[pg.PlotCurveItem, pg.FillBetweenItem]] = []  # bottom first
        self.table = row_table(COLUMNS)
        self.table.setWordWrap(False)
        self.table.horizontalHeader().setStretchLastSection(True)
        for column, width in enumerate(COLUMN_WIDTHS):  # fixed: sizing to contents re-measures every row
            self.table.setColumnWidth(column, width)
        self.table.itemSelectionChanged.connect(self._table_selection)

        self.recipe_plot = pg.PlotWidget()
        self.recipe_plot.setLabel("bottom", "weight size (MiB)")
        self.recipe_plot.setLabel("left", "KL (nats)")
        self.recipe_points = pg.ScatterPlotItem(size=7, brush=pg.mkBrush(150, 150, 150, 160), pen=None)
        self.recipe_points.sigClicked.connect(self._point_clicked)
        self.front_line = pg.PlotDataItem([], [], pen=pg.mkPen("#d62728", width=1.5), symbol="o",
                                          symbolBrush="#d62728", symbolSize=8)
        self.chosen_point = pg.ScatterPlotItem(size=14, brush=None, pen=pg.mkPen("#f0a030", width=2))
        for item in (self.recipe_points, self.front_line, self.chosen_point):
            self.recipe_plot.addItem(item)
        self.apply_button = QPushButton("Apply recipe")
        self.apply_button.setToolTip("Send the chosen member's dtypes to the Morph panel")
        self.apply_button.clicked.connect(self.apply_recipe)
        self.recipe_box = QGroupBox("Recipes: weight size vs KL (Pareto front in red)")
        recipe_layout = QVBoxLayout(self.recipe_box)
        recipe_layout.addWidget(self.recipe_plot, 1)
        recipe_layout.addWidget(self.apply_button)
        self.recipe_box.hide()

        # fitness across the top; below it the species (or, for recipes, the bytes-vs-KL scatter)
        # beside the population table
        lower = QSplitter(Qt.Orientation.Horizontal)
        lower.addWidget(self.species_plot)
        lower.addWidget(self.recipe_box)
        lower.addWidget(self.table)
        lower.setSizes([1000, 1000, 1000])  # equal shares (a hidden one's goes to the others)
        plots = QSplitter(Qt.Orientation.Vertical)
        plots.addWidget(self.fitness_plot)
        plots.addWidget(lower)
        run_box.setMaximumWidth(RUN_BOX_MAX_WIDTH)
        layout = QHBoxLayout(self)
        layout.addWidget(scrolling(run_box))
        layout.addWidget(plots, 1)

        for edit in (self.population_edit, self.generations_edit, self.seed_edit, self.threshold_edit,
                     self.address_edit, *self.rate_edits.values()):
            edit.textChanged.connect(self._validate)
        self.task_box.currentIndexChanged.connect(self._validate)
        self.scheduler_box.currentIndexChanged.connect(self._validate)
        self.speciation_check.toggled.connect(self._validate)
        self.runs_box.currentIndexChanged.connect(self._sync_controls)

    # ----- public API ------------------------------------------------------------------------------
    @property
    def workspace(self) -> Workspace | None:
        return self._workspace

    def set_workspace(self, workspace: Workspace | None) -> None:
        """Checkpoint runs into ``workspace`` and list its runs (None: runs are not kept)."""
        self._workspace = workspace
        self.refresh_runs()
        self._validate()

    def set_model(self, model) -> None:
        """The loaded language model the quant-recipe task evolves (None: none is loaded)."""
        self._model = model
        self._validate()

    def refresh_runs(self, select: int | None = None) -> None:
        """Re-read the workspace's runs into the list (newest first), choosing run ``select``."""
        keep = select if select is not None else self.runs_box.currentData()
        self.runs_box.blockSignals(True)
        self.runs_box.clear()
        if self._workspace is not None:
            for r in EvolutionRuns(self._workspace).list():
                self.runs_box.addItem(f"run {r.id} · {r.task} · generation {r.generations} · {r.status}",
                                      r.id)
        index = self.runs_box.findData(keep) if keep is not None else -1
        self.runs_box.setCurrentIndex(max(index, 0) if self.runs_box.count() else -1)
        self.runs_box.blockSignals(False)
        self._sync_controls()

    def form_settings(self) -> dict:
        """The form as the nested settings of a run (a ``loomlab evolve`` TOML file's sections);
        raises :class:`LoomConfigError` naming a field that does not parse."""
        task = self.task_box.currentData()
        run: dict[str, Any] = {"task": task,
                               "population": _integer("population", self.population_edit.text()),
                               "generations": _integer("generations", self.generations_edit.text())}
        scheduler = self.scheduler_box.currentData()
        if scheduler == "address":
            run["scheduler"] = self.address_edit.text().strip()
            if not run["scheduler"]:
                raise LoomConfigError("scheduler address: give the Dask scheduler's address, e.g. tcp://host:8786")
        elif scheduler == "local":
            run["scheduler"] = "local"
        neat: dict[str, Any] = {name: _number(label.lower(), self.rate_edits[name].text())
                                for name, label in NEAT_FIELDS.items()}
        seed = self.seed_edit.text().strip()
        if seed:
            neat["seed"] = _integer("seed", seed)
        doc: dict[str, Any] = {"run": run, "neat": neat}
        if task == RECIPE_TASK:
            if self._model is None:
                raise LoomConfigError(NO_MODEL)
            doc["task"] = {"model": model_source(self._model)}
        if self.speciation_check.isChecked() and task != RECIPE_TASK:
            doc["speciation"] = {"compatibility_threshold": _number("threshold", self.threshold_edit.text())}
        return doc

    def run_plan(self) -> RunPlan:
        """The run the form describes, validated (raises :class:`LoomConfigError`)."""
        return plan_from_dict(self.form_settings())

    def set_form(self, *, task: str | None = None, population: int | None = None,
                 generations: int | None = None, seed: int | str | None = None,
                 speciation: bool | None = None, threshold: float | None = None,
                 scheduler: str | None = None, **rates: float) -> None:
        """Fill form fields (what a person would type); ``scheduler`` is "inprocess", "local" or an
        address; ``rates`` are NEAT fields of :data:`NEAT_FIELDS`."""
        if task is not None:
            self.task_box.setCurrentIndex(self.task_box.findData(task))
        for edit, value in ((self.population_edit, population), (self.generations_edit, generations),
                            (self.seed_edit, seed), (self.threshold_edit, threshold)):
            if value is not None:
                edit.setText(str(value))
        if speciation is not None:
            self.speciation_check.setChecked(speciation)
        if scheduler is not None:
            key = scheduler if scheduler in ("inprocess", "local") else "address"
            self.scheduler_box.setCurrentIndex(self.scheduler_box.findData(key))
            if key == "address":
                self.address_edit.setText(scheduler)
        for name, value in rates.items():
            if name not in self.rate_edits:
                raise KeyError(f"no NEAT field {name!r} on the form; it has {', '.join(NEAT_FIELDS)}")
            self.rate_edits[name].setText(str(value))

    def is_busy(self) -> bool:
        return self._job is not None

    @property
    def buffer(self) -> LiveBuffer:
        """Where the current run's reporter leaves its updates (drained by :meth:`refresh`)."""
        return self._buffer

    def refresh(self) -> None:
        """Draw what the run reported since the last redraw (the timer does this while a run goes)."""
        self._tick()

    def start(self) -> None:
        """Start the run the form describes, in a job (checkpointed into the workspace, if any).

        A network task runs in a child process (:mod:`loomlab.core.evolve.search.run_process`: its
        pure-Python loop would hold this process's GIL and stall the window); the quant-recipe task
        runs on the job's thread, beside the loaded model it morphs (its work is in numpy and
        numba, which let the GIL go)."""
        self._validate()
        if not self._can_start() or self._plan is None:
            return
        plan, workspace, model = self._plan, self._workspace, self._model
        generations = plan.generations or 0
        if plan.task.name == RECIPE_TASK:
            def build(evaluator, reporters):
                plan.task.use_model(model)
                return plan.evolution(evaluator=evaluator, reporters=reporters, store=workspace)

            def work(job: Job, sink, pause) -> RunResult:
                return run_live(build, sink, generations=generations, until=plan.until,
                                scheduler=plan.scheduler, options=plan.evaluator, pause=pause,
                                cancelled=job.is_cancelled)
        else:
            request = {"workspace": self._workspace_path(), "settings": self.form_settings(),
                       "generations": generations, "until": plan.until, "scheduler": plan.scheduler,
                       "options": plan.evaluator}

            def work(job: Job, sink, pause) -> RunResult:
                return run_in_child(request, sink, pause=pause, cancelled=job.is_cancelled)
        self._run_job("evolve", work, generations)
        self.status.setText(f"evolving {plan.task.name} · seed {plan.neat.seed}")

    def resume(self, run_id: int | None = None) -> None:
        """Continue workspace run ``run_id`` (default: the one chosen in the list) from its last
        checkpoint for the form's number of generations, in a child process (see :meth:`start`)."""
        run_id = run_id if run_id is not None else self.runs_box.currentData()
        if not self._can_start() or self._workspace is None or run_id is None:
            return
        try:
            generations = _integer("generations", self.generations_edit.text())
            scheduler = self._scheduler()
        except LoomConfigError as e:
            self.message.setText(str(e))
            return
        request = {"workspace": self._workspace_path(), "resume": run_id, "generations": generations,
                   "scheduler": scheduler}

        def work(job: Job, sink, pause) -> RunResult:
            return run_in_child(request, sink, pause=pause, cancelled=job.is_cancelled)

        self._run_job(f"resume run {run_id}", work, generations)
        self.status.setText(f"resuming run {run_id} for {generations} generations")

    def pause(self) -> None:
        """Stop the run after the current generation's checkpoint (resumable)."""
        if self._pause is not None:
            self._pause.set()
            self.status.setText("pausing after this generation's checkpoint…")
            self._sync_controls()

    def stop(self) -> None:
        """Stop the run now: the generation under way is dropped, the last checkpoint stays."""
        if self._job is not None:
            self._job.cancel()

    def export_best(self, path: str) -> None:
        """Save the best network so far atomically (``.json``: Loom's format, ``.loom``: ours)."""
        if not isinstance(self.best, VolumetricNetwork):
            raise LoomError("there is no best network to export yet")
        save_network(self.best, path)

    def apply_recipe(self) -> None:
        """Emit :attr:`recipe_chosen` for the chosen recipe member (default: the fittest); its
        "keep" genes as the Morph panel's :data:`~.morph_panel.AS_LOADED`."""
        row = self.chosen_recipe_row()
        if row is not None:
            genes = (AS_LOADED if gene == KEEP_GENE else gene for gene in row.recipe)
            self.recipe_chosen.emit(dict(zip(self.layer_names, genes, strict=True)))

    def chosen_recipe_row(self) -> MemberRow | None:
        if not self.rows or self.rows[0].recipe is None:
            return None
        i = self.selected_row if self.selected_row is not None and self.selected_row < len(self.rows) else 0
        return self.rows[i]

    def select_row(self, index: int | None) -> None:
        """Choose the population table's row ``index`` (rank - 1)."""
        self.selected_row = index
        if index is None:
            self.table.clearSelection()
        elif self.table.currentRow() != index:
            self.table.selectRow(index)
        self._draw_chosen()

    def show_run(self, run_id: int) -> None:
        """Show workspace run ``run_id`` as its last checkpoint left it: its history and best
        network (the population table needs a live run)."""
        if self._workspace is None or self.is_busy():
            return
        runs = EvolutionRuns(self._workspace)
        try:
            record = runs.get(run_id)
            state = runs.latest_checkpoint(run_id).state
        except WorkspaceError as e:  # no such run, or no checkpoint yet
            self.status.setText(str(e))
            return
        best = None
        if record.task in TASKS and state.get("best") is not None:
            best = checkpoint_from_bytes(bytes.fromhex(state["best"]))
        history = [GenerationStats.from_dict(d) for d in state["history"]]
        fitness = state.get("best_fitness")
        self._apply_start(RunStarted(run_id, record.task, history, best,
                                     float("-inf") if fitness is None else fitness))
        self._set_rows([])
        self._redraw()
        self.refresh_runs(select=run_id)
        self.status.setText(f"run {run_id} · {record.status} at generation {record.generations}")

    def fill_demo(self, generations: int = 30, population: int = 40, seed: int = 1) -> Evolution:
        """Run a short speciated XOR experiment synchronously, here on the GUI thread, and show it
        (for screenshots and demos: about half a second; nothing is checkpointed)."""
        if self.is_busy():
            raise LoomError("a run is going; stop it first")
        self.set_form(task="xor", population=population, generations=generations, seed=seed, speciation=True,
                      scheduler="inprocess")
        plan = self.run_plan()
        buffer = LiveBuffer()
        reporter = LiveReporter(buffer.accept)
        run = plan.evolution(reporters=[reporter])
        reporter.attach(run)
        result = run.run(generations)
        self._buffer = buffer
        self._tick()
        self.status.setText(f"demo: XOR {result.status} at generation {result.generation} · best "
                            f"{result.best_fitness:.4f}")
        return run

    def set_shown(self, shown: bool) -> None:
        """Whether the panel is on screen: hidden, it does not redraw (the run goes on, and the
        plots catch up when it is shown again)."""
        self._shown = shown
        if shown and self._job is not None:
            self._tick()
            self.timer.start()
        else:
            self.timer.stop()

    def shutdown(self) -> None:
        """Stop the run (its last checkpoint stays, to resume later) and join its job."""
        self._closed = True
        self.timer.stop()
        self.stop()
        if self._job is not None:
            self._job.wait()
            self._job = None

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self.shutdown()
        super().closeEvent(event)

    # ----- the run's job ---------------------------------------------------------------------------
    def _run_job(self, name: str, work: Callable[[Job, Callable[[Event], None], threading.Event], RunResult],
                 generations: int) -> None:
        buffer, pause = LiveBuffer(), threading.Event()
        self._buffer, self._pause = buffer, pause
        self._clear_view()

        def run(job: Job) -> RunResult:
            def sink(event: Event) -> None:
                if isinstance(event, Progress):
                    job.report(event.stage, event.done, event.total)
                else:
                    buffer.accept(event)
            return work(job, sink, pause)

        self._job = self._runner.start(run, name=name, on_progress=self._on_progress,
                                       on_success=lambda r: self._ended("succeeded", result=r),
                                       on_failure=lambda m: self._ended("failed", f"{name} failed: {m}"),
                                       on_cancel=lambda: self._ended("cancelled"))
        if self._shown:
            self.timer.start()
        self._sync_controls()

    def _ended(self, outcome: str, message: str = "", result: RunResult | None = None) -> None:
        if self._closed:
            return
        self._job, self._pause = None, None
        self.timer.stop()
        self._tick()
        if result is not None:
            name = "run" if result.run_id is None else f"run {result.run_id}"
            message = (f"{name} {result.status} at generation {result.generation} · best fitness "
                       f"{result.best_fitness:.4f}")
            self.run_ended.emit(result)
        elif outcome == "cancelled":
            message = (f"run {self.run_id} stopped at generation {len(self.history)}"
                       if self.run_id is not None else "stopped")
        self.status.setText(message)
        self.refresh_runs(select=self.run_id)
        self._sync_controls()

    def _on_progress(self, stage: str, done: int, total: int) -> None:
        if stage == "generation" and total > 0:
            self.progress.setRange(0, total)
            self.progress.setValue(done)

    # ----- drawing: on the timer's tick only ---------------------------------------------------------
    def _tick(self) -> None:
        events, snapshot, best = self._buffer.drain()
        for e in events:
            if isinstance(e, RunStarted):
                self._apply_start(e)
            else:
                self.history.append(e)
        if snapshot is not None:
            self._set_rows(snapshot.rows)
        if best is not None:
            self._set_best(best.member, best.fitness)
        if events or snapshot is not None:
            self._redraw()

    def _clear_view(self) -> None:
        self.history, self.run_id, self.task_name = [], None, ""
        self.best, self.best_fitness, self.layer_names = None, float("-inf"), ()
        self._set_rows([])
        self._redraw()

    def _apply_start(self, e: RunStarted) -> None:
        self.run_id, self.task_name, self.layer_names = e.run_id, e.task, e.layer_names
        self.history = list(e.history)
        self.best, self.best_fitness = None, float("-inf")
        if e.best is not None:
            self._set_best(e.best, e.best_fitness)
        self.recipe_box.setVisible(e.task == RECIPE_TASK)
        size_column = RECIPE_SIZE_COLUMN if e.task == RECIPE_TASK else COLUMNS[-1]
        self.table.horizontalHeaderItem(len(COLUMNS) - 1).setText(size_column)
        self.species_plot.setVisible(e.task != RECIPE_TASK)

    def _set_best(self, best: Any, fitness: float) -> None:
        self.best, self.best_fitness = best, fitness
        if isinstance(best, VolumetricNetwork):
            self.best_changed.emit(best)
        self._sync_controls()

    def _redraw(self) -> None:
        x = np.array([s.generation for s in self.history], np.float64)
        for key, curve in self.curves.items():
            curve.setData(x, np.array([getattr(s, key) for s in self.history], np.float64))
        self._draw_species(x)
        self._draw_recipes()

    def _draw_species(self, x: np.ndarray) -> None:
        """The stacked species areas: one curve and one fill per species, made when the count
        grows and given new data after (remaking them at every tick took ~35 ms of the GUI thread
        for 60 generations of a speciated run)."""
        ids, tops = species_stack(self.history)
        layers = self.species_layers
        while len(layers) > len(ids):
            top, fill = layers.pop()
            self.species_plot.removeItem(fill)
            self.species_plot.removeItem(top)
        while len(layers) < len(ids):
            top = pg.PlotCurveItem()
            fill = pg.FillBetweenItem(layers[-1][0] if layers else self.species_base, top)
            self.species_plot.addItem(top)
            self.species_plot.addItem(fill)
            layers.append((top, fill))
        self.species_base.setData(x, np.zeros_like(x))
        for (top, fill), sid, values in zip(layers, ids, tops, strict=True):
            colour = SPECIES_COLOURS[sid % len(SPECIES_COLOURS)]
            top.setData(x, values, pen=pg.mkPen(colour))
            fill.setBrush(pg.mkBrush(colour))

    def _draw_recipes(self) -> None:
        points = [(r.parameters / MIB, r.kl) for r in self.rows if r.recipe is not None and r.kl is not None]
        if len(points) != len(self.rows) or not points:
            self.front = []
            self.recipe_points.setData([], [])
            self.front_line.setData([], [])
            self._draw_chosen()
            return
        xy = np.array(points, np.float64)
        self.recipe_points.setData(x=xy[:, 0], y=xy[:, 1], data=list(range(len(points))))
        self.front = pareto_front(points)
        self.front_line.setData(xy[self.front, 0], xy[self.front, 1])
        self._draw_chosen()

    def _draw_chosen(self) -> None:
        row = self.chosen_recipe_row()
        if row is None or row.kl is None:
            self.chosen_point.setData([], [])
        else:
            self.chosen_point.setData([row.parameters / MIB], [row.kl])
        self._sync_controls()

    def _set_rows(self, rows: list[MemberRow]) -> None:
        self.rows = rows
        if self.selected_row is not None and self.selected_row >= len(rows):
            self.selected_row = None
        table = self.table
        table.blockSignals(True)
        table.setUpdatesEnabled(False)
        table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            cells = (str(r.rank), "—" if r.species is None else str(r.species), f"{r.fitness:.6g}",
                     r.layer_types, f"{r.parameters:,}" if r.recipe is None else format_bytes(r.parameters))
            for j, text in enumerate(cells):
                item = table.item(i, j)
                if item is None:
                    table.setItem(i, j, QTableWidgetItem(text))
                else:
                    item.setText(text)
        table.setUpdatesEnabled(True)
        table.blockSignals(False)

    # ----- user actions ------------------------------------------------------------------------------
    def _table_selection(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        self.selected_row = rows[0].row() if rows else None
        self._draw_chosen()

    def _point_clicked(self, _item, points, *_) -> None:
        if len(points):
            self.select_row(int(points[0].data()))

    def _ask_export(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the best network", "best.loom",
                                              "Loom Lab checkpoint (*.loom);;Loom JSON (*.json)")
        if path:
            try:
                self.export_best(path)
                self.status.setText(f"saved {path}")
            except (LoomError, OSError) as e:
                self.status.setText(f"export failed: {e}")

    # ----- validation and controls -------------------------------------------------------------------
    def _workspace_path(self) -> str | None:
        return str(self._workspace.path) if self._workspace is not None else None

    def _scheduler(self) -> str | None:
        return self.form_settings()["run"].get("scheduler")

    def _validate(self) -> None:
        try:
            self._plan = self.run_plan()
            self.message.setText("")
        except LoomError as e:
            self._plan = None
            self.message.setText(str(e))
        self._sync_controls()

    def _can_start(self) -> bool:
        return self._job is None and not self._closed

    def _sync_controls(self) -> None:
        idle = self._job is None and not self._closed
        self.start_button.setEnabled(idle and self._plan is not None)
        self.resume_button.setEnabled(idle and self._workspace is not None
                                      and self.runs_box.currentData() is not None)
        self.runs_box.setEnabled(idle)
        self.pause_button.setEnabled(not idle and self._pause is not None and not self._pause.is_set())
        self.stop_button.setEnabled(not idle)
        is_recipe = self.task_box.currentData() == RECIPE_TASK  # recipes are not speciated
        self.speciation_check.setEnabled(idle and not is_recipe)
        self.threshold_edit.setEnabled(idle and not is_recipe and self.speciation_check.isChecked())
        self.address_edit.setEnabled(idle and self.scheduler_box.currentData() == "address")
        for w in (self.task_box, self.population_edit, self.generations_edit, self.seed_edit,
                  self.scheduler_box):
            w.setEnabled(idle)
        for w in self.rate_edits.values():  # a recipe's mutation is the task's own (mutation_rate)
            w.setEnabled(idle and not is_recipe)
        self.export_button.setEnabled(isinstance(self.best, VolumetricNetwork))
        self.apply_button.setEnabled(self.chosen_recipe_row() is not None and bool(self.layer_names))
        self.progress.setVisible(not idle)


def _integer(field: str, text: str) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise LoomConfigError(f"{field}: {text.strip()!r} is not a whole number") from None


def _number(field: str, text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise LoomConfigError(f"{field}: {text.strip()!r} is not a number") from None
    if not np.isfinite(value):
        raise LoomConfigError(f"{field} must be a finite number, got {text.strip()!r}")
    return value


__all__ = ["EvolutionPanel", "pareto_front", "species_stack"]
