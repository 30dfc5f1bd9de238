"""The Evolution panel: set up an evolution run, start, pause, stop and resume it, and watch it.

The form is turned into the same nested settings a ``loomlab evolve`` TOML file holds and built
by :func:`loomlab.core.evolve.search.run_config.plan_from_dict`, so a run started here and one started
from the command line with the same settings and seed give the same history. The form is
validated as it is typed: an invalid value shows why and disables Start.

A run is an :class:`~loomlab.core.evolve.search.run.Evolution` in a child process
(:mod:`loomlab.core.evolve.search.run_process`; a quant-recipe or gguf-recipe run, which morphs the
loaded model, on a job's thread instead). Its
:class:`~loomlab.core.evolve.search.live.LiveReporter` sends live events, which the job hands a
:class:`~loomlab.core.evolve.search.live.LiveBuffer` (every generation's statistics, the latest
population table, the latest best member); a QTimer on the GUI thread drains the buffer a few
times a second and redraws once per tick, however many generations went by. Pause stops
the run after the current generation's checkpoint; Stop stops it at once (the generation being
evaluated is dropped, the last checkpoint stays); either can be resumed from the list of the
workspace's runs, continuing the same history.

A recipe run shows its members' weight size against KL beside the population table: for
quant-recipe the KL on the probe it is bred on; for gguf-recipe the KL on the held-out text (the
members re-scored on it: the fittest, or a Pareto run's front), with llama.cpp's presets as
labelled reference points, and the chosen member's format for every matrix as a strip (block x
tensor kind, :mod:`.format_strip`). A point or a table row chooses a member (default: the
fittest). Its Apply sends a quant-recipe member's dtypes to the Morph panel; for gguf-recipe it
morphs the loaded model to the member's formats in a job, and "Export GGUF…" does the same and
writes the model as a GGUF file (cancellable); "Save recipe…" writes the JSON recipe ``loomlab
quantize --recipe`` reads.

A control run (cartpole, acrobot, ...) shows its best member beside the population table
(:mod:`.control_replay`): its episode replayed with its observation and action traces, and its
network as a graph (:mod:`.network_graph`), both following each new best.

Signals: :attr:`EvolutionPanel.best_changed` (the best network so far, for the Topology view),
:attr:`EvolutionPanel.recipe_chosen` (``{layer: dtype}`` of a quant-recipe member, for the Morph
panel) and :attr:`EvolutionPanel.model_morphed` (the loaded model was morphed to a gguf-recipe
member: the panels showing it read it again).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path
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
    QSizePolicy,
    QSplitter,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from loomlab.core.errors import LoomConfigError, LoomError
from loomlab.core.evolve.control.control_task import CONTROL_TASKS, ControlTask
from loomlab.core.evolve.genetics.neat import NEATConfig
from loomlab.core.evolve.llm.format_space import pareto_front
from loomlab.core.evolve.search.live import (
    KEEP_GENE,
    Event,
    LiveBuffer,
    LiveReporter,
    MemberRow,
    Progress,
    References,
    RunStarted,
    run_live,
)
from loomlab.core.evolve.search.reporters import GenerationStats
from loomlab.core.evolve.search.run import Evolution, RunResult
from loomlab.core.evolve.search.run_config import RunPlan, model_source, plan_from_dict
from loomlab.core.evolve.search.run_process import run_in_child
from loomlab.core.evolve.search.tasks import TASKS, get_task
from loomlab.core.io import save_network
from loomlab.core.io.checkpoint import checkpoint_from_bytes
from loomlab.core.llm.quality import recipe as recipes
from loomlab.core.llm.quality.drift import DEFAULT_CTX
from loomlab.core.network import VolumetricNetwork
from loomlab.core.units import format_bytes
from loomlab.core.workspace.evolution_runs import EvolutionRuns
from loomlab.core.workspace.store import Workspace, WorkspaceError

from .control_replay import BestMemberViews
from .format_strip import FormatStrip
from .morph_panel import AS_LOADED
from .scrolling import scrolling
from .sort_items import row_table
from .workers import Job, JobRunner

RECIPE_TASK = "quant-recipe"  # a Loom dtype per weighted layer
GGUF_TASK = "gguf-recipe"  # a GGUF format per matrix, against llama.cpp's presets
RECIPE_TASKS = (RECIPE_TASK, GGUF_TASK)  # run beside the loaded model, shown as a size-vs-KL scatter
CONTROL_TASK_NAMES = tuple(CONTROL_TASKS)  # agents in Gymnasium's environments ("gym": any id)
GENERIC_CONTROL = "gym"  # the control task whose environment the form names
DEFAULT_EPISODES = 5
TASK_NAMES = (*TASKS, *CONTROL_TASK_NAMES, *RECIPE_TASKS)
PARETO = "pareto"
BUDGETS = (PARETO, *recipes.PRESETS)  # a gguf-recipe run's budget: the Pareto front, or a preset's bytes
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
NO_MODEL_GGUF = ("Load a language model first: the gguf-recipe task evolves a GGUF format for each of "
                 "its matrices.")
KL_LABEL, HELDOUT_LABEL = "KL (nats)", "held-out KL (nats)"
RECIPE_TITLE = "Recipes: weight size vs KL (Pareto front in red)"
GGUF_TITLE = "Recipes: weight size vs held-out KL (Pareto front in red, llama.cpp presets in blue)"
REFERENCE_COLOUR = "#1f77b4"
REFERENCE_FONT_SCALE = 0.85  # the presets' labels: small, several presets can lie close together
RECIPE_VIEWS_SHARES = (3, 2)  # the scatter and the format strip side by side
LOWER_SHARE = 2  # a gguf-recipe or control run: the lower row this many times the fitness plot's height
GGUF_RECIPE_SHARE = 2  # and the scatter and strip this many times the table's width
CONTROL_SHARE = 2  # a control run: the replay this many times the species plot's and the table's width
FITNESS_PENS = {"best": "#2ca02c", "mean": "#1f77b4", "worst": "#d62728"}
SPECIES_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
                   "#ff9da7", "#9c755f", "#bab0ac")


def reference_labels(points: Sequence[tuple[str, int, float]]) -> list[tuple[str, int, float]]:
    """One label per distinct reference point: presets that plan to the same recipe (on narrow
    rows several fall back to the same formats) share a point, named together (``Q4_0 / Q4_1``)."""
    names: dict[tuple[int, float], list[str]] = {}
    for name, size, kl in points:
        names.setdefault((size, kl), []).append(name)
    return [(" / ".join(n), size, kl) for (size, kl), n in names.items()]


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
    model_morphed = Signal(list)  # the MorphReports of an Apply (or Export) of a gguf-recipe member
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
        self._recipe_job: Job | None = None  # an Apply or an Export of a gguf-recipe member
        self._refusal: str | None = None  # why the run's task refused the loaded model (set by its job)
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
        self.references: list[tuple[str, int, float]] = []  # (preset, bytes, held-out KL) of a gguf run
        self.selected_row: int | None = None
        self._layout_kind = ""  # whose shares the plots have: a gguf-recipe or a control run's, or ""
        self._control_task: ControlTask | None = None  # a control run's task, for the replay
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
        # a gguf-recipe run's own settings (its task parameters)
        self.budget_box = QComboBox()
        for budget in BUDGETS:
            self.budget_box.addItem(budget, budget)
        self.budget_box.setToolTip("pareto: breed the whole front of size against KL; a preset: the lowest "
                                   "KL within that preset's bytes")
        self.train_edit, self.heldout_edit = QLineEdit(), QLineEdit()
        self.train_edit.setPlaceholderText("the shipped English text")
        self.train_edit.setToolTip("The text file recipes are bred on (KL against the loaded model)")
        self.heldout_edit.setPlaceholderText("the shipped probe text")
        self.heldout_edit.setToolTip("The text file members are re-scored on, never seen by the search: "
                                     "the scatter's KL")
        # a control run's own settings: the environment ("gym" only) and the episodes per member
        self.env_edit = QLineEdit()
        self.env_edit.setPlaceholderText("a Gymnasium id, e.g. BipedalWalker-v3")
        self.env_edit.setToolTip("Any Gymnasium environment with Box or Discrete spaces")
        self.episodes_edit = QLineEdit(str(DEFAULT_EPISODES))
        self.episodes_edit.setToolTip("Seeded episodes per member: its fitness is their mean return")
        self.ctx_edit = QLineEdit(str(DEFAULT_CTX))
        self.ctx_edit.setToolTip("Tokens per chunk of both texts (each needs at least max(512, 2 x ctx) "
                                 "tokens)")
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
        form.addRow("Budget", self.budget_box)
        self.text_rows = {}  # the row widget holding each text field and its Browse button
        for label, edit, title in (("Training text", self.train_edit, "The training text"),
                                   ("Held-out text", self.heldout_edit, "The held-out text")):
            browse = QPushButton("…")
            browse.setToolTip(f"Choose {title.lower()} file")
            browse.setFixedWidth(browse.fontMetrics().horizontalAdvance("…") + 24)
            browse.clicked.connect(lambda _=False, e=edit, t=title: self._ask_text(e, t))
            row = QWidget()
            row_layout = QHBoxLayout(row)
            row_layout.setContentsMargins(0, 0, 0, 0)
            row_layout.addWidget(edit, 1)
            row_layout.addWidget(browse)
            self.text_rows[edit] = row
            form.addRow(label, row)
        form.addRow("Context", self.ctx_edit)
        form.addRow("Environment", self.env_edit)
        form.addRow("Episodes", self.episodes_edit)
        self.form = form

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
        self.reference_points = pg.ScatterPlotItem(size=10, symbol="d", brush=pg.mkBrush(REFERENCE_COLOUR),
                                                   pen=None)
        self.reference_labels: list[pg.TextItem] = []  # one per distinct reference point
        self._drawn_references: list[tuple[str, int, float]] = []
        for item in (self.reference_points, self.recipe_points, self.front_line, self.chosen_point):
            self.recipe_plot.addItem(item)
        self.strip = FormatStrip()
        self.strip.setToolTip("The chosen member's format for each matrix (hover a cell for its tensor)")
        self.apply_button = QPushButton("Apply recipe")
        self.apply_button.clicked.connect(self.apply_recipe)
        self.save_recipe_button = QPushButton("Save recipe…")
        self.save_recipe_button.setToolTip("Save the chosen member as a JSON recipe (loomlab quantize MODEL "
                                           "OUT --recipe FILE reads it)")
        self.save_recipe_button.clicked.connect(self._ask_save_recipe)
        self.export_gguf_button = QPushButton("Export GGUF…")
        self.export_gguf_button.setToolTip("Morph the loaded model to the chosen member and write it as a "
                                           "GGUF file")
        self.export_gguf_button.clicked.connect(self._ask_export_gguf)
        self.recipe_cancel_button = QPushButton("Cancel")
        self.recipe_cancel_button.clicked.connect(self.cancel_recipe_job)
        self.recipe_progress = QProgressBar()
        self.recipe_progress.setTextVisible(False)
        self.recipe_box = QGroupBox(RECIPE_TITLE)
        self.recipe_views = QSplitter(Qt.Orientation.Horizontal)
        self.recipe_views.addWidget(self.recipe_plot)
        self.recipe_views.addWidget(self.strip)
        self.recipe_views.setChildrenCollapsible(False)
        self.recipe_views.setSizes([100 * share for share in RECIPE_VIEWS_SHARES])
        recipe_buttons = QHBoxLayout()
        for b in (self.apply_button, self.save_recipe_button, self.export_gguf_button):
            recipe_buttons.addWidget(b)
        recipe_buttons.addWidget(self.recipe_progress, 1)
        recipe_buttons.addWidget(self.recipe_cancel_button)
        recipe_layout = QVBoxLayout(self.recipe_box)
        recipe_layout.addWidget(self.recipe_views, 1)
        recipe_layout.addLayout(recipe_buttons)
        self.recipe_box.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Expanding)
        self.recipe_box.hide()

        # fitness across the top; below it the species (or, for recipes, the bytes-vs-KL scatter)
        # beside the population table
        lower = QSplitter(Qt.Orientation.Horizontal)
        lower.addWidget(self.species_plot)
        lower.addWidget(self.recipe_box)
        self.member_views = BestMemberViews(self._runner)  # a control run's best member
        self.member_views.hide()
        lower.addWidget(self.member_views)
        lower.addWidget(self.table)
        lower.setSizes([1000] * 4)  # equal shares (a hidden one's goes to the others)
        self.lower = lower
        plots = QSplitter(Qt.Orientation.Vertical)
        plots.addWidget(self.fitness_plot)
        plots.addWidget(lower)
        self.plots = plots
        run_box.setMaximumWidth(RUN_BOX_MAX_WIDTH)
        layout = QHBoxLayout(self)
        layout.addWidget(scrolling(run_box))
        layout.addWidget(plots, 1)

        for edit in (self.population_edit, self.generations_edit, self.seed_edit, self.threshold_edit,
                     self.address_edit, self.train_edit, self.heldout_edit, self.ctx_edit,
                     self.env_edit, self.episodes_edit, *self.rate_edits.values()):
            edit.textChanged.connect(self._validate)
        self.task_box.currentIndexChanged.connect(self._validate)
        self.budget_box.currentIndexChanged.connect(self._validate)
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
        """The loaded language model the recipe tasks evolve (None: none is loaded)."""
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
        if task in RECIPE_TASKS:
            if self._model is None:
                raise LoomConfigError(NO_MODEL if task == RECIPE_TASK else NO_MODEL_GGUF)
            doc["task"] = {"model": model_source(self._model)}
            if task == GGUF_TASK:
                doc["task"].update(self._gguf_params())
        elif task in CONTROL_TASK_NAMES:
            doc["task"] = {"episodes": _integer("episodes", self.episodes_edit.text())}
            if task == GENERIC_CONTROL:
                doc["task"]["env"] = self.env_edit.text().strip()
        if self.speciation_check.isChecked() and task not in RECIPE_TASKS:
            doc["speciation"] = {"compatibility_threshold": _number("threshold", self.threshold_edit.text())}
        return doc

    def _gguf_params(self) -> dict[str, Any]:
        """The gguf-recipe task's parameters the form sets (the text files must exist)."""
        params: dict[str, Any] = {"budget": self.budget_box.currentData(),
                                  "ctx": _integer("context", self.ctx_edit.text())}
        for key, field, edit in (("train", "training text", self.train_edit),
                                 ("heldout", "held-out text", self.heldout_edit)):
            path = edit.text().strip()
            if path and not Path(path).is_file():
                raise LoomConfigError(f"{field}: {path} is not a file")
            params[key] = path
        return params

    def run_plan(self) -> RunPlan:
        """The run the form describes, validated (raises :class:`LoomConfigError`)."""
        return plan_from_dict(self.form_settings())

    def set_form(self, *, task: str | None = None, population: int | None = None,
                 generations: int | None = None, seed: int | str | None = None,
                 speciation: bool | None = None, threshold: float | None = None,
                 scheduler: str | None = None, budget: str | None = None, train: str | None = None,
                 heldout: str | None = None, ctx: int | None = None, env: str | None = None,
                 episodes: int | None = None, **rates: float) -> None:
        """Fill form fields (what a person would type); ``scheduler`` is "inprocess", "local" or an
        address; ``budget``, ``train``, ``heldout`` and ``ctx`` are the gguf-recipe task's (a
        budget of :data:`BUDGETS`, text file paths, tokens per chunk); ``env`` (the gym task's
        Gymnasium id) and ``episodes`` a control task's; ``rates`` are NEAT fields of
        :data:`NEAT_FIELDS`."""
        if task is not None:
            self.task_box.setCurrentIndex(self.task_box.findData(task))
        if budget is not None:
            index = self.budget_box.findData(budget)
            if index < 0:
                raise KeyError(f"no budget {budget!r} on the form; it has {', '.join(BUDGETS)}")
            self.budget_box.setCurrentIndex(index)
        for edit, value in ((self.population_edit, population), (self.generations_edit, generations),
                            (self.seed_edit, seed), (self.threshold_edit, threshold),
                            (self.train_edit, train), (self.heldout_edit, heldout), (self.ctx_edit, ctx),
                            (self.env_edit, env), (self.episodes_edit, episodes)):
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
        """A run, or an Apply or Export of a recipe, is going."""
        return self._job is not None or self._recipe_job is not None

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
        pure-Python loop would hold this process's GIL and stall the window); the recipe tasks run
        on the job's thread, beside the loaded model they morph (their work is in numpy and numba,
        which let the GIL go). A model the task refuses (gguf-recipe: a quantized one) is named in
        the form's message line."""
        self._validate()
        if not self._can_start() or self._plan is None:
            return
        plan, workspace, model = self._plan, self._workspace, self._model
        generations = plan.generations or 0
        self._refusal = None
        if plan.task.name in RECIPE_TASKS:
            def build(evaluator, reporters):
                try:
                    plan.task.use_model(model)
                except LoomConfigError as e:
                    self._refusal = str(e)  # read on the GUI thread once the job has failed
                    raise
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
        """Apply the chosen recipe member (default: the fittest). A quant-recipe member: emit
        :attr:`recipe_chosen`, its "keep" genes as the Morph panel's
        :data:`~.morph_panel.AS_LOADED`. A gguf-recipe member: morph the loaded model to its
        formats in a job (:meth:`apply_gguf`)."""
        row = self.chosen_recipe_row()
        if row is None:
            return
        if self.task_name == GGUF_TASK:
            self.apply_gguf()
            return
        genes = (AS_LOADED if gene == KEEP_GENE else gene for gene in row.recipe)
        self.recipe_chosen.emit(dict(zip(self.layer_names, genes, strict=True)))

    def chosen_mapping(self) -> dict[str, str] | None:
        """``{GGUF tensor: format}`` of the chosen gguf-recipe member (the JSON recipe ``loomlab
        quantize --recipe`` reads), or None."""
        row = self.chosen_recipe_row()
        if row is None or self.task_name != GGUF_TASK or len(self.layer_names) != len(row.recipe):
            return None
        return dict(zip(self.layer_names, row.recipe, strict=True))

    def apply_gguf(self) -> None:
        """Morph the loaded model to the chosen gguf-recipe member in a job (the layers it already
        matches are left alone); :attr:`model_morphed` follows."""
        self._recipe_work("apply recipe")

    def export_gguf(self, path: str) -> None:
        """Morph the loaded model to the chosen gguf-recipe member (if it is not so already) and
        write it to ``path`` as GGUF, in a job (Cancel stops between tensors; a failure or cancel
        leaves no file). A model that cannot be exported (not loaded from a GGUF file) is named in
        the status line and nothing is morphed."""
        from loomlab.core.llm.quality.gguf_export import export_refusal

        refusal = "" if self._model is None else export_refusal(self._model)  # names and dtypes only
        if refusal:
            self.status.setText(f"not exported: {refusal}")
            return
        self._recipe_work("export GGUF", path)

    def save_recipe(self, path: str) -> None:
        """Write the chosen gguf-recipe member to ``path`` as a JSON recipe, atomically."""
        mapping = self.chosen_mapping()
        if mapping is None:
            return
        try:
            recipes.save_recipe(path, mapping)
        except (LoomError, OSError) as e:
            self.status.setText(f"cannot save the recipe to {path}: {e}")
            return
        self.status.setText(f"saved a recipe of {len(mapping)} tensors to {path}")

    def cancel_recipe_job(self) -> None:
        """Stop an Export between tensors (an Apply under way finishes its layers first)."""
        if self._recipe_job is not None:
            self._recipe_job.cancel()

    def _recipe_work(self, name: str, path: str | None = None) -> None:
        mapping, model = self.chosen_mapping(), self._model
        if mapping is None or model is None or not self._can_start():
            if model is None:
                self.status.setText("no model is loaded: load the model the recipe was evolved for")
            return
        morphed: list = []  # the layers' reports; None first while a morph is under way
        progress = self._recipe_progress

        def work(job: Job):
            with model.busy():
                plan = recipes.plan_recipe(model.net, mapping)
                if plan.changed:
                    morphed.append(None)
                    morphed.extend(recipes.apply_recipe(model.net, plan, progress=lambda done, total, layer:
                                                        job.report(f"{name}: {layer}", done, total)))
                if path is None:
                    return len(plan.changed)
                from loomlab.core.llm.quality.gguf_export import export_gguf

                return export_gguf(model, path, progress=lambda stage, done, total: job.report(
                    f"{name}: {stage}", done, total), cancel=job.is_cancelled)

        def ended(message: str) -> None:
            if self._closed:
                return
            self._recipe_job = None
            self.status.setText(message)
            self._sync_controls()
            if morphed:  # the model changed, even if the export then failed or was stopped
                self.model_morphed.emit([r for r in morphed if r is not None])

        def succeeded(result) -> None:
            if path is None:
                ended(f"applied the recipe: {result} layers morphed" if result else
                      "the model already has the recipe's formats")
            else:
                ended(f"saved {result.path} ({format_bytes(result.nbytes)}, {result.changed} of "
                      f"{result.tensors} tensors in new encodings)")

        self._recipe_job = self._runner.start(work, name=name, on_progress=progress, on_success=succeeded,
                                              on_failure=lambda m: ended(f"{name} failed: {m}"),
                                              on_cancel=lambda: ended(f"{name} cancelled"))
        self.status.setText(f"{name}…")
        self._sync_controls()

    def _recipe_progress(self, stage: str, done: int, total: int) -> None:
        if self._closed:
            return
        self.recipe_progress.setRange(0, max(total, 0))
        self.recipe_progress.setValue(done)
        self.status.setText(f"{stage} ({done}/{total})" if total else stage)

    def chosen_recipe_row(self) -> MemberRow | None:
        """The recipe member chosen in the table or the scatter (default: the fittest), or None."""
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
        if record.task not in RECIPE_TASKS and state.get("best") is not None:  # a network task
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
        self.member_views.shutdown()
        self.stop()
        if self._job is not None:
            self._job.wait()
            self._job = None
        if self._recipe_job is not None:
            self._recipe_job.stop()
            self._recipe_job = None

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
        self._validate()  # a plan of its own for the next run: the finished run's task holds its caches
        if outcome == "failed" and self._refusal:
            self.message.setText(self._refusal)  # the loaded model: the form's problem, not the run's
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
            elif isinstance(e, References):
                self.references = list(e.points)
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
        self.member_views.clear()
        self.best, self.best_fitness, self.layer_names = None, float("-inf"), ()
        self.references = []
        self._set_rows([])
        self._redraw()

    def _apply_start(self, e: RunStarted) -> None:
        self.run_id, self.task_name, self.layer_names = e.run_id, e.task, e.layer_names
        control = e.task in CONTROL_TASK_NAMES
        self._control_task = self._run_task(e.run_id, e.task) if control else None
        self.member_views.clear()
        self.member_views.setVisible(control)
        self.history = list(e.history)
        self.references = []
        self.best, self.best_fitness = None, float("-inf")
        if e.best is not None:
            self._set_best(e.best, e.best_fitness)
        recipe, gguf = e.task in RECIPE_TASKS, e.task == GGUF_TASK
        self.recipe_box.setVisible(recipe)
        self.recipe_box.setTitle(GGUF_TITLE if gguf else RECIPE_TITLE)
        self.recipe_plot.setLabel("left", HELDOUT_LABEL if gguf else KL_LABEL)
        for w in (self.strip, self.save_recipe_button, self.export_gguf_button):
            w.setVisible(gguf)
        self.apply_button.setToolTip("Morph the loaded model to the chosen member's formats" if gguf else
                                     "Send the chosen member's dtypes to the Morph panel")
        size_column = RECIPE_SIZE_COLUMN if recipe else COLUMNS[-1]
        self.table.horizontalHeaderItem(len(COLUMNS) - 1).setText(size_column)
        self.species_plot.setVisible(not recipe)
        kind = GGUF_TASK if gguf else "control" if control else ""
        if kind != self._layout_kind:  # the scatter and strip, or the replay, take most room; else equal
            self._layout_kind = kind
            self.plots.setSizes([1000, LOWER_SHARE * 1000 if kind else 1000])
            self.lower.setSizes([1000, GGUF_RECIPE_SHARE * 1000 if gguf else 1000,
                                 CONTROL_SHARE * 1000 if control else 1000, 1000])

    def _run_task(self, run_id: int | None, name: str) -> ControlTask | None:
        """A control run's task with the parameters the workspace stored for it (a run from a TOML
        file may set them; a run without a workspace has the form's), or None where it cannot be
        built (an environment this install lacks): the replay then shows nothing."""
        try:
            if run_id is not None and self._workspace is not None:
                return get_task(name, **EvolutionRuns(self._workspace).get(run_id).config["task"]["params"])
            if self._plan is not None and self._plan.task.name == name:
                return self._plan.task
            return get_task(name)
        except LoomError:
            return None

    def _set_best(self, best: Any, fitness: float) -> None:
        self.best, self.best_fitness = best, fitness
        if isinstance(best, VolumetricNetwork):
            self.best_changed.emit(best)
            if self._control_task is not None:
                self.member_views.show_member(self._control_task, best)
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

    def _scatter_kl(self, row: MemberRow) -> float | None:
        """A member's KL on the scatter: on the held-out text for gguf-recipe, else the run's."""
        return row.heldout_kl if self.task_name == GGUF_TASK else row.kl

    def _draw_recipes(self) -> None:
        """The scatter of members, their Pareto front and (gguf-recipe) the presets. A quant-recipe
        run's members are drawn when every one has its KL; a gguf-recipe run's, those re-scored on
        the held-out text."""
        shown = [i for i, r in enumerate(self.rows)
                 if r.recipe is not None and self._scatter_kl(r) is not None]
        if self.task_name != GGUF_TASK and len(shown) != len(self.rows):
            shown = []
        points = [(self.rows[i].parameters, self._scatter_kl(self.rows[i])) for i in shown]
        if not points:
            self.front = []
            self.recipe_points.setData([], [])
            self.front_line.setData([], [])
        else:
            xy = np.array([(size / MIB, kl) for size, kl in points], np.float64)
            self.recipe_points.setData(x=xy[:, 0], y=xy[:, 1], data=shown)
            front = pareto_front(points)
            self.front = [shown[i] for i in front]
            self.front_line.setData(xy[front, 0], xy[front, 1])
        self._draw_references()
        self._draw_chosen()

    def _draw_references(self) -> None:
        """The presets as points, each distinct one labelled."""
        labels = reference_labels(self.references) if self.task_name == GGUF_TASK else []
        if labels == self._drawn_references:
            return
        self._drawn_references = labels
        for item in self.reference_labels:
            self.recipe_plot.removeItem(item)
        self.reference_labels = []
        self.reference_points.setData(x=[size / MIB for _, size, _ in labels], y=[kl for _, _, kl in labels])
        colour = pg.mkColor(pg.getConfigOption("foreground"))  # on the plot's canvas, not the window's
        font = self.font()
        font.setPointSizeF(font.pointSizeF() * REFERENCE_FONT_SCALE)
        xs = [size for _, size, _ in labels] + [r.parameters for r in self.rows if r.recipe is not None]
        middle = (min(xs) + max(xs)) / 2 if labels else 0
        for name, size, kl in labels:  # written away from the plot's nearer side edge
            item = pg.TextItem(name, color=colour, anchor=(1 if size > middle else 0, 1))
            item.setFont(font)
            item.setPos(size / MIB, kl)
            self.recipe_plot.addItem(item)
            self.reference_labels.append(item)

    def _draw_chosen(self) -> None:
        row = self.chosen_recipe_row()
        kl = None if row is None else self._scatter_kl(row)
        if kl is None:
            self.chosen_point.setData([], [])
        else:
            self.chosen_point.setData([row.parameters / MIB], [kl])
        if self.task_name == GGUF_TASK and row is not None and len(row.recipe) == len(self.layer_names):
            self.strip.set_recipe(self.layer_names, row.recipe)
        else:
            self.strip.clear()
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

    def _ask_text(self, edit: QLineEdit, title: str) -> None:
        path, _ = QFileDialog.getOpenFileName(self, title, edit.text(), "Text (*.txt);;All files (*)")
        if path:
            edit.setText(path)

    def _ask_save_recipe(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save recipe as", "recipe.json", "Recipe (*.json)")
        if path:
            self.save_recipe(path if path.lower().endswith(".json") else path + ".json")

    def _ask_export_gguf(self) -> None:
        from loomlab.core.llm.quality.gguf_export import export_refusal

        refusal = "" if self._model is None else export_refusal(self._model)
        if refusal:  # said before a file is asked for
            self.status.setText(f"not exported: {refusal}")
            return
        path, _ = QFileDialog.getSaveFileName(self, "Export as GGUF", "", "GGUF model (*.gguf)")
        if path:
            self.export_gguf(path if path.lower().endswith(".gguf") else path + ".gguf")

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
        return self._job is None and self._recipe_job is None and not self._closed

    def _sync_controls(self) -> None:
        idle = self._can_start()
        self.start_button.setEnabled(idle and self._plan is not None)
        self.resume_button.setEnabled(idle and self._workspace is not None
                                      and self.runs_box.currentData() is not None)
        self.runs_box.setEnabled(idle)
        self.pause_button.setEnabled(not idle and self._pause is not None and not self._pause.is_set())
        self.stop_button.setEnabled(self._job is not None)
        task = self.task_box.currentData()
        is_recipe = task in RECIPE_TASKS  # recipes are not speciated
        for w in (self.budget_box, self.ctx_edit, *self.text_rows.values()):
            self.form.setRowVisible(w, task == GGUF_TASK)
            w.setEnabled(idle)
        for w, shown in ((self.env_edit, task == GENERIC_CONTROL),
                         (self.episodes_edit, task in CONTROL_TASK_NAMES)):
            self.form.setRowVisible(w, shown)
            w.setEnabled(idle)
        self.speciation_check.setEnabled(idle and not is_recipe)
        self.threshold_edit.setEnabled(idle and not is_recipe and self.speciation_check.isChecked())
        self.address_edit.setEnabled(idle and self.scheduler_box.currentData() == "address")
        for w in (self.task_box, self.population_edit, self.generations_edit, self.seed_edit,
                  self.scheduler_box):
            w.setEnabled(idle)
        for w in self.rate_edits.values():  # a recipe's mutation is the task's own (mutation_rate)
            w.setEnabled(idle and not is_recipe)
        self.export_button.setEnabled(isinstance(self.best, VolumetricNetwork))
        chosen = self.chosen_recipe_row() is not None and bool(self.layer_names)
        gguf = self.task_name == GGUF_TASK  # Apply and Export morph the model: not while a run uses it
        self.apply_button.setEnabled(chosen and (not gguf or (idle and self._model is not None)))
        self.save_recipe_button.setEnabled(chosen)
        self.export_gguf_button.setEnabled(chosen and idle and self._model is not None)
        self.progress.setVisible(self._job is not None)
        self.recipe_progress.setVisible(self._recipe_job is not None)
        self.recipe_cancel_button.setVisible(self._recipe_job is not None)


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
