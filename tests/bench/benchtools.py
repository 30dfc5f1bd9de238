"""What the benchmark scripts share; each runs as ``python tests/bench/NAME.py``, which puts
this folder on ``sys.path``."""

from __future__ import annotations

import time
from collections.abc import Callable


def best(fn: Callable[[], object], repeat: int) -> float:
    """The shortest of ``repeat`` timed calls, in seconds: the one the machine disturbed least."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)
