"""The decode thread count: the /proc/stat reader and the choice against their formulas, with a fake
clock and fake counters; one real run beside a busy child process; and its use by the kernels and
by generation (numba's count is per thread, set in the generating thread)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import time

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from gguf import quants

from loomlab.core.llm.kernels import quant
from loomlab.core.llm.kernels.cpu_threads import (
    SLACK_CORES,
    CpuSample,
    ThreadChooser,
    others_busy_cores,
    read_busy_seconds,
    threads_for,
)
from loomlab.core.llm.kernels.quant import QuantMatrix
from loomlab.core.procinfo import usable_cpus

# user nice system idle iowait irq softirq steal guest guest_nice
STAT = """cpu  900 90 900 9000 900 9 9 90 0 0
cpu0 100 10 200 5000 400 1 2 30 7 0
cpu1 300 20 400 4000 500 3 4 50 0 0
cpu2 500 60 300 9000 0 5 3 10 0 0
intr 12345 0 0
ctxt 999
"""


def busy_ticks(line: str) -> int:
    """The oracle: user + nice + system + irq + softirq + steal of one /proc/stat line."""
    v = [int(x) for x in line.split()[1:]]
    return v[0] + v[1] + v[2] + v[5] + v[6] + v[7]


def test_read_busy_seconds_sums_busy_columns_of_the_given_cpus(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    lines = STAT.splitlines()
    tick = os.sysconf("SC_CLK_TCK")
    both = busy_ticks(lines[1]) + busy_ticks(lines[3])
    assert read_busy_seconds({0, 2}, str(stat)) == pytest.approx(both / tick)
    assert read_busy_seconds({1}, str(stat)) == pytest.approx(busy_ticks(lines[2]) / tick)
    assert read_busy_seconds({7}, str(stat)) is None  # a CPU the file does not list
    assert read_busy_seconds({0}, str(tmp_path / "missing")) is None
    stat.write_text("cpu0 12 x 3\n")
    assert read_busy_seconds({0}, str(stat)) is None


def test_read_busy_seconds_of_this_machine_grows_with_work():
    cpus = os.sched_getaffinity(0)
    before = read_busy_seconds(cpus)
    t = time.process_time()
    while time.process_time() - t < 0.1:  # 0.1 s of our own CPU time lands in some cpuN line
        pass
    assert before is not None and read_busy_seconds(cpus) - before >= 0.1 - 2 / os.sysconf("SC_CLK_TCK")


@pytest.mark.parametrize(("busy", "own", "window", "want"), [
    (2.0, 0.5, 1.0, 1.5), (0.3, 0.3, 0.5, 0.0), (0.1, 0.4, 1.0, 0.0), (3.0, 1.0, 2.0, 1.0),
    (1.0, 0.0, 0.0, 0.0)])
def test_others_busy_cores_is_busy_minus_own_over_the_window(busy, own, window, want):
    prev = CpuSample(at=10.0, busy_s=100.0, own_s=7.0)
    cur = CpuSample(at=10.0 + window, busy_s=100.0 + busy, own_s=7.0 + own)
    assert others_busy_cores(prev, cur) == pytest.approx(want)


@pytest.mark.parametrize("usable", [1, 2, 4, 16])
@pytest.mark.parametrize("others", [0.0, 0.1, 0.19, 0.21, 0.9, 1.0, 1.3, 2.5, 40.0])
@pytest.mark.parametrize("limit", [1, 3, 64])
def test_threads_for_formula(usable, others, limit):
    want = max(1, min(math.floor(usable - others + SLACK_CORES), usable, limit))
    assert threads_for(usable, others, limit) == want


def test_threads_for_examples():
    assert threads_for(2, 0.0, 2) == 2
    assert threads_for(2, 1.0, 2) == 1  # one busy competitor on 2 cores: one thread
    assert threads_for(4, 1.0, 4) == 3
    assert threads_for(2, 0.15, 2) == 2  # background noise below the slack keeps both
    assert threads_for(2, 0.25, 2) == 1


class FakeMachine:
    """Cumulative counters advanced by hand: others' load and ours, in cores, over ``dt``."""

    def __init__(self):
        self.t, self.busy, self.own, self.reads = 100.0, 5000.0, 3.0, 0

    def run(self, dt: float, others: float, ours: float) -> None:
        self.t += dt
        self.busy += dt * (others + ours)
        self.own += dt * ours

    def read_busy(self, cpus):
        self.reads += 1
        return self.busy

    def chooser(self, cpus=(0, 1), limit=8) -> ThreadChooser:
        return ThreadChooser(limit, cpus=cpus, clock=lambda: self.t, read_busy=self.read_busy,
                             own_cpu=lambda: self.own, interval=0.3, first_window=0.05, stale_after=2.0)


def test_chooser_starts_at_the_limit_and_measures_a_first_window():
    m = FakeMachine()
    c = m.chooser(cpus=(0, 1, 2, 3), limit=3)
    assert c.choose() == 3 and m.reads == 1  # no window yet: assume the CPUs are free
    m.run(0.04, others=2.0, ours=1.0)
    assert c.choose() == 3 and m.reads == 1  # within first_window: a clock read only
    m.run(0.02, others=2.0, ours=1.0)
    assert c.choose() == threads_for(4, 2.0, 3) == 2 and m.reads == 2
    assert c.others == pytest.approx(2.0)


def test_chooser_resamples_each_interval_and_follows_the_load():
    m = FakeMachine()
    c = m.chooser()
    c.choose()
    m.run(0.1, others=1.0, ours=1.0)
    assert c.choose() == 1
    for others, want in ((1.0, 1), (0.0, 2), (0.6, 1), (0.1, 2)):
        m.run(0.2, others=others, ours=2.0)
        reads = m.reads
        assert c.choose() == c.threads and m.reads == reads  # 0.2 s < interval: not yet
        m.run(0.15, others=others, ours=2.0)
        assert c.choose() == want and m.reads == reads + 1
        # the window is the 0.35 s since the last sample, all at this load
        assert c.others == pytest.approx(others)


def test_chooser_starts_a_fresh_window_after_a_long_gap():
    m = FakeMachine()
    c = m.chooser()
    c.choose()
    m.run(0.1, others=1.0, ours=0.0)
    assert c.choose() == 1
    m.run(60.0, others=0.0, ours=0.0)  # an idle minute: its average must not decide alone
    assert c.choose() == 1 and c.others == pytest.approx(1.0)  # kept until a fresh window
    m.run(0.06, others=0.0, ours=2.0)
    assert c.choose() == 2 and c.others == pytest.approx(0.0)


def test_chooser_without_proc_keeps_the_limit_and_stops_reading():
    reads = []
    c = ThreadChooser(4, cpus=(0, 1, 2, 3), clock=time.monotonic,
                      read_busy=lambda cpus: reads.append(cpus), own_cpu=time.process_time)
    assert [c.choose() for _ in range(5)] == [4] * 5
    assert len(reads) == 1


def test_chooser_limit_is_capped_by_the_cpus():
    assert ThreadChooser(64, cpus=(0, 1)).limit == 2
    assert ThreadChooser(0, cpus=(0, 1)).limit == 1


def test_a_busy_child_on_one_of_our_cpus_takes_a_thread_away():
    """Real /proc/stat: whatever else runs on this machine, a child spinning on one of our CPUs
    is at least ~one core of others' load, so the choice is at most usable - 1 (and >= 1)."""
    cpus = sorted(os.sched_getaffinity(0))
    child = subprocess.Popen(
        [sys.executable, "-c", f"import os, sys\nos.sched_setaffinity(0, {{{cpus[0]}}})\n"
                               "sys.stdout.write('x'); sys.stdout.flush()\nwhile True: pass"],
        stdout=subprocess.PIPE)
    try:
        assert child.stdout.read(1) == b"x"  # spinning from here on
        c = ThreadChooser(len(cpus), first_window=0.5)
        c.choose()
        time.sleep(0.6)
        threads = c.choose()
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
    assert c.others >= 0.7, f"a spinning child measured as {c.others:.2f} cores"
    assert 1 <= threads <= max(1, usable_cpus() - 1)


# ---------------------------------------------------------------------------------------------
# Applying the choice: per thread, inside quant.adaptive_threads.


@pytest.fixture
def fake_load(monkeypatch):
    """quant's chooser on a fake machine with as many CPUs as numba has threads."""
    m = FakeMachine()
    top = numba.config.NUMBA_NUM_THREADS
    monkeypatch.setattr(quant, "thread_chooser", m.chooser(cpus=range(top), limit=top))
    return m


def q8_matrix(rows=40, cols=64):
    rng = np.random.default_rng(0)
    data = quants.quantize(rng.standard_normal((rows, cols)).astype(np.float32), GT.Q8_0)
    return QuantMatrix(data, GT.Q8_0, (rows, cols)), quants.dequantize(data, GT.Q8_0)


def test_kernels_use_the_chosen_count_and_the_entry_count_comes_back(fake_load):
    m, W = q8_matrix()
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    top = numba.config.NUMBA_NUM_THREADS
    before = numba.get_num_threads()
    with quant.adaptive_threads():
        assert numba.get_num_threads() == before  # no window yet
        fake_load.run(0.1, others=1.0, ours=1.0)
        np.testing.assert_allclose(m.matvec(x), W @ x, rtol=1e-5, atol=1e-5)
        assert numba.get_num_threads() == threads_for(top, 1.0, top) == max(1, top - 1)
        fake_load.run(0.4, others=0.0, ours=1.0)
        m.rows([0, 3])  # the embedding lookup paces too
        assert numba.get_num_threads() == top
    assert numba.get_num_threads() == before


def test_entry_count_is_a_ceiling(fake_load):
    m, _ = q8_matrix()
    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with quant.adaptive_threads():
            fake_load.run(0.1, others=0.0, ours=0.0)  # an idle machine would allow all threads
            m.matvec(np.ones(64, np.float32))
            assert numba.get_num_threads() == 1
        assert numba.get_num_threads() == 1
    finally:
        numba.set_num_threads(before)


def test_no_chooser_and_outside_the_context_leave_numba_alone(fake_load, monkeypatch):
    m, _ = q8_matrix()
    before = numba.get_num_threads()
    fake_load.run(0.1, others=50.0, ours=0.0)
    m.matvec(np.ones(64, np.float32))  # not inside adaptive_threads
    assert numba.get_num_threads() == before and fake_load.reads == 0
    monkeypatch.setattr(quant, "thread_chooser", None)
    with quant.adaptive_threads():
        m.matvec(np.ones(64, np.float32))
        assert numba.get_num_threads() == before


def test_the_default_chooser_covers_numbas_pool():
    assert quant.thread_chooser.limit == min(numba.config.NUMBA_NUM_THREADS, usable_cpus())
    assert quant.thread_chooser.cpus == frozenset(os.sched_getaffinity(0))


def test_generation_runs_with_the_chosen_count(fake_load):
    """TextModel holds adaptive_threads while it generates: between tokens the generating thread
    has the chooser's count, and its own count afterwards."""
    from loomlab.core.llm.generate.textmodel import load_model

    top = numba.config.NUMBA_NUM_THREADS
    before = numba.get_num_threads()
    seen = []
    with load_model("smollm2-135m") as model:
        for _ in model.generate("The history of computing", max_tokens=4):
            seen.append(numba.get_num_threads())
            fake_load.run(0.35, others=1.0, ours=1.0)
    assert seen[0] == top  # the prefill measured no window yet
    assert seen[1:] == [max(1, top - 1)] * 3
    assert numba.get_num_threads() == before
