"""The workbench's main window: dockable panels, menus, status bar, settings, clean shutdown.

The window owns one :class:`JobRunner` (every long job runs there), the workspace database and
the panels; it wires what one panel produces (a loaded model, an opened network) into the
others. Closing the window shuts the panels down, cancels and joins every job, and saves the
layout.
"""

from __future__ import annotations

from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray, QPoint, QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QActionGroup, QKeySequence, QPainter, QPixmap
from PySide6.QtWidgets import (
    QApplication,
    QDockWidget,
    QFileDialog,
    QLabel,
    QMainWindow,
    QMessageBox,
    QWidget,
)

from loomlab.core import save_network
from loomlab.core.errors import LoomConfigError
from loomlab.core.layer_names import model_parts
from loomlab.core.procinfo import release_memory, rss_bytes
from loomlab.core.workspace.store import Workspace
from loomlab.views.backend_choice import BackendChoice, BackendMenu, BackendStatus
from loomlab.views.chat_panel import ChatPanel
from loomlab.views.dna_panel import DNAPanel
from loomlab.views.evolution_panel import EvolutionPanel
from loomlab.views.inspect_panel import InspectPanel
from loomlab.views.models_panel import ModelsPanel
from loomlab.views.morph_panel import MorphPanel
from loomlab.views.run_panel import RunPanel
from loomlab.views.server_panel import ServerPanel
from loomlab.views.telemetry_panel import TelemetryPanel
from loomlab.views.theme import THEMES, ThemeController
from loomlab.views.topology_panel import TopologyPanel
from loomlab.views.workers import JobRunner

from .first_run import KernelsStatus

if TYPE_CHECKING:
    from loomlab.core.llm.model.kernel_compilation import KernelCompilation

APP_NAME = "Loom Lab"
ORGANIZATION = "LoomLab"
NETWORK_FILTER = "Loom networks (*.json *.loom);;All files (*)"
MODEL_FILTER = "GGUF models (*.gguf);;All files (*)"
MAX_RECENT = 8
STEP_PAUSE_MS = 40  # between panels taking a new model (see _chain)
RELEASE_PAUSE_MS = 300  # after an unload, before giving its memory back (see _release_if_idle)
PANELS = ("models", "chat", "topology", "inspect", "telemetry", "morph", "run", "dna", "evolution", "server")
#: The panels tabbed along the bottom, the first in front.
BOTTOM_ROW = ("server", "telemetry", "morph", "run", "dna", "evolution")
MODELS_SHARE, BOTTOM_SHARE = 0.25, 0.3  # of the window's width and height, in the default layout
DEFAULT_SIZE = (1400, 900)  # a first start's window, where the screen has room for it
FOCUS_SHARE = 0.6  # the bottom row's share of the height when one of its panels is asked for
LAYOUT_VERSION = 1  # of the saved dock layout: one saved for another default layout is not restored
#: Panels that show a layer and select it when another of them does.
LINKED = ("topology", "telemetry", "morph", "inspect")
SHORTCUTS = (("Ctrl+O", "Open a network"), ("Ctrl+Shift+O", "Open a model"),
             ("Ctrl+Shift+S", "Save the network as"), ("Ctrl+Return", "Send a chat message"),
             ("Ctrl+Q", "Quit"))


class MainWindow(QMainWindow):
    """The top-level window. ``settings`` and ``workspace_path`` are injectable for tests;
    ``backend`` overrides the saved backend setting (View > Backend)."""

    def __init__(self, backend: str | None = None, *, workspace_path: str | Path | None = None,
                 settings: QSettings | None = None, model_folders: list[str] | None = None,
                 parent: QWidget | None = None):
        super().__init__(parent)
        self.settings = settings or QSettings(ORGANIZATION, APP_NAME)
        self.backend_choice = BackendChoice(parent=self)
        self.network = None  # the network shown: a Loom net or the loaded model's grid
        self.kernels_status: KernelsStatus | None = None  # a first run's kernel count (show_kernels)
        self._shut_down = False  # pending _chain steps must not touch panels that have shut down
        self._steps_pending = 0
        self.model = None
        self.runner = JobRunner(self)
        self.workspace = Workspace(workspace_path)
        self.setWindowTitle(APP_NAME)
        self.setDockNestingEnabled(True)
        free = self.screen().availableGeometry()  # a first start's window fits a small screen
        self.resize(min(DEFAULT_SIZE[0], free.width()), min(DEFAULT_SIZE[1], free.height()))
        self.panels = {
            "models": ModelsPanel(self.runner, model_folders),
            "chat": ChatPanel(self.runner, self.workspace),
            "topology": TopologyPanel(),
            "inspect": InspectPanel(self.runner),
            "telemetry": TelemetryPanel(),
            "morph": MorphPanel(self.runner),
            "run": RunPanel(self.runner),
            "dna": DNAPanel(self.runner),
            "evolution": EvolutionPanel(self.runner, self.workspace),
            "server": ServerPanel(self.runner, self._start_server),
        }
        self._model_choice: str | None = None  # the loaded model's entry in the DNA panel
        self._release_pending = False  # memory to give back once the unloaded model's jobs end
        self._release_timer = QTimer(self)
        self._release_timer.setSingleShot(True)
        self._release_timer.setInterval(RELEASE_PAUSE_MS)
        self._release_timer.timeout.connect(self._release)
        self._laid_out: bool | None = None  # None until shown; then whether the docks have their shares
        self._bottom_share = BOTTOM_SHARE
        self.docks = self._build_docks()
        # a dock behind another's tab stays "visible" to Qt: these panels learn it from the dock
        for name in ("morph", "topology", "inspect", "telemetry", "dna", "evolution"):
            self.docks[name].visibilityChanged.connect(self.panels[name].set_shown)
        self._build_menus()
        self._build_status_bar()
        self._wire()
        self._choose_backend(backend)
        self._restore_layout()

    # ----- construction --------------------------------------------------------------------
    def _build_docks(self) -> dict[str, QDockWidget]:
        """The default layout, built around the chat: Models on the left, Chat (Topology and
        Inspect behind its tab) taking most of the height, and the other panels tabbed in one short row along
        the bottom with Server in front, so that a chat and its server are seen together.
        Tabbed, the bottom row is as tall as its tallest panel's minimum, not their sum."""
        titles = {"models": "Models", "chat": "Chat", "topology": "Topology 3D", "inspect": "Inspect",
                  "telemetry": "Telemetry", "morph": "Morph", "run": "Run", "dna": "DNA",
                  "evolution": "Evolution", "server": "Server"}
        area = Qt.DockWidgetArea
        docks = {}
        for name in PANELS:
            dock = QDockWidget(titles[name], self)
            dock.setObjectName(f"dock-{name}")  # saveState() identifies docks by object name
            dock.setWidget(self.panels[name])
            docks[name] = dock
        self.addDockWidget(area.LeftDockWidgetArea, docks["models"])
        self.addDockWidget(area.RightDockWidgetArea, docks["chat"])
        self.tabifyDockWidget(docks["chat"], docks["topology"])
        self.tabifyDockWidget(docks["chat"], docks["inspect"])
        for name in BOTTOM_ROW:
            self.addDockWidget(area.BottomDockWidgetArea, docks[name])
        for name in BOTTOM_ROW[1:]:
            # hidden until the window shows and tabifies them (showEvent): shown now, they would
            # stand side by side at the first layout and the window would take their summed width
            docks[name].hide()
        docks["chat"].raise_()
        return docks

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if self._laid_out is None:
            # The bottom row is tabified once shown: tabified before the first layout, Qt 6.11
            # leaves a stale copy of a tab bar drawn over the status bar. Then the docks take their
            # shares of the window (a restored state has its own), once that layout has run:
            # before, Qt keeps the docks' own heights.
            self._laid_out = self._restored
            if not self._restored:
                first = self.docks[BOTTOM_ROW[0]]
                for name in BOTTOM_ROW[1:]:
                    self.tabifyDockWidget(first, self.docks[name])
                    self.docks[name].show()
                first.raise_()
                QTimer.singleShot(0, self, self._size_docks)

    @property
    def laid_out(self) -> bool:
        """True once the docks have their places in the shown window (see :meth:`showEvent`)."""
        return bool(self._laid_out)

    def _size_docks(self) -> None:
        models, chat, bottom = self.docks["models"], self.docks["chat"], self.docks[BOTTOM_ROW[0]]
        width, height = self.width(), self.height()
        self.resizeDocks([models, chat], [round(MODELS_SHARE * width), round((1 - MODELS_SHARE) * width)],
                         Qt.Orientation.Horizontal)
        share = self._bottom_share
        self.resizeDocks([chat, bottom], [round((1 - share) * height), round(share * height)],
                         Qt.Orientation.Vertical)
        self.layout().activate()  # the docks and what is in them take their sizes now
        self._laid_out = True

    def show_panel(self, name: str) -> None:
        """Bring panel ``name`` to the front (``loomlab --panel NAME``); one of the bottom row
        takes about half the window's height, the person having asked to look at it."""
        self.docks[name].show()
        self.docks[name].raise_()
        if name in BOTTOM_ROW:
            self._bottom_share = FOCUS_SHARE
            if self.laid_out:
                self._size_docks()

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        self.open_model_action = self._action("Open &model...", "Ctrl+Shift+O", self.choose_model)
        self.open_action = self._action("&Open network...", QKeySequence.StandardKey.Open,
                                        self.choose_network)
        self.save_action = self._action("&Save network as...", "Ctrl+Shift+S", self.choose_save_path)
        self.quit_action = self._action("&Quit", QKeySequence.StandardKey.Quit, self.close)
        file_menu.addAction(self.open_model_action)
        file_menu.addAction(self.open_action)
        file_menu.addAction(self.save_action)
        self.recent_menu = file_menu.addMenu("Open &recent")
        file_menu.addSeparator()
        file_menu.addAction(self.quit_action)
        self._refresh_recent()

        view_menu = self.menuBar().addMenu("&View")
        for name in PANELS:
            view_menu.addAction(self.docks[name].toggleViewAction())
        view_menu.addSeparator()
        self.backend_menu = BackendMenu(self.backend_choice, self)
        view_menu.addMenu(self.backend_menu)
        self._build_theme_menu(view_menu.addMenu("&Theme"))

        help_menu = self.menuBar().addMenu("&Help")
        self.about_action = self._action(f"&About {APP_NAME}", None, self.show_about)
        self.shortcuts_action = self._action("&Keyboard shortcuts", None, self.show_shortcuts)
        help_menu.addAction(self.about_action)
        help_menu.addAction(self.shortcuts_action)

    def _build_theme_menu(self, menu) -> None:
        """System / Light / Dark, persisted; "System" follows the desktop's scheme as it changes."""
        saved = self.settings.value("theme", "system")
        self.theme = ThemeController(QApplication.instance(), saved if saved in THEMES else "system", self)
        group = QActionGroup(self)
        self.theme_actions = {}
        for choice in THEMES:
            action = QAction(choice.capitalize(), self, checkable=True)
            action.setChecked(choice == self.theme.choice)
            action.triggered.connect(lambda _=False, c=choice: self.set_theme(c))
            group.addAction(action)
            menu.addAction(action)
            self.theme_actions[choice] = action

    def set_theme(self, choice: str) -> None:
        self.theme.set_choice(choice)
        self.theme_actions[choice].setChecked(True)
        self.settings.setValue("theme", choice)

    def _action(self, text: str, shortcut, slot) -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut) if isinstance(shortcut, str) else shortcut)
        action.triggered.connect(slot)
        return action

    def _build_status_bar(self) -> None:
        # Labels rather than showMessage(): a menu's status tips would erase a temporary message.
        self.network_label = QLabel("No network open")
        self.backend_label = BackendStatus(self.backend_choice)
        self.memory_label = QLabel("")
        self.speed_label = QLabel("")
        # Fixed sizes: a label that may change size asks its layout again on every setText, and
        # the status bar then repaints whole (every label, and the window behind them): 13 times
        # in a 2.5 s reply. Qt skips that for a widget fixed in both directions.
        for label, widest in ((self.speed_label, "8888.8 tok/s"), (self.memory_label, "memory: 888888 MiB")):
            label.setFixedSize(label.fontMetrics().horizontalAdvance(widest) + 8, label.sizeHint().height())
            label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        self.statusBar().addWidget(self.network_label, 1)
        for label in (self.speed_label, self.memory_label, self.backend_label):
            self.statusBar().addPermanentWidget(label)
        self.memory_timer = QTimer(self)
        self.memory_timer.setInterval(1000)
        self.memory_timer.timeout.connect(self._update_memory)
        self.memory_timer.start()
        self._update_memory()

    def _wire(self) -> None:
        models = self.panels["models"]
        models.model_loaded.connect(self.set_model)
        models.model_unloaded.connect(self.clear_model)
        models.network_opened.connect(self.set_network)
        models.show_requested.connect(self.show_in_panels)
        self.panels["chat"].tokens_per_second.connect(
            lambda tps: self.speed_label.setText(f"{tps:.1f} tok/s"))
        # the Chat and Server panels switch the one loaded model's activations: each shows the other's switch
        chat, server = self.panels["chat"], self.panels["server"]
        chat.activations_changed.connect(lambda _mode: server.show_activations())
        server.activations_changed.connect(lambda _mode: chat.show_activations())
        for name in LINKED:  # selecting a layer in one of them selects it in the others
            self.panels[name].layer_selected.connect(lambda key, source=name: self._select_layer(key, source))
        self.runner.changed.connect(self._release_if_idle)
        # trained weights: the panels that show weights read them again
        self.panels["run"].trained.connect(lambda _losses: self.panels["morph"].refresh())
        self.panels["run"].trained.connect(lambda _losses: self.panels["topology"].refresh())
        self.panels["morph"].morphed.connect(lambda _reports: self.panels["topology"].refresh())
        # the Inspect panel inspects the model as morphed, and offers the chat's turns
        inspect = self.panels["inspect"]
        self.panels["morph"].morphed.connect(lambda _reports: inspect.refresh())
        inspect.set_conversation_source(chat.session.model_messages)
        chat.reply_finished.connect(lambda _message: inspect.pull_conversation())
        dna, evolution = self.panels["dna"], self.panels["evolution"]
        dna.logic_shifts_changed.connect(self.panels["topology"].show_logic_shifts)
        dna.child_ready.connect(self._open_child)
        models.listed.connect(self._offer_listed_models)
        # the best network so far is shown, and named in the status bar, as an opened one is
        evolution.best_changed.connect(lambda net: self._show_network(net, "evolution's best"))
        evolution.recipe_chosen.connect(self._choose_recipe)
        evolution.model_morphed.connect(self._model_morphed)

    def _choose_backend(self, backend: str | None) -> None:
        """The backend models and networks load on: ``backend``, else the saved choice. One this
        machine cannot run (CuPy gone, no device) says why in the status bar; numpy stays."""
        choice = self.backend_choice
        choice.changed.connect(lambda name: self.settings.setValue("backend", name))
        choice.changed.connect(lambda name: setattr(self.panels["models"], "backend", name))
        choice.refused.connect(self._backend_refused)
        choice.set_name(backend or str(self.settings.value("backend", "numpy")))

    def _backend_refused(self, message: str) -> None:
        """Chosen in the menu: a dialog says why. At startup (the saved choice): the status bar."""
        if self.isVisible():
            QMessageBox.warning(self, APP_NAME, message)
        else:
            self.statusBar().showMessage(message, 15000)

    def _offer_listed_models(self, entries: list) -> None:
        """The Models panel's models are offered for comparison (by name or path: a model is
        read only when compared)."""
        for entry in entries:
            if not entry.problem:
                self.panels["dna"].add_choice(entry.name if entry.source == "builtin" else str(entry.path),
                                              entry.name)

    def _open_child(self, child, name: str) -> None:
        """A spliced network opens in the panels; a merged model's folder loads as a model."""
        if isinstance(child, str):
            self.open_model(child)
        else:
            self.set_network(child, name)

    def _choose_recipe(self, recipe: dict) -> None:
        """An evolved quantization recipe goes to the Morph panel (applied when the user says)."""
        self.panels["morph"].choose_recipe(recipe)
        self.docks["morph"].show()
        self.docks["morph"].raise_()

    def _model_morphed(self, _reports: list) -> None:
        """The Evolution panel morphed the loaded model to an evolved recipe (Apply, Export GGUF):
        the panels showing its layers read them again, as after the Morph panel's Apply."""
        for name in ("morph", "topology", "inspect"):
            self.panels[name].refresh()

    def _select_layer(self, key, source: str) -> None:
        for name in LINKED:
            if name != source:
                self.panels[name].select_layer_key(key)

    # ----- what is open ----------------------------------------------------------------------
    def set_model(self, model) -> None:
        """A language model was loaded: chat with it, show and morph its grid.

        Each panel takes the model in its own event-loop turn, so the GUI never stalls for the
        sum of them (a 10 ms timer keeps firing: tests/app/test_main_window.py)."""
        self.model = model
        label = f"model: {model.name or model.info()['architecture']}"
        self._offer_model(model)
        self._chain(lambda: self.model is model, [
            lambda: self.panels["chat"].set_model(model), lambda: self.panels["morph"].set_model(model),
            lambda: self.panels["evolution"].set_model(model), lambda: self.panels["server"].set_model(model),
            lambda: self.panels["inspect"].set_model(model),
            lambda: self._show_network(model.net, label)])

    def _start_server(self, host: str, port: int, api_key: str | None, max_batch: int, on_log):
        """The Server panel's starter (called on its job's thread): serve the loaded model."""
        from loomlab.app.serve.server import Server  # the web stack is imported once a server starts

        model = self.model
        if model is None:
            raise LoomConfigError("no model is loaded: load one in the Models panel first")
        server = Server(model, host=host, port=port, api_key=api_key, max_batch=max_batch,
                        model_name=model.name or None, on_log=on_log)
        server.start()
        return server

    def _offer_model(self, model) -> None:
        """The DNA panel offers the loaded model (compare it, as morphed, with its file or another
        model); only the model loaded now, so an unloaded one is not kept alive there."""
        if self._model_choice is not None:
            self.panels["dna"].remove_choice(self._model_choice)
        self._model_choice = None
        if model is not None:
            self._model_choice = f"loaded: {model.name or 'model'}"
            self.panels["dna"].add_choice(model, self._model_choice)
            source = model.net.source  # its file, to compare the model as morphed with
            if source is not None and source.path:
                self.panels["dna"].add_choice(str(source.path), str(source.path))

    def _chain(self, still_wanted, steps: list) -> None:
        """Run ``steps`` one by one, each a pause after the one before (the first a pause after
        now), while ``still_wanted()``. The pause lets each step's repaint run on its own, with
        due timers between: queued back to back, Qt ran the steps and repaints in one stall."""
        def run() -> None:
            self._steps_pending -= 1
            if not self._shut_down and still_wanted():
                steps[0]()
                self._chain(still_wanted, steps[1:])

        if steps:
            self._steps_pending += 1
            QTimer.singleShot(STEP_PAUSE_MS, self, run)

    @property
    def handing_over(self) -> bool:
        """True while panels are still to take what was just opened (see :meth:`_chain`); False
        once every panel has it."""
        return self._steps_pending > 0

    def clear_model(self) -> None:
        """The model was unloaded: no panel keeps its grid (a Loom network opened since stays), and
        the memory it used goes back to the system once its last job has ended."""
        self.panels["chat"].clear_model()
        self.panels["inspect"].clear_model()
        self.panels["evolution"].set_model(None)
        self.panels["server"].set_model(None)
        self._offer_model(None)
        if self.model is not None and self.network is self.model.net:
            self.panels["morph"].clear()
            self.panels["topology"].set_network(None)
            self.panels["telemetry"].set_network(None)
            self.panels["run"].set_network(None)
            self.network = None
            self.network_label.setText("No network open")
        self.model = None
        self.speed_label.setText("")
        self._release_pending = True
        self._release_if_idle()

    def _release_if_idle(self) -> None:
        """Give freed memory back (an unloaded model's) once no job may still hold part of it and
        the events queued for the panels that held it have run (a short pause after that)."""
        if self._release_pending and not self.runner.active and not self._shut_down:
            self._release_timer.start()

    def _release(self) -> None:
        if self.runner.active:
            return  # runner.changed calls _release_if_idle again when the jobs end
        if self.handing_over:  # panels still to take what came since: nothing calls back, so look again
            self._release_timer.start()
            return
        self._release_pending = False
        release_memory()

    def show_in_panels(self, item) -> None:
        """Show a loaded model (a TextModel) or an opened network in the Chat, Topology, Telemetry,
        Morph and Run panels again (the Models panel's "Show in panels")."""
        if hasattr(item, "net"):
            self.set_model(item)
        else:
            self.set_network(item)

    def set_network(self, net, label: str = "network") -> None:
        """A Loom network was opened: show it, watch it, morph it."""
        self.panels["morph"].set_network(net)
        self._show_network(net, label)

    def _show_network(self, net, label: str) -> None:
        self.network = net
        self.network_label.setText(f"{label} — {model_parts(net)}, {net.parameter_count():,} parameters")
        self._chain(lambda: self.network is net, [lambda: self.panels["topology"].set_network(net),
                                                  lambda: self.panels["telemetry"].set_network(net),
                                                  lambda: self.panels["run"].set_network(net)])

    # ----- file actions ----------------------------------------------------------------------
    def choose_model(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open model", "", MODEL_FILTER)
        if path:
            self.open_model(path)

    def open_model(self, path_or_alias: str) -> None:
        self._remember(path_or_alias)
        self.panels["models"].load(path_or_alias)

    def choose_network(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open network", "", NETWORK_FILTER)
        if path:
            self.open_network(path)

    def open_network(self, path: str) -> None:
        self._remember(path)
        self.panels["models"].open_network(path)

    def choose_save_path(self) -> None:
        if self.network is None:
            QMessageBox.information(self, APP_NAME, "Open a network first.")
            return
        path, _ = QFileDialog.getSaveFileName(self, "Save network as", "", NETWORK_FILTER)
        if path:
            self.save_network_as(path)

    def save_network_as(self, path: str) -> None:
        net = self.network
        self.runner.start(lambda job: save_network(net, path), name="save",
                          on_success=lambda _: self.statusBar().showMessage(f"saved {path}", 5000),
                          on_failure=lambda msg: QMessageBox.warning(self, APP_NAME, msg))

    def _remember(self, path: str) -> None:
        recent = [p for p in self._recent() if p != path]
        self.settings.setValue("recent", [path, *recent][:MAX_RECENT])
        self._refresh_recent()

    def _recent(self) -> list[str]:
        value = self.settings.value("recent", [])
        return [value] if isinstance(value, str) else list(value or [])

    def _refresh_recent(self) -> None:
        self.recent_menu.clear()
        for path in self._recent():
            opener = self.open_network if path.endswith((".json", ".loom")) else self.open_model
            self.recent_menu.addAction(path, lambda p=path, o=opener: o(p))
            self.panels["dna"].add_choice(path, path)  # a path: read when compared, nothing kept
        self.recent_menu.setEnabled(bool(self._recent()))

    # ----- help ------------------------------------------------------------------------------
    def about_text(self) -> str:
        return (f"{APP_NAME} {version('loomlab')}\n\nA workbench for looking inside neural networks "
                "and talking to them, over a Python reimplementation of Loom's M-POLY-VTD engine.")

    def show_about(self) -> None:
        QMessageBox.about(self, f"About {APP_NAME}", self.about_text())

    def show_shortcuts(self) -> None:
        QMessageBox.information(self, "Keyboard shortcuts", "\n".join(f"{k}\t{v}" for k, v in SHORTCUTS))

    def snapshot(self) -> QPixmap:
        """The window as it looks. ``grab()`` leaves the 3-D view blank (it is a native window of
        its own, see ``PickingView``), so the view's own frame is painted over its place."""
        pixmap = self.grab()
        view = self.panels["topology"].view
        if view.container.isVisible() and view.isExposed():
            painter = QPainter(pixmap)
            painter.drawImage(view.container.mapTo(self, QPoint(0, 0)), view.grabFramebuffer())
            painter.end()
        return pixmap

    # ----- status, layout, shutdown ----------------------------------------------------------
    def _update_memory(self) -> None:
        rss = rss_bytes()
        self.memory_label.setText(f"memory: {rss / 2**20:.0f} MiB" if rss else "")
        self.backend_label.refresh()  # a GPU's memory

    def _restore_layout(self) -> None:
        geometry, state = self.settings.value("geometry"), self.settings.value("state")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        self._restored = isinstance(state, QByteArray) and self.restoreState(state, LAYOUT_VERSION)

    def show_kernels(self, compilation: KernelCompilation) -> None:
        """Count a first run's kernel compilation in the status bar (with Skip) until it ends."""
        self.kernels_status = KernelsStatus(compilation, self)
        self.statusBar().addWidget(self.kernels_status)

    def shutdown(self) -> None:
        """Stop everything this window started; safe to call twice."""
        self._shut_down = True
        if self.kernels_status is not None:
            self.kernels_status.stop()  # what it compiled stays cached for the next start
        self.memory_timer.stop()
        self._release_timer.stop()
        self.settings.setValue("geometry", self.saveGeometry())
        self.settings.setValue("state", self.saveState(LAYOUT_VERSION))
        # panels first: a finishing reply still writes to the workspace; the server before the
        # Models panel, which closes the model the server answers with
        for name in ("server", *(n for n in PANELS if n != "server")):
            self.panels[name].shutdown()
        self.runner.shutdown()
        if self.model is not None:
            self.model.close()
            self.model = None
        self.workspace.close()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)
