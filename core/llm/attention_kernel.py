"""Causal GQA attention as one numba kernel whose result for a query does not depend on the others.

``attend`` computes, for the query at position ``p = start + t`` and head ``h`` (KV head
``h // (H / Hkv)``), ``softmax(scale * q . k_s) @ v_s`` over the keys it sees (``lo..p``, ``lo`` set
by the sliding window). Every (query, head) pair runs the same float operations in the same order
whatever T is: each score a sum over d in order (the keys are read head_dim-major, so LLVM
vectorizes across keys without fastmath and no lanes are ever summed), the max, the
exponentials (a polynomial, vectorized) and their sum in ``LANES`` float32 lanes summed in order
(as the matmul kernels in :mod:`.quant` do), then the weighted sum of the value rows. numpy's
version (``qg @ keys.T``, a masked softmax, ``@ values``) summed differently by shape: a
position's output changed in the last bits with the number of queries sharing the step, and
greedy output then differed with and without prefix caching or speculative decoding. One kernel
call also replaces ~10 small numpy calls per layer and token.

Keys and values are float32, or float16 stored as their ``uint16`` bits (numba cannot type
float16): :func:`_half_to_float` converts each element with integer operations as it is read.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, njit, prange, types
from numba.extending import intrinsic, overload

from ..errors import LoomShapeError
from .kernel_hints import wide_vectors
from .quantize import _bits, _from_bits

F32 = np.float32
LANES = 16  # float32 lanes of the exponentials' sum: one AVX-512 register
KV_DTYPES = (np.dtype(np.float32), np.dtype(np.uint16))  # float16 travels as its bits

# nogil: the GUI thread keeps running while a worker decodes; parallel over (query, head) pairs
_KERNEL = dict(parallel=True, cache=True, fastmath=False, nogil=True)


@njit(inline="always")
def _half_to_float(h):
    """float16 bits ``h`` as float32, bit for bit what numpy's ``astype`` gives (NaN payloads
    included). The magnitude's bits, shifted into float32's places, are a float32 2**112 times too
    small, exactly, for normals and subnormals alike (a float16 subnormal lands on a float32
    subnormal), so one multiply converts both; inf/NaN keep their payload by integer ops.
    No branches: the loops that read float16 stay vectorized."""
    h = np.int64(h)
    magnitude = _bits(_from_bits((h & 0x7FFF) << 13) * F32(2.0**112))
    special = 0x7F800000 | ((h & 0x3FF) << 13)
    return _from_bits((special if (h & 0x7C00) == 0x7C00 else magnitude) | ((h & 0x8000) << 16))


def _element(a, i):
    """``a[i]`` as float32 (a float16's bits converted); compiled by the overload below."""


@overload(_element)
def _element_typed(a, i):
    if a.dtype == types.uint16:
        return lambda a, i: _half_to_float(a[i])
    return lambda a, i: a[i]


@njit(inline="always")
def _u(i):
    """An unsigned index: numba skips its negative-index wraparound, which hides from LLVM that
    consecutive ``i`` read consecutive addresses (and keeps the loop scalar)."""
    return np.uint64(i)


@njit(inline="always")
def exp_poly(x):
    """e**x (cephes' expf: x = n ln2 + r, a degree-7 polynomial in r, times 2**n built from
    bits), within 2 ulp for x in [-87, 88]; numba's exp calls libm once per element, this one
    vectorizes. Below -87 it gives e**-87 (~1e-38: a weight that vanishes beside the max's 1),
    above 88 e**88 (~1.7e38; 2**n would overflow the exponent's bits)."""
    x = min(max(x, F32(-87.0)), F32(88.0))
    t = x * F32(1.44269504088896341) + F32(0.5)
    i = np.int32(t)  # floor(t) by conversion (exact here): numba's np.floor is a call, no vector op
    n = F32(i) - (F32(1.0) if F32(i) > t else F32(0.0))
    r = x - n * F32(0.693359375) + n * F32(2.12194440e-4)
    y = F32(1.9875691500e-4) * r + F32(1.3981999507e-3)
    y = y * r + F32(8.3334519073e-3)
    y = y * r + F32(4.1665795894e-2)
    y = y * r + F32(1.6666665459e-1)
    y = y * r + F32(5.0000001201e-1)
    y = y * (r * r) + r + F32(1)
    return y * _from_bits((np.int64(n) + 127) << 23)


@njit(inline="always")
def _attend_item(q, h, kv, keys_t, values, p, window, scale, out):
    """Query ``q[h]`` (head h, KV head kv) at position ``p`` over ``keys_t[Hkv, hd, S]`` (head_dim-
    major: a score is then a sum over d in order, and the scores of all visible keys are one
    vector loop per d, with no reduction across lanes) and ``values[Hkv, S, hd]``, into
    ``out[h * hd : (h + 1) * hd]``."""
    hd = q.shape[1]
    lo = max(0, p - window + 1) if window > 0 else 0
    n = p + 1 - lo
    w = np.zeros(n, F32)
    # four d a pass: each score still takes its terms one at a time in d order (the same
    # operations, so the same bits), but is loaded and stored once per four of them
    d4 = hd - hd % 4
    for d in range(0, d4, 4):
        q0, q1, q2, q3 = q[h, d], q[h, d + 1], q[h, d + 2], q[h, d + 3]
        k0, k1, k2, k3 = keys_t[kv, d], keys_t[kv, d + 1], keys_t[kv, d + 2], keys_t[kv, d + 3]
        for i in range(n):
            j = _u(lo + i)
            w[i] = (((w[i] + q0 * _element(k0, j)) + q1 * _element(k1, j)) + q2 * _element(k2, j)) \
                + q3 * _element(k3, j)
    for d in range(d4, hd):
        qd = q[h, d]
        row = keys_t[kv, d]
        for i in range(n):
            w[i] += qd * _element(row, _u(lo + i))
    top = F32(-np.inf)
    for i in range(n):
        w[i] *= scale
        top = max(top, w[i])
    lanes = np.zeros(LANES, F32)  # the exponentials' sum: lane j takes i = j, j + L, ...
    for c in range(0, n - n % LANES, LANES):
        for j in range(LANES):
            e = exp_poly(w[_u(c + j)] - top)
            w[_u(c + j)] = e
            lanes[j] += e
    for i in range(n - n % LANES, n):
        w[i] = exp_poly(w[i] - top)
        lanes[i % LANES] += w[i]
    total = F32(0)
    for j in range(LANES):
        total += lanes[j]
    acc = np.zeros(hd, F32)
    n4 = n - n % 4  # four positions a pass, each output still summing them in order (as above)
    for i in range(0, n4, 4):
        s = lo + i
        w0, w1, w2, w3 = w[i], w[i + 1], w[i + 2], w[i + 3]
        v0, v1, v2, v3 = values[kv, s], values[kv, s + 1], values[kv, s + 2], values[kv, s + 3]
        for d in range(hd):
            j = _u(d)
            acc[d] = (((acc[d] + w0 * _element(v0, j)) + w1 * _element(v1, j)) + w2 * _element(v2, j)) \
                + w3 * _element(v3, j)
    for i in range(n4, n):
        vr = values[kv, lo + i]
        for d in range(hd):
            acc[d] += w[i] * _element(vr, _u(d))
    for d in range(hd):
        out[h * hd + d] = acc[d] / total


@njit(**_KERNEL)
def _attend(q, keys_t, values, start, window, scale, out):
    T, H, hd = q.shape
    group = H // keys_t.shape[0]
    for item in prange(T * H):
        wide_vectors()
        t, h = item // H, item % H
        _attend_item(q[t], h, h // group, keys_t, values, start + t, window, scale, out[t])


@intrinsic
def _f32_pointer(typingctx, address):
    """An int64 address as a float32 pointer (a buffer the caller keeps alive)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], ir.PointerType(ir.FloatType()))
    return types.CPointer(types.float32)(types.int64), codegen


@njit(inline="always")
def uncounted(a):
    """A view of the float32 C-contiguous array ``a`` that carries no reference count (as
    :func:`cache_views`' do), for arrays the caller keeps alive. Slicing a counted array changes
    its count atomically; when the threads of a parallel region slice the same shared array (a
    row of the queries, a position's cos), its count's cache line bounces between the cores at
    every slice."""
    return carray(_f32_pointer(a.ctypes.data), a.shape)


@njit(inline="always")
def cache_views(address_k, address_v, Hkv, hd, cap):
    """A float32 host cache's buffers from their addresses (``KVCache.host_buffers``): the keys
    ``[Hkv, hd, cap]`` (head_dim-major) and the values ``[Hkv, cap, hd]``."""
    return (carray(_f32_pointer(address_k), (Hkv, hd, cap)),
            carray(_f32_pointer(address_v), (Hkv, cap, hd)))


@njit(**_KERNEL)
def _append_and_attend(q, k, v, buffers, starts, window, scale, out):
    """Each sequence b's new keys and values ``k/v[b]`` written into its cache buffers at
    ``starts[b]..`` (``buffers[b]``: addresses of keys ``[Hkv, hd, cap]`` and values
    ``[Hkv, cap, hd]``, and cap), then every (sequence, query, head) as :func:`_attend` does it."""
    B, T, H, hd = q.shape
    Hkv = k.shape[2]
    for b in prange(B):
        cap = buffers[b, 2]
        keys_t, values = cache_views(buffers[b, 0], buffers[b, 1], Hkv, hd, cap)
        for t in range(T):
            for kv in range(Hkv):
                for d in range(hd):
                    keys_t[kv, d, starts[b] + t] = k[b, t, kv, d]
                    values[kv, starts[b] + t, d] = v[b, t, kv, d]
    group = H // Hkv
    for item in prange(B * T * H):
        wide_vectors()
        b, t, h = item // (T * H), item // H % T, item % H
        cap = buffers[b, 2]
        keys_t, values = cache_views(buffers[b, 0], buffers[b, 1], Hkv, hd, cap)
        _attend_item(q[b, t], h, h // group, keys_t, values, starts[b] + t, window, scale, out[b, t])


def append_and_attend(q, k, v, caches, starts: tuple[int, ...], window: int | None,
                      scale: float) -> np.ndarray:
    """A decode step's attention for B sequences in one call: ``k``/``v`` ``[B, T, Hkv, hd]``
    appended to each sequence's float32 host cache (room reserved here), then :func:`attend`'s
    result for each, ``[B, T, H * hd]``, the same bits as B calls of it. ``q``, ``k``, ``v``
    float32 C-contiguous; ``starts[b]`` is cache b's offset before the append (it moves here)."""
    B, T = q.shape[:2]
    for c in caches:
        c.reserve(T)
    buffers = np.array([c.host_buffers() for c in caches], np.int64)  # after reserve: growth moves them
    out = np.empty((B, T, q.shape[2] * q.shape[3]), F32)
    _append_and_attend(q, k, v, buffers, np.array(starts, np.int64), 0 if window is None else window,
                       F32(scale), out)
    for c in caches:
        c.offset += T
    return out


def check_attend_args(q, keys, values, start: int, window: int | None) -> tuple[int, int, int]:
    """:func:`attend`'s argument checks, for any array with ``shape`` and ``dtype`` (the GPU
    kernel's device arrays too); returns q's ``(T, H, hd)``.

    Raises:
        LoomShapeError: shapes, dtypes, heads or positions do not fit together.
    """
    qs, ks, vs = (tuple(getattr(a, "shape", ())) for a in (q, keys, values))
    if len(qs) != 3 or len(ks) != 3 or ks != vs:
        raise LoomShapeError(f"attend needs q [T, H, hd] and keys/values [Hkv, S, hd] alike; got "
                             f"{qs}, {ks}, {vs}")
    (T, H, hd), (Hkv, S, khd) = qs, ks
    if khd != hd or Hkv == 0 or H % Hkv:
        raise LoomShapeError(f"attend: {H} query heads of {hd} need a divisor of them as KV heads "
                             f"of the same size; got {Hkv} of {khd}")
    if np.dtype(keys.dtype) not in KV_DTYPES or np.dtype(values.dtype) != np.dtype(keys.dtype):
        raise LoomShapeError(f"attend: keys/values must both be float32 or float16 bits (uint16); got "
                             f"{keys.dtype} and {values.dtype}")
    if start < 0 or start + T > S:
        raise LoomShapeError(f"attend: queries at {start}..{start + T - 1} need keys up to there; "
                             f"{S} positions given")
    if window is not None and window < 1:
        raise LoomShapeError(f"attend: a window must hold at least the query itself; got {window}")
    return T, H, hd


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int, window: int | None,
           scale: float) -> np.ndarray:
    """Causal attention of queries ``q[T, H, hd]`` at positions ``start..start+T-1``.

    Args:
        q: float32 queries, ``H`` a multiple of the KV heads.
        keys, values: ``[Hkv, S, hd]`` float32, or float16 as ``uint16`` bits; positions
            ``0..start+T-1`` are read (``S`` may be a cache's larger capacity).
        start: position of the first query.
        window: positions a query sees, itself included (sliding-window layers); None: all before it.
        scale: the score scale (``head_dim ** -0.5`` for most models).

    Returns:
        float32 ``[T, H * hd]``; row t has the same bits as ``attend(q[t:t+1], ..., start + t, ...)``.

    Raises:
        LoomShapeError: shapes, dtypes, heads or positions do not fit together.
    """
    q = np.ascontiguousarray(q, dtype=F32)
    check_attend_args(q, keys, values, start, window)
    # a KVCache's keys are a transposed view of a head_dim-major buffer: no copy here
    return attend_checked(q, np.ascontiguousarray(keys.transpose(0, 2, 1)), np.ascontiguousarray(values),
                          int(start), window, scale)


def attend_checked(q, keys_t, values, start: int, window: int | None, scale: float) -> np.ndarray:
    """:func:`attend` for a caller that has made its checks (a decode step's attention layer on
    its own caches, ~30 a token): ``q`` float32 C-contiguous, ``keys_t`` the keys as
    ``[Hkv, hd, S]`` and ``values`` ``[Hkv, S, hd]``, both C-contiguous (a KVCache's buffers)."""
    T, H, hd = q.shape
    out = np.empty((T, H * hd), F32)
    _attend(q, keys_t, values, start, 0 if window is None else window, F32(scale), out)
    return out
