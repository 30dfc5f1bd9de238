"""Long work off the GUI thread: a :class:`Job` runs a function in a QThread and reports
progress, streamed items, the result or the error as Qt signals (delivered on the GUI thread);
a :class:`JobRunner` owns the jobs, so closing a window can cancel and join every one of them.

A job function receives the job as its only argument and uses ``job.report(stage, done,
total)``, ``job.emit_item(x)`` and ``job.is_cancelled()`` (or passes ``job.is_cancelled`` as the
``cancel`` callable of a core function). Core never sees Qt: it gets plain callables.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QThread, Signal

# Progress reaches the GUI at most this often per stage: QProgressBar.setValue repaints at once
# (not at the next frame), and a bar over a big table repainted the table behind it each time
# (the Morph panel's Apply of a language model: 2.7 s of GUI time at ~25 updates a second).
PROGRESS_INTERVAL_S = 0.2


class Job(QThread):
    progress = Signal(str, int, int)  # stage, done, total
    item = Signal(object)  # something the function streamed (a token record, a report row ...)
    succeeded = Signal(object)  # the function's return value
    failed = Signal(str)  # one line: what went wrong
    cancelled = Signal()

    def __init__(self, fn: Callable[[Job], Any], name: str = "job", parent: QObject | None = None):
        super().__init__(parent)
        self.setObjectName(name)
        self._fn = fn
        self._cancel = threading.Event()
        self._last_stage, self._last_report = "", 0.0

    # ----- called from the worker thread -----------------------------------------------------
    def report(self, stage: str, done: int, total: int) -> None:
        """Progress from the worker; at most 5 updates a second reach the GUI (plus every stage
        change and the last step): a queued storm of them, each a synchronous repaint of its
        progress bar, stalls the GUI thread."""
        now = time.monotonic()
        if stage == self._last_stage and done < total and now - self._last_report < PROGRESS_INTERVAL_S:
            return
        self._last_stage, self._last_report = stage, now
        self.progress.emit(stage, int(done), int(total))

    def emit_item(self, value: Any) -> None:
        self.item.emit(value)

    def is_cancelled(self) -> bool:
        return self._cancel.is_set()

    def run(self) -> None:
        try:
            result = self._fn(self)
        except Exception as e:  # any failure reaches the GUI as one line, never a crash
            if self.is_cancelled():
                self.cancelled.emit()
            else:
                self.failed.emit(f"{type(e).__name__}: {e}" if not str(e).startswith(type(e).__name__)
                                 else str(e))
            return
        if self.is_cancelled():
            self.cancelled.emit()
        else:
            self.succeeded.emit(result)

    # ----- called from the GUI thread ----------------------------------------------------------
    def cancel(self) -> None:
        self._cancel.set()

    def stop(self) -> None:
        """Cancel and wait until the thread has finished (a panel shutting down)."""
        try:
            self.cancel()
            self.wait()
        except RuntimeError:  # the runner already finished and deleted it
            pass


class JobRunner(QObject):
    """Starts jobs and keeps them until they end; :meth:`shutdown` cancels and joins them all."""

    changed = Signal()  # a job started or ended (for busy indicators)

    def __init__(self, parent: QObject | None = None):
        super().__init__(parent)
        self._jobs: list[Job] = []

    @property
    def active(self) -> list[Job]:
        return list(self._jobs)

    def start(self, fn: Callable[[Job], Any], *, name: str = "job",
              on_progress: Callable[[str, int, int], None] | None = None,
              on_item: Callable[[Any], None] | None = None,
              on_success: Callable[[Any], None] | None = None,
              on_failure: Callable[[str], None] | None = None,
              on_cancel: Callable[[], None] | None = None) -> Job:
        job = Job(fn, name, self)
        for signal, slot in ((job.progress, on_progress), (job.item, on_item), (job.succeeded, on_success),
                             (job.failed, on_failure), (job.cancelled, on_cancel)):
            if slot is not None:
                signal.connect(slot)
        # a bound slot, not a lambda holding the runner: a lambda kept the runner alive until the
        # finished job's deferred delete, which then destroyed it mid-deletion ("pure virtual")
        job.finished.connect(self._on_finished)
        self._jobs.append(job)
        job.start()
        self.changed.emit()
        return job

    def _on_finished(self) -> None:
        job = self.sender()
        if isinstance(job, Job):
            self._forget(job)

    def _forget(self, job: Job) -> None:
        if job in self._jobs:
            self._jobs.remove(job)
            job.deleteLater()
            self.changed.emit()

    def cancel_all(self) -> None:
        for job in self._jobs:
            job.cancel()

    def shutdown(self, timeout_ms: int = 10000) -> bool:
        """Cancel every job and wait for their threads; True when all have stopped."""
        self.cancel_all()
        ok = all(job.wait(timeout_ms) for job in list(self._jobs))
        for job in list(self._jobs):
            self._forget(job)
        QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)  # delete finished jobs now
        return ok
