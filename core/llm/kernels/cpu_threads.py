"""How many threads the parallel kernels should use: the CPUs this process may run on, less the
ones other processes keep busy.

Why: every parallel kernel ends at a barrier that waits for its slowest thread. When another
process keeps a core busy, one of our threads is descheduled for a whole time slice at a time,
and each of the ~200 kernels of a decoded token can wait for it: on 2 cores beside one busy
process, 2 threads decode SmolLM2 several times slower than 1
(``python tests/bench/bench_decode_under_load.py``: ``fixed+busy`` against ``adaptive+busy``).

Others' load is measured, not guessed from the load average (which counts our own threads): the
busy time of the CPUs in this process's affinity, read from ``/proc/stat``'s per-CPU lines, less
this process's own CPU time, over the window since the previous sample. Reading both costs
microseconds, so :meth:`ThreadChooser.choose` re-samples every :attr:`~ThreadChooser.interval`
seconds and is a clock comparison in between; the readers and the clock are injectable.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

# A competitor using more than this fraction of a core takes the core away from us: beside a
# process busy 15% of the time two threads still decode faster than one, at 25% slower (now and
# then a barrier waits a whole time slice for the descheduled thread; docs/kernels.md).
SLACK_CORES = 0.2
# /proc/stat columns (after the cpu name) that count as busy: user, nice, system, irq, softirq,
# steal (a hypervisor running someone else on our CPU is a competitor too). guest and guest_nice
# are already inside user and nice; idle and iowait are free time.
_BUSY_COLUMNS = (0, 1, 2, 5, 6, 7)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's unit


@dataclass(frozen=True)
class CpuSample:
    """Cumulative counters at one moment, in seconds."""

    at: float  # the clock
    busy_s: float  # busy time summed over the usable CPUs (since boot)
    own_s: float  # this process's CPU time, all its threads


def read_busy_seconds(cpus: Collection[int], stat_path: str = "/proc/stat") -> float | None:
    """Busy seconds since boot summed over ``cpus``, from ``/proc/stat``; None where the file
    cannot be read or lists none of them (not Linux, or a hidden /proc)."""
    prefix = tuple(f"cpu{c} " for c in cpus)
    ticks, found = 0, False
    try:
        with open(stat_path) as f:
            for line in f:
                if line.startswith(prefix):
                    fields = line.split()[1:]
                    ticks += sum(int(fields[i]) for i in _BUSY_COLUMNS if i < len(fields))
                    found = True
    except (OSError, ValueError):
        return None
    return ticks / _CLOCK_TICKS if found else None



def others_busy_cores(prev: CpuSample, cur: CpuSample) -> float:
    """Cores other processes kept busy on average between two samples (>= 0)."""
    window = cur.at - prev.at
    if window <= 0:
        return 0.0
    others = (cur.busy_s - prev.busy_s) - (cur.own_s - prev.own_s)
    return max(0.0, others / window)


def threads_for(usable: int, others: float, limit: int) -> int:
    """``floor(usable - others + SLACK_CORES)`` clamped to ``[1, min(usable, limit)]``: every core
    that others use by more than SLACK_CORES costs one thread."""
    free = math.floor(usable - others + SLACK_CORES)
    return max(1, min(free, usable, limit))


def _affinity() -> frozenset[int]:
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


class ThreadChooser:
    """Picks a thread count from the CPUs left free by other processes; shared by threads.

    Args:
        limit: most threads ever chosen (numba's pool size).
        cpus: the CPU ids this process may run on (default: its affinity).
        clock, read_busy, own_cpu: the monotonic clock, ``read_busy(cpus) -> seconds | None``
            and this process's CPU seconds; injectable for tests.
        interval: seconds between re-samples.
        first_window: the shortest window a choice is made from, after a fresh start.
        stale_after: a previous sample older than this is discarded (its average would describe
            the past, e.g. the idle time between two generations) and a fresh window starts.
    """

    def __init__(self, limit: int, *, cpus: Collection[int] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 read_busy: Callable[[Collection[int]], float | None] = read_busy_seconds,
                 own_cpu: Callable[[], float] = time.process_time,
                 interval: float = 0.3, first_window: float = 0.05, stale_after: float = 2.0):
        self.cpus = frozenset(_affinity() if cpus is None else cpus)
        self.limit = max(1, min(int(limit), len(self.cpus)))
        self.interval, self.first_window, self.stale_after = interval, first_window, stale_after
        self._clock, self._read_busy, self._own_cpu = clock, read_busy, own_cpu
        self._threads = self.limit  # until a window is measured, assume the machine is ours
        self._last: CpuSample | None = None
        self._due = -math.inf
        self._lock = threading.Lock()
        self.others = 0.0  # the last measured load of other processes, in cores

    @property
    def threads(self) -> int:
        """The current choice, without sampling."""
        return self._threads

    def choose(self) -> int:
        """The thread count to use now; re-samples when a window has elapsed."""
        now = self._clock()
        # a clock read between samples; and never wait for another thread that is sampling
        if now < self._due or not self._lock.acquire(blocking=False):
            return self._threads
        try:
            self._resample(now)
        finally:
            self._lock.release()
        return self._threads

    def _resample(self, now: float) -> None:
        busy = self._read_busy(self.cpus)
        if busy is None:  # nothing to measure with: keep today's choice, stop asking
            self._due = math.inf
            return
        sample = CpuSample(now, busy, self._own_cpu())
        prev, self._last = self._last, sample
        if prev is None or now - prev.at > self.stale_after:
            self._due = now + self.first_window
            return
        self.others = others_busy_cores(prev, sample)
        self._threads = threads_for(len(self.cpus), self.others, self.limit)
        self._due = now + self.interval
