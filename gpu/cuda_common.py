"""What the numba-CUDA kernels share: finding numba's CUDA target, moving inputs and results, and
the block-wide reduction.

``numba.cuda`` is imported with this module (not with ``loomlab.gpu``), guarded: importing it
touches no driver, and a numba without its CUDA target leaves ``cuda`` None, so the kernel modules
import on any machine and :func:`numba_cuda` says what is missing when a kernel is asked for.
Kernel modules bind ``cuda`` as a module global (``from .cuda_common import cuda``) because the
simulator swaps in its fake module by rebinding the globals that hold ``numba.cuda``; a closure
over it would reach the real one. With ``NUMBA_ENABLE_CUDASIM=1`` in the environment before numba
is first imported, the same kernels run in numba's CUDA simulator on the CPU (each GPU thread a
Python thread): that is how the test suite checks them on machines without a GPU.

Arrays: a kernel function takes host (numpy) arrays or device arrays (numba's, or anything with
``__cuda_array_interface__``, such as CuPy's). Given device arrays it returns a numba device array
(``cupy.asarray`` wraps one without a copy) and moves nothing to the host; given numpy arrays it
copies them over and returns numpy, which is what the simulator tests use.
"""

from __future__ import annotations

import functools

import numpy as np

try:
    from numba import cuda
except ImportError:  # a numba without its CUDA target (and no numba-cuda): numba_cuda() says so
    cuda = None

from loomlab.core.errors import LoomConfigError, LoomShapeError

INSTALL_HINT = "pip install 'loomlab[gpu]' (numba-cuda with the CUDA 12 toolkit libraries)"
# Shared arrays need a size NVVM knows when compiling (a closure's int is typed as a plain int64
# and refused), so reductions get a buffer for the most threads a block can have: 4 KiB.
MAX_THREADS = 1024


@functools.cache
def numba_cuda():
    """The ``numba.cuda`` module, checked once; :class:`LoomConfigError` saying why it is unusable."""
    if cuda is None:
        raise LoomConfigError(f"the CUDA kernels need numba's CUDA target, which is not installed: "
                              f"{INSTALL_HINT}")
    if not cuda.is_available():
        raise LoomConfigError("numba found no usable CUDA device or driver (set NUMBA_ENABLE_CUDASIM=1 "
                              "before numba is imported to run the kernels in its CUDA simulator)")
    return cuda


def on_device(a) -> bool:
    """Whether ``a`` is already in device memory: a numba device array (the simulator's too, which
    has no ``__cuda_array_interface__``) or any array exporting that interface (CuPy's)."""
    return hasattr(a, "copy_to_host") or hasattr(a, "__cuda_array_interface__")


def device_input(a, dtype, name: str):
    """``a`` as a C-contiguous device array of ``dtype``: host arrays are converted and copied
    over; a device array of another dtype is refused (converting it would hide a copy)."""
    numba_cuda()
    if not on_device(a):
        return cuda.to_device(np.ascontiguousarray(a, dtype=dtype))
    d = a if hasattr(a, "copy_to_host") else cuda.as_cuda_array(a)  # CuPy: a view, no copy
    if d.dtype != np.dtype(dtype) or not d.is_c_contiguous():
        raise LoomShapeError(f"{name} on the device must be C-contiguous {np.dtype(dtype)}; got "
                             f"{d.dtype}{'' if d.is_c_contiguous() else ' (strided)'}")
    return d


def result(d_out, host: bool):
    """A kernel's output: copied back to numpy when the caller gave host arrays."""
    return d_out.copy_to_host() if host else d_out


def block_reduce_builder(combine):
    """A device function ``block_reduce(buf, tid, threads)`` that folds ``buf[0:threads]`` (a
    shared array, ``threads`` the block's size, a power of two) into ``buf[0]`` with the device function
    ``combine`` by halving: every thread of the block must call it (it synchronises), each gets
    the result, and ``buf`` may be reused as soon as it returns."""

    @cuda.jit(device=True)
    def block_reduce(buf, tid, threads):
        cuda.syncthreads()
        step = threads // 2
        while step > 0:
            if tid < step:
                buf[tid] = combine(buf[tid], buf[tid + step])
            cuda.syncthreads()
            step //= 2
        total = buf[0]
        cuda.syncthreads()  # everyone has read it before a caller reuses ``buf``
        return total

    return block_reduce


def _add(a, b):
    return a + b


def block_sum_builder():
    """:func:`block_reduce_builder` adding: the block-wide sum both kernels need."""
    return block_reduce_builder(cuda.jit(device=True)(_add))


def check_threads(threads: int) -> int:
    """Threads per block for a tree reduction: a power of two from 32 (one warp) to 1024."""
    if threads < 32 or threads > MAX_THREADS or threads & (threads - 1):
        raise LoomConfigError(f"threads per block must be a power of two in 32..{MAX_THREADS}; got {threads}")
    return threads
