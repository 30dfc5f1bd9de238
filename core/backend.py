"""Array backends: the array module numeric code is written against.

Numeric code receives ``xp`` (numpy or cupy) instead of importing numpy directly, so the CuPy
backend in :mod:`loomlab.gpu` reuses every layer unchanged. Backends are found by name in a
registry; ``"auto"`` picks CuPy when a CUDA device is usable and numpy otherwise.

``"strict"`` (and ``"strict-no-float64"``) run the same code on ``array_api_strict``, which refuses
what CuPy would refuse or make slow: functions outside the array API standard, implicit conversion
to host numpy, arrays of two devices in one operation, and (on the second) float64. Its arrays live
on a simulated device, so every host copy has to go through :func:`to_host`.

numpy is built in. Any other backend is a plugin that calls :func:`register_backend` when it is
imported, and is found through the ``loomlab.backends`` entry points of the installed packages
(``cupy = "loomlab.gpu"`` in this project's pyproject.toml): the engine never imports a plugin by
name, and imports one only when its backend is asked for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cache, cached_property
from importlib.metadata import entry_points
from types import ModuleType
from typing import Protocol, runtime_checkable

import numpy as np

from .errors import LoomConfigError

ENTRY_POINT_GROUP = "loomlab.backends"


@runtime_checkable
class DeviceKernels(Protocol):
    """What a language model needs from a device beyond the array API: its matrices uploaded
    once, then multiplied, and attention. Described here, where a backend names its own
    (``Backend.llm_kernels``), so that backends never import the language models; the array-API
    fallback and base class is :class:`loomlab.core.llm.kernels.device_kernels.LLMKernels`."""

    backend: Backend
    xp: ModuleType

    def upload(self, m) -> object:
        """A layer matrix (a QuantMatrix, or a float32 numpy array ``[out, in]``) made
        device-resident."""

    def table(self, m):
        """A matrix as the float32 array ``[out, in]`` on the device that rows are gathered from."""

    def linear(self, x, m):
        """``x [T, in]`` on the device times the uploaded matrix ``m`` transposed: ``[T, out]``."""

    def attend(self, q, keys, values, start: int, window: int | None, scale: float):
        """Causal attention of ``q [T, H, hd]`` at positions ``start..`` over ``keys`` / ``values``
        ``[Hkv, S, hd]`` on the device: ``[T, H * hd]``."""


@dataclass(frozen=True)
class Backend:
    name: str
    xp: ModuleType  # the array namespace: numpy, cupy or a device-bound array_api_strict
    device: object = None  # where its arrays live; None: the namespace's default device
    # makes this backend's language-model kernels (called with the backend; CuPy's names a subclass
    # of loomlab.core.llm.kernels.device_kernels.LLMKernels); None: the array-API fallback
    llm_kernels: Callable[[Backend], DeviceKernels] | None = None

    def asarray(self, a, dtype=None):
        return self.xp.asarray(a, dtype=dtype)

    def to_numpy(self, a) -> np.ndarray:
        """Bring an array back to host memory (a no-op for numpy)."""
        return to_host(a)

    @cached_property
    def has_float64(self) -> bool:
        """Whether the device computes in float64 (many consumer GPUs, and ``no_float64``, do not)."""
        return device_has_float64(self.xp, self.device)


NUMPY = Backend("numpy", np)

STRICT_INSTALL_HINT = "pip install 'loomlab[dev]' (or: pip install array-api-strict)"
# backend name -> array_api_strict's simulated device it computes on
STRICT_DEVICES = {"strict": "device1", "strict-no-float64": "no_float64"}


def strict_backend(name: str = "strict") -> Backend:
    """The checking backend: array_api_strict on the simulated device ``STRICT_DEVICES[name]``."""
    try:
        import array_api_strict
    except ImportError as e:
        raise LoomConfigError(f"the {name!r} backend needs array-api-strict, which is not installed: "
                              f"{STRICT_INSTALL_HINT}") from e
    device = array_api_strict.Device(STRICT_DEVICES[name])
    return Backend(name, strict_namespace(device), device)


# name -> zero-argument factory; factories import their heavy module only when called.
_FACTORIES: dict[str, Callable[[], Backend]] = {
    "numpy": lambda: NUMPY,
    **{name: (lambda n=name: strict_backend(n)) for name in STRICT_DEVICES},
}


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
    """The array module an array belongs to (``cupy.get_array_module`` without needing CuPy).

    An array_api_strict array gets the namespace bound to its own device, so arrays created while
    computing on it land beside it, as CuPy's land on the current device.
    """
    library = _library(a)
    if library == "cupy":
        import cupy

        return cupy
    if library == "array_api_strict":
        return strict_namespace(a.device)
    return np


def _library(a) -> str:
    """The top-level package an array's type comes from ("numpy", "cupy", "array_api_strict")."""
    return type(a).__module__.split(".")[0]


def to_host(a) -> np.ndarray:
    """Copy an array to host memory as numpy: the one explicit device-to-host transfer."""
    if isinstance(a, np.ndarray):
        return a
    if hasattr(a, "get"):  # CuPy
        return a.get()
    if _library(a) == "array_api_strict":
        import array_api_strict

        # np.asarray refuses an array on a simulated device: move it to the CPU device first
        return np.asarray(a.to_device(array_api_strict.Device()))
    return np.asarray(a)


def host_dtype(dtype) -> np.dtype:
    """The numpy dtype of a dtype of any namespace (array_api_strict's compare unequal to numpy's)."""
    if isinstance(dtype, np.dtype | type):
        return np.dtype(dtype)
    return np.dtype(str(dtype).rsplit(".", 1)[-1])  # "array_api_strict.float32" -> float32


# The array API's creation functions that take ``device=``; the device-bound namespace fills it in.
_CREATION_FUNCTIONS = ("arange", "empty", "eye", "full", "linspace", "ones", "zeros")


@cache
def strict_namespace(device) -> ModuleType:
    """array_api_strict with ``device`` as its current device, the way CuPy has one.

    Creation functions default to ``device`` and ``asarray`` copies host data onto it, so numeric
    code written once for numpy and CuPy (``xp.zeros(...)``, ``xp.asarray(host)``) runs unchanged.
    An array already on some device keeps it: moving between devices stays explicit, and mixing
    devices raises in array_api_strict.
    """
    import array_api_strict as strict

    ns = ModuleType(f"array_api_strict[{device!r}]", strict_namespace.__doc__)

    def bound(f):
        def on_device(*args, device=device, **kwargs):
            return f(*args, device=device, **kwargs)

        return on_device

    for name in _CREATION_FUNCTIONS:
        setattr(ns, name, bound(getattr(strict, name)))

    def asarray(obj, /, *, dtype=None, copy=None):
        where = obj.device if _library(obj) == "array_api_strict" else device
        return strict.asarray(obj, dtype=dtype, device=where, copy=copy)

    ns.asarray = asarray
    ns.__getattr__ = lambda name: getattr(strict, name)  # everything else is array_api_strict's
    return ns


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


# ----- float width of a device ----------------------------------------------------------------
def device_has_float64(xp, device=None) -> bool:
    """Whether ``device`` of namespace ``xp`` computes in float64 (``no_float64`` and many GPUs do not)."""
    info = getattr(xp, "__array_namespace_info__", None)
    if info is None:  # a namespace predating the inspection API: assume the common case
        return True
    return "float64" in info().dtypes(device=device, kind="real floating")


@cache  # asked per loss, per gradient and per statistic: the namespace's inspection API is slow
def widest_float(xp, device=None):
    """float64 where ``device`` has it, else float32: the accumulator of losses, gradients and
    statistics (float64 on the host, as Loom)."""
    return xp.float64 if device_has_float64(xp, device) else xp.float32


def host_floats(*values) -> list[float]:
    """0-d arrays of one device as Python floats, in one transfer: for the decisions and reports a
    trainer makes in Python (skip a layer, stop an epoch) on numbers reduced on the device."""
    xp = array_module(values[0])
    return to_host(xp.stack(values)).tolist()


# ----- writing into an array of another dtype -------------------------------------------------
def assign_cast(dst, src) -> None:
    """``dst[...] = src`` in ``dst``'s dtype, in place (an optimizer writing a float64 update into a
    float32 master). numpy casts while it copies, in one pass; the standard refuses mixed dtypes in
    a setitem, so other namespaces cast first (one temporary)."""
    if isinstance(dst, np.ndarray):
        dst[...] = src
    else:
        dst[...] = array_module(dst).astype(src, dst.dtype)
