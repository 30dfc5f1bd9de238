"""The activations setting across the window (issue 33): a model loaded exact in the Models panel
shows float32 in the Chat and Server panels, and a switch in either of them shows in the other."""

from __future__ import annotations

from ..views.test_activations_setting import pick
from .test_main_window import make_window


def test_the_models_panel_s_mode_reaches_chat_and_server_and_a_switch_in_one_shows_in_the_other(
        qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    models, chat, server = win.panels["models"], win.panels["chat"], win.panels["server"]
    try:
        models.activations = "float32"
        win.open_model("smollm2-135m")
        qtbot.waitUntil(lambda: win.model is not None and server.activations_box.isEnabled()
                        and not win.handing_over, timeout=120000)
        model = win.model
        assert model.activations == "float32"
        assert chat.activations_box.mode == server.activations_box.mode == "float32"

        pick(qtbot, chat.activations_box, "int8")
        assert model.activations == "int8" and server.activations_box.mode == "int8"
        pick(qtbot, server.activations_box, "float32")
        assert model.activations == "float32" and chat.activations_box.mode == "float32"
    finally:
        win.close()
