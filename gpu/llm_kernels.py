"""The language-model kernels on an NVIDIA GPU: the cupy backend's
:class:`~loomlab.core.llm.kernels.device_kernels.LLMKernels`.

* ``upload``: a GGUF block matrix stays in its blocks on the device (a
  :class:`~loomlab.gpu.quant_cuda.CudaQuantMatrix`: its bytes and float32 block scales, never the
  float32 matrix); a float matrix (F32 / F16 / BF16, or a float32 array) becomes a float32 device
  array (the array-API fallback's upload), multiplied by the namespace's matmul (cuBLAS on CuPy),
  faster than a per-row kernel.
* ``linear``: ``x @ W.T`` by :mod:`~loomlab.gpu.quant_cuda`'s product kernel or that matmul.
* ``attend``: :func:`loomlab.gpu.attention_cuda.attend`.

Results come back as arrays of the backend's namespace: CuPy wraps the kernels' numba device
arrays without a copy (``__cuda_array_interface__``). Run over numpy (the tests, under numba's CUDA
simulator), the kernels take and give host arrays.
"""

from __future__ import annotations

from loomlab.core.errors import LoomShapeError
from loomlab.core.llm.kernels.device_kernels import LLMKernels
from loomlab.core.llm.kernels.quant import QuantMatrix

from .attention_cuda import attend as attend_cuda
from .cuda_common import check_threads, numba_cuda
from .quant_cuda import THREADS, CudaQuantMatrix


class CudaLLMKernels(LLMKernels):
    """:class:`LLMKernels` for a backend whose arrays live on a CUDA device (CuPy's).

    Args:
        backend: the :class:`~loomlab.core.backend.Backend` whose namespace results belong to.
        threads: threads per block of every kernel, a power of two in 32..1024 (the simulator
            tests use 32: it runs each GPU thread as a Python thread).

    Raises:
        LoomConfigError: numba's CUDA target is missing or finds no device (and no simulator).
    """

    def __init__(self, backend, *, threads: int = THREADS):
        numba_cuda()  # say now, not at the first layer, that the kernels cannot run here
        super().__init__(backend)
        self.threads = check_threads(threads)

    def upload(self, m):
        """A layer matrix made device-resident: a quantized :class:`QuantMatrix` in its blocks, a
        float one (or a float32 array ``[out, in]``) as a float32 device array."""
        if isinstance(m, QuantMatrix) and m.raw_blocks is not None:
            return CudaQuantMatrix(m, threads=self.threads)
        if len(getattr(m, "shape", ())) != 2:
            raise LoomShapeError(f"upload takes a QuantMatrix or a 2-D float matrix [out, in]; got "
                                 f"{type(m).__name__} of shape {getattr(m, 'shape', None)}")
        return super().upload(m)

    def linear(self, x, m):
        """``x [T, in]`` float32 on the device times the uploaded ``m`` transposed: ``[T, out]``."""
        if isinstance(m, CudaQuantMatrix):
            return self.xp.asarray(m.matmul(self._dense(x)))
        return super().linear(x, m)

    def attend(self, q, keys, values, start: int, window: int | None, scale: float,
               softcap: float | None = None):
        """:func:`loomlab.core.llm.kernels.attention_kernel.attend`'s semantics on device arrays: ``q [T, H,
        hd]``, ``keys`` / ``values`` ``[Hkv, S, hd]`` -> ``[T, H * hd]`` float32."""
        out = attend_cuda(self._dense(q), self._dense(keys), self._dense(values), start, window, scale,
                          softcap, threads=self.threads)
        return self.xp.asarray(out)

    def _dense(self, a):
        """``a`` C-contiguous, as the kernels read it: a strided view (a KV cache's transposed
        buffer, a slice of its capacity) is copied once here, as the CPU kernels copy it."""
        flags = getattr(a, "flags", None)
        if flags is None or flags.c_contiguous:
            return a
        return self.xp.ascontiguousarray(a)

    def __repr__(self) -> str:
        return f"CudaLLMKernels({self.backend.name}, threads={self.threads})"
