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
