"""core.procinfo against what the operating system's own tools report (Linux)."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from loomlab.core import procinfo

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux only)")


def test_usable_cpus_is_what_nproc_counts():
    assert procinfo.usable_cpus() == int(subprocess.run(["nproc"], capture_output=True, text=True,
                                                        check=True).stdout)


def test_cpu_name_and_machine_line():
    with open("/proc/cpuinfo") as f:
        names = {line.split(":", 1)[1].strip() for line in f if line.startswith("model name")}
    if names:  # some architectures' /proc/cpuinfo has no model name: platform's answer is used then
        assert procinfo.cpu_name() in names
    assert procinfo.machine() == f"{procinfo.cpu_name()}, {procinfo.usable_cpus()} CPUs"


def test_resident_memory_grows_by_what_is_touched():
    before = procinfo.rss_bytes()
    block = np.ones(64 * 2**20, np.uint8)  # 64 MiB, every page written
    grown = procinfo.rss_bytes() - before
    assert 0.9 * block.nbytes <= grown <= 1.5 * block.nbytes
    assert procinfo.peak_rss_bytes() >= procinfo.rss_bytes() >= block.nbytes
