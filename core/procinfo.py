"""What this process runs on and uses: its memory, from ``/proc/self/status`` (0 where that file
does not exist), and the CPU that benchmarks name when they report a speed."""

from __future__ import annotations

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
