"""Starting the desktop application. Only ``loomlab`` without a subcommand imports this module,
so the headless commands never load Qt.

``loomlab [--panel NAME] [--model M] [--network NET] [--prompt TEXT]`` opens the window and
drives it into that state (open the network, load the model, send the prompt and wait for the
reply); with ``--screenshot PATH`` it then renders the window to a PNG and exits. A screenshot
run works in a throwaway workspace and settings: its chat, recent files and layout never reach
the user's own. A failure on the way prints one line on stderr and exits with status 2.
"""

from __future__ import annotations

import gc
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

import pyqtgraph as pg
from PySide6.QtCore import QCoreApplication, QEventLoop, QSettings, Qt
from PySide6.QtWidgets import QApplication

from .main_window import APP_NAME, PANELS, MainWindow

if TYPE_CHECKING:
    from loomlab.core.llm.model.kernel_compilation import KernelCompilation

SCREENSHOT_SIZE = (1600, 1000)  # the size every panel is laid out and tested for
STATE_TIMEOUT_S = 600  # fetching a built-in model on a slow network can take minutes


@dataclass
class GuiOptions:
    screenshot: str | None = None
    panel: str | None = None
    model: str | None = None
    network: str | None = None
    prompt: str | None = None
    demo: bool = False
    backend: str | None = None  # None: the saved View > Backend choice


def make_app(argv: list[str]) -> QApplication:
    # set before the QApplication exists: a floated 3-D dock needs GL contexts shared
    QCoreApplication.setAttribute(Qt.ApplicationAttribute.AA_ShareOpenGLContexts)
    app = QApplication.instance() or QApplication(argv)
    app.setApplicationName(APP_NAME)
    app.setApplicationVersion(version("loomlab"))
    pg.setConfigOptions(imageAxisOrder="row-major")
    return app


def warm_up() -> KernelCompilation | None:
    """Prepare the process for a GUI thread that shares the GIL with engine workers; returns the
    first run's kernel compilation, for the window's status bar (None when every kernel was cached).

    Load the language-model kernels before the window shows: numba's first call initialises its
    compiler and reads the disk cache, holding the GIL for ~0.35 s, which in a worker later
    froze the window; on a new install a child process compiles them meanwhile
    (:func:`~.first_run.start_kernels`). And hand the GIL over every 1 ms instead of 5: each Qt
    event the GUI thread handles takes the GIL several times, and behind a worker running Python
    code the waits added up to stalls. Last, move what startup built (~200k objects: Qt,
    pyqtgraph, numpy, numba) out of the cyclic garbage collector's reach: a full collection over
    them took 120-200 ms with the GIL held, whichever thread set it off, and one landing during a
    model load was the GUI's worst stall. Afterwards a full collection walks only what came
    later (~5k objects with a model loaded: ~3 ms). Frozen objects are never collected, which
    costs nothing here: modules, classes and the app's singletons live as long as the process.
    """
    import loomlab.core.llm.generate.textmodel  # noqa: F401 - imported now rather than by the first load

    from .first_run import start_kernels

    compilation = start_kernels()
    sys.setswitchinterval(0.001)
    gc.collect()  # so that only live objects are frozen
    gc.freeze()
    return compilation


def run_gui(argv: list[str], options: GuiOptions | None = None) -> int:
    """Show the main window and run the event loop (or take a screenshot); returns the exit code."""
    options = options or GuiOptions()
    app = make_app(argv)
    compilation = warm_up()
    if options.screenshot is None:
        window = MainWindow(options.backend)
        if compilation is not None:
            window.show_kernels(compilation)
        return _run_window(app, window, options)
    if compilation is not None:  # a screenshot waits for nothing: the kernels compile when used
        compilation.stop()
    with tempfile.TemporaryDirectory(prefix="loomlab-screenshot-") as scratch:
        settings = QSettings(str(Path(scratch) / "settings.ini"), QSettings.Format.IniFormat)
        window = MainWindow(options.backend, workspace_path=Path(scratch) / "workspace.sqlite3",
                            settings=settings)
        try:
            return _take_screenshot(window, options)
        finally:
            window.close()


def _run_window(app: QApplication, window: MainWindow, options: GuiOptions) -> int:
    window.show()
    try:
        drive(window, options)
    except RuntimeError as e:
        window.close()
        return _fail(e)
    return app.exec()


def _take_screenshot(window: MainWindow, options: GuiOptions) -> int:
    window.resize(*SCREENSHOT_SIZE)
    window.show()
    try:
        drive(window, options)
        _settle(window, 1.0)
        if not window.snapshot().save(options.screenshot):
            raise RuntimeError(f"cannot write the screenshot to {options.screenshot}")
    except RuntimeError as e:
        return _fail(e)
    return 0


def _fail(error: RuntimeError) -> int:
    print(f"loomlab: error: {error}", file=sys.stderr)
    return 2


def drive(window: MainWindow, options: GuiOptions) -> None:
    """Bring ``window`` to the state ``options`` describe, waiting on the event loop."""
    if options.panel is not None:
        if options.panel not in PANELS:
            raise RuntimeError(f"unknown panel {options.panel!r}; panels: {', '.join(PANELS)}")
        window.show_panel(options.panel)
    if options.network is not None:
        window.open_network(options.network)
        _wait(window, lambda: window.network is not None and not window.handing_over, "opening the network")
    if options.model is not None:
        window.open_model(options.model)
        _wait(window, lambda: window.model is not None and not window.handing_over, "loading the model")
    if options.demo:
        dna = window.panels["dna"]
        dna.show_example(*dna.example_pair(), ("XOR seed", "NEAT mutant"))
        window.panels["evolution"].fill_demo(generations=30, population=40, seed=1)
    if options.prompt is not None:
        if window.model is None:
            raise RuntimeError("--prompt needs --model")
        chat = window.panels["chat"]
        replies = []
        chat.reply_finished.connect(replies.append)
        chat.send(options.prompt)
        _wait(window, lambda: bool(replies), "waiting for the reply")
        print(replies[0].content, flush=True)
    if options.panel == "inspect" and window.model is not None:
        _inspect(window, options)


def _inspect(window: MainWindow, options: GuiOptions) -> None:
    """The Inspect panel shows its first view: of the chat's reply (``--prompt``), else of its own
    prompt."""
    inspect = window.panels["inspect"]
    _wait(window, lambda: inspect.inspector is not None, "handing the model to the Inspect panel")
    if options.prompt is not None:
        inspect.pull_conversation()
        inspect.use_turn(-1)
    view = inspect.current_view()
    shown = lambda: inspect.result(view) is not None  # noqa: E731
    _wait(window, lambda: shown() or (not inspect.is_busy() and bool(inspect.tokens)), "inspecting")


def _wait(window: MainWindow, done: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + STATE_TIMEOUT_S
    while not done():
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        if not window.runner.active and not window.handing_over and not done():
            _settle(window, 0.2)  # a job's result may still be queued
            if not done():
                raise RuntimeError(f"{what} failed: {window.panels['models'].status_label.text()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} took longer than {STATE_TIMEOUT_S} s")
        time.sleep(0.01)


def _settle(window: MainWindow, seconds: float) -> None:
    """Let timers (telemetry, topology colours) and repaints run before grabbing."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 50)
        time.sleep(0.01)
