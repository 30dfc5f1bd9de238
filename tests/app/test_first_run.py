"""The window's first start: compiling kernels shows a dialog with a count, Skip stops the rest;
with every kernel cached nothing shows."""

from __future__ import annotations

import threading

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication, QProgressDialog, QPushButton

from loomlab.app.first_run import prepare_kernels
from loomlab.core.errors import LoomCancelled
from loomlab.core.llm.kernels.kernel_warmup import KERNELS_STAGE


def dialogs() -> list[QProgressDialog]:
    return [w for w in QApplication.topLevelWidgets() if isinstance(w, QProgressDialog) and w.isVisible()]


def test_compiling_kernels_shows_a_count_and_skip_stops_the_rest(qtbot):
    seen, skipped = [], threading.Event()

    def warm_up(progress, cancel):  # two kernels compile, then it waits to be skipped
        for done in (0, 1, 2):
            progress(KERNELS_STAGE, done, 0)
        if cancel.wait(10):
            skipped.set()
            raise LoomCancelled("skipped")

    def look_then_skip():
        shown = dialogs()
        seen.extend(d.labelText() for d in shown)
        for d in shown:
            d.findChild(QPushButton).click()  # Skip

    QTimer.singleShot(300, look_then_skip)
    assert prepare_kernels(warm_up) == 2
    assert skipped.is_set()
    assert seen == [f"{KERNELS_STAGE[:1].upper()}{KERNELS_STAGE[1:]}: 2 compiled…"]
    assert dialogs() == []


def test_with_every_kernel_cached_no_dialog_shows(qtbot):
    shown = []

    def warm_up(progress, cancel):
        shown.extend(dialogs())

    assert prepare_kernels(warm_up) == 0
    assert shown == [] and dialogs() == []
