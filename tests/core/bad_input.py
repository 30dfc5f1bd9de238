"""The check every bad-file test makes: one typed error, raised quickly, without a big allocation."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass
class Traced:
    """What the block of :func:`traced` allocated (tracemalloc): ``kept`` at its end, ``peak``."""

    kept: int = 0
    peak: int = 0


@contextmanager
def traced() -> Iterator[Traced]:
    """Measure the Python allocations (numpy's included) of a block."""
    result = Traced()
    tracemalloc.start()
    try:
        yield result
        result.kept, result.peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()


def raises_quickly_and_small(call: Callable[[], object], error: type[BaseException], *, seconds: float,
                             peak_bytes: float) -> BaseException:
    """Run ``call``, expect ``error``, and hold its time and its peak Python allocation (tracemalloc)
    to the limits; returns the exception for the caller's own checks."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(error) as e:
            call()
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < seconds and peak < peak_bytes, (elapsed, peak)
    return e.value
