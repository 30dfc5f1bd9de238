"""GGUF block matrices multiplied on an NVIDIA GPU: numba-CUDA kernels for every format
:class:`loomlab.core.llm.kernels.quant.QuantMatrix` holds (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q6_K, and
F32 / F16 / BF16 as float32).

:class:`CudaQuantMatrix` copies a matrix's blocks and its float32 side arrays (block scales and
offsets, made by the same format object the CPU matrix uses) to the device once; its ``matvec``
and ``matmul`` then launch one thread block per output row (and group of ``ROWS_PER_BLOCK`` rows
of X): each thread dequantizes a strided share of the row's weights with the float32 expressions
of ``quant._decode`` (one weight at a time, not a chunk), multiplies them with X in float32, and
the block adds its threads' partial sums by halving in shared memory. Adjacent threads read
adjacent weights and X elements, so the loads coalesce.

Results equal ``QuantMatrix.matvec`` / ``matmul`` to float32 rounding, not bit for bit: the same
weights and products, summed in another order (and NVVM may contract a multiply-add into an FMA).
The simulator tests bound the difference by the float32 summation error bound.
"""

from __future__ import annotations

import functools

import numpy as np

from loomlab.core.errors import LoomShapeError
from loomlab.core.llm.kernels.quant import FIVE, FORMATS, INT8, NIB4, Q6K, QuantMatrix

from .cuda_common import (
    MAX_THREADS,
    block_sum_builder,
    check_threads,
    cuda,
    device_input,
    numba_cuda,
    on_device,
    result,
)

F32 = np.float32
PLAIN = 4  # F32 / F16 / BF16: the float32 matrix is the "scale" array, one weight per element
THREADS = 128  # per block (one output row): 4 warps, each row's weights in strides of 128
ROWS_PER_BLOCK = 4  # rows of X one block multiplies (matmul): each weight is decoded once for them
DEVICE_KINDS = (NIB4, FIVE, INT8, Q6K)  # the block layouts _weight decodes


def _weight(kind, q, s, m, has_m, r, i, bbytes, qoff, gshift, group, shift, zero):
    """Weight ``i`` of row ``r``, in float32, by ``quant._decode``'s expression for ``kind`` (the
    CPU chunk decoder, unrolled to one element). ``s`` / ``m`` are the format's float32 scales and
    offsets (``has_m`` False: no offsets, and ``w + m`` is skipped, as the CPU adds -0.0)."""
    if kind == PLAIN:
        return s[r, i]
    if kind == NIB4:  # chunk k: ``group`` bytes, their low nibbles then their high nibbles
        k = i // (2 * group)
        e = i - k * 2 * group
        high = 1 if e >= group else 0
        base = (k >> gshift) * bbytes + qoff + (k & ((1 << gshift) - 1)) * group
        v = np.int32(q[r, base + e - high * group])
        nibble = (v >> 4) if high else (v & 15)
        at = (2 * k + high) >> shift
        w = s[r, at] * (F32(nibble) - zero)
        return w + m[r, at] if has_m else w
    if kind == FIVE:  # a 32-weight block: 4 bytes of fifth bits (bit e for weight e), 16 nibble bytes
        k = i >> 5
        e = i & 31
        base = k * bbytes + qoff
        v = np.int32(q[r, base + 4 + (e & 15)])
        nibble = (v >> 4) if e >= 16 else (v & 15)
        fifth = (np.int32(q[r, base + (e >> 3)]) >> (e & 7)) & 1
        w = s[r, k] * F32((nibble | (fifth << 4)) - (0 if has_m else 16))
        return w + m[r, k] if has_m else w
    if kind == INT8:
        k = i >> 5
        v = np.int32(q[r, k * bbytes + qoff + (i & 31)])
        return F32(v - 256 if v > 127 else v) * s[r, k]
    # Q6_K: half a 210-byte super-block is 128 weights in four runs p of 32 (``quant._q6_place``)
    k = i >> 7
    p = (i >> 5) & 3
    j = i & 31
    start = (k >> 1) * 210 + (k & 1) * 64
    low = np.int32(q[r, start + 32 * (p & 1) + j])
    high = np.int32(q[r, (k >> 1) * 210 + 128 + (k & 1) * 32 + j])
    value = F32(((low >> (4 if p >= 2 else 0)) & 15) | (((high >> (2 * p)) & 3) << 4)) - F32(32)
    return s[r, (k >> 1) * 16 + (k & 1) * 8 + 2 * p + (j >> 4)] * value


@functools.cache
def _products_kernel():
    """The product kernel: block (r, g) multiplies weight row r with rows ``g * rows_per_block``
    onwards of X (at most ``ROWS_PER_BLOCK``, the size of its accumulator array)."""
    numba_cuda()
    weight = cuda.jit(device=True)(_weight)
    block_sum = block_sum_builder()

    @cuda.jit
    def products(kind, q, s, m, has_m, bbytes, qoff, gshift, group, shift, zero, X, rows_per_block, out):
        r = cuda.blockIdx.x
        t0 = cuda.blockIdx.y * rows_per_block
        tid, threads = cuda.threadIdx.x, cuda.blockDim.x
        n_t = rows_per_block if t0 + rows_per_block <= X.shape[0] else X.shape[0] - t0
        acc = cuda.local.array(ROWS_PER_BLOCK, F32)
        for b in range(n_t):
            acc[b] = F32(0)
        for i in range(tid, X.shape[1], threads):
            w = weight(kind, q, s, m, has_m, r, i, bbytes, qoff, gshift, group, shift, zero)
            for b in range(n_t):
                acc[b] += w * X[t0 + b, i]
        buf = cuda.shared.array(MAX_THREADS, F32)
        for b in range(n_t):  # n_t is the same for the whole block: every thread reaches each sync
            buf[tid] = acc[b]
            total = block_sum(buf, tid, threads)
            if tid == 0:
                out[t0 + b, r] = total

    return products


class CudaQuantMatrix:
    """A :class:`QuantMatrix` on the device: its blocks and float32 side arrays copied once.

    Args:
        matrix: the CPU matrix (any format it holds).
        threads: threads per block, a power of two in 32..1024 (the simulator tests use 32).

    Raises:
        LoomConfigError: numba's CUDA target is missing or finds no device (and no simulator).
        LoomShapeError: ``matrix`` is not a QuantMatrix.
    """

    def __init__(self, matrix: QuantMatrix, *, threads: int = THREADS):
        if not isinstance(matrix, QuantMatrix):
            raise LoomShapeError(f"CudaQuantMatrix needs a QuantMatrix; got {type(matrix).__name__}")
        numba_cuda()
        self.shape, self.type_name, self.threads = matrix.shape, matrix.type_name, check_threads(threads)
        fmt = FORMATS[matrix.ggml_type]
        if matrix.raw_blocks is None or getattr(fmt, "kind", None) not in DEVICE_KINDS:
            # a plain type (QuantMatrix keeps it as a float32 matrix), or blocks this kernel does
            # not decode yet (Q2_K, Q3_K, Q5_K, IQ4_XS; the types decoded at load): float32 values
            scale, offset = matrix.dequantize(), None
            self._layout = (PLAIN, 0, 0, 0, 1, 0, F32(0))
            q = np.zeros((1, 1), np.uint8)
        else:
            q = matrix.raw_blocks
            scale, offset = fmt.side(q.reshape(q.shape[0], -1, fmt.block_bytes))
            self._layout = (fmt.kind, *fmt.layout())
        self._q = cuda.to_device(q)
        self._s = cuda.to_device(np.ascontiguousarray(scale, dtype=F32))
        self._has_m = offset is not None  # else a placeholder: every launch has the same argument types
        self._m = cuda.to_device(np.ascontiguousarray(offset, F32) if self._has_m else np.zeros((1, 1), F32))

    def matvec(self, x):
        """``W @ x`` for ``x[in_features]`` -> float32 ``[out_features]`` (numpy in, numpy out;
        a device array in, a device array out)."""
        return self._run(x, 1)

    def matmul(self, X):
        """``X @ W.T`` for ``X[T, in_features]`` -> float32 ``[T, out_features]`` (numpy in,
        numpy out; a device array in, a device array out)."""
        return self._run(X, 2)

    def _run(self, X, ndim: int):
        shape = getattr(X, "shape", None)  # indexed from the front: the simulator's refuse [-1]
        if shape is None or len(shape) != ndim or shape[ndim - 1] != self.shape[1]:
            want = "(in_features,)" if ndim == 1 else "(T, in_features)"
            raise LoomShapeError(f"{self.type_name} matrix {self.shape} needs input {want} with "
                                 f"in_features={self.shape[1]}; got {shape or type(X).__name__}")
        d_x = device_input(X, F32, "the input")
        if ndim == 1:
            d_x = d_x.reshape(1, -1)
        T = d_x.shape[0]
        d_out = cuda.device_array((T, self.shape[0]), F32)
        if T:
            rows_per_block = 1 if ndim == 1 else ROWS_PER_BLOCK  # matvec: no idle accumulators
            grid = (self.shape[0], (T + rows_per_block - 1) // rows_per_block)
            _products_kernel()[grid, self.threads](self._layout[0], self._q, self._s, self._m, self._has_m,
                                                   *self._layout[1:], d_x, rows_per_block, d_out)
        return result(d_out.reshape(-1) if ndim == 1 else d_out, host=not on_device(X))

    def __repr__(self) -> str:
        return f"CudaQuantMatrix({self.type_name}, shape={self.shape})"


def quant_product(matrix: QuantMatrix | CudaQuantMatrix, x):
    """``W @ x`` (``x`` 1-D) or ``X @ W.T`` (``x`` 2-D) on the device. A :class:`QuantMatrix` is
    copied over for this call; keep a :class:`CudaQuantMatrix` to multiply by the same weights
    again without copying them."""
    device = matrix if isinstance(matrix, CudaQuantMatrix) else CudaQuantMatrix(matrix)
    return device.matvec(x) if getattr(x, "ndim", None) == 1 else device.matmul(x)
