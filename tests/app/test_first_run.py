"""The window's first start: with kernels missing from numba's cache the window shows at once,
a child compiles them and the status bar counts them, Skip stops it; with every kernel cached (or
in the "wait" mode) nothing is started."""

from __future__ import annotations

import subprocess
import sys

import pytest

from loomlab.app import first_run
from loomlab.app.first_run import TITLE, KernelsStatus, start_kernels
from loomlab.core.errors import LoomConfigError


class FakeCompilation:
    def __init__(self):
        self.compiled, self.finished, self.error, self.stops = 0, False, None, 0

    def stop(self):
        self.stops += 1


def test_the_status_bar_counts_the_kernels_and_skip_stops_the_child(qtbot):
    c = FakeCompilation()
    status = KernelsStatus(c)
    qtbot.addWidget(status)
    status.show()
    assert status.label.text() == f"{TITLE}…"
    c.compiled = 7
    qtbot.waitUntil(lambda: status.label.text() == f"{TITLE}: 7 compiled…", timeout=3000)
    assert status.label.text() == "Preparing kernels for this CPU (first run only): 7 compiled…"
    status.skip.click()
    assert c.stops == 1 and status.isHidden() and not status.timer.isActive()


def test_the_status_hides_when_the_kernels_are_ready_and_says_a_failure(qtbot):
    done, failed = FakeCompilation(), FakeCompilation()
    failed.error = "the kernel compilation exited with status 1: boom"
    widgets = [KernelsStatus(done), KernelsStatus(failed)]
    for w in widgets:
        qtbot.addWidget(w)
        w.show()
    done.finished = failed.finished = True
    qtbot.waitUntil(lambda: not any(w.timer.isActive() for w in widgets), timeout=3000)
    assert widgets[0].isHidden() and done.stops == 1
    assert widgets[1].isVisible() and widgets[1].skip.isHidden()
    assert "failed" in widgets[1].label.text() and widgets[1].label.toolTip() == failed.error


def test_start_kernels_starts_a_child_only_for_a_cold_cache_in_the_answer_mode(monkeypatch):
    started, warmed = [], []
    monkeypatch.setattr(first_run, "KernelCompilation", lambda path: started.append(path) or "child")
    monkeypatch.setattr(first_run.kernel_warmup, "warm_up", lambda: warmed.append(1))
    monkeypatch.setattr(first_run, "every_kernel_cached", lambda: True)
    assert start_kernels("answer") is None and started == []
    monkeypatch.setattr(first_run, "every_kernel_cached", lambda: False)
    assert start_kernels("answer") == "child" and started == [None]  # None: every kernel, not a model's
    assert start_kernels("wait") is None and warmed == [1] and started == [None]
    monkeypatch.delenv("LOOMLAB_FIRST_RUN", raising=False)
    assert start_kernels() == "child"  # the default is to answer
    with pytest.raises(LoomConfigError, match="first_run"):
        start_kernels("later")


def test_the_child_for_every_kernel_reports_each_one():
    code = ("import sys\nimport loomlab.core.llm.model.kernel_compilation as kc\n"
            "kc.warm_up = lambda report: [report('k', n, 0) for n in (1, 2, 3)]\n"
            "sys.exit(kc.main(['--all']))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["compiled 1", "compiled 2", "compiled 3"]
