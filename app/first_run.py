"""The window's first start on a new install: numba compiles every kernel for this CPU before the
window shows (minutes on 2 cores; later starts load them from its cache in under a second). A
dialog says so and counts them, and Skip leaves the rest to be compiled on first use."""

from __future__ import annotations

import threading
from collections.abc import Callable

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QProgressDialog

from loomlab.core.errors import LoomCancelled
from loomlab.core.llm.kernels.kernel_warmup import KERNELS_STAGE

POLL_S = 0.05  # how often the GUI thread looks at the compiling thread, drawing in between
TITLE = f"{KERNELS_STAGE[:1].upper()}{KERNELS_STAGE[1:]}"


def kernels_dialog() -> QProgressDialog:
    """A busy bar with a count; its button skips the rest."""
    dialog = QProgressDialog(f"{TITLE}…", "Skip", 0, 0)
    dialog.setWindowTitle("Loom Lab")
    dialog.setWindowModality(Qt.WindowModality.ApplicationModal)
    dialog.setMinimumDuration(0)
    dialog.setAutoClose(False)
    dialog.setAutoReset(False)
    return dialog


def prepare_kernels(warm_up: Callable[..., None], app: QApplication | None = None) -> int:
    """Run ``warm_up(progress=..., cancel=...)`` on a thread while this (the GUI) thread draws a
    dialog once the first kernel starts compiling; with a warm cache no dialog appears. Returns
    how many kernels were compiled (0 when all were cached or the first was skipped)."""
    app = app or QApplication.instance()
    skip, count = threading.Event(), [None]

    def report(stage: str, done: int, total: int) -> None:
        count[0] = done  # read by the GUI thread below: a plain assignment, no Qt call here

    def run() -> None:
        try:
            warm_up(progress=report, cancel=skip)
        except LoomCancelled:
            pass  # skipped: the rest compile when first used

    worker = threading.Thread(target=run, name="loomlab-kernels")
    worker.start()
    dialog = None
    while worker.is_alive():
        worker.join(POLL_S)
        if count[0] is not None:
            dialog = dialog or _shown(kernels_dialog(), skip)
            dialog.setLabelText(f"{TITLE}: {count[0]} compiled…")
        app.processEvents()
    if dialog is not None:
        dialog.close()
        dialog.deleteLater()
    return count[0] or 0


def _shown(dialog: QProgressDialog, skip: threading.Event) -> QProgressDialog:
    dialog.canceled.connect(skip.set)
    dialog.show()
    return dialog
