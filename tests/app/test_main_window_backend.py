"""The window's backend: View > Backend, the status bar (backend and a GPU's memory), the saved
choice, and what the Models panel loads on.

Oracles: the engine's backends (numpy here, a CuPy-like stand-in with memory numbers for a GPU)
and its messages for a backend that cannot run.
"""

from __future__ import annotations

import json

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QMessageBox

from loomlab.app.main_window import MainWindow
from loomlab.core.backend import NUMPY

from ..core.fake_cupy import GiB
from ..core.goldens import forward_case
from .test_main_window import make_window


def saved_backend(tmp_path) -> str | None:
    return QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat).value("backend")


def test_auto_is_chosen_in_the_menu_kept_and_networks_open_on_it(qtbot, tmp_path, no_cupy):
    path = tmp_path / "block.json"
    path.write_text(json.dumps(forward_case("transformer_block")["network"]))
    window = make_window(qtbot, tmp_path)
    assert window.backend_label.text() == "backend: numpy"
    window.backend_menu.choice_actions["auto"].trigger()
    assert window.backend_label.text() == "backend: numpy (auto)"
    assert window.panels["models"].backend == "auto"
    window.open_network(str(path))
    qtbot.waitUntil(lambda: window.network is not None, timeout=10000)
    assert window.network.backend is NUMPY
    window.close()
    assert saved_backend(tmp_path) == "auto"
    again = make_window(qtbot, tmp_path)  # the next start takes the saved choice
    assert again.backend_choice.name == "auto" and again.backend_menu.choice_actions["auto"].isChecked()
    again.close()


def test_the_status_bar_follows_a_gpus_memory(qtbot, tmp_path, gpu):
    window = make_window(qtbot, tmp_path)
    window.backend_menu.choice_actions["cupy"].trigger()
    assert window.backend_label.text() == ("backend: cupy · GPU 1.00 GiB used, peak 2.00 GiB, "
                                           "70.0 of 80.0 GiB free")
    gpu.xp.get_default_memory_pool().used = 2 * GiB
    qtbot.waitUntil(lambda: "GPU 2.00 GiB used" in window.backend_label.text(), timeout=3000)  # 1 s timer
    window.close()


def test_a_language_model_opens_on_the_chosen_gpu_in_the_models_panel(qtbot, tmp_path, monkeypatch):
    from loomlab.core import backend

    strict = backend.get_backend("strict")  # a device that computes, standing in for a GPU
    gpu = backend.Backend("cupy", strict.xp, strict.device)
    monkeypatch.setitem(backend._FACTORIES, "cupy", lambda: gpu)
    window = make_window(qtbot, tmp_path)
    window.backend_menu.choice_actions["cupy"].trigger()
    window.open_model("smollm2-135m")
    qtbot.waitUntil(lambda: window.model is not None, timeout=20000)
    assert window.model.backend == gpu and window.model.net.on_device
    window.close()


def test_cupy_chosen_without_cupy_says_how_to_install_it_and_numpy_stays(qtbot, tmp_path, no_cupy,
                                                                         monkeypatch):
    warnings = []
    monkeypatch.setattr(QMessageBox, "warning", staticmethod(lambda *a: warnings.append(a[2])))
    window = make_window(qtbot, tmp_path)
    window.backend_menu.choice_actions["cupy"].trigger()
    assert len(warnings) == 1 and "pip install 'loomlab[gpu]'" in warnings[0]
    assert window.backend_choice.name == "numpy" and window.backend_menu.choice_actions["numpy"].isChecked()
    assert window.backend_label.text() == "backend: numpy"
    window.close()


def test_a_saved_cupy_without_cupy_starts_on_numpy_and_says_why(qtbot, tmp_path, no_cupy):
    QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat).setValue("backend", "cupy")
    window = make_window(qtbot, tmp_path)
    assert window.backend_choice.name == "numpy" and window.panels["models"].backend == "numpy"
    assert "needs CuPy" in window.statusBar().currentMessage()
    window.close()


def test_a_backend_given_to_the_window_wins_over_the_saved_one(qtbot, tmp_path, no_cupy):
    """loomlab --backend auto opens the window so."""
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    settings.setValue("backend", "numpy")
    window = MainWindow("auto", workspace_path=tmp_path / "workspace.sqlite3", settings=settings)
    qtbot.addWidget(window)
    assert window.backend_choice.name == "auto" and window.panels["models"].backend == "auto"
    window.close()
