"""The window's first start on a new install: numba has none of the kernels for this CPU, and
compiling them takes minutes on 2 cores. The window shows at once; a child process compiles them
while the status bar counts them, with a Skip button (the rest then compile when first used). A
model loaded meanwhile answers on numpy until its own kernels are ready (the Models panel says
so). Later starts load them from numba's cache in under a second."""

from __future__ import annotations

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QHBoxLayout, QLabel, QPushButton, QWidget

from loomlab.core.llm.kernels import kernel_warmup
from loomlab.core.llm.kernels.kernel_warmup import KERNELS_STAGE
from loomlab.core.llm.model.kernel_compilation import KernelCompilation, every_kernel_cached, first_run_mode

POLL_MS = 500  # how often the status bar reads the child's count
TITLE = f"{KERNELS_STAGE[:1].upper()}{KERNELS_STAGE[1:]}"


def start_kernels(first_run: str | None = None) -> KernelCompilation | None:
    """Load every cached kernel (on a thread that ends: see ``kernel_warmup.warm_up``); None when
    that was all. Otherwise, in the "answer" first-run mode (the default), the child compiling the
    rest; in "wait" mode (``$LOOMLAB_FIRST_RUN``: tests, benchmarks) they compile here first."""
    if first_run_mode(first_run) == "wait":
        kernel_warmup.warm_up()
        return None
    return None if every_kernel_cached() else KernelCompilation(None)


class KernelsStatus(QWidget):
    """The status bar's "Preparing kernels for this CPU (first run only): N compiled" and a Skip
    button, while ``compilation`` runs; hidden once it has finished or was skipped, or says that it
    failed (the kernels then compile when first used)."""

    def __init__(self, compilation: KernelCompilation, parent: QWidget | None = None):
        super().__init__(parent)
        self.compilation = compilation
        self.label = QLabel(f"{TITLE}…")
        self.skip = QPushButton("Skip")
        self.skip.setToolTip("Stop compiling; the remaining kernels compile when first used")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.label)
        layout.addWidget(self.skip)
        self.skip.clicked.connect(self.stop)
        self.timer = QTimer(self, interval=POLL_MS)
        self.timer.timeout.connect(self.refresh)
        self.timer.start()

    def refresh(self) -> None:
        c = self.compilation
        if not c.finished:
            self.label.setText(f"{TITLE}: {c.compiled} compiled…")
            return
        self.timer.stop()
        c.stop()  # reaps the exited child
        if c.error is None:
            self.hide()
        else:
            self.skip.hide()
            self.label.setText("Kernel compilation failed; kernels compile when first used")
            self.label.setToolTip(c.error)

    def stop(self) -> None:
        """End the child (what it compiled stays cached) and hide; safe to call twice."""
        self.timer.stop()
        self.compilation.stop()
        self.hide()
