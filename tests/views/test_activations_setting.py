"""The activations setting (issue 33) on the real SmolLM2 model: the Models panel loads with the
mode its load options show, the Chat and Server panels show the loaded model's mode and switch it
(a person picks with the keyboard), and a chat reply after a switch runs in the mode switched to.

Oracles: ``TextModel.activations`` itself, the keyword ``load_model`` receives, and the flag the
engine's ``int8_activations`` is entered with while a reply generates."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from loomlab.core.llm.generate import textmodel
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.workspace.store import Workspace
from loomlab.views import models_panel
from loomlab.views.activations import ActivationsBox
from loomlab.views.chat_panel import ChatPanel
from loomlab.views.models_panel import ModelsPanel
from loomlab.views.server_panel import ServerPanel
from loomlab.views.workers import JobRunner

from .panel_layout import DOCKED, assert_unclipped

SMOLLM = "smollm2-135m"
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def shared_model():
    with load_model(SMOLLM) as m:
        yield m


@pytest.fixture
def model(shared_model):
    """The module's model in the default mode, left in it after the test."""
    shared_model.activations = "int8"
    yield shared_model
    shared_model.activations = "int8"


def pick(qtbot, box: ActivationsBox, mode: str) -> None:
    """Choose ``mode`` as a person does without a mouse: focus the box, arrow to the item."""
    box.setFocus()
    key = Qt.Key.Key_Down if box.findText(mode) > box.currentIndex() else Qt.Key.Key_Up
    for _ in range(box.count()):
        if box.mode == mode:
            return
        qtbot.keyClick(box, key)
    assert box.mode == mode


def test_the_box_speaks_the_cli_words_and_only_a_person_s_pick_is_announced(qtbot):
    box = ActivationsBox()
    qtbot.addWidget(box)
    assert [box.itemText(i) for i in range(box.count())] == ["int8", "float32"]  # the CLI's words
    assert "fast" in box.itemData(0, Qt.ItemDataRole.ToolTipRole)
    assert "exact" in box.itemData(1, Qt.ItemDataRole.ToolTipRole)
    assert box.mode == "int8"  # the engine's default, as the CLI's
    chosen: list[str] = []
    box.mode_chosen.connect(chosen.append)
    box.set_mode("float32")
    assert box.mode == "float32" and chosen == []
    pick(qtbot, box, "int8")
    assert chosen == ["int8"]
    with pytest.raises(ValueError, match="float16"):
        box.set_mode("float16")
    assert box.mode == "int8"


def test_the_models_panel_loads_with_the_activations_its_load_options_show(qtbot, runner, monkeypatch):
    asked: list[dict] = []
    real = models_panel.load_model
    monkeypatch.setattr(models_panel, "load_model",
                        lambda target, **kwargs: (asked.append({"target": target, **kwargs}),
                                                  real(target, **kwargs))[1])
    panel = ModelsPanel(runner, [])
    qtbot.addWidget(panel)
    panel.resize(1000, 620)
    panel.show()
    qtbot.waitUntil(lambda: not panel.scanning, timeout=20000)
    assert panel.activations == "int8" and panel.activations_box.isVisible()
    assert panel.select(SMOLLM)
    pick(qtbot, panel.activations_box, "float32")
    assert panel.activations == "float32"
    with qtbot.waitSignal(panel.model_loaded, timeout=TIMEOUT_MS) as loaded:
        qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
        # Cancel goes with the bar it stops, which left the option its room beside "Show in panels"
        assert panel.cancel_button.isVisible() and panel.cancel_button.isEnabled()
    assert panel.cancel_button.isHidden() and panel.progress_bar.isHidden()
    model = loaded.args[0]
    try:
        assert [(a["target"], a["activations"], a["backend"]) for a in asked] \
            == [(SMOLLM, "float32", "numpy")]
        assert model.activations == "float32"
        panel.activations = "int8"  # the option set in code: what the next load will use
        assert panel.activations_box.currentText() == "int8"
        assert model.activations == "float32"  # a load option: the loaded model keeps its mode
        panel.resize(317, 479)  # the Models dock of a 1280x800 window: the option whole on screen
        qtbot.wait(50)
        box = panel.activations_box
        assert box.isVisible() and box.visibleRegion().boundingRect() == box.rect()
        assert box.width() >= box.minimumSizeHint().width() and panel.show_button.isVisible()
    finally:
        assert panel.shutdown()


@pytest.fixture
def chat(qtbot, tmp_path, model):
    runner = JobRunner()
    with Workspace(tmp_path / "workspace.sqlite3") as workspace:
        panel = ChatPanel(runner, workspace)
        qtbot.addWidget(panel)
        panel.resize(1200, 700)
        panel.show()
        yield panel
        panel.shutdown()
        assert runner.shutdown()


def test_the_chat_panel_shows_the_model_s_activations_and_switches_them(qtbot, chat, model, monkeypatch):
    assert not chat.activations_box.isEnabled()  # no model: nothing to switch
    model.activations = "float32"  # loaded exact (the Models panel's option)
    chat.set_model(model)
    assert chat.activations_box.mode == "float32" and chat.activations_box.isEnabled()

    with qtbot.waitSignal(chat.activations_changed) as changed:
        pick(qtbot, chat.activations_box, "int8")
    assert changed.args == ["int8"] and model.activations == "int8"
    # not a sampling knob of the conversation: the stored sampling stays as it was
    assert "activations" not in chat.sampling.values()

    model.activations = "float32"  # switched elsewhere (the Server panel)
    chat.show_activations()
    assert chat.activations_box.mode == "float32"

    # the next reply runs in the mode shown: the engine is entered with int8 activations off
    entered: list[bool] = []
    real = textmodel.int8_activations
    monkeypatch.setattr(textmodel, "int8_activations", lambda on: (entered.append(on), real(on))[1])
    chat.sampling.spins["max_tokens"].setValue(3)
    with qtbot.waitSignal(chat.reply_finished, timeout=TIMEOUT_MS) as finished:
        chat.send("Hi")
        assert not chat.activations_box.isEnabled()  # a reply keeps the mode it started with
    assert finished.args[0].token_count > 0
    assert entered and not any(entered)
    assert chat.activations_box.isEnabled() and model.activations == "float32"

    chat.clear_model()
    assert not chat.activations_box.isEnabled()


def test_the_server_panel_shows_the_model_s_activations_and_switches_them(qtbot, runner, model):
    panel = ServerPanel(runner, lambda *args: None)  # never started here
    qtbot.addWidget(panel)
    panel.resize(*DOCKED)
    panel.show()
    try:
        assert not panel.activations_box.isEnabled()
        model.activations = "float32"
        panel.set_model(model)
        assert panel.activations_box.mode == "float32" and panel.activations_box.isEnabled()
        with qtbot.waitSignal(panel.activations_changed) as changed:
            pick(qtbot, panel.activations_box, "int8")
        assert changed.args == ["int8"] and model.activations == "int8"
        model.activations = "float32"  # switched elsewhere (the Chat panel)
        panel.show_activations()
        assert panel.activations_box.mode == "float32"
        assert assert_unclipped(panel) > 10  # the new row fits a docked bottom panel
        panel.set_model(None)
        assert not panel.activations_box.isEnabled()
    finally:
        panel.shutdown()
