"""The backend setting: the model (BackendChoice), the View menu that writes it and the status bar
that shows it with the device's memory.

Oracles: the engine's backends (numpy here; a CuPy-like stand-in for a GPU, whose memory numbers
the status bar must show) and its messages for a backend that cannot run.
"""

from __future__ import annotations

import pytest

from loomlab.core.backend import NUMPY
from loomlab.views.backend_choice import BackendChoice, BackendMenu, BackendStatus

from ..core.fake_cupy import GiB


@pytest.fixture
def views(qtbot):
    choice = BackendChoice()
    menu, status = BackendMenu(choice), BackendStatus(choice)
    qtbot.addWidget(menu)
    qtbot.addWidget(status)
    return choice, menu, status


def checked(menu: BackendMenu) -> list[str]:
    return [name for name, action in menu.choice_actions.items() if action.isChecked()]


def test_it_starts_on_numpy(views):
    choice, menu, status = views
    assert choice.name == "numpy" and choice.backend is NUMPY
    assert checked(menu) == ["numpy"]
    assert [a.text() for a in menu.actions()] == ["NumPy (CPU)", "CuPy (NVIDIA GPU)",
                                                  "Auto (the GPU where usable)"]
    assert status.text() == "backend: numpy"


def test_changing_the_model_updates_the_menu_and_the_status_bar(views, gpu, qtbot):
    choice, menu, status = views
    with qtbot.waitSignal(choice.changed) as changed:
        assert choice.set_name("cupy")
    assert changed.args == ["cupy"] and choice.backend is gpu
    assert checked(menu) == ["cupy"]
    assert status.text() == "backend: cupy · GPU 1.00 GiB used, peak 2.00 GiB, 70.0 of 80.0 GiB free"
    pool = gpu.xp.get_default_memory_pool()
    pool.used, pool.held = 3 * GiB, 4 * GiB  # the status bar's timer reads the memory again
    status.refresh()
    assert status.text() == "backend: cupy · GPU 3.00 GiB used, peak 4.00 GiB, 70.0 of 80.0 GiB free"
    assert choice.set_name("numpy") and checked(menu) == ["numpy"] and status.text() == "backend: numpy"


def test_using_the_menu_updates_the_model(views, gpu, qtbot):
    choice, menu, status = views
    with qtbot.waitSignal(choice.changed) as changed:
        menu.choice_actions["auto"].trigger()
    assert changed.args == ["auto"] and choice.name == "auto" and choice.backend is gpu
    assert checked(menu) == ["auto"] and status.text().startswith("backend: cupy (auto) · GPU ")


def test_auto_without_a_gpu_picks_numpy_and_says_so(views, no_cupy):
    choice, menu, status = views
    menu.choice_actions["auto"].trigger()
    assert choice.name == "auto" and choice.backend is NUMPY
    assert status.text() == "backend: numpy (auto)"


def test_cupy_without_cupy_is_refused_with_the_install_hint_and_numpy_stays(views, no_cupy, qtbot):
    choice, menu, status = views
    with qtbot.waitSignal(choice.refused) as refused, qtbot.assertNotEmitted(choice.changed):
        menu.choice_actions["cupy"].trigger()
    assert "needs CuPy, which is not installed: pip install 'loomlab[gpu]'" in refused.args[0]
    assert choice.name == "numpy" and checked(menu) == ["numpy"] and status.text() == "backend: numpy"


def test_an_unknown_name_is_refused(views, qtbot):
    choice, _, _ = views
    with qtbot.waitSignal(choice.refused) as refused:
        assert not choice.set_name("tpu")
    assert refused.args == ["unknown backend 'tpu'; choose from numpy, cupy, auto"]
