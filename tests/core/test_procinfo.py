"""core.procinfo against what the operating system's own tools report (Linux)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from loomlab.core import procinfo

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")


def test_usable_cpus_is_what_nproc_counts():
    # nproc also obeys OMP_NUM_THREADS / OMP_THREAD_LIMIT; the affinity is what is compared
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_THREAD_LIMIT")}
    assert procinfo.usable_cpus() == int(subprocess.run(["nproc"], capture_output=True, text=True,
                                                        check=True, env=env).stdout)


def test_cpu_name_and_machine_line():
    with open("/proc/cpuinfo") as f:
        names = {line.split(":", 1)[1].strip() for line in f if line.startswith("model name")}
    if names:  # some architectures' /proc/cpuinfo has no model name: platform's answer is used then
        assert procinfo.cpu_name() in names
    assert procinfo.machine() == f"{procinfo.cpu_name()}, {procinfo.usable_cpus()} CPUs"


def test_resident_memory_grows_by_what_is_touched():
    procinfo.release_memory()  # else the block may reuse pages earlier tests freed but kept resident
    before = procinfo.rss_bytes()
    block = np.ones(64 * 2**20, np.uint8)  # 64 MiB, every page written
    grown = procinfo.rss_bytes() - before
    assert 0.9 * block.nbytes <= grown <= 1.5 * block.nbytes
    assert procinfo.peak_rss_bytes() >= procinfo.rss_bytes() >= block.nbytes


RELEASE_PROBE = """
import numpy as np
from loomlab.core import procinfo
blocks = [np.ones(16384, np.float32) for _ in range(4000)]  # 4000 x 64 KiB from malloc's heap
pin = np.ones(16384, np.float32)  # allocated last: freeing the blocks leaves a hole, not a free top
del blocks
resident = procinfo.rss_bytes()
given = procinfo.release_memory()
print(given, resident - procinfo.rss_bytes())
"""


def test_release_memory_gives_freed_heap_pages_back():
    # in a child process: the freed 250 MiB stay resident until release_memory trims them
    out = subprocess.run([sys.executable, "-c", RELEASE_PROBE], capture_output=True, text=True, check=True)
    given, dropped = map(int, out.stdout.split())
    assert given >= 200 * 2**20 and abs(given - dropped) < 8 * 2**20
