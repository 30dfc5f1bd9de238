"""Weight matrices kept in GGUF's quantized blocks, multiplied in place by numba kernels.

A :class:`QuantMatrix` holds the file's block bytes as they are (a zero-copy ``uint8`` view of the
memory map, one row of blocks per output feature) and multiplies them without ever building the
float32 matrix. Block scales are float16 in the file and numba cannot type float16, so each
matrix converts its scales to float32 side arrays once, at construction; nibbles and bytes stay
in the file's layout (see gguf-py's ``gguf/quants.py``, which the tests use as the oracle).

Row invariance: for ``T < MATMUL_MIN_T`` (= 65) rows of X, and for plain types (F32 / F16 /
BF16, :func:`float_matmul`) at every T, row t of ``matmul(X)`` has the same bits as
``matvec(X[t])`` whatever the other rows are, so a sequence decodes the same alone or in any
slot of a batch (and a prompt of up to 64 tokens prefills the same as token by token). Every
kernel computes each weight with one expression (``_decode``'s) and adds it to the same float32
lanes in the same order; numba runs with ``fastmath=False`` (no FMA contraction, no
reassociation), so equal operations give equal bits. Three kernels share that arithmetic:
  * T = 1 (``FUSED_MAX_T``): fused decode kernels, each weight computed in registers.
  * 2 <= T < 65: ``_block_matmul``: each pair of weight rows dequantized once into a small
    buffer, then dotted with every row of X (reads the weights once for all rows).
  * T >= 65: row tiles dequantized on one thread, BLAS ``X @ tile.T``. Not row-invariant (BLAS
    blocks by shape), but 1.5-3x faster than the batch kernel from T = 64 on
    (``python tests/bench/bench_quant_batch.py``): BLAS uses FMA and AVX-512, which the invariant
    kernels give up (an FMA rounds differently).

Kernel shape: numba leaves the SLP vectorizer off, so a float reduction never vectorizes. Each
(output row, row of X) therefore keeps one float32 accumulator per position inside a chunk
("lanes", summed once at the end); the per-chunk inner loops have a run-time trip count so
LLVM's loop vectorizer turns them into straight SIMD code, and two weight rows share each pass
(same x loads, two independent dependency chains).

Threads: the kernels run on numba's OpenMP pool. Inside :func:`adaptive_threads` (held by a
generating model) they use as many threads as the CPUs other processes leave free
(:mod:`.cpu_threads`), re-chosen while they run; elsewhere, numba's count as the caller set it.
Each kernel ends at a barrier, so a thread that another process deschedules stalls it for a whole
time slice. The tiled path dequantizes on the calling thread only and multiplies with BLAS, which
the model limits to one thread (:func:`single_threaded_blas`): OpenBLAS's workers keep spinning
after each call, and alternating its pool with numba's call after call starves numba's threads.

The measurements behind these choices are in docs/kernels.md.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, ClassVar

import numba
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GT
from gguf import quants as gguf_quants  # decoders of the types without a kernel
from numba import njit, prange

from ...errors import LoomShapeError, ModelFormatError
from . import mapped_pages
from .cpu_threads import ThreadChooser
from .kernel_hints import prefetch_row, wide_vectors

F32 = np.float32
ROW_CHUNK = 16  # rows per parallel work item (even: a row pair never straddles two items)
TILE_BYTES = 1 << 20  # prefill dequantizes this much of the matrix at a time (stays in L2)
FUSED_MAX_T = 1  # up to this many rows of X, the fused kernel per row (from 2, the batch kernel is faster)
MATMUL_MIN_T = 65  # from this many rows on, dequantize + BLAS: faster, but not row-invariant

# nogil: a GUI thread (or any other) keeps running while a worker thread multiplies
KERNEL_OPTIONS = dict(parallel=True, cache=True, fastmath=False, nogil=True)


# ---------------------------------------------------------------------------------------------
# Kernel helpers. Numba widens integer arithmetic to int64; reading a byte as int64 keeps every
# operation signed (uint64 mixed with int64 would become float64), and the int32 cast before
# the float conversion lets LLVM narrow the vector code to 32-bit lanes. Lane counts (G, H) are
# arguments, not constants: LLVM fully unrolls a constant 16-trip loop, and with SLP off the
# unrolled code stays scalar. Likewise inner loops start at 0 (``range(a, a + H)`` stayed scalar).


@njit(inline="always")
def _u(i):
    """An unsigned index: numba then skips its negative-index wraparound, which would otherwise
    hide from LLVM that ``a[base + j]`` walks consecutive addresses (and block vectorization)."""
    return np.uint64(i)


@njit(inline="always")
def _byte(q, r, i):
    return np.int64(q[r, _u(i)])


@njit(inline="always")
def _f(v):
    return F32(np.int32(v))


@njit(inline="always")
def _lane_sum(lanes):
    acc = F32(0)
    for j in range(lanes.shape[0]):
        acc += lanes[j]
    return acc


# ---------------------------------------------------------------------------------------------
# One kernel pair serves every block format: ``kind`` picks the format's chunk decoder, a branch
# taken the same way for a whole call (the CPU predicts it; LLVM keeps each branch's loop
# vectorized). A chunk is ``P * L`` consecutive weights of a row. Every product kernel adds a
# chunk to ``L`` float32 lanes per (weight row, row of X), lane j getting the P products at j,
# j + L, ... summed left to right, chunks in order; the fused kernels compute the weights in
# registers, the batch kernel decodes them into a small buffer first. The chunk of each format is
# the run its scales cover, so the decode is a few vector loops per chunk:
#   NIB4 (Q4_0, Q4_1, Q4_K): a group of G bytes, low nibbles then high nibbles: L = G, P = 2
#   FIVE (Q5_0, Q5_1): a 32-weight block: L = 16, P = 2
#   INT8 (Q8_0): a 32-weight block: L = 32, P = 1
#   Q6K: half a super-block (128 weights): L = 32, P = 4
#   Q5K (Q5_K): NIB4's groups of 32 bytes plus each weight's fifth bit: L = 32, P = 2
#   Q3K, Q2K (Q3_K, Q2_K): half a super-block (128 weights) of 2-bit runs: L = 32, P = 4
#   IQ4X (IQ4_XS, IQ4_NL): 32 weights of nibbles, each an index into IQ4_VALUES: L = 16, P = 2
#   MXF4 (MXFP4): the same with MXFP4_VALUES
# ``lay`` = (block bytes, first quant byte, log2 groups per block, G, nibble shift, zero) is one
# tuple type for every format, so all formats share a compiled kernel (two, with and without
# offsets ``m``: None compiles the add of -0.0 away, which LLVM drops from ``w + m``).

NIB4, FIVE, INT8, Q6K, Q5K, Q3K, Q2K, IQ4X, MXF4 = 0, 1, 2, 3, 4, 5, 6, 7, 8
IQ4_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                      np.int8)  # IQ4_NL's and IQ4_XS's values of a nibble (kvalues_iq4nl)
MXFP4_VALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12],
                        np.int8)  # E2M1's values, doubled (kvalues_mxfp4; the scale is halved)


@njit(inline="always")
def _geometry(kind, G):
    """Lanes and products per lane of one chunk of ``kind``."""
    if kind == INT8:
        return G, 1
    if kind == Q6K or kind == Q3K or kind == Q2K:
        return 2 * G, 4
    return G, 2


@njit(inline="always")
def _offset(m, r, i):
    """Row r's offset i; -0.0 when the format has none (``m`` None), so ``w + m`` is exactly w."""
    if m is None:
        return F32(-0.0)
    return m[r, i]


@njit(inline="always")
def _q5_high_bits(q, r, at):
    return (_byte(q, r, at) | (_byte(q, r, at + 1) << 8) | (_byte(q, r, at + 2) << 16)
            | (_byte(q, r, at + 3) << 24))


@njit(inline="always")
def _q5_zero(m):
    """16 for Q5_0 (no offsets), 0 for Q5_1: a constant in each compiled kernel (a run-time
    zero measured 8% slower)."""
    if m is None:
        return 16
    return 0


@njit(inline="always")
def _q5(nibble, high, bit, zero):
    return _f((nibble | (((high >> bit) & 1) << 4)) - zero)


@njit(inline="always")
def _q5_k(nibble, plane, bit):
    """A Q5_K quant: the nibble and bit ``bit`` of its byte of the fifth-bit plane. In int32:
    with numba's int64 and a run-time shift, LLVM kept 4-lane vectors (4.5x slower)."""
    return F32(np.int32(nibble) | ((np.int32(plane) >> np.int32(bit)) & np.int32(1)) << np.int32(4))


@njit(inline="always")
def _q5_k_place(k, lay):
    """Q5_K group k (64 weights of a super-block's quarter g): its first nibble byte, its first
    plane byte, and g (the plane bit of its low nibbles; its high nibbles take bit 2g + 1)."""
    bbytes, qoff, gshift, G = lay[0], lay[1], lay[2], lay[3]
    blk, g = k >> gshift, k & ((1 << gshift) - 1)
    return blk * bbytes + qoff + g * G, blk * bbytes + 16, 2 * g


@njit(inline="always")
def _q6(lo_byte, hi_byte, nib_shift, hi_shift):
    return _f(((lo_byte >> nib_shift) & 15) | (((hi_byte >> hi_shift) & 3) << 4)) - F32(32)


@njit(inline="always")
def _q6_place(t):
    """Q6K step t (a quarter super-block: a half's low or high 16 lanes): byte offsets of the
    low and high runs, first weight and first sub-scale."""
    blk, half = t >> 2, (t >> 1) & 1
    return blk * 210 + 64 * half, blk * 210 + 128 + 32 * half, blk * 256 + 128 * half, blk * 16 + 8 * half


@njit(inline="always")
def _low_bit_half(kind, q, r, k, lay, s, m, dst, o):
    """Q3_K / Q2_K half k of a super-block: weight 32p + l of the half (p = 0-3, l = 0-31) is bits
    2p, 2p + 1 of its run's byte l, with a scale (``s``: d * sub-scale) and Q2_K's offset (``m``:
    -dmin * min) per 16 weights; Q3_K subtracts 4 unless bit 4h + p of mask byte l is set."""
    bbytes, qoff = lay[0], lay[1]
    blk, half = k >> 1, k & 1
    run, sub = blk * bbytes + qoff + 32 * half, blk * 16 + 8 * half
    for kk in range(2):
        a, b, c, e = s[r, sub + kk], s[r, sub + 2 + kk], s[r, sub + 4 + kk], s[r, sub + 6 + kk]
        ma, mb = _offset(m, r, sub + kk), _offset(m, r, sub + 2 + kk)
        mc, me = _offset(m, r, sub + 4 + kk), _offset(m, r, sub + 6 + kk)
        for n in range(16):
            j = kk * 16 + n
            v = np.int32(_byte(q, r, run + j))
            if kind == Q3K:
                h = np.int32(_byte(q, r, blk * bbytes + j)) >> np.int32(4 * half)
                v0, v1 = (v & 3) | ((h & 1) << 2), ((v >> 2) & 3) | ((h & 2) << 1)
                v2, v3 = ((v >> 4) & 3) | (h & 4), ((v >> 6) & 3) | ((h & 8) >> 1)
                dst[_u(o + j)] = a * F32(v0 - 4) + ma
                dst[_u(o + 32 + j)] = b * F32(v1 - 4) + mb
                dst[_u(o + 64 + j)] = c * F32(v2 - 4) + mc
                dst[_u(o + 96 + j)] = e * F32(v3 - 4) + me
            else:
                dst[_u(o + j)] = a * F32(v & 3) + ma
                dst[_u(o + 32 + j)] = b * F32((v >> 2) & 3) + mb
                dst[_u(o + 64 + j)] = c * F32((v >> 4) & 3) + mc
                dst[_u(o + 96 + j)] = e * F32(v >> 6) + me


@njit(inline="always")
def _decode(kind, q, r, k, lay, s, m, dst, o):
    """Chunk k of row r, dequantized into ``dst[o : o + P * L]`` with gguf-py's float32 ops.

    NIB4: weight = s * (nibble - zero) + m, one s and m per half-group (nibble shift 0) or per
    group (shift 1). FIVE: blocks of f16 d (Q5_1: and m), 4 bytes of fifth bits (bit j for
    weight j) at ``qoff``, 16 nibble bytes. INT8: f16 d then 32 int8. Q6K: 210-byte super-blocks
    of 128 low-nibble bytes, 64 bytes of 2-bit high parts, 16 int8 sub-scales, f16 d (``s`` holds
    d * sub-scale); a half reads byte l of its low and high runs for weights l, l+32, l+64, l+96.
    """
    bbytes, qoff, gshift, G, shift, zero = lay
    if kind == NIB4:
        base = (k >> gshift) * bbytes + qoff + (k & ((1 << gshift) - 1)) * G
        lo, hi = (2 * k) >> shift, (2 * k + 1) >> shift
        sl, sh, ml, mh = s[r, lo], s[r, hi], _offset(m, r, lo), _offset(m, r, hi)
        for j in range(G):
            v = _byte(q, r, base + j)
            dst[_u(o + j)] = sl * (_f(v & 15) - zero) + ml
            dst[_u(o + G + j)] = sh * (_f(v >> 4) - zero) + mh
    elif kind == Q5K:
        base, plane, bit = _q5_k_place(k, lay)
        sl, sh, ml, mh = s[r, 2 * k], s[r, 2 * k + 1], _offset(m, r, 2 * k), _offset(m, r, 2 * k + 1)
        for j in range(G):
            v, h = _byte(q, r, base + j), _byte(q, r, plane + j)
            dst[_u(o + j)] = sl * _q5_k(v & 15, h, bit) + ml
            dst[_u(o + G + j)] = sh * _q5_k(v >> 4, h, bit + 1) + mh
    elif kind == FIVE:
        base = k * bbytes + qoff
        h, d, mb, z = _q5_high_bits(q, r, base), s[r, k], _offset(m, r, k), _q5_zero(m)
        for j in range(G):
            v = _byte(q, r, base + 4 + j)
            dst[_u(o + j)] = d * _q5(v & 15, h, j, z) + mb
            dst[_u(o + G + j)] = d * _q5(v >> 4, h, j + G, z) + mb
    elif kind == Q3K or kind == Q2K:
        _low_bit_half(kind, q, r, k, lay, s, m, dst, o)
    elif kind == IQ4X or kind == MXF4:
        base, d = (k >> gshift) * bbytes + qoff + (k & ((1 << gshift) - 1)) * G, s[r, k]
        table = IQ4_VALUES if kind == IQ4X else MXFP4_VALUES
        for j in range(G):
            v = _byte(q, r, base + j)
            dst[_u(o + j)] = d * F32(table[_u(v & 15)])
            dst[_u(o + G + j)] = d * F32(table[_u(v >> 4)])
    elif kind == INT8:
        base, d = k * bbytes + qoff, s[r, k]
        for j in range(G):
            dst[_u(o + j)] = _f(((_byte(q, r, base + j) + 128) & 255) - 128) * d
    else:
        ql, qh, _, sc = _q6_place(2 * k)
        for kk in range(2):  # a sub-scale covers 16 weights of each run
            a, b, c, e = s[r, sc + kk], s[r, sc + 2 + kk], s[r, sc + 4 + kk], s[r, sc + 6 + kk]
            for n in range(G):
                j = kk * G + n
                u, v, h = _byte(q, r, ql + j), _byte(q, r, ql + 32 + j), _byte(q, r, qh + j)
                dst[_u(o + j)] = a * _q6(u, h, 0, 0)
                dst[_u(o + 32 + j)] = b * _q6(v, h, 0, 2)
                dst[_u(o + 64 + j)] = c * _q6(u, h, 4, 4)
                dst[_u(o + 96 + j)] = e * _q6(v, h, 4, 6)


@njit(inline="always")
def _pair_dots(w, ra, rb, wo, x, n, L, P, lanes):
    """Rows ra and rb of the float32 weights ``w`` (from column wo on) times ``x``, over n chunks
    of P * L, into ``lanes[0]`` and ``lanes[1]``: ``lanes[0, j] += sum_p w[ra, wo + c + p*L + j]
    * x[c + p*L + j]`` (p ascending) for chunk offsets c in order: the fused kernels' operations.

    Each operand is one array (two rows of one buffer, two lane rows of one array): with five
    separate ones, LLVM gave up on the alias checks and left the loops scalar (3x slower). The P
    branch stays outside the loops for the same reason, and every index is wrapped in ``_u``
    whole (``_u(i) + L`` mixes unsigned and signed and turned the loads into gathers)."""
    if P == 1:
        for k in range(n):
            o = k * L
            for j in range(L):
                xj = x[_u(o + j)]
                lanes[0, _u(j)] += w[ra, _u(wo + o + j)] * xj
                lanes[1, _u(j)] += w[rb, _u(wo + o + j)] * xj
    elif P == 2:
        for k in range(n):
            o = k * 2 * L
            for j in range(L):
                x0, x1 = x[_u(o + j)], x[_u(o + L + j)]
                lanes[0, _u(j)] += w[ra, _u(wo + o + j)] * x0 + w[ra, _u(wo + o + L + j)] * x1
                lanes[1, _u(j)] += w[rb, _u(wo + o + j)] * x0 + w[rb, _u(wo + o + L + j)] * x1
    else:
        for k in range(n):
            o = k * 4 * L
            for j in range(L):
                x0, x1, x2, x3 = x[_u(o + j)], x[_u(o + L + j)], x[_u(o + 2 * L + j)], x[_u(o + 3 * L + j)]
                lanes[0, _u(j)] += (w[ra, _u(wo + o + j)] * x0 + w[ra, _u(wo + o + L + j)] * x1
                                    + w[ra, _u(wo + o + 2 * L + j)] * x2 + w[ra, _u(wo + o + 3 * L + j)] * x3)
                lanes[1, _u(j)] += (w[rb, _u(wo + o + j)] * x0 + w[rb, _u(wo + o + L + j)] * x1
                                    + w[rb, _u(wo + o + 2 * L + j)] * x2 + w[rb, _u(wo + o + 3 * L + j)] * x3)


@njit(inline="always")
def _pair_sums(lanes, out, t, r0, r1):
    out[t, r0] = _lane_sum(lanes[0])
    out[t, r1] = _lane_sum(lanes[1])


@njit(**KERNEL_OPTIONS)
def _block_matmul(kind, q, lay, s, m, X, out):
    """``out[t, r] = W[r] . X[t]`` for the block matrix ``q``: each pair of weight rows is
    dequantized once into a small buffer, then dotted with every row of X. Each (r, t) result
    is the same float operations in the same order for any T and any other rows, and the same
    as the fused kernels'."""
    rows, cols = q.shape[0], X.shape[1]
    L, P = _geometry(kind, lay[3])
    n = cols // (L * P)
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        wide_vectors()
        w = np.empty((2, cols), F32)
        lanes = np.empty((2, L), F32)
        for r0 in range(c * ROW_CHUNK, min(rows, c * ROW_CHUNK + ROW_CHUNK), 2):
            r1 = min(r0 + 1, rows - 1)
            prefetch_row(q, r0)
            prefetch_row(q, r1)
            for k in range(n):
                _decode(kind, q, r0, k, lay, s, m, w[0], k * L * P)
                _decode(kind, q, r1, k, lay, s, m, w[1], k * L * P)
            for t in range(X.shape[0]):
                lanes[:] = 0
                _pair_dots(w, 0, 1, 0, X[t], n, L, P, lanes)
                _pair_sums(lanes, out, t, r0, r1)


@njit(**KERNEL_OPTIONS)
def _block_rows(kind, q, lay, s, m, ids, out):
    L, P = _geometry(kind, lay[3])
    for i in prange(ids.shape[0]):
        wide_vectors()
        for k in range(out.shape[1] // (L * P)):
            _decode(kind, q, ids[i], k, lay, s, m, out[i], k * L * P)


# ---------------------------------------------------------------------------------------------
# Decode (one row of X): fused kernels that compute each weight in registers with ``_decode``'s
# exact expression and add it to the same lanes in the same order as ``_block_matmul``, so a row
# gets the same bits from either; they skip the buffer store and reload, which make the two-phase
# kernel slower for one row. Two rows share each pass (same x loads, two independent dependency
# chains); the per-block inner loop has a run-time trip count so LLVM's loop vectorizer turns it
# into straight SIMD code.


@njit(**KERNEL_OPTIONS)
def _nib4_matvec(q, lay, s, m, x, out):
    bbytes, qoff, gshift, G, shift, zero = lay
    rows = q.shape[0]
    n_groups = (q.shape[1] // bbytes) << gshift
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        wide_vectors()
        la = np.empty(G, F32)
        lb = np.empty(G, F32)
        for r0 in range(c * ROW_CHUNK, min(rows, c * ROW_CHUNK + ROW_CHUNK), 2):
            r1 = min(r0 + 1, rows - 1)
            prefetch_row(q, r0)
            prefetch_row(q, r1)
            la[:] = 0
            lb[:] = 0
            for gi in range(n_groups):
                base = (gi >> gshift) * bbytes + qoff + (gi & ((1 << gshift) - 1)) * G
                lo, hi = (2 * gi) >> shift, (2 * gi + 1) >> shift
                sl0, sh0, sl1, sh1 = s[r0, lo], s[r0, hi], s[r1, lo], s[r1, hi]
                ml0, mh0 = _offset(m, r0, lo), _offset(m, r0, hi)
                ml1, mh1 = _offset(m, r1, lo), _offset(m, r1, hi)
                x0 = 2 * gi * G
                for j in range(G):
                    xl = x[_u(x0 + j)]
                    xh = x[_u(x0 + G + j)]
                    v = _byte(q, r0, base + j)
                    w = _byte(q, r1, base + j)
                    la[j] += (sl0 * (_f(v & 15) - zero) + ml0) * xl + (sh0 * (_f(v >> 4) - zero) + mh0) * xh
                    lb[j] += (sl1 * (_f(w & 15) - zero) + ml1) * xl + (sh1 * (_f(w >> 4) - zero) + mh1) * xh
            out[r0] = _lane_sum(la)
            out[r1] = _lane_sum(lb)


@njit(**KERNEL_OPTIONS)
def _q5_k_matvec(q, lay, s, m, x, out):
    G = lay[3]
    rows = q.shape[0]
    n_groups = (q.shape[1] // lay[0]) << lay[2]
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        wide_vectors()
        la = np.empty(G, F32)
        lb = np.empty(G, F32)
        for r0 in range(c * ROW_CHUNK, min(rows, c * ROW_CHUNK + ROW_CHUNK), 2):
            r1 = min(r0 + 1, rows - 1)
            prefetch_row(q, r0)
            prefetch_row(q, r1)
            la[:] = 0
            lb[:] = 0
            for gi in range(n_groups):
                base, plane, bit = _q5_k_place(gi, lay)
                sl0, sh0, sl1, sh1 = s[r0, 2 * gi], s[r0, 2 * gi + 1], s[r1, 2 * gi], s[r1, 2 * gi + 1]
                ml0, mh0, ml1, mh1 = m[r0, 2 * gi], m[r0, 2 * gi + 1], m[r1, 2 * gi], m[r1, 2 * gi + 1]
                x0 = 2 * gi * G
                for j in range(G):
                    xl = x[_u(x0 + j)]
                    xh = x[_u(x0 + G + j)]
                    v, h = _byte(q, r0, base + j), _byte(q, r0, plane + j)
                    w, e = _byte(q, r1, base + j), _byte(q, r1, plane + j)
                    la[j] += ((sl0 * _q5_k(v & 15, h, bit) + ml0) * xl
                              + (sh0 * _q5_k(v >> 4, h, bit + 1) + mh0) * xh)
                    lb[j] += ((sl1 * _q5_k(w & 15, e, bit) + ml1) * xl
                              + (sh1 * _q5_k(w >> 4, e, bit + 1) + mh1) * xh)
            out[r0] = _lane_sum(la)
            out[r1] = _lane_sum(lb)


@njit(**KERNEL_OPTIONS)
def _q5_matvec(q, lay, s, m, x, out):
    bbytes, hoff, _, G, _, _ = lay
    rows = q.shape[0]
    zero = _q5_zero(m)
    nb = q.shape[1] // bbytes
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        wide_vectors()
        la = np.empty(G, F32)
        lb = np.empty(G, F32)
        for r0 in range(c * ROW_CHUNK, min(rows, c * ROW_CHUNK + ROW_CHUNK), 2):
            r1 = min(r0 + 1, rows - 1)
            prefetch_row(q, r0)
            prefetch_row(q, r1)
            la[:] = 0
            lb[:] = 0
            for blk in range(nb):
                base = blk * bbytes + hoff
                h0 = _q5_high_bits(q, r0, base)
                h1 = _q5_high_bits(q, r1, base)
                d0, d1 = s[r0, blk], s[r1, blk]
                m0, m1 = _offset(m, r0, blk), _offset(m, r1, blk)
                x0 = blk * 32
                for j in range(G):
                    xl = x[_u(x0 + j)]
                    xh = x[_u(x0 + G + j)]
                    v = _byte(q, r0, base + 4 + j)
                    w = _byte(q, r1, base + 4 + j)
                    la[j] += ((d0 * _q5(v & 15, h0, j, zero) + m0) * xl
                              + (d0 * _q5(v >> 4, h0, j + G, zero) + m0) * xh)
                    lb[j] += ((d1 * _q5(w & 15, h1, j, zero) + m1) * xl
                              + (d1 * _q5(w >> 4, h1, j + G, zero) + m1) * xh)
            out[r0] = _lane_sum(la)
            out[r1] = _lane_sum(lb)


@njit(**KERNEL_OPTIONS)
def _q8_0_matvec(q, lay, s, m, x, out):
    G = lay[3]
    rows = q.shape[0]
    nb = q.shape[1] // 34
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        wide_vectors()
        la = np.empty(G, F32)
        lb = np.empty(G, F32)
        for r0 in range(c * ROW_CHUNK, min(rows, c * ROW_CHUNK + ROW_CHUNK), 2):
            r1 = min(r0 + 1, rows - 1)
            prefetch_row(q, r0)
            prefetch_row(q, r1)
            la[:] = 0
            lb[:] = 0
            for blk in range(nb):
                base = blk * 34 + 2
                d0, d1 = s[r0, blk], s[r1, blk]
                x0 = blk * 32
                for j in range(G):
                    xj = x[_u(x0 + j)]
                    la[j] += (F32(q[r0, _u(base + j)]) * d0) * xj  # q: the int8 view
                    lb[j] += (F32(q[r1, _u(base + j)]) * d1) * xj
            out[r0] = _lane_sum(la)
            out[r1] = _lane_sum(lb)


@njit(**KERNEL_OPTIONS)
def _q6_k_matvec(q, lay, s, m, x, out):
    H = lay[3]
    rows = q.shape[0]
    n_steps = q.shape[1] // 210 * 4
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        wide_vectors()
        la = np.empty(2 * H, F32)
        lb = np.empty(2 * H, F32)
        for r0 in range(c * ROW_CHUNK, min(rows, c * ROW_CHUNK + ROW_CHUNK), 2):
            r1 = min(r0 + 1, rows - 1)
            prefetch_row(q, r0)
            prefetch_row(q, r1)
            la[:] = 0
            lb[:] = 0
            for t in range(n_steps):
                ql, qh, x0, sc = _q6_place(t)
                k = t & 1
                a0, b0, c0, e0 = s[r0, sc + k], s[r0, sc + 2 + k], s[r0, sc + 4 + k], s[r0, sc + 6 + k]
                a1, b1, c1, e1 = s[r1, sc + k], s[r1, sc + 2 + k], s[r1, sc + 4 + k], s[r1, sc + 6 + k]
                for i in range(H):
                    j = k * H + i
                    xa, xb = x[_u(x0 + j)], x[_u(x0 + 32 + j)]
                    xc, xe = x[_u(x0 + 64 + j)], x[_u(x0 + 96 + j)]
                    u, v, h = _byte(q, r0, ql + j), _byte(q, r0, ql + 32 + j), _byte(q, r0, qh + j)
                    la[j] += ((a0 * _q6(u, h, 0, 0)) * xa + (b0 * _q6(v, h, 0, 2)) * xb
                              + (c0 * _q6(u, h, 4, 4)) * xc + (e0 * _q6(v, h, 4, 6)) * xe)
                    u, v, h = _byte(q, r1, ql + j), _byte(q, r1, ql + 32 + j), _byte(q, r1, qh + j)
                    lb[j] += ((a1 * _q6(u, h, 0, 0)) * xa + (b1 * _q6(v, h, 0, 2)) * xb
                              + (c1 * _q6(u, h, 4, 4)) * xc + (e1 * _q6(v, h, 4, 6)) * xe)
            out[r0] = _lane_sum(la)
            out[r1] = _lane_sum(lb)


_FUSED = {NIB4: _nib4_matvec, FIVE: _q5_matvec, INT8: _q8_0_matvec, Q6K: _q6_k_matvec, Q5K: _q5_k_matvec}


FLOAT_LANES = 32


@njit(**KERNEL_OPTIONS)
def _float_matmul(W, X, out):
    rows, cols = W.shape
    L = FLOAT_LANES
    n = cols // L
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        wide_vectors()
        lanes = np.empty((2, L), F32)
        for r0 in range(c * ROW_CHUNK, min(rows, c * ROW_CHUNK + ROW_CHUNK), 2):
            r1 = min(r0 + 1, rows - 1)
            prefetch_row(W, r0)
            prefetch_row(W, r1)
            for t in range(X.shape[0]):
                lanes[:] = 0
                _pair_dots(W, r0, r1, 0, X[t], n, L, 1, lanes)
                _pair_dots(W, r0, r1, n * L, X[t, n * L:], 1, cols - n * L, 1, lanes)  # the tail
                _pair_sums(lanes, out, t, r0, r1)


# ---------------------------------------------------------------------------------------------
# Formats: one class per GGUF encoding, registered in FORMATS by declaring its ``ggml_type`` (as
# core/dtypes.py registers Loom's formats by ``name``). Block formats run the kernels above;
# plain ones are kept as a float32 matrix.

FORMATS: dict[int, GgmlFormat] = {}


class GgmlFormat:
    """A GGUF tensor encoding a :class:`QuantMatrix` can hold: ``block_elems`` weights stored in
    ``block_bytes`` bytes. Subclasses that declare ``ggml_type`` register themselves."""

    ggml_type: ClassVar[int]
    block_elems: ClassVar[int]
    block_bytes: ClassVar[int]
    array_dtypes: ClassVar[tuple[str, ...]] = ()  # accepted in place of raw bytes, shaped as the matrix

    @property
    def name(self) -> str:
        """The ggml type's name, e.g. ``"Q4_K"``."""
        return GT(self.ggml_type).name

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "ggml_type" in cls.__dict__:
            FORMATS[int(cls.ggml_type)] = cls()


class PlainFormat(GgmlFormat):
    """F32 / F16 / BF16: one weight per element, converted to a float32 matrix once."""

    block_elems = 1

    def to_f32(self, raw: np.ndarray) -> np.ndarray:
        """Little-endian bytes [rows, in * block_bytes] as float32 [rows, in]."""
        raise NotImplementedError


class _F32(PlainFormat):
    ggml_type, block_bytes, array_dtypes = GT.F32, 4, ("float32",)

    def to_f32(self, raw):
        return raw.view("<f4")  # a view of the file: no copy


class _F16(PlainFormat):
    ggml_type, block_bytes, array_dtypes = GT.F16, 2, ("float16",)

    def to_f32(self, raw):
        return raw.view("<f2").astype(F32)


class _BF16(PlainFormat):
    ggml_type, block_bytes, array_dtypes = GT.BF16, 2, ("uint16", "bfloat16")  # BF16 as its uint16 bits

    def to_f32(self, raw):
        return (raw.view("<u2").astype(np.uint32) << 16).view(F32)


DECODE_ELEMS = 1 << 20  # a decoded format converts this many weights at a time (bounds the temporaries)


class DecodedFormat(PlainFormat):
    """A block format without a matrix kernel (IQ2_XS, IQ3_S, TQ1_0 ...): its blocks are decoded
    once, at construction, into a float32 matrix that the float kernels multiply (4 bytes a
    weight instead of the file's 0.3-1.1). The decoders are gguf-py's (``gguf.quants``; Q8_K's,
    which gguf-py lacks, here), bit-equal to llama.cpp's ``dequantize_row_*``; the file's blocks
    stay available to export unchanged (:attr:`QuantMatrix.raw_blocks`)."""

    def to_f32(self, raw):
        rows, cols = raw.shape[0], raw.shape[1] // self.block_bytes * self.block_elems
        out = np.empty((rows, cols), F32)
        step = max(1, DECODE_ELEMS // cols)
        for r in range(0, rows, step):
            out[r:r + step] = self.decode(raw[r:r + step])
        return out

    def decode(self, raw: np.ndarray) -> np.ndarray:
        """uint8 blocks [rows, bytes per row] as float32 [rows, weights per row]."""
        return gguf_quants.dequantize(raw, GT(self.ggml_type)).astype(F32, copy=False)


class _Q8_K(DecodedFormat):
    """llama.cpp's activation blocks, which a file may also hold: float32 d, 256 int8 quants,
    16 int16 sums (unused here); weight = d * q (``dequantize_row_q8_K``)."""

    ggml_type, block_elems, block_bytes = GT.Q8_K, 256, 292

    def decode(self, raw):
        blocks = raw.reshape(raw.shape[0], -1, self.block_bytes)
        d = np.ascontiguousarray(blocks[:, :, :4]).view("<f4")
        return (d * blocks[:, :, 4:260].view(np.int8)).reshape(raw.shape[0], -1)


def _register_decoded(names: tuple[str, ...]) -> None:
    for name in names:
        elems, nbytes = GGML_QUANT_SIZES[GT[name]]
        fields = {"ggml_type": GT[name], "block_elems": elems, "block_bytes": nbytes}
        type(f"_{name}", (DecodedFormat,), fields)


_register_decoded(("IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S", "TQ1_0", "TQ2_0",
                   "NVFP4"))  # the types gguf-py decodes


def _f16_field(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte ``at`` of every block, as float32 [rows, n_blocks]."""
    return np.ascontiguousarray(blocks[:, :, at:at + 2]).view("<f2")[..., 0].astype(F32)


class BlockFormat(GgmlFormat):
    """A quantized block format: the float32 side arrays it needs and its decoder's layout."""

    kind: ClassVar[int]  # the decoder branch in ``_decode``
    qoff: ClassVar[int] = 0  # first byte of the quants (FIVE: of the fifth bits) in a block
    group: ClassVar[int] = 16  # G: NIB4 bytes per group; lanes (Q6K: half the lanes) otherwise
    shift: ClassVar[int] = 0  # NIB4: 1 when one scale covers a whole group
    zero: ClassVar[int] = 0  # NIB4: subtracted from each nibble

    def side(self, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Float32 scale and offset arrays (offsets None when the format has none) from blocks
        viewed as [rows, n_blocks, block_bytes]."""
        raise NotImplementedError

    def layout(self) -> tuple:
        """``_decode``'s ``lay`` tuple: the same types for every format (one compiled kernel)."""
        groups = self.kind in (NIB4, Q5K, IQ4X, MXF4)
        gshift = max(0, (self.block_elems // (2 * self.group)).bit_length() - 1) if groups else 0
        return self.block_bytes, self.qoff, gshift, self.group, self.shift, F32(self.zero)


class _Q4_0(BlockFormat):
    ggml_type, block_elems, block_bytes = GT.Q4_0, 32, 18
    kind, qoff, shift, zero = NIB4, 2, 1, 8

    def side(self, blocks):
        return _f16_field(blocks, 0), None


class _Q4_1(BlockFormat):
    ggml_type, block_elems, block_bytes = GT.Q4_1, 32, 20
    kind, qoff, shift = NIB4, 4, 1

    def side(self, blocks):
        return _f16_field(blocks, 0), _f16_field(blocks, 2)


def q4_k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K blocks ``[rows, nb, 144]`` -> their 6-bit scales and mins, ``[rows, nb, 8]`` each
    (``get_scale_min_k4`` of ggml-quants.c)."""
    packed = blocks[:, :, 4:16].reshape(*blocks.shape[:2], 3, 4)
    lo, mid, top = packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]
    scales = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return scales, mins


class _Q4_K(BlockFormat):
    ggml_type, block_elems, block_bytes = GT.Q4_K, 256, 144
    kind, qoff, group = NIB4, 16, 32

    def side(self, blocks):
        """Per 32-weight sub-block: ``d * scale`` and ``-dmin * min`` from the 12 packed 6-bit bytes."""
        d, dmin = _f16_field(blocks, 0), _f16_field(blocks, 2)
        rows, nb = d.shape
        sc, mn = (a.astype(F32) for a in q4_k_scales(blocks))
        scale = (d[:, :, None] * sc).reshape(rows, nb * 8)
        offset = -(dmin[:, :, None] * mn).reshape(rows, nb * 8)
        return scale, offset


class _Q5_K(_Q4_K):
    """Q4_K's scales and nibbles (at byte 48) plus a plane of fifth bits at byte 16: byte l's bit
    2g holds the fifth bit of weight 64g + l, bit 2g + 1 that of weight 64g + 32 + l."""

    ggml_type, block_elems, block_bytes = GT.Q5_K, 256, 176
    kind, qoff = Q5K, 48


def iq4_xs_scales(blocks: np.ndarray) -> np.ndarray:
    """IQ4_XS super-blocks ``[rows, nb, 136]`` -> the 8 signed 6-bit sub-scales ``ls - 32`` of each,
    ``[rows, nb, 8]`` (low 4 bits in ``scales_l``, top 2 in the uint16 ``scales_h``)."""
    low = np.stack([blocks[:, :, 4:8] & 0x0F, blocks[:, :, 4:8] >> 4], axis=-1).reshape(*blocks.shape[:2], 8)
    high = np.ascontiguousarray(blocks[:, :, 2:4]).view("<u2")[..., 0].astype(np.int32)
    top = np.stack([(high >> (2 * ib)) & 3 for ib in range(8)], axis=-1)
    return (low.astype(np.int32) | (top << 4)).astype(np.int8) - np.int8(32)


class _IQ4_NL(BlockFormat):
    """32 weights: f16 d, then 16 bytes of nibbles (weights j and 16 + j), indices into
    :data:`IQ4_VALUES`."""

    ggml_type, block_elems, block_bytes = GT.IQ4_NL, 32, 18
    kind, qoff = IQ4X, 2

    def side(self, blocks):
        return _f16_field(blocks, 0), None


def mxfp4_scales(blocks: np.ndarray) -> np.ndarray:
    """MXFP4 blocks ``[rows, nb, 17]`` -> each block's E8M0 exponent e as the float32 2^(e - 128)
    (halved, as :data:`MXFP4_VALUES` are doubled): gguf-py's ``e8m0_to_fp32_half``, ggml's own."""
    return gguf_quants.MXFP4.e8m0_to_fp32_half(blocks[:, :, 0])


class _MXFP4(BlockFormat):
    """32 weights: an E8M0 exponent byte, then 16 bytes of nibbles (weights j and 16 + j),
    indices into :data:`MXFP4_VALUES`."""

    ggml_type, block_elems, block_bytes = GT.MXFP4, 32, 17
    kind, qoff = MXF4, 1

    def side(self, blocks):
        return mxfp4_scales(blocks), None


class _IQ4_XS(BlockFormat):
    """256 weights: f16 d, the sub-scales' top bits (uint16) and low nibbles (4 bytes), then per
    sub-block of 32 16 bytes of nibbles (weights j and 16 + j), indices into :data:`IQ4_VALUES`."""

    ggml_type, block_elems, block_bytes = GT.IQ4_XS, 256, 136
    kind, qoff = IQ4X, 8

    def side(self, blocks):
        d = _f16_field(blocks, 0)
        return (d[:, :, None] * iq4_xs_scales(blocks).astype(F32)).reshape(d.shape[0], -1), None


def q3_k_scales(packed: np.ndarray) -> np.ndarray:
    """Q3_K's twelve bytes per super-block ``[rows, nb, 12]`` -> its 16 signed 6-bit sub-scales
    ``[rows, nb, 16]`` (low nibbles of bytes 0-7, then their high nibbles; top bits in 8-11)."""
    low = np.concatenate([packed[:, :, :8] & 0x0F, packed[:, :, :8] >> 4], axis=-1)
    top = np.concatenate([(packed[:, :, 8:12] >> (2 * k)) & 3 for k in range(4)], axis=-1)
    return (low | (top << 4)).astype(np.int8) - np.int8(32)


class _Q3_K(BlockFormat):
    """256 weights: a 32-byte mask of third bits, 64 bytes of 2-bit runs, 12 bytes of sub-scales, f16 d."""

    ggml_type, block_elems, block_bytes = GT.Q3_K, 256, 110
    kind, qoff = Q3K, 32

    def side(self, blocks):
        d = _f16_field(blocks, 108)
        return (d[:, :, None] * q3_k_scales(blocks[:, :, 96:108]).astype(F32)).reshape(d.shape[0], -1), None


class _Q2_K(BlockFormat):
    """256 weights: 16 bytes of 4-bit sub-scale and min pairs, 64 bytes of 2-bit runs, f16 d and dmin."""

    ggml_type, block_elems, block_bytes = GT.Q2_K, 256, 84
    kind, qoff = Q2K, 16

    def side(self, blocks):
        d, dmin = _f16_field(blocks, 80), _f16_field(blocks, 82)
        sub = blocks[:, :, :16]
        scale = (d[:, :, None] * (sub & 0x0F).astype(F32)).reshape(d.shape[0], -1)
        offset = -(dmin[:, :, None] * (sub >> 4).astype(F32)).reshape(d.shape[0], -1)
        return scale, offset


class _Q5_0(BlockFormat):
    ggml_type, block_elems, block_bytes = GT.Q5_0, 32, 22
    kind, qoff = FIVE, 2

    def side(self, blocks):
        return _f16_field(blocks, 0), None


class _Q5_1(BlockFormat):
    ggml_type, block_elems, block_bytes = GT.Q5_1, 32, 24
    kind, qoff = FIVE, 4

    def side(self, blocks):
        return _f16_field(blocks, 0), _f16_field(blocks, 2)


class _Q8_0(BlockFormat):
    ggml_type, block_elems, block_bytes = GT.Q8_0, 32, 34
    kind, qoff, group = INT8, 2, 32

    def side(self, blocks):
        return _f16_field(blocks, 0), None


class _Q6_K(BlockFormat):
    ggml_type, block_elems, block_bytes = GT.Q6_K, 256, 210
    kind = Q6K

    def side(self, blocks):
        d = _f16_field(blocks, 208)
        sub = blocks[:, :, 192:208].view(np.int8).astype(F32)
        return (d[:, :, None] * sub).reshape(d.shape[0], -1), None


SUPPORTED_TYPES: tuple[str, ...] = tuple(GT(t).name for t in FORMATS)
DECODED_TYPES: tuple[str, ...] = tuple(f.name for f in FORMATS.values() if isinstance(f, DecodedFormat))


_tiles = threading.local()


def _tile_buffer(n: int) -> np.ndarray:
    """This thread's float32 scratch buffer for prefill tiles, grown on demand and reused."""
    buf = getattr(_tiles, "buf", None)
    if buf is None or buf.size < n:
        buf = _tiles.buf = np.empty(n, F32)
    return buf[:n]


# ---------------------------------------------------------------------------------------------


FEW_ROWS = 8  # rows() of fewer than 1/FEW_ROWS of a matrix's rows decodes their blocks alone

Matrix = Any  # a QuantMatrix (matvec / matmul / rows / dequantize) or a float32 numpy array


class QuantMatrix:
    """A weight matrix ``[out_features, in_features]`` kept in a GGUF tensor's encoding.

    Args:
        data: the tensor's bytes as ``uint8 [out_features, bytes_per_row]`` (used in place, no
            copy when row-contiguous). For F32 / F16 / BF16 an array shaped ``shape`` with a
            4- or 2-byte dtype (BF16 as its uint16 bits) is accepted as well.
        ggml_type: the ggml type id (``gguf.GGMLQuantizationType``): Q4_0, Q4_1, Q5_0, Q5_1,
            Q8_0, Q4_K, Q6_K, or F32 / F16 / BF16, which are kept as a float32 array.
        shape: ``(out_features, in_features)``.
        name: the tensor's name, for error messages.

    Raises:
        ModelFormatError: unsupported type, or bytes that do not match the shape.
    """

    def __init__(self, data: np.ndarray, ggml_type: int, shape: tuple[int, int], *, name: str = "tensor"):
        if not isinstance(ggml_type, (int, np.integer)):
            raise ModelFormatError(name, f"ggml type must be an integer id; got {ggml_type!r}")
        self.ggml_type = int(ggml_type)
        self.shape = _check_shape(shape, name)
        fmt = FORMATS.get(self.ggml_type)
        if fmt is None:
            raise ModelFormatError(name, f"ggml type {self.ggml_type} ({self.type_name}) has no matrix "
                                         f"kernel; supported: {', '.join(SUPPORTED_TYPES)}")
        raw = read_only(self._raw_bytes(data, fmt, name))
        self._q, self._dense, self._fmt = None, None, fmt
        self._kernel_args: tuple | None = None  # the float kernels' (_float_args), on first use
        self.int8_rows = None  # (kind, repacked rows) once the int8 kernels first use it (quant_int8)
        self.decoded = isinstance(fmt, DecodedFormat)  # blocks decoded to float32 at load
        if isinstance(fmt, PlainFormat):
            self._dense = read_only(np.ascontiguousarray(fmt.to_f32(raw)))
            if self.decoded:
                mapped_pages.release(raw)  # read again only by an export
                self._q = raw  # the file's blocks, for an export that keeps them
        else:
            self._q = raw
            self._fused = _FUSED.get(fmt.kind)  # without one, a row takes the batch kernel (same bits)

    def _float_args(self) -> tuple:
        """The float kernels' leading arguments ``(kind, blocks, layout, scales, offsets)`` and the
        one-row kernel's, with the blocks' scales as float32 arrays: made on first use, as a model
        decoding with 8-bit activations never needs them (for Q4_1 they are 40% of the blocks'
        bytes again). Two threads making them at once make equal tuples."""
        args = self._kernel_args
        if args is None:
            fmt, raw = self._fmt, self._q
            blocks = raw.reshape(raw.shape[0], -1, fmt.block_bytes)
            side = tuple(None if a is None else read_only(np.ascontiguousarray(a, dtype=F32))
                         for a in fmt.side(blocks))
            plain = (fmt.kind, raw, fmt.layout(), *side)
            args = self._kernel_args = (plain, (raw.view(np.int8) if fmt.kind == INT8 else raw, *plain[2:]))
        return args

    def _raw_bytes(self, data: np.ndarray, fmt: GgmlFormat, name: str) -> np.ndarray:
        """Check ``data`` against the type and shape; return it as uint8 [rows, bytes_per_row]."""
        if not isinstance(data, np.ndarray):
            raise ModelFormatError(name, f"tensor data must be a numpy array, not {type(data).__name__}")
        rows, cols = self.shape
        if cols % fmt.block_elems:
            raise ModelFormatError(name, f"{self.type_name} rows of {cols} weights are not whole blocks "
                                         f"of {fmt.block_elems}")
        if data.dtype.name in fmt.array_dtypes and data.shape == (rows, cols):
            data = np.ascontiguousarray(data).view(np.uint8)
        row_bytes = cols // fmt.block_elems * fmt.block_bytes
        if data.dtype != np.uint8 or data.shape != (rows, row_bytes):
            raise ModelFormatError(name, f"{self.type_name} {rows}x{cols} needs uint8 data of shape "
                                         f"({rows}, {row_bytes}); got {data.dtype} {data.shape}")
        return np.ascontiguousarray(data)

    @property
    def type_name(self) -> str:
        """The ggml type's name, e.g. ``"Q4_1"``."""
        return _type_name(self.ggml_type)

    @property
    def raw_blocks(self) -> np.ndarray | None:
        """The blocks as a GGUF file stores them, uint8 ``[rows, bytes per row]`` (read-only), or
        None for a plain type (F16, F32 ...), which is kept as float32 values. A decoded type
        (:attr:`decoded`) has both."""
        return self._q

    @property
    def nbytes(self) -> int:
        """Bytes this matrix holds: the file's blocks plus the float32 scale arrays once the float
        kernels have made them (or the float32 matrix for plain types)."""
        if self._dense is not None:
            return int(self._dense.nbytes)
        side = () if self._kernel_args is None else self._kernel_args[0][3:]
        return int(self._q.nbytes + sum(a.nbytes for a in side if a is not None))

    def matvec(self, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """``W @ x`` for one input vector ``x[in_features]`` -> float32 ``[out_features]``.

        ``out``, when given, is a float32 ``[out_features]`` array written in place.
        """
        x = self._input(x, 1)
        if out is None:
            out = np.empty(self.shape[0], F32)
        elif (out.dtype != F32 or out.shape != (self.shape[0],) or not out.flags.c_contiguous
              or not out.flags.writeable):
            raise LoomShapeError(f"out must be a writable contiguous float32 array of shape "
                                 f"({self.shape[0]},); got {out.dtype} {out.shape}")
        self._products(x.reshape(1, -1), out.reshape(1, -1))
        return out

    def matmul(self, X: np.ndarray) -> np.ndarray:
        """``X @ W.T`` for ``X[T, in_features]`` -> float32 ``[T, out_features]``.

        Below ``MATMUL_MIN_T`` rows (and for plain types always), row t of the result has the same
        bits as ``matvec(X[t])``; beyond it, row tiles of ``W`` are dequantized into a reused
        buffer and multiplied with BLAS.
        """
        X = self._input(X, 2)
        T = X.shape[0]
        out = np.empty((T, self.shape[0]), F32)
        if self._dense is not None or T < MATMUL_MIN_T:
            self._products(X, out)
        else:
            threads = numba.get_num_threads()
            numba.set_num_threads(1)  # never alternate numba's and BLAS's thread pools (module doc)
            try:
                self._tiled_matmul(X, out)
            finally:
                numba.set_num_threads(threads)
        return out

    def _tiled_matmul(self, X: np.ndarray, out: np.ndarray) -> None:
        rows, cols = self.shape
        tile_rows = max(1, TILE_BYTES // (4 * cols))
        buf = _tile_buffer(min(tile_rows, rows) * cols)
        for r0 in range(0, rows, tile_rows):
            ids = np.arange(r0, min(rows, r0 + tile_rows), dtype=np.int64)
            tile = buf[:ids.size * cols].reshape(ids.size, cols)
            _block_rows(*self._float_args()[0], ids, tile)
            np.matmul(X, tile.T, out=out[:, r0:r0 + ids.size])

    def rows(self, ids) -> np.ndarray:
        """Rows ``ids`` of the matrix, dequantized: float32 ``[len(ids), in_features]``
        (an embedding lookup when the matrix is a token table)."""
        ids = np.asarray(ids)
        if ids.ndim != 1 or not (np.issubdtype(ids.dtype, np.integer) or ids.size == 0):
            raise LoomShapeError(f"row ids must be a 1-D integer array; got {ids.dtype} {ids.shape}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.shape[0]):
            raise LoomShapeError(f"row ids must lie in [0, {self.shape[0]}); got {ids.min()}..{ids.max()}")
        ids = ids.astype(np.int64)
        if self._dense is not None:
            return self._dense[ids]
        out = np.empty((ids.size, self.shape[1]), F32)
        pace()
        if self._kernel_args is None and ids.size * FEW_ROWS < self.shape[0]:
            # a few rows (tokens looked up) before the float kernels have run: their own blocks'
            # scales, not the whole table's, which would read every page of it (_float_args)
            fmt, picked = self._fmt, np.ascontiguousarray(self._q[ids])
            side = fmt.side(picked.reshape(ids.size, -1, fmt.block_bytes))
            _block_rows(fmt.kind, picked, fmt.layout(),
                        *(None if a is None else np.ascontiguousarray(a, dtype=F32) for a in side),
                        np.arange(ids.size, dtype=np.int64), out)
        else:
            _block_rows(*self._float_args()[0], ids, out)
        return out

    def row_range(self, start: int, stop: int) -> QuantMatrix:
        """Rows ``start .. stop - 1`` as a matrix of this encoding viewing this one's bytes (a row
        of a block format is whole blocks, so a row range is a byte range): a fused matrix (phi3's
        Q/K/V, its gate and up) split without dequantizing, each part taking every fast kernel.

        Raises:
            LoomShapeError: the range is empty or not inside the matrix.
        """
        if not 0 <= start < stop <= self.shape[0]:
            raise LoomShapeError(f"rows {start}..{stop} are not a range of the {self.shape[0]} rows of "
                                 f"{self!r}")
        part = object.__new__(QuantMatrix)
        part.__dict__.update(self.__dict__)
        part.shape = (stop - start, self.shape[1])
        part._q = None if self._q is None else self._q[start:stop]
        part._dense = None if self._dense is None else self._dense[start:stop]
        part._kernel_args, part.int8_rows = None, None  # made for the part's own rows on first use
        return part

    def _products(self, X: np.ndarray, out: np.ndarray) -> None:
        """``out = X @ W.T`` by the row-invariant kernels."""
        pace()
        if self._dense is not None:
            _float_matmul(self._dense, X, out)
        elif X.shape[0] <= FUSED_MAX_T and self._fused is not None:
            args = self._float_args()[1]
            for t in range(X.shape[0]):
                self._fused(*args, X[t], out[t])
        else:
            _block_matmul(*self._float_args()[0], X, out)

    def dequantize(self) -> np.ndarray:
        """The whole matrix as a new float32 ``[out_features, in_features]`` array."""
        return self.rows(np.arange(self.shape[0]))

    def _input(self, x: np.ndarray, ndim: int) -> np.ndarray:
        x = np.asarray(x)
        if x.ndim != ndim or x.shape[-1] != self.shape[1]:
            want = "(in_features,)" if ndim == 1 else "(T, in_features)"
            raise LoomShapeError(f"{self.type_name} matrix {self.shape} needs input {want} with "
                                 f"in_features={self.shape[1]}; got {x.shape}")
        return read_only(np.ascontiguousarray(x, dtype=F32))

    def __repr__(self) -> str:
        return f"QuantMatrix({self.type_name}, shape={self.shape})"


def float_matmul(W: np.ndarray, X: np.ndarray) -> np.ndarray:
    """``X @ W.T`` for a float32 matrix ``W[out_features, in_features]`` and ``X[T, in_features]``
    -> float32 ``[T, out_features]``, row-invariant: row t has the same bits as
    ``float_matmul(W, X[t:t+1])[0]`` whatever the other rows are (BLAS picks its blocking, and so
    its summation order, by shape). ``FLOAT_LANES`` float32 lanes per output, summed in order.

    Raises:
        LoomShapeError: ``W`` is not a 2-D float32 array or ``X`` not ``(T, in_features)``.
    """
    if not isinstance(W, np.ndarray) or W.dtype != F32 or W.ndim != 2:
        raise LoomShapeError(f"float_matmul needs a 2-D float32 weight matrix; got "
                             f"{getattr(W, 'dtype', type(W).__name__)} {getattr(W, 'shape', '')}")
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != W.shape[1]:
        raise LoomShapeError(f"float_matmul with a {W.shape} matrix needs input (T, {W.shape[1]}); "
                             f"got {X.shape}")
    out = np.empty((X.shape[0], W.shape[0]), F32)
    pace()
    _float_matmul(read_only(np.ascontiguousarray(W)), read_only(np.ascontiguousarray(X, dtype=F32)), out)
    return out


def read_only(a: np.ndarray) -> np.ndarray:
    """A read-only view: kernels then always see the same array type as a memory-mapped file
    gives, so numba compiles (and caches) one specialization instead of two."""
    view = a.view()
    view.flags.writeable = False
    return view


def _check_shape(shape, name: str) -> tuple[int, int]:
    try:
        rows, cols = (int(v) for v in shape)
    except (TypeError, ValueError):
        raise ModelFormatError(name, f"matrix shape must be (out_features, in_features); "
                                     f"got {shape!r}") from None
    if rows <= 0 or cols <= 0:
        raise ModelFormatError(name, f"matrix shape must be positive; got {(rows, cols)}")
    return rows, cols


def _type_name(ggml_type: int) -> str:
    try:
        return GT(ggml_type).name
    except ValueError:
        return "unknown"


_controller = None


def single_threaded_blas():
    """A context in which OpenBLAS uses one thread, for code that runs these kernels.

    OpenBLAS's workers keep spinning after each multi-threaded call and starve numba's threads on
    small machines (module doc). Entering costs ~10 µs.
    """
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()
    return _controller.limit(limits=1, user_api="blas")


# ---------------------------------------------------------------------------------------------
# How many threads the kernels use: numba's count is a per-thread setting, so it is chosen in the
# thread that runs the kernels, inside adaptive_threads(). The count adapts, not the scheduling:
# no threading layer or chunking measured beat one thread beside a busy core, and each cost idle
# speed (docs/kernels.md, "Threads").

thread_chooser: ThreadChooser | None = ThreadChooser(limit=numba.config.NUMBA_NUM_THREADS)
"""Picks the kernels' thread count inside :func:`adaptive_threads` from the CPUs other processes
leave free. ``None`` keeps numba's count as the calling thread set it (what
``tests/bench/bench_decode_under_load.py`` compares against)."""

_adaptive = threading.local()


@contextmanager
def adaptive_threads():
    """A context in which this thread's kernels use the thread count :data:`thread_chooser` picks,
    re-picked while they run, never more than numba's count on entry (``numba.set_num_threads(1)``
    before it pins one thread); that count is set again on exit. Nested uses leave it to the
    outermost."""
    chooser, owner = thread_chooser, threading.get_ident()
    if chooser is None or getattr(_adaptive, "chooser", None) is not None:
        yield
        return
    ceiling = numba.get_num_threads()
    _adaptive.chooser, _adaptive.ceiling, _adaptive.applied = chooser, ceiling, ceiling
    try:
        pace()
        yield
    finally:
        if threading.get_ident() == owner:  # a generator closed from another thread: not its setting
            _adaptive.chooser = None
            numba.set_num_threads(ceiling)


def pace() -> None:
    """Apply the current choice in this thread. Called per kernel launch, not per token: it is a
    clock read (``/proc`` is read every ~0.3 s), and with too many threads on a busy machine one
    token can take a second, so the switch must not wait for the token's end."""
    chooser = getattr(_adaptive, "chooser", None)
    if chooser is not None:
        n = min(chooser.choose(), _adaptive.ceiling)
        if n != _adaptive.applied:
            numba.set_num_threads(n)
            _adaptive.applied = n
