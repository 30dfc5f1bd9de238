"""Causal GQA decode attention on an NVIDIA GPU: :func:`loomlab.core.llm.kernels.attention_kernel.attend`'s
semantics as one numba-CUDA kernel.

One thread block per (query, head): the query at position ``p = start + t`` and head ``h`` (KV head
``h // (H / Hkv)``) sees keys ``lo..p`` (``lo`` set by the sliding window). The block's threads
take the keys in strides: each score is a sum over d in order times ``scale`` (as on the CPU),
then soft-capped when ``softcap`` > 0 (``tanh(s / softcap) * softcap``);
the block's maximum, then its exponentials and their sum, are reduced in shared memory; then each
thread takes head-dimension elements and sums ``weight_i * v_i[d]`` over the keys in order. The
scores and weights live in a scratch array ``[T * H, keys]`` in device memory (a decode step has
one query per sequence, so it is small).

Keys and values are float32, or float16 stored as their ``uint16`` bits as the KV cache keeps them
(:func:`_half` converts each element exactly, with integer and power-of-two operations).

Results equal ``attend``'s to float32 rounding: the exponentials differ (the CPU's polynomial and
CUDA's ``expf`` are each within 2 ulp) and the exponentials' sum runs in another order.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from loomlab.core.llm.kernels.attention_kernel import check_attend_args

from .cuda_common import (
    MAX_THREADS,
    block_reduce_builder,
    block_sum_builder,
    check_threads,
    cuda,
    device_input,
    numba_cuda,
    on_device,
    result,
)

F32 = np.float32
THREADS = 128


def _half(bits):
    """float16 bits as float32, exactly: a normal is (1024 + mantissa) * 2**(exponent - 25), a
    subnormal mantissa * 2**-24, both products of powers of two and small integers."""
    h = np.int32(bits)
    exponent = (h >> 10) & 31
    mantissa = h & 1023
    if exponent == 31:
        v = F32(math.inf) if mantissa == 0 else F32(math.nan)
    elif exponent == 0:
        v = F32(mantissa) * F32(2.0**-24)
    else:
        v = F32(mantissa + 1024) * F32(2.0**-25) * F32(1 << exponent)
    return -v if h & 0x8000 else v


def _plain(v):
    return v


def _max(a, b):
    return a if a >= b else b  # no max(): numba's built-in CUDA target fails to type it (0.68)


@functools.cache
def _attend_kernel(half: bool):
    """The kernel reading float16 bits (``half``) or float32 keys and values."""
    numba_cuda()
    element = cuda.jit(device=True)(_half if half else _plain)
    block_sum = block_sum_builder()
    larger = cuda.jit(device=True)(_max)
    block_max = block_reduce_builder(larger)

    @cuda.jit
    def attend_kernel(q, keys, values, start, window, scale, softcap, w, out):
        t, h = cuda.blockIdx.x, cuda.blockIdx.y
        tid, threads = cuda.threadIdx.x, cuda.blockDim.x
        H, hd = q.shape[1], q.shape[2]
        kv = h // (H // keys.shape[0])
        p = start + t
        lo = p - window + 1 if window > 0 and p >= window else 0
        n = p + 1 - lo
        row = t * H + h
        buf = cuda.shared.array(MAX_THREADS, F32)
        top = F32(-math.inf)
        for i in range(tid, n, threads):
            score = F32(0)
            for d in range(hd):
                score += q[t, h, d] * element(keys[kv, lo + i, d])
            score *= scale
            if softcap > 0:
                score = F32(math.tanh(score / softcap)) * softcap
            w[row, i] = score
            top = larger(top, score)
        buf[tid] = top
        top = block_max(buf, tid, threads)
        total = F32(0)
        for i in range(tid, n, threads):
            e = F32(math.exp(w[row, i] - top))
            w[row, i] = e
            total += e
        buf[tid] = total
        total = block_sum(buf, tid, threads)  # it synchronises: every weight is written
        for d in range(tid, hd, threads):
            acc = F32(0)
            for i in range(n):
                acc += w[row, i] * element(values[kv, lo + i, d])
            out[t, h * hd + d] = acc / total

    return attend_kernel


def attend(q, keys, values, start: int, window: int | None, scale: float, softcap: float | None = None, *,
           threads: int = THREADS):
    """Causal attention of queries ``q[T, H, hd]`` at positions ``start..start+T-1``, on the device.

    Arguments as :func:`loomlab.core.llm.kernels.attention_kernel.attend` (``keys`` / ``values``
    ``[Hkv, S, hd]``, float32 or float16 as ``uint16`` bits); host arrays or device arrays. Returns
    float32 ``[T, H * hd]``: numpy when ``q`` is a host array, a device array when it is one.
    ``threads``: per block, a power of two in 32..1024.

    Raises:
        LoomShapeError: shapes, dtypes, heads or positions do not fit together.
        LoomConfigError: no CUDA device (and no simulator), or a bad ``threads``.
    """
    T, H, hd = check_attend_args(q, keys, values, start, window, softcap)
    check_threads(threads)
    kernel = _attend_kernel(np.dtype(keys.dtype) == np.uint16)
    d_q = device_input(q, F32, "q")
    d_k, d_v = device_input(keys, keys.dtype, "keys"), device_input(values, keys.dtype, "values")
    d_out = cuda.device_array((T, H * hd), F32)
    if T:
        keys_seen = start + T if window is None else min(start + T, window)
        w = cuda.device_array((T * H, keys_seen), F32)
        kernel[(T, H), threads](d_q, d_k, d_v, int(start), 0 if window is None else int(window), F32(scale),
                                F32(0 if softcap is None else softcap), w, d_out)
    return result(d_out, host=not on_device(q))
