"""What this process runs on and uses: its memory, from ``/proc/self/status`` (0 where that file
does not exist), and the CPU that benchmarks name when they report a speed."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import platform


def _status_kib(field: str) -> int:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_bytes() -> int:
    """Resident memory now."""
    return _status_kib("VmRSS") * 1024


def peak_rss_bytes() -> int:
    """The most resident memory this process has used so far."""
    return _status_kib("VmHWM") * 1024


def release_memory() -> int:
    """Collect garbage and hand freed heap pages back to the system; returns the bytes of resident
    memory this gave back (0 when nothing did).

    After a model is unloaded most of what it used is free but still resident: glibc keeps freed
    pages of its arenas (every thread that allocated has one) for reuse, so the process would sit
    at 1.5-2 GiB with nothing loaded. ``malloc_trim(0)`` returns them; elsewhere (musl, macOS) the
    collection is all this does.
    """
    before = rss_bytes()
    gc.collect()
    libc = ctypes.util.find_library("c")
    if libc is not None:
        trim = getattr(ctypes.CDLL(libc), "malloc_trim", None)
        if trim is not None:
            trim(0)
    return max(before - rss_bytes(), 0)


def cpu_name() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else what ``platform`` knows."""
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity, which a container or taskset narrows)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def machine() -> str:
    """One line naming the machine a measurement was taken on, e.g. ``AMD EPYC 7B13, 2 CPUs``."""
    return f"{cpu_name()}, {usable_cpus()} CPUs"
