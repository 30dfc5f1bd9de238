"""Decode with 8-bit activations, as llama.cpp computes: integer dot products per block.

:mod:`.quant` multiplies the file's blocks by float32 activations, dequantizing every weight to
float32 first, and that decode is compute-bound. llama.cpp instead quantizes the activation
vector ``x`` to 8 bits per block (``quantize_row_q8_0/q8_1/q8_K_ref`` in ggml-quants.c) and
multiplies integers: per block one integer dot product of the weight's quants with ``x``'s, then
one float multiply by both scales (``ggml_vec_dot_*`` in ggml-cpu/quants.c). The result is not
the float product: ``x`` is rounded to 8 bits per block (llama.cpp's own numerics), so this is an
opt-in mode (:func:`int8_activations`), not a replacement for :meth:`QuantMatrix.matvec`.

Activation formats (``quantize_activations``), per block of ``x``:
    Q8_0: 32 values, ``d = fp16(max|x| / 127)``, ``q = roundf(x / d)`` (the unrounded d's inverse).
    Q8_1: Q8_0 plus ``s = fp16(d * sum(q))``, for weight formats with an offset (Q4_1, Q5_1).
    Q8_K: 256 values, ``d = max / -127`` (float32, of the signed value of largest magnitude),
          ``q = min(127, rint(x * -127 / max))``, and ``bsums``: sums of q per 16.
Each kind also keeps ``sums``, the integer sum of q per 32 (Q8_0, Q8_1) or per 16 (Q8_K): a
format with a zero point (Q4_0 nibbles are ``n - 8``) multiplies the unsigned quants and
subtracts ``zero * sum`` exactly, which is llama.cpp's result with a u8 x s8 product.

Kernel shape: each block's integer dot product is one LLVM IR expression (the intrinsics below),
which LLVM's x86 backend compiles to ``vpdpbusd`` where the CPU has AVX-VNNI or AVX512-VNNI and
to what the target has elsewhere; then one float multiply-add by both scales per block, as in
llama.cpp. Output rows run in parallel on numba's threads, paced by :mod:`.quant`'s thread chooser.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as GT
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..errors import LoomConfigError, LoomShapeError
from .kernel_hints import prefetch_row
from .quant import _KERNEL, ROW_CHUNK, QuantMatrix, _pace, _read_only
from .quant_int8_rows import (
    WQ4_0,
    WQ4_1,
    WQ5_0,
    WQ5_1,
    WQ8_0,
    fp16_round,
    q8_scale,
    quantize_grouped,
    repack,
    roundf,
    rows_products,
)

F32 = np.float32
I32 = np.int32

# Activation kinds; the names are llama.cpp's block types.
AQ8_0, AQ8_1, AQ8_K = 0, 1, 2
ACTIVATION_KINDS = {"Q8_0": AQ8_0, "Q8_1": AQ8_1, "Q8_K": AQ8_K}
_BLOCK = {AQ8_0: 32, AQ8_1: 32, AQ8_K: 256}

# Weight kinds of the kernel, and the activation each one takes (llama.cpp's vec_dot_type).
WQ4_K, WQ6_K = 5, 6  # after quant_int8_rows' five
_WEIGHT_KIND = {GT.Q4_0: (WQ4_0, AQ8_0), GT.Q4_1: (WQ4_1, AQ8_1), GT.Q5_0: (WQ5_0, AQ8_0),
                GT.Q5_1: (WQ5_1, AQ8_1), GT.Q8_0: (WQ8_0, AQ8_0), GT.Q4_K: (WQ4_K, AQ8_K),
                GT.Q6_K: (WQ6_K, AQ8_K)}
INT8_TYPES: tuple[str, ...] = tuple(GT(t).name for t in _WEIGHT_KIND)


@dataclass(frozen=True)
class QuantizedActivations:
    """Rows of ``x`` in one of llama.cpp's 8-bit activation formats (module docstring).

    Attributes:
        kind: ``"Q8_0"``, ``"Q8_1"`` or ``"Q8_K"``.
        qs: int8 ``[T, n]``, the quants in ``x``'s order.
        d: float32 ``[T, n / block]``, each block's scale (an fp16 value for Q8_0 / Q8_1).
        s: float32 ``[T, n / 32]``, Q8_1's ``fp16(d * sum(q))``; zeros for the other kinds.
        sums: int32 ``[T, n / span]``, the sum of q per 32 (Q8_0, Q8_1) or per 16 (Q8_K: bsums).
    """

    kind: str
    qs: np.ndarray
    d: np.ndarray
    s: np.ndarray
    sums: np.ndarray


# ---------------------------------------------------------------------------------------------
# Activation quantizers (serial: a few microseconds per row, run before the parallel loop).


@njit(cache=True, nogil=True)
def _quantize_rows(akind, X, qs, d, s, sums):
    T, n = X.shape
    B = 256 if akind == AQ8_K else 32
    for t in range(T):
        x = X[t]
        for b in range(n // B):
            o = b * B
            if akind == AQ8_K:
                amax, top = F32(0), F32(0)
                for j in range(B):  # the signed value of largest magnitude, first one on ties
                    if abs(x[o + j]) > amax:
                        amax, top = abs(x[o + j]), x[o + j]
                if amax == 0:
                    d[t, b] = 0
                    qs[t, o:o + B] = 0
                else:
                    iscale = F32(-127) / top
                    for j in range(B):
                        qs[t, o + j] = min(127, np.int32(np.rint(iscale * x[o + j])))
                    d[t, b] = F32(1) / iscale
                for k in range(B // 16):
                    acc = I32(0)
                    for j in range(16):
                        acc += qs[t, o + 16 * k + j]
                    sums[t, b * (B // 16) + k] = acc
            else:
                dd, inv = q8_scale(x, o)
                acc = I32(0)
                for j in range(B):
                    q = np.int32(roundf(x[o + j] * inv))
                    qs[t, o + j] = q
                    acc += q
                d[t, b] = fp16_round(dd)
                sums[t, b] = acc
                s[t, b] = fp16_round(F32(acc) * dd) if akind == AQ8_1 else F32(0)


@njit(cache=True, nogil=True)
def _activation_buffers(akind, T, n):
    """Empty (qs, d, s, sums) for T rows of n values of ``akind``."""
    B, span = (256, 16) if akind == AQ8_K else (32, 32)
    return (np.empty((T, n), np.int8), np.empty((T, n // B), F32), np.empty((T, n // 32), F32),
            np.empty((T, n // span), np.int32))


def quantize_activations(x: np.ndarray, kind: str) -> QuantizedActivations:
    """Quantize ``x[n]`` or ``X[T, n]`` row by row as llama.cpp's ``quantize_row_<kind>_ref``.

    Args:
        x: float32 values, the last axis a whole number of blocks (32; 256 for Q8_K).
        kind: ``"Q8_0"``, ``"Q8_1"`` or ``"Q8_K"``.

    Returns:
        The quants and scales, always 2-D (one row for a vector).

    Raises:
        LoomConfigError: an unknown kind.
        LoomShapeError: ``x`` is not 1-D or 2-D, or its rows are not whole blocks.
    """
    akind = ACTIVATION_KINDS.get(kind)
    if akind is None:
        raise LoomConfigError(f"activation kind must be one of {', '.join(ACTIVATION_KINDS)}; got {kind!r}")
    X = np.asarray(x, dtype=F32)
    if X.ndim == 1:
        X = X[None]
    if X.ndim != 2 or X.shape[1] % _BLOCK[akind]:
        raise LoomShapeError(f"{kind} needs x of shape (n,) or (T, n) with n a multiple of "
                             f"{_BLOCK[akind]}; got {np.shape(x)}")
    X = np.ascontiguousarray(X)
    qs, d, s, sums = _activation_buffers(akind, *X.shape)
    _quantize_rows(akind, X, qs, d, s, sums)
    return QuantizedActivations(kind, qs, d, s, sums)


# ---------------------------------------------------------------------------------------------
# Integer block dot products, written as LLVM IR: ``reduce.add(mul(zext(w), sext(x)))`` over a
# vector of u8 weights and s8 activations, which LLVM's x86 backend turns into ``vpdpbusd`` where
# the CPU has VNNI (and into what the target has elsewhere) -- the instruction llama.cpp calls by
# hand. The same sum written as a numba loop stays i32 multiplies and adds: the loop vectorizer
# leaves a vector accumulator between the products and the reduction, which the pattern needs
# adjacent. Each intrinsic reads ``n`` bytes of the weight row at a flat index of the C-ordered
# blocks ``q`` and the matching quants of ``xq``.

_I8, _I32 = ir.IntType(8), ir.IntType(32)


def _load_bytes(context, builder, arrty, arr, index, n):
    data = context.make_array(arrty)(context, builder, arr).data
    ptr = builder.gep(data, [index], inbounds=True, source_etype=_I8)
    return builder.load(ptr, typ=ir.VectorType(_I8, n), align=1)


def _field(builder, v, shift, mask):
    """``(v >> shift) & mask`` lane by lane on a byte vector."""
    n = v.type.count
    if shift:
        v = builder.lshr(v, ir.Constant(v.type, [shift] * n))
    if mask != 0xFF:
        v = builder.and_(v, ir.Constant(v.type, [mask] * n))
    return v


def _dot_with(context, builder, sig, args, w):
    """The int32 sum of ``w * xq[xi : xi + len(w)]`` (args ``..., xq, xi`` last)."""
    x = _load_bytes(context, builder, sig.args[-2], args[-2], args[-1], w.type.count)
    vt = ir.VectorType(_I32, w.type.count)
    return _reduce_add(builder, builder.mul(builder.zext(w, vt), builder.sext(x, vt)))


def _reduce_add(builder, v):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [v.type]),
                                        f"llvm.vector.reduce.add.v{v.type.count}i32")
    return builder.call(fn, [v])


def _nibble_dot(n, shift):
    """``dot(q, qi, xq, xi)``: the low (shift 0) or high (shift 4) nibbles of the n bytes at
    q[qi:] times the n quants at xq[xi:]."""
    @intrinsic
    def dot(typingctx, q, qi, xq, xi):
        def codegen(context, builder, sig, args):
            v = _load_bytes(context, builder, sig.args[0], args[0], args[1], n)
            return _dot_with(context, builder, sig, args, _field(builder, v, shift, 0xF))
        return types.int32(q, qi, xq, xi), codegen
    return dot


def _q6_dot(nib_shift, hi_shift):
    """``dot(q, lo, hi, xq, xi)``: 16 Q6_K quants, 4 bits of the bytes at q[lo:] and 2 of those
    at q[hi:] (unsigned, 0..63), times the 16 quants at xq[xi:]."""
    @intrinsic
    def dot(typingctx, q, lo, hi, xq, xi):
        def codegen(context, builder, sig, args):
            low = _load_bytes(context, builder, sig.args[0], args[0], args[1], 16)
            top = _load_bytes(context, builder, sig.args[0], args[0], args[2], 16)
            low, top = _field(builder, low, nib_shift, 0xF), _field(builder, top, hi_shift, 3)
            w = builder.or_(low, builder.shl(top, ir.Constant(top.type, [4] * 16)))
            return _dot_with(context, builder, sig, args, w)
        return types.int32(q, lo, hi, xq, xi), codegen
    return dot


_dot_lo32 = _nibble_dot(32, 0)  # Q4_K: the two sub-blocks of a 32-byte group
_dot_hi32 = _nibble_dot(32, 4)


_dot_q6_0, _dot_q6_1, _dot_q6_2, _dot_q6_3 = _q6_dot(0, 0), _q6_dot(0, 2), _q6_dot(4, 4), _q6_dot(4, 6)


@njit(inline="always")
def _i(v):
    return I32(v)


@njit(inline="always")
def _row_dot(kind, q, r, wd, wm, wsc, wmn, xq, xd, xsum):
    """Weight row r (``q`` is the flat blocks) times one quantized activation row: llama.cpp's
    ``ggml_vec_dot_<w>_<x>``, with the same integer sums per block, for the formats the
    whole-row dots do not cover (Q4_K, Q6_K)."""
    nb = wd.shape[1]
    row = r * (q.shape[0] // wd.shape[0])
    acc = F32(0)
    if kind == WQ4_K:
        # 144-byte super-blocks: f16 d, f16 dmin, 12 bytes of 6-bit scales / mins (unpacked into
        # wsc / wmn), 128 nibble bytes: 4 groups of 32 bytes, low nibbles then high nibbles.
        # A weight is d * scale * n - dmin * min, so the mins meet x's sums per 16 (bsums).
        for b in range(nb):
            isum, msum = I32(0), I32(0)
            for g in range(4):
                at, xo, k, s16 = row + b * 144 + 16 + 32 * g, b * 256 + 64 * g, b * 8 + 2 * g, b * 16 + 4 * g
                isum = I32(isum + _i(wsc[r, k]) * _dot_lo32(q, at, xq, xo)
                           + _i(wsc[r, k + 1]) * _dot_hi32(q, at, xq, xo + 32))
                msum = I32(msum + _i(wmn[r, k]) * (xsum[s16] + xsum[s16 + 1])
                           + _i(wmn[r, k + 1]) * (xsum[s16 + 2] + xsum[s16 + 3]))
            acc += F32(isum) * (wd[r, b] * xd[b]) - F32(msum) * (wm[r, b] * xd[b])
    else:
        # Q6_K: 210-byte super-blocks of 128 low-nibble bytes, 64 bytes of 2-bit high parts, 16
        # int8 sub-scales, f16 d. A half (128 weights) reads byte l of its low and high runs for
        # weights l, l+32, l+64, l+96; each sub-scale covers 16 of them. Quants are 0..63 - 32.
        for b in range(nb):
            isum = I32(0)
            blk = row + b * 210
            for half in range(2):
                ql, qh, xo = blk + 64 * half, blk + 128 + 32 * half, b * 256 + 128 * half
                for kk in range(2):  # run p of 16 at l = 16 kk: scale 2 p + kk, x sums likewise
                    a, h, x, sc, s16 = ql + 16 * kk, qh + 16 * kk, xo + 16 * kk, blk + 192 + 8 * half + kk, \
                        b * 16 + 8 * half + kk
                    d0 = _dot_q6_0(q, a, h, xq, x) - 32 * xsum[s16]
                    d1 = _dot_q6_1(q, a + 32, h, xq, x + 32) - 32 * xsum[s16 + 2]
                    d2 = _dot_q6_2(q, a, h, xq, x + 64) - 32 * xsum[s16 + 4]
                    d3 = _dot_q6_3(q, a + 32, h, xq, x + 96) - 32 * xsum[s16 + 6]
                    isum = I32(isum + _i(np.int8(q[sc])) * d0 + _i(np.int8(q[sc + 2])) * d1
                               + _i(np.int8(q[sc + 4])) * d2 + _i(np.int8(q[sc + 6])) * d3)
            acc += F32(isum) * (wd[r, b] * xd[b])
    return acc


@njit(**_KERNEL)
def _rows_matmul(kind, w, xg, d, s, nsum, out):
    """``out[t, r]`` = repacked weight row r (:mod:`.quant_int8_rows`) times activation row t
    (:func:`quantize_grouped`'s). Each (r, t) is the same operations whatever T is, so a row of
    X gets the same bits alone or among others."""
    rows = out.shape[1]
    w2 = w.reshape(rows, -1)
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        rows_products(kind, w2, c * ROW_CHUNK, min(rows, c * ROW_CHUNK + ROW_CHUNK), xg, d, s, nsum, out)


@njit(**_KERNEL)
def _superblocks_matmul(kind, q, wd, wm, wsc, wmn, qs, d, sums, out):
    """``out[t, r]`` = Q4_K / Q6_K weight row r times Q8_K activation row t (``_row_dot``)."""
    rows = out.shape[1]
    q2 = q.reshape(rows, -1)  # rows of blocks, for prefetch_row
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        for r in range(c * ROW_CHUNK, min(rows, c * ROW_CHUNK + ROW_CHUNK)):
            prefetch_row(q2, r)
            for t in range(qs.shape[0]):
                out[t, r] = _row_dot(kind, q, r, wd, wm, wsc, wmn, qs[t], d[t], sums[t])


@njit(cache=True, nogil=True)
def _quantize_q8_k(X):
    qs, d, s, sums = _activation_buffers(AQ8_K, X.shape[0], X.shape[1])
    _quantize_rows(AQ8_K, X, qs, d, s, sums)
    return qs, d, sums


# ---------------------------------------------------------------------------------------------
# Per-matrix scale arrays, built once from the file's blocks (float16 fields as float32, Q4_K's
# packed 6-bit scales unpacked) and kept while the matrix lives.

_NONE_F = _read_only(np.zeros((1, 1), F32))
_NONE_U = _read_only(np.zeros((1, 1), np.uint8))
_sides: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_sides_lock = threading.Lock()


def _f16_at(blocks: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, :, at:at + 2]).view("<f2")[..., 0].astype(F32)


def _build_side(qm: QuantMatrix) -> tuple:
    kind, akind = _WEIGHT_KIND[GT(qm.ggml_type)]
    raw = qm.raw_blocks
    elems = 256 if akind == AQ8_K else 32
    if kind not in (WQ4_K, WQ6_K):  # repacked rows carry their own scales
        return kind, _read_only(repack(kind, raw, qm.shape[1] // elems).reshape(-1))
    blocks = raw.reshape(raw.shape[0], qm.shape[1] // elems, -1)
    wd = _f16_at(blocks, 208 if kind == WQ6_K else 0)  # the (super-)block scale d
    wm, wsc, wmn = _NONE_F, _NONE_U, _NONE_U  # placeholders: one compiled kernel for every format
    if kind in (WQ4_1, WQ5_1, WQ4_K):
        wm = _f16_at(blocks, 2)
    if kind == WQ4_K:
        rows, nb = wd.shape
        packed = blocks[:, :, 4:16].reshape(rows, nb, 3, 4)
        lo, mid, top = packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]
        wsc = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=-1).reshape(rows, nb * 8)
        wmn = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=-1).reshape(rows, nb * 8)
    return (kind, raw.reshape(-1), *(_read_only(np.ascontiguousarray(a)) for a in (wd, wm, wsc, wmn)))


def _side(qm: QuantMatrix) -> tuple:
    side = _sides.get(qm)
    if side is None:
        with _sides_lock:
            side = _sides.get(qm)
            if side is None:
                side = _sides[qm] = _build_side(qm)
    return side


def supports(qm: QuantMatrix) -> bool:
    """Whether :func:`int8_matvec` has a kernel for this matrix's encoding."""
    return isinstance(qm, QuantMatrix) and qm.raw_blocks is not None and qm.ggml_type in _WEIGHT_KIND


def int8_matmul(qm: QuantMatrix, X: np.ndarray) -> np.ndarray:
    """``X @ W.T`` with each row of ``X[T, in]`` quantized to 8 bits as llama.cpp does for
    ``qm``'s format (Q8_1 for Q4_1 / Q5_1, Q8_K for Q4_K / Q6_K, Q8_0 otherwise) and integer dot
    products per block -> float32 ``[T, out]``. Row t has the same bits as ``int8_matvec(qm, X[t])``.

    Raises:
        LoomConfigError: the matrix's encoding has no integer kernel (see ``INT8_TYPES``).
        LoomShapeError: ``X`` is not ``(T, in_features)``.
    """
    if not supports(qm):
        raise LoomConfigError(f"int8 activations need a {', '.join(INT8_TYPES)} matrix; got {qm!r}")
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != qm.shape[1]:
        raise LoomShapeError(f"{qm.type_name} matrix {qm.shape} needs input (T, {qm.shape[1]}); "
                             f"got {X.shape}")
    return int8_product(qm, np.ascontiguousarray(X, dtype=F32))


def int8_product(qm: QuantMatrix, X: np.ndarray) -> np.ndarray:
    """:func:`int8_matmul` without its checks, for a caller that has made them (``linear()``, a
    few microseconds per matrix, ~200 matrices a token): ``qm`` supported, ``X`` float32
    C-contiguous ``(T, in_features)``."""
    return int8_products((qm,), X)[0]


def int8_products(qms, X: np.ndarray) -> list[np.ndarray]:
    """:func:`int8_product` of each matrix with the same ``X``, which is quantized once per
    activation kind (attention's Q, K and V, the MLP's gate and up share their input)."""
    _pace()
    X = _read_only(X)
    grouped = superblocks = None
    outs = []
    for qm in qms:
        kind, *side = _side(qm)
        out = np.empty((X.shape[0], qm.shape[0]), F32)
        if kind in (WQ4_K, WQ6_K):
            superblocks = superblocks or _quantize_q8_k(X)
            _superblocks_matmul(kind, *side, *superblocks, out)
        else:
            grouped = grouped or quantize_grouped(X)
            _rows_matmul(kind, *side, *grouped, out)
        outs.append(out)
    return outs


def int8_matvec(qm: QuantMatrix, x: np.ndarray) -> np.ndarray:
    """``W @ x`` for one vector ``x[in]`` with 8-bit activations (:func:`int8_matmul`) -> float32
    ``[out]``."""
    x = np.asarray(x)
    if x.ndim != 1:
        raise LoomShapeError(f"int8_matvec needs a vector x of shape ({qm.shape[1]},); got {x.shape}")
    return int8_matmul(qm, x[None])[0]


_mode = threading.local()


@contextmanager
def int8_activations(enabled: bool = True):
    """A context in which this thread's decode may use the integer kernels: ``linear()`` can ask
    :func:`int8_enabled` and call :func:`int8_matmul` for a supported matrix."""
    before = getattr(_mode, "on", False)
    _mode.on = enabled
    try:
        yield
    finally:
        _mode.on = before


def int8_enabled() -> bool:
    """Whether the calling thread is inside :func:`int8_activations`."""
    return getattr(_mode, "on", False)
