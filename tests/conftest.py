"""Every test must leave no thread, QThread, busy QThreadPool or active QTimer behind: a worker
that outlives its test is a bug that later shows up as a crash in some other test (napari's
dangling-thread fixtures). Qt is imported only for tests that use a Qt fixture, so core tests run
where Qt is not installed."""

from __future__ import annotations

import os
import sys
import threading
import traceback
import weakref

import pytest

# The GPU plugin registers its "cupy" backend when first imported, into whatever registry
# core.backend holds at that moment. Several tests swap the registry for a copy; had the first
# import happened under one, the registration would leave with the copy and later tests would
# find "cupy" unknown. Importing it here (safe without CuPy) registers it in the real one first.
import loomlab.gpu  # noqa: F401

QT_FIXTURES = {"qtbot", "qapp"}

# Models load with their kernels compiled, whatever numba's cache holds when a test starts (a fresh
# clone's is empty): a test's numbers are then the kernels', not a first run's numpy ones. The
# first-run mode, the default for users, has its own tests (tests/core/llm/model/
# test_kernel_compilation.py), which set it back. Child processes (the CLI's tests) inherit it.
os.environ.setdefault("LOOMLAB_FIRST_RUN", "wait")


@pytest.fixture(scope="module")
def smollm2():
    """The built-in smollm2-135m, loaded once per test module (a test that morphs it puts it back)."""
    from loomlab.core.llm.generate.textmodel import load_model

    with load_model("smollm2-135m") as model:
        yield model


@pytest.fixture
def registry(monkeypatch):
    """core.backend's registry of backends as a test may change it; restored afterwards."""
    from loomlab.core import backend

    factories = dict(backend._FACTORIES)
    monkeypatch.setattr(backend, "_FACTORIES", factories)
    return factories


@pytest.fixture
def gpu(monkeypatch):
    """A machine where CuPy works: the "cupy" backend is a CuPy-like stand-in with memory numbers
    (1 GiB used, 2 GiB peak, 70 of 80 GiB free; tests/core/fake_cupy.py)."""
    from loomlab.core import backend

    from .core.fake_cupy import GiB, cupy_like

    fake = backend.Backend("cupy", cupy_like(used=GiB, held=2 * GiB, free=70 * GiB, total=80 * GiB))
    monkeypatch.setitem(backend._FACTORIES, "cupy", lambda: fake)
    return fake


@pytest.fixture
def no_cupy(monkeypatch):
    """This machine without CuPy, whatever is installed: ``import cupy`` fails."""
    monkeypatch.setitem(sys.modules, "cupy", None)


@pytest.fixture(autouse=True)
def _no_dangling_threads():
    before = set(threading.enumerate())
    yield
    # _DummyThread stands for a foreign (e.g. Qt) thread that once ran Python; QThreads are
    # checked by _no_dangling_qt_work instead.
    leaked = [t.name for t in threading.enumerate()
              if t not in before and t.is_alive() and not isinstance(t, threading._DummyThread)]
    if leaked:
        pytest.fail(f"test left Python threads running: {leaked}")


@pytest.fixture(autouse=True)
def _no_dangling_qt_work(request, monkeypatch):
    if not QT_FIXTURES & set(request.fixturenames):
        yield
        return
    kinds = _qt_kinds()
    started = {cls: _track_start(monkeypatch, cls) for cls in kinds}
    yield
    dangling = []
    for cls, (busy, stop) in kinds.items():
        for obj, where in list(started[cls].items()):
            if _on_live(busy, obj):
                dangling.append(f"{cls.__name__} started at\n{where}")
                _on_live(stop, obj)  # so the leak cannot crash a later test
    if dangling:
        pytest.fail("test left Qt work running:\n" + "\n".join(dangling))


def _qt_kinds() -> dict:
    """Each startable Qt class -> (is it still busy?, how to stop it)."""
    from PySide6.QtCore import QThread, QThreadPool, QTimer

    return {
        QThread: (QThread.isRunning, lambda thread: (thread.quit(), thread.wait(2000))),
        QTimer: (QTimer.isActive, QTimer.stop),
        QThreadPool: (lambda pool: pool.activeThreadCount() > 0, lambda pool: pool.waitForDone(2000)),
    }


def _track_start(monkeypatch, cls) -> dict:
    """Patch ``cls.start`` to remember every object started, with where it was started from."""
    # Timers and threads are held weakly, so one the test dropped is destroyed (and stopped) as
    # usual; a pool is held strongly, because globalInstance() hands out short-lived wrappers.
    tracked = {} if cls.__name__ == "QThreadPool" else weakref.WeakKeyDictionary()
    original = cls.start

    def start(self, *args, **kwargs):
        tracked[self] = "".join(traceback.format_stack(limit=3)[:-1])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "start", start)
    return tracked


def _on_live(fn, obj):
    """``fn(obj)``, or None when the C++ object behind ``obj`` is already deleted (so not running)."""
    try:
        return fn(obj)
    except RuntimeError:
        return None


def pytest_sessionfinish(session, exitstatus):
    """Delete the session's widgets while Qt is whole. Left to interpreter shutdown, a run that
    built a main window ended in a segmentation fault after every test had passed (exit status
    139): Python finalizes the QApplication before the widgets' deferred deletions have run."""
    import sys

    if "PySide6.QtWidgets" not in sys.modules:
        return
    import gc

    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QApplication

    app = QApplication.instance()
    if app is None:
        return
    for widget in app.topLevelWidgets():
        widget.close()
        widget.deleteLater()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    gc.collect()
