"""The main window: docks and menus, wiring between panels, persisted layout, clean shutdown."""

from __future__ import annotations

import gc
import json
import time
from importlib.metadata import version

import numpy as np
import pytest
from PySide6.QtCore import QSettings, QTimer
from PySide6.QtWidgets import QApplication, QMessageBox, QTabBar

from loomlab.app.main_window import PANELS, STEP_PAUSE_MS, MainWindow
from loomlab.core import load_network
from loomlab.core.llm.text.tokenizer_process import TokenizerProcess
from loomlab.core.morph import weighted_cells
from loomlab.views.morph_panel import DTYPE, LAYER

from ..core.goldens import forward_case
from ..views.panel_layout import DOCKED


def make_window(qtbot, tmp_path, size: tuple[int, int] | None = None):
    """A main window on fresh settings, shown; ``size`` is asked for before it shows (as
    ``loomlab --screenshot`` does), so the default layout is laid out for it."""
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    win = MainWindow(workspace_path=tmp_path / "workspace.sqlite3", settings=settings,
                     model_folders=[str(tmp_path / "models")])
    qtbot.addWidget(win)
    if size is not None:
        win.resize(*size)
    win.show()
    qtbot.waitExposed(win)
    qtbot.waitUntil(lambda: win.laid_out, timeout=5000)  # the docks take their places just after
    return win


TAB_GROUPS = [("Chat", "Topology 3D", "Inspect"), ("Server", "Telemetry", "Morph", "Run", "DNA", "Evolution")]


def tab_bars(win: MainWindow) -> list[tuple[str, ...]]:
    """The tabs of each tab bar the window shows: one bar a group (Qt drew a stale copy of a
    group's bar over the status bar when the group was tabified before the first layout)."""
    return sorted(tuple(b.tabText(i) for i in range(b.count()))
                  for b in win.findChildren(QTabBar) if b.isVisible() and b.parent() is win)


def on_screen(win: MainWindow) -> set[str]:
    """The panels a person sees: a dock behind another's tab is "visible" to Qt, but not exposed."""
    return {name for name, panel in win.panels.items() if not panel.visibleRegion().isEmpty()}


def assert_docks_fit(win: MainWindow) -> None:
    """Every panel on screen, its dock and the tab bars lie inside the window, each panel has at
    least its minimum size, and the status bar shows."""
    inside = win.rect()
    for what, rect in (("status bar", win.statusBar().geometry()),
                       *(("tab bar", b.geometry()) for b in win.findChildren(QTabBar)
                         if b.isVisible() and b.parent() is win)):
        assert inside.contains(rect), f"the {what} at {rect.getRect()} is outside the window {inside.size()}"
    assert on_screen(win)
    for name in on_screen(win):
        dock, panel, need = win.docks[name], win.panels[name], win.panels[name].minimumSizeHint()
        assert inside.contains(dock.geometry()), \
            f"the {name} dock at {dock.geometry().getRect()} is outside the window {inside.size()}"
        assert panel.width() >= need.width() and panel.height() >= need.height(), \
            f"the {name} panel is {panel.width()}x{panel.height()}, needs {need.width()}x{need.height()}"


@pytest.fixture
def window(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    yield win
    win.close()


@pytest.fixture
def golden_net_path(tmp_path):
    path = tmp_path / "block.json"
    path.write_text(json.dumps(forward_case("transformer_block")["network"]))
    return path


def menu_actions(win: MainWindow) -> dict[str, list[str]]:
    plain = lambda text: text.replace("&", "")
    return {plain(m.title()): [plain(a.text()) for a in m.actions() if not a.isSeparator()]
            for m in (a.menu() for a in win.menuBar().actions())}


def test_menus_and_docks(window):
    menus = menu_actions(window)
    assert menus["File"] == ["Open model...", "Open network...", "Save network as...", "Open recent", "Quit"]
    assert menus["View"] == ["Models", "Chat", "Topology 3D", "Inspect", "Telemetry", "Morph", "Run", "DNA",
                             "Evolution", "Server", "Backend", "Theme"]
    assert menus["Help"] == ["About Loom Lab", "Keyboard shortcuts"]
    assert set(window.docks) == set(PANELS)
    assert all(dock.widget() is window.panels[name] for name, dock in window.docks.items())
    assert tab_bars(window) == TAB_GROUPS


@pytest.mark.parametrize("size", [(1280, 800), (1600, 1000), (1920, 1080)])
def test_the_window_takes_the_size_asked_for_and_every_panel_fits_it(qtbot, tmp_path, size):
    """Issue 31 §2: the docks' minimum heights added up to a 2621x1135 window whatever size was
    asked for (at 800 px the bottom tab bar and the status bar were 335 px off screen). Now the
    window is the size asked for, and each panel brought to the front in turn lies inside it
    with at least its minimum size."""
    win = make_window(qtbot, tmp_path, size)
    try:
        assert win.size().toTuple() == size
        assert tab_bars(win) == TAB_GROUPS
        assert_docks_fit(win)
        for name in PANELS:
            win.docks[name].raise_()
            qtbot.waitUntil(lambda n=name: n in on_screen(win), timeout=5000)
            assert win.size().toTuple() == size
            assert_docks_fit(win)
    finally:
        win.close()


def test_the_default_layout_is_built_around_the_chat(qtbot, tmp_path):
    """Issue 31 §2: at 1600x1000 the transcript had ~150 px while Telemetry took 600, and Server
    hid behind Chat's tab. Now Chat and Server show together, Telemetry waits behind a tab, and
    the transcript is the tallest thing on screen. A panel in the bottom row gets the size the
    panels' own tests lay them out at (DOCKED)."""
    win = make_window(qtbot, tmp_path, (1600, 1000))
    try:
        assert on_screen(win) == {"models", "chat", "server"}
        transcript, bottom_row = win.panels["chat"].view, win.docks["server"]
        assert transcript.height() > 0.35 * win.height()
        assert transcript.height() > 1.5 * bottom_row.height()
        assert win.docks["chat"].width() > 2 / 3 * win.width()
        bottom_panel = win.panels["server"].size()
        assert bottom_panel.width() == DOCKED[0] and abs(bottom_panel.height() - DOCKED[1]) <= 10
    finally:
        win.close()


def test_a_first_load_says_that_it_prepares_kernels_and_counts_them(window, qtbot, monkeypatch):
    """Issue 31 §4: a first load sat ~19 s silent after its bar while numba compiled kernels. The
    load's worker reports each compiled kernel (core.llm.kernel_warmup); the Models panel's load
    progress says what it waits for, with the count, while the bar runs."""
    import threading

    from loomlab.core.errors import LoomConfigError
    from loomlab.core.llm.kernels.kernel_warmup import KERNELS_STAGE

    checked = threading.Event()

    def compiling(target, *, progress, **_):  # stands in for load_model on a cold cache
        for done in range(3):
            progress(KERNELS_STAGE, done, 0)
        checked.wait(10)
        raise LoomConfigError("the load ends here")

    monkeypatch.setattr("loomlab.views.models_panel.load_model", compiling)
    models = window.panels["models"]
    window.open_model("smollm2-135m")
    try:
        qtbot.waitUntil(lambda: models.status_label.text().endswith("2 done…"), timeout=10000)
        assert models.status_label.text() == "Preparing kernels for this CPU (first run only): 2 done…"
        assert models.progress_bar.isVisible() and models.progress_bar.maximum() == 0  # busy
    finally:
        checked.set()
    qtbot.waitUntil(lambda: not window.runner.active, timeout=10000)
    assert models.status_label.text().endswith("the load ends here")


def test_about_and_status_bar(window, monkeypatch):
    shown = []
    monkeypatch.setattr(QMessageBox, "about", staticmethod(lambda *a: shown.append(a)))
    window.about_action.trigger()
    assert version("loomlab") in shown[0][2]
    assert window.backend_label.text() == "backend: numpy"
    assert window.memory_label.text().startswith("memory: ") and window.memory_label.text().endswith("MiB")


def test_opening_a_network_reaches_every_panel(window, qtbot, golden_net_path):
    window.open_network(str(golden_net_path))
    qtbot.waitUntil(lambda: window.network is not None, timeout=10000)
    expected = load_network(golden_net_path)
    # the panels take it one by one, each in its own event-loop turn
    qtbot.waitUntil(lambda: window.panels["telemetry"].network is window.network, timeout=10000)
    assert window.panels["topology"].network is window.network
    assert window.network.parameter_count() == expected.parameter_count()
    assert f"{expected.parameter_count():,} parameters" in window.network_label.text()
    # the Run panel takes it last: it can run and train what is shown
    qtbot.waitUntil(lambda: window.panels["run"].network is window.network, timeout=10000)
    assert window._recent()[0] == str(golden_net_path)
    # the DNA panel offers recent files and the Models panel's models to compare
    dna_choices = window.panels["dna"].picker_a.combo
    assert dna_choices.findText(str(golden_net_path)) >= 0
    qtbot.waitUntil(lambda: not window.panels["models"].scanning, timeout=10000)
    assert dna_choices.findText("smollm2-135m") >= 0
    morph = window.panels["morph"]  # behind the Server tab: it fills its table once opened
    assert morph.table.rowCount() == 0
    window.docks["morph"].raise_()
    qtbot.waitUntil(lambda: morph.table.rowCount() == len(weighted_cells(window.network)), timeout=10000)


def test_dna_and_evolution_panels_reach_the_others(window, qtbot, golden_net_path):
    dna, evolution = window.panels["dna"], window.panels["evolution"]
    topology = window.panels["topology"]
    # an evolution run's best network is shown in the Topology view
    best = evolution.fill_demo(generations=3, population=12, seed=2).best
    qtbot.waitUntil(lambda: topology.network is best, timeout=10000)
    assert window.network is best and window.network_label.text().startswith("evolution's best — ")
    # a comparison's logic shifts become arrows there
    a, b = dna.example_pair()
    topology.set_network(a)
    dna.logic_shifts_changed.emit([("0,0,0,0", "0,0,0,1", 0.9)])
    assert len(topology.shift_arrows) == 1
    # a spliced child opens in every panel
    dna.child_ready.emit(b, "child")
    qtbot.waitUntil(lambda: window.panels["run"].network is b, timeout=10000)
    assert window.network is b and window.network_label.text().startswith("child")
    # a recipe goes to Morph, which shows it chosen (applied when the user says)
    window.docks["morph"].raise_()
    morph = window.panels["morph"]
    qtbot.waitUntil(lambda: morph.table.rowCount() == len(weighted_cells(b)), timeout=10000)
    first = morph.table.item(0, LAYER).text()
    evolution.recipe_chosen.emit({first: "int8"})
    assert morph.table.cellWidget(0, DTYPE).currentText() == "int8"
    assert [la.cfg.dtype for _, la in weighted_cells(b)][0] != "int8"
    # a gguf-recipe member applied to the model by the Evolution panel: Morph reads the layers again
    with qtbot.waitSignal(morph.reported, timeout=10000):
        evolution.model_morphed.emit([])


def test_only_panels_on_screen_watch_the_network(window, qtbot, golden_net_path):
    """A dock behind another's tab is still "visible" to Qt; its panel must not make the engine
    compute statistics for it (two watching panels cost a decoding model twice)."""
    window.open_network(str(golden_net_path))
    qtbot.waitUntil(lambda: window.network is not None, timeout=10000)
    qtbot.waitUntil(lambda: window.panels["run"].network is window.network, timeout=10000)
    net, topology, telemetry = window.network, window.panels["topology"], window.panels["telemetry"]
    # the default layout: Topology behind Chat, Telemetry behind Server
    assert net.observers == []
    window.docks["topology"].raise_()
    qtbot.waitUntil(lambda: net.observers == [topology._observer], timeout=5000)
    window.docks["telemetry"].raise_()
    qtbot.waitUntil(lambda: telemetry._observer in net.observers and telemetry.timer.isActive(), timeout=5000)
    window.docks["morph"].raise_()
    qtbot.waitUntil(lambda: telemetry._observer is None and not telemetry.timer.isActive(), timeout=5000)
    assert net.observers == [topology._observer]
    window.docks["chat"].raise_()
    window.docks["telemetry"].raise_()
    qtbot.waitUntil(lambda: net.observers == [telemetry._observer] and telemetry.timer.isActive(),
                    timeout=5000)


def test_the_status_bar_counts_cells_and_the_layers_in_them(window, qtbot, tmp_path):
    from loomlab.core import VolumetricNetwork, make_layer, save_network

    net = VolumetricNetwork(2, 2, 2, 2)  # 8 cells of 2 layers, each 4x4 weights (Loom's Dense has no bias)
    for i in range(8):
        net.cells[2 * i] = make_layer("Dense", input_height=4, output_height=4, activation="ReLU")
        net.cells[2 * i + 1] = make_layer("Dense", input_height=4, output_height=4, activation="Linear")
    save_network(net, tmp_path / "grid.json")
    window.open_network(str(tmp_path / "grid.json"))
    qtbot.waitUntil(lambda: window.network is not None, timeout=10000)
    # the words every panel uses (layer_names.Parts)
    assert "8 cells × 2 per cell · 16 layers, 16 weighted, 256 parameters" in window.network_label.text()


def test_selecting_a_layer_in_one_panel_selects_it_in_the_others(window, qtbot, golden_net_path):
    window.open_network(str(golden_net_path))
    qtbot.waitUntil(lambda: window.network is not None and window.panels["run"].network is window.network,
                    timeout=10000)  # the Run panel takes it last
    window.docks["morph"].raise_()
    morph, topology, telemetry = (window.panels[n] for n in ("morph", "topology", "telemetry"))
    qtbot.waitUntil(lambda: morph.table.rowCount() > 1, timeout=10000)
    keys = [(r.z, r.y, r.x, r.l, r.path) for r in window.network.blueprint()]
    weighted = [k for k in keys if morph.select_layer_key(k)]
    key = weighted[-1]
    topology.layer_selected.emit(key)  # as a click on a point does
    assert telemetry.selected_key == key and morph.selected_layer_key() == key
    other = weighted[0]
    morph.layer_selected.emit(other)
    assert topology.selected_key == other and telemetry.selected_key == other


def test_closing_while_panels_take_a_network_stops_the_handover(qtbot, tmp_path, golden_net_path):
    win = make_window(qtbot, tmp_path)
    # closed right after the window takes the network (a slot connected after the window's own),
    # before the first panel's turn: polling for it could miss that turn on a busy machine
    win.panels["models"].network_opened.connect(lambda _net: win.close())
    win.open_network(str(golden_net_path))
    qtbot.waitUntil(lambda: win.network is not None, timeout=10000)
    qtbot.wait(3 * STEP_PAUSE_MS + 100)  # past every pending step (the fixture checks for timers)
    assert win.panels["topology"].network is None and win.panels["telemetry"].network is None


def test_view_menu_hides_a_panel_and_the_layout_persists(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    toggle = win.docks["telemetry"].toggleViewAction()
    assert toggle.isChecked()
    toggle.trigger()
    assert not win.docks["telemetry"].isVisible()
    win.close()
    again = make_window(qtbot, tmp_path)
    assert not again.docks["telemetry"].isVisible() and again.docks["chat"].isVisible()
    again.close()


def test_a_bottom_panel_asked_for_takes_half_the_height(qtbot, tmp_path):
    """``loomlab --panel dna`` (and its screenshot): the panel asked for is in front and the
    bottom row takes half the window, not the short strip of the default layout."""
    win = make_window(qtbot, tmp_path, (1600, 1000))
    try:
        win.show_panel("dna")
        qtbot.waitUntil(lambda: "dna" in on_screen(win), timeout=5000)
        assert win.docks["dna"].height() > 0.4 * win.height()
        assert_docks_fit(win)
    finally:
        win.close()


def test_a_layout_saved_for_the_old_default_is_not_restored(qtbot, tmp_path):
    """A layout saved before the default one changed (Qt's state version 0: Server behind Chat,
    the bottom panels side by side) would bring the too-tall window back: it is not restored."""
    old = make_window(qtbot, tmp_path)
    old.docks["telemetry"].raise_()
    state = old.saveState()  # version 0, as the window saved its layout before
    old.close()
    old.settings.setValue("state", state)
    old.settings.sync()
    again = make_window(qtbot, tmp_path)
    try:
        assert on_screen(again) == {"models", "chat", "server"}
    finally:
        again.close()


def test_the_theme_choice_applies_and_persists(qtbot, tmp_path):
    from PySide6.QtGui import QPalette

    app = QApplication.instance()
    saved_palette = app.palette()
    window_lightness = lambda: app.palette().color(QPalette.ColorRole.Window).lightness()
    try:
        win = make_window(qtbot, tmp_path)
        assert menu_actions(win)["View"][-1] == "Theme"
        assert [a.text() for a in win.theme_actions.values()] == ["System", "Light", "Dark"]
        assert win.theme_actions["system"].isChecked() and window_lightness() > 200  # Xvfb: no scheme
        win.theme_actions["dark"].trigger()
        assert window_lightness() < 80 and win.theme_actions["dark"].isChecked()
        win.close()
        again = make_window(qtbot, tmp_path)  # same settings file: starts dark
        assert again.theme.choice == "dark" and again.theme_actions["dark"].isChecked()
        assert window_lightness() < 80
        again.set_theme("light")
        assert window_lightness() > 200 and again.settings.value("theme") == "light"
        again.close()
    finally:
        app.setPalette(saved_palette)


def test_save_network_as_writes_the_open_network(window, qtbot, golden_net_path, tmp_path):
    window.open_network(str(golden_net_path))
    qtbot.waitUntil(lambda: window.network is not None, timeout=10000)
    out = tmp_path / "copy.loom"
    window.save_network_as(str(out))
    qtbot.waitUntil(out.exists, timeout=10000)
    qtbot.waitUntil(lambda: not window.runner.active, timeout=10000)
    assert load_network(out).parameter_count() == window.network.parameter_count()


def test_closing_during_a_job_cancels_and_joins_it(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)

    def slow(job):
        while not job.is_cancelled():
            time.sleep(0.01)

    job = win.runner.start(slow, name="slow")
    qtbot.waitUntil(job.isRunning, timeout=5000)
    t = time.perf_counter()
    win.close()
    assert time.perf_counter() - t < 5 and not win.runner.active


def test_warm_up_leaves_the_startup_heap_out_of_the_garbage_collector():
    """A full collection walks only what the collector still tracks: after warm_up that must
    be a small remainder, not the ~200k objects startup built (a 120-200 ms walk, GIL held)."""
    import gc

    from loomlab.app.gui import warm_up

    gc.collect()  # earlier tests' garbage is no part of the heap warm_up freezes (it collects first)
    before = len(gc.get_objects())
    warm_up()
    assert gc.get_freeze_count() >= 0.9 * before
    assert len(gc.get_objects()) < 0.01 * before


def start_ticking() -> tuple[list[float], QTimer]:
    """A 10 ms timer on the GUI thread, recording when each tick came (the stall measure)."""
    ticks: list[float] = []
    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(lambda: ticks.append(time.perf_counter()))
    timer.start()
    return ticks, timer


def assert_responsive(ticks: list[float], idle_start: float, start: float, end: float, what: str) -> None:
    """The 10 ms timer's gaps from ``start`` to ``end`` against the chat's bound: the 99th
    percentile under 100 ms, the worst under 100 ms plus what the idle window's worst gap (from
    ``idle_start`` to ``start``) exceeded its tick by (one scheduler hiccup), never over 300 ms."""
    gaps = [(b - a, a) for a, b in zip(ticks, ticks[1:], strict=False)]
    idle = max(g for g, at in gaps if idle_start <= at < start)
    series = [g for g, at in gaps if start <= at < end]
    p99 = np.percentile(series, 99)
    allowed = min(0.1 + max(idle - 0.01, 0.0), 0.3)
    print(f"worst GUI stall idle {idle * 1000:.0f} ms, while {what} {max(series) * 1000:.0f} ms "
          f"(p99 {p99 * 1000:.0f} ms) over {len(series)} ticks")
    assert p99 < 0.1, f"the GUI thread's 99th percentile gap was {p99 * 1000:.0f} ms while {what}"
    assert max(series) < allowed, (f"the GUI thread stalled for {max(series) * 1000:.0f} ms while {what} "
                                   f"(idle worst {idle * 1000:.0f} ms)")


def at_rest(qtbot, ticks: list[float]) -> None:
    """Wait for 20 ticks in a row from now on, none 30 ms after the one before, after a full
    garbage collection: the whole suite's heap (gigabytes by then) is the test process's, not the
    workbench's, and a collection of it landing in a measured window stalled the timer ~50 ms."""
    gc.collect()
    start = len(ticks)
    qtbot.waitUntil(lambda: len(ticks) > start + 21 and np.diff(ticks[-21:]).max() < 0.03, timeout=10000)


def test_gui_stays_responsive_during_an_evolution_run(qtbot, tmp_path):
    """The Evolution panel's live plots and table while XOR evolves (population 150, speciated,
    60 generations): the 10 ms timer keeps firing, with the chat's bound (below). The run goes in
    a child process; when it ran on a thread of the window's process its pure-Python loop held the
    GIL and the GUI thread waited for it at every redraw (worst gaps 100-280 ms)."""
    from loomlab.app.gui import warm_up

    warm_up()
    win = make_window(qtbot, tmp_path)
    win.docks["evolution"].raise_()
    evolution = win.panels["evolution"]
    ticks, timer = start_ticking()
    ended = []
    evolution.run_ended.connect(ended.append)
    try:
        at_rest(qtbot, ticks)
        idle_start = time.perf_counter()
        qtbot.wait(1000)
        run_start = time.perf_counter()
        evolution.set_form(task="xor", population=150, generations=60, seed=3, speciation=True,
                           scheduler="inprocess")
        evolution.start()
        qtbot.waitUntil(lambda: not evolution.is_busy(), timeout=180000)
        run_end = time.perf_counter()
    finally:
        timer.stop()
        win.close()
    assert ended, evolution.status.text()
    assert ended[0].generation == len(evolution.history) and len(evolution.history) >= 1
    assert ended[0].status in ("finished", "solved")
    assert_responsive(ticks, idle_start, run_start, run_end, "evolving")


def test_gui_stays_responsive_while_a_model_loads_and_generates(qtbot, tmp_path):
    """A 10 ms timer keeps firing while smollm2 loads and answers (the issue's measure; Xvfb
    with llvmpipe's software OpenGL draws the window).

    Loading runs from the click to the window at rest with the model in every panel; the
    message is sent only then, as a person would, so the last panel's repaint and the send's
    are not measured as one. The window's own first frames (startup) come before the click.

    The bound is 100 ms, against a baseline taken in the same run: on a busy 2-core machine (CI)
    the scheduler alone sometimes holds the GUI thread off its core for tens of ms, also while
    the window is idle. So the 99th percentile of the gaps is held to 100 ms (a stall repeated per
    token or per panel shows there), and the worst gap to 100 ms plus what the idle window's worst
    gap exceeded its 10 ms tick by (one scheduler hiccup), never more than 300 ms. The worst gaps
    are printed (pytest -s)."""
    from loomlab.app.gui import warm_up

    warm_up()  # what run_gui does before showing the window
    win = make_window(qtbot, tmp_path)
    ticks, timer = start_ticking()

    def wait_until_at_rest() -> None:
        at_rest(qtbot, ticks)

    chat = win.panels["chat"]
    try:
        wait_until_at_rest()
        idle_start = time.perf_counter()
        qtbot.wait(1000)  # the baseline: the same window, idle, on the same machine, now
        load_start = time.perf_counter()
        win.open_model("smollm2-135m")
        # loaded: every panel has the model (the telemetry panel takes it last), all drawn
        qtbot.waitUntil(lambda: chat.model is not None
                        and win.panels["telemetry"].network is chat.model.net, timeout=120000)
        wait_until_at_rest()
        generation_start = time.perf_counter()
        finished = []
        chat.reply_finished.connect(finished.append)
        chat.send("Name a colour.")
        qtbot.waitUntil(lambda: bool(finished), timeout=120000)
    finally:
        timer.stop()
        win.close()
    gaps = [(b - a, a) for a, b in zip(ticks, ticks[1:], strict=False)]
    idle = max(g for g, at in gaps if idle_start <= at < load_start)
    loading = [g for g, at in gaps if load_start <= at < generation_start]
    generating = [g for g, at in gaps if at >= generation_start]
    allowed = min(0.1 + max(idle - 0.01, 0.0), 0.3)
    ms = lambda series: f"{max(series) * 1000:.0f} ms (p99 {np.percentile(series, 99) * 1000:.0f} ms)"
    print(f"worst GUI stall idle {idle * 1000:.0f} ms, while loading {ms(loading)}, while generating "
          f"{ms(generating)} over {len(generating)} ticks; allowed {allowed * 1000:.0f} ms")
    assert len(generating) > 20 and finished[0].token_count > 0
    assert isinstance(chat.model.tokenizer, TokenizerProcess)  # built outside this process's GIL
    for what, series in (("loading", loading), ("generating", generating)):
        p99 = np.percentile(series, 99)
        assert p99 < 0.1, f"the GUI thread's 99th percentile gap was {p99 * 1000:.0f} ms while {what}"
        assert max(series) < allowed, (f"the GUI thread stalled for {max(series) * 1000:.0f} ms while {what} "
                                       f"(idle worst {idle * 1000:.0f} ms)")


def test_gui_stays_responsive_while_a_model_morphs_to_a_block_format_and_back(qtbot, tmp_path):
    """Issue 14 §3: the Morph panel's Apply (every matrix of smollm2-135m to Q8_0) and Revert run
    in its worker; the 10 ms timer keeps firing with the chat's bound (see the test above)."""
    from loomlab.app.gui import warm_up

    warm_up()
    win = make_window(qtbot, tmp_path)
    morph = win.panels["morph"]
    ticks, timer = start_ticking()
    measured = []
    morph.measured.connect(measured.append)
    try:
        win.open_model("smollm2-135m")
        qtbot.waitUntil(lambda: win.panels["telemetry"].network is not None, timeout=120000)
        win.docks["morph"].raise_()
        qtbot.waitUntil(lambda: morph.table.rowCount() == 123 and not morph.is_busy(), timeout=120000)
        at_rest(qtbot, ticks)
        idle_start = time.perf_counter()
        qtbot.wait(1000)
        morph_start = time.perf_counter()
        morph.set_all_dtype("Q8_0")
        morph.apply()
        qtbot.waitUntil(lambda: len(measured) == 1, timeout=180000)
        morph.revert()
        qtbot.waitUntil(lambda: len(measured) == 2, timeout=180000)
        morph_end = time.perf_counter()
        net = win.panels["chat"].model.net
        assert {row.current for row in morph._rows} == {"Q4_1", "Q8_0", "F32"}  # back as loaded
    finally:
        timer.stop()
        win.close()
    applied, reverted = measured
    assert applied["bytes_now"] < applied["bytes_original"] * 2 and applied["kl_mean"] < 0.01
    assert reverted["bytes_now"] == reverted["bytes_original"] == net.memory_bytes()
    assert (reverted["kl_mean"], reverted["top1_agreement"]) == (0.0, 1.0)
    assert_responsive(ticks, idle_start, morph_start, morph_end, "morphing")


def test_gui_stays_responsive_while_a_patching_grid_computes(qtbot, tmp_path):
    """Issue 35: the Inspect panel's patching grid (smollm2-135m, a 5-token prompt, every layer and
    position) runs in its job; the 10 ms timer keeps firing with the chat's bound (see above). A
    bar of its attribution then selects that block's attention layer in the linked panels."""
    from loomlab.app.gui import warm_up

    warm_up()
    win = make_window(qtbot, tmp_path)
    inspect = win.panels["inspect"]
    ticks, timer = start_ticking()
    try:
        win.open_model("smollm2-135m")
        qtbot.waitUntil(lambda: win.panels["telemetry"].network is not None and not win.handing_over,
                        timeout=120000)
        win.docks["inspect"].raise_()  # behind the Chat tab it computes nothing
        qtbot.waitUntil(lambda: inspect.result("attention") is not None and not inspect.is_busy(),
                        timeout=60000)
        inspect.show_view("patching")
        inspect.patching_view.corrupted_edit.setText("The capital of Italy is")
        at_rest(qtbot, ticks)
        idle_start = time.perf_counter()
        qtbot.wait(1000)
        patch_start = time.perf_counter()
        inspect.compute("patching")
        qtbot.waitUntil(lambda: inspect.result("patching") is not None, timeout=120000)
        patch_end = time.perf_counter()
        grid = inspect.result("patching")
        inspect.show_view("attribution")
        qtbot.waitUntil(lambda: inspect.result("attribution") is not None, timeout=60000)
        kind, layer, _, _ = inspect.attribution_view.rows[0]
        inspect.attribution_view.choose(0)
        key = inspect.layer_key(kind, layer)
        selected = (win.panels["topology"].selected_key, win.panels["telemetry"].selected_key)
    finally:
        timer.stop()
        win.close()
    assert grid.restored.shape == (30, 5)
    assert key is not None and selected == (key, key)
    assert_responsive(ticks, idle_start, patch_start, patch_end, "patching")


def test_a_first_runs_kernel_count_shows_in_the_status_bar_and_closing_stops_it(window, qtbot):
    from loomlab.app.first_run import TITLE

    class Compilation:
        compiled, finished, error, stops = 3, False, None, 0

        def stop(self):
            self.stops += 1

    c = Compilation()
    window.show()
    window.show_kernels(c)
    status = window.kernels_status
    qtbot.waitUntil(lambda: status.label.text() == f"{TITLE}: 3 compiled…", timeout=3000)
    assert status.isVisible() and status.geometry().right() <= window.width()
    window.close()
    assert c.stops >= 1 and not status.timer.isActive()
