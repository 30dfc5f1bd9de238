"""The CuPy backend: the engine's numeric code running on an NVIDIA GPU.

Importing this package registers the "cupy" backend with :mod:`loomlab.core.backend`, which
imports it through the ``loomlab.backends`` entry point (pyproject.toml) the first time "cupy" or
"auto" is asked for. Importing it never imports CuPy by itself, so it is safe on machines without
CUDA.
"""

from __future__ import annotations

from loomlab.core.backend import Backend, register_backend
from loomlab.core.errors import LoomConfigError

INSTALL_HINT = "pip install 'loomlab[gpu]' (CuPy for CUDA 12)"


def cupy_backend() -> Backend:
    """A :class:`Backend` over CuPy; :class:`LoomConfigError` saying why when no GPU is usable."""
    try:
        import cupy
    except ImportError as e:
        raise LoomConfigError(f"the 'cupy' backend needs CuPy, which is not installed: {INSTALL_HINT}") from e
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # no driver, or a driver older than CuPy's CUDA
        raise LoomConfigError(f"CuPy cannot reach a CUDA device: {e}") from e
    if devices < 1:
        raise LoomConfigError("CuPy found no CUDA device")
    from .llm_kernels import CudaLLMKernels  # numba's CUDA target: imported when the backend is made

    return Backend("cupy", cupy, llm_kernels=CudaLLMKernels)


register_backend("cupy", cupy_backend)
