"""A stand-in for CuPy's memory API, so the code a GPU runs is tested without pretending one
exists (the ``gpu`` fixture in tests/conftest.py builds a backend on it)."""

from __future__ import annotations

from types import SimpleNamespace

MiB, GiB = 2**20, 2**30


class FakePool:
    """CuPy's MemoryPool as far as device_memory reads it."""

    def __init__(self, used: int, held: int):
        self.used, self.held = used, held

    def used_bytes(self) -> int:
        return self.used

    def total_bytes(self) -> int:
        return self.held


def cupy_like(used=3 * MiB, held=8 * MiB, free=70 * GiB, total=80 * GiB) -> SimpleNamespace:
    """A module with CuPy's memory API (cupy.get_default_memory_pool, cupy.cuda.runtime.memGetInfo)."""
    pool = FakePool(used, held)
    return SimpleNamespace(get_default_memory_pool=lambda: pool,
                           cuda=SimpleNamespace(runtime=SimpleNamespace(memGetInfo=lambda: (free, total))))

