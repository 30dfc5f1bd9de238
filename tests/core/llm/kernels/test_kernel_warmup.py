"""A first run's kernel compilation is reported (and cancellable) while a model loads; warming
every kernel up front leaves the caller no thread pool."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from numba import njit

from loomlab.core.errors import LoomCancelled
from loomlab.core.llm.kernels.kernel_warmup import KERNELS_STAGE, compile_progress


def fresh_kernel(module: str):
    """A kernel numba has not compiled yet, as if defined in ``module``."""
    def twice(x):
        return x * 2.0

    twice.__module__ = module
    return njit(twice)


def test_each_of_our_kernels_compiled_is_reported_before_and_after():
    seen = []
    with compile_progress(lambda *a: seen.append(a)) as counter:
        assert fresh_kernel("loomlab.core.llm.example")(np.float32(1.5)) == 3.0
    assert seen == [(KERNELS_STAGE, 0, 0), (KERNELS_STAGE, 1, 0)]
    assert counter.done == 1


def test_other_packages_kernels_are_not_counted():
    seen = []
    with compile_progress(lambda *a: seen.append(a)) as counter:
        fresh_kernel("someone_else")(np.float32(1.0))
    assert seen == [] and counter.done == 0


def test_a_cancel_stops_before_the_next_kernel_and_the_listener_goes_away():
    kernel = fresh_kernel("loomlab.core.llm.example")
    with pytest.raises(LoomCancelled), compile_progress(None, cancel=lambda: True):
        kernel(np.float32(1.0))
    seen = []
    with compile_progress(lambda *a: seen.append(a)):
        pass
    assert kernel(np.float32(2.0)) == 4.0  # compiles now: nobody listens, nobody cancels
    assert seen == []


def test_a_loaded_model_has_its_kernels_ready_and_its_step_count_untouched(smollm2):
    """load_model warmed the model's path: warming again compiles nothing and reports nothing."""
    from loomlab.core.llm.kernels.kernel_warmup import warm_model

    seen, steps = [], smollm2.net.step_count
    assert warm_model(smollm2.net, lambda *a: seen.append(a)) == 0
    assert seen == [] and smollm2.net.step_count == steps


POOL_PROBE = """
import os, time
import numba
count = lambda: len(os.listdir("/proc/self/task"))
before = count()
from loomlab.core.llm.kernels import kernel_warmup
kernel_warmup.warm_up()
deadline = time.monotonic() + 5  # an ended thread's pool workers leave a moment after it
while count() > before and time.monotonic() < deadline:
    time.sleep(0.01)
print(numba.get_num_threads(), before, count())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="counts threads in /proc (Linux only)")
def test_warm_up_leaves_the_caller_no_openmp_pool():
    # run in the calling thread, the kernels would leave it a pool of numba.get_num_threads() - 1
    # workers for good, and a second pool (a generating worker's) then halves decode speed on 2
    # cores; run on a thread that ends, the pool's workers leave with it
    out = subprocess.run([sys.executable, "-c", POOL_PROBE], capture_output=True, text=True, check=True)
    threads, before, after = map(int, out.stdout.split())
    assert after == before, f"{after - before} threads left behind by warm_up ({threads} numba threads)"
