"""Array backends: the array module numeric code is written against.

Numeric code receives ``xp`` (numpy or cupy) instead of importing numpy directly, so the CuPy
backend in :mod:`loomlab.gpu` reuses every layer unchanged. Backends are found by name in a
registry; ``"auto"`` picks CuPy when a CUDA device is usable and numpy otherwise.

numpy is built in. Any other backend is a plugin that calls :func:`register_backend` when it is
imported, and is found through the ``loomlab.backends`` entry points of the installed packages
(``cupy = "loomlab.gpu"`` in this project's pyproject.toml): the engine never imports a plugin by
name, and imports one only when its backend is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import ModuleType

import numpy as np

from .errors import LoomConfigError

ENTRY_POINT_GROUP = "loomlab.backends"


@dataclass(frozen=True)
class Backend:
    name: str
    xp: ModuleType  # the array module: numpy or cupy

    def asarray(self, a, dtype=None):
        return self.xp.asarray(a, dtype=dtype)

    def to_numpy(self, a) -> np.ndarray:
        """Bring an array back to host memory (a no-op for numpy)."""
        return a.get() if hasattr(a, "get") else np.asarray(a)


NUMPY = Backend("numpy", np)

# name -> zero-argument factory; factories import their heavy module only when called.
_FACTORIES: dict[str, Callable[[], Backend]] = {"numpy": lambda: NUMPY}


def register_backend(name: str, factory: Callable[[], Backend]) -> None:
    """Make ``get_backend(name)`` call ``factory()``; plugins call this when imported."""
    _FACTORIES[name] = factory


def get_backend(name: str = "numpy") -> Backend:
    """Return the backend called ``name`` ("numpy", "cupy" or "auto").

    An unknown name, or a backend this machine cannot run (no CuPy, no CUDA device), raises
    :class:`LoomConfigError` saying why; ``"auto"`` falls back to numpy instead.
    """
    if name == "auto":
        try:
            return _make("cupy")
        except Exception:  # no CuPy, no driver or no device: the CPU always works
            return NUMPY
    return _make(name)


def _make(name: str) -> Backend:
    factory = _FACTORIES.get(name)
    if factory is None:
        _load_plugin(name)
        factory = _FACTORIES.get(name)
    if factory is None:
        known = sorted({*_FACTORIES, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))})
        raise LoomConfigError(f"unknown backend {name!r}; known: {known} or 'auto'")
    return factory()


def _load_plugin(name: str) -> None:
    """Import the plugins that declare backend ``name``; importing one registers its backends."""
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        try:
            ep.load()
        except Exception as e:  # a broken plugin is reported as that, not as an unknown name
            raise LoomConfigError(f"backend {name!r}: its plugin {ep.value!r} failed to import: {e}") from e


def array_module(a) -> ModuleType:
    """The array module an array belongs to (``cupy.get_array_module`` without needing CuPy)."""
    if type(a).__module__.split(".")[0] == "cupy":
        import cupy

        return cupy
    return np


# ----- choosing a backend by name, device memory ---------------------------------------------
def backend_names() -> list[str]:
    """The names :func:`get_backend` takes here: the registered and installed backends, and "auto"."""
    return sorted({*_FACTORIES, *(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)), "auto"})


@dataclass(frozen=True)
class DeviceMemory:
    """A GPU's memory as its backend sees it, in bytes."""

    used: int  # held by live arrays (CuPy's memory pool: used_bytes)
    free: int  # free on the device for any process (cudaMemGetInfo)
    total: int  # the device's memory
    # The pool keeps freed blocks for reuse, so the bytes it holds (total_bytes) are the most live
    # arrays needed at once since it last released blocks, rounded up to its block sizes.
    peak: int

    def describe(self) -> str:
        gib = 2**30
        return (f"GPU {self.used / gib:.2f} GiB used, peak {self.peak / gib:.2f} GiB, "
                f"{self.free / gib:.1f} of {self.total / gib:.1f} GiB free")


def device_memory(backend: Backend) -> DeviceMemory | None:
    """Device memory of ``backend`` now; None for a backend without a device (numpy).

    A backend has a device when its array module has CuPy's memory-pool API, so a CuPy-like
    module can stand in for CuPy in tests."""
    pool_of = getattr(backend.xp, "get_default_memory_pool", None)
    if pool_of is None:
        return None
    pool = pool_of()
    free, total = backend.xp.cuda.runtime.memGetInfo()
    return DeviceMemory(used=int(pool.used_bytes()), free=int(free), total=int(total),
                        peak=int(pool.total_bytes()))
