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

import math
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

F32 = np.float32
I32 = np.int32

# Activation kinds; the names are llama.cpp's block types.
AQ8_0, AQ8_1, AQ8_K = 0, 1, 2
ACTIVATION_KINDS = {"Q8_0": AQ8_0, "Q8_1": AQ8_1, "Q8_K": AQ8_K}
_BLOCK = {AQ8_0: 32, AQ8_1: 32, AQ8_K: 256}

# Weight kinds of the kernel, and the activation each one takes (llama.cpp's vec_dot_type).
WQ4_0, WQ4_1, WQ5_0, WQ5_1, WQ8_0, WQ4_K, WQ6_K = range(7)
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


@njit(inline="always")
def _fp16_round(v):
    """float32 ``v`` rounded to the nearest float16 (ties to even, as F16C's conversion), as
    float32: numba has no float16 type. Scaling by powers of two is exact, so ``rint`` on the
    scaled value is the conversion's rounding; below fp16's smallest normal the step is 2^-24."""
    a = abs(np.float64(v))
    if a == 0.0:
        return F32(v)
    e = math.frexp(a)[1]  # a in [2^(e-1), 2^e): fp16 keeps 10 bits below the leading one
    step = math.ldexp(1.0, max(e - 11, -24))
    r = np.rint(a / step) * step
    if r >= 65520.0:
        r = np.inf
    return F32(math.copysign(r, v))


@njit(inline="always")
def _roundf(v):
    """C's ``roundf``: halves away from zero (numpy's rint rounds them to even)."""
    r = np.trunc(v)
    if abs(v - r) >= F32(0.5):
        r += F32(math.copysign(1.0, v))
    return r


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
                amax = F32(0)
                for j in range(B):
                    amax = max(amax, abs(x[o + j]))
                dd = amax / F32(127)
                inv = F32(1) / dd if dd != 0 else F32(0)
                acc = I32(0)
                for j in range(B):
                    q = np.int32(_roundf(x[o + j] * inv))
                    qs[t, o + j] = q
                    acc += q
                d[t, b] = _fp16_round(dd)
                sums[t, b] = acc
                s[t, b] = _fp16_round(F32(acc) * dd) if akind == AQ8_1 else F32(0)


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


def _concat(builder, a, b):
    n = a.type.count
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, 2 * n), list(range(2 * n))))


def _dot_with(context, builder, sig, args, w):
    """The int32 sum of ``w * xq[xi : xi + len(w)]`` (args ``..., xq, xi`` last)."""
    x = _load_bytes(context, builder, sig.args[-2], args[-2], args[-1], w.type.count)
    vt = ir.VectorType(_I32, w.type.count)
    return _reduce_add(builder, builder.mul(builder.zext(w, vt), builder.sext(x, vt)))


def _reduce_add(builder, v):
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I32, [v.type]),
                                        f"llvm.vector.reduce.add.v{v.type.count}i32")
    return builder.call(fn, [v])


def _nibble_dot(n, fields):
    """``dot(q, qi, xq, xi)``: fields f = (shift, mask) of the n bytes at q[qi:], concatenated, times
    the ``n * len(fields)`` quants at xq[xi:]."""
    @intrinsic
    def dot(typingctx, q, qi, xq, xi):
        def codegen(context, builder, sig, args):
            v = _load_bytes(context, builder, sig.args[0], args[0], args[1], n)
            parts = [_field(builder, v, *f) for f in fields]
            w = parts[0] if len(parts) == 1 else _concat(builder, *parts)
            return _dot_with(context, builder, sig, args, w)
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


_dot_lo32 = _nibble_dot(32, ((0, 0xF),))  # Q4_K: the two sub-blocks of a 32-byte group
_dot_hi32 = _nibble_dot(32, ((4, 0xF),))


# ---------------------------------------------------------------------------------------------
# Whole-row dots for the 32-weight block formats (Q4_0, Q4_1, Q8_0): the loop over a row's blocks
# in IR too, as llama.cpp's AVX2 ``ggml_vec_dot`` loops do. Each block's integer products are
# summed only down to 8 int32 lanes (one ``vpdpbusd`` with VNNI), converted to float and added
# to 8 float lanes times the block's scale; the lanes are summed once per row. The per-block
# dots above reduce every block to one integer (a horizontal sum, ~6 instructions) and then
# scale it in scalar code: twice the instructions per block. Summing the lanes in a fixed tree
# keeps a row's result the same whatever else is multiplied.

_F32 = ir.FloatType()
_V8I, _V8F = ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)
_V32I, _V16F = ir.VectorType(_I32, 32), ir.VectorType(_F32, 16)


def _host_features() -> dict:
    """The CPU features numba compiles for: the host's, or none where NUMBA_CPU_NAME names
    another target (e.g. ``generic`` for a portable cache)."""
    from llvmlite import binding as llvm
    from numba.core import config

    if config.CPU_NAME and config.CPU_NAME != "host":
        return {}
    return llvm.get_host_cpu_features()


def _host_has_vnni() -> bool:
    """Whether numba compiles for a CPU with VNNI on 256-bit vectors."""
    features = _host_features()
    return bool(features.get("avxvnni") or (features.get("avx512vnni") and features.get("avx512vl")))


def _host_has_vnni512() -> bool:
    """Whether numba compiles for a CPU with VNNI on 512-bit vectors (and byte ops on them)."""
    features = _host_features()
    return bool(features.get("avx512vnni") and features.get("avx512bw"))


def _vpdpbusd(builder, w, x, lanes):
    vt = ir.VectorType(_I32, lanes)
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                                        f"llvm.x86.avx512.vpdpbusd.{32 * lanes}")
    return builder.call(fn, [ir.Constant(vt, [0] * lanes), builder.bitcast(w, vt), builder.bitcast(x, vt)])


def _lanes_dot(builder, w, x):
    """Partial sums of the products ``w[j] * x[j]`` (w unsigned, x signed bytes; 32 or 64 of
    them) in 8 or 16 int32 lanes: lane i holds products 4i..4i+3 (vpdpbusd's grouping; the
    generic code's differs, which only moves integers between lanes of one block, scaled alike)."""
    n = w.type.count
    if n == 64 and _host_has_vnni512():
        return _vpdpbusd(builder, w, x, 16)
    if n == 64:  # two blocks of 32, each as below
        def half(v, h):
            return builder.shuffle_vector(v, v, ir.Constant(_V32I, list(range(h, h + 32))))
        halves = [_lanes_dot(builder, half(w, h), half(x, h)) for h in (0, 32)]
        return builder.shuffle_vector(*halves, ir.Constant(ir.VectorType(_I32, 16), list(range(16))))
    if _host_has_vnni():
        return _vpdpbusd(builder, w, x, 8)
    v32 = ir.VectorType(_I32, 32)
    p = builder.mul(builder.zext(w, v32), builder.sext(x, v32))
    quarter = [builder.shuffle_vector(p, p, ir.Constant(_V8I, list(range(8 * k, 8 * k + 8))))
               for k in range(4)]
    return builder.add(builder.add(quarter[0], quarter[1]), builder.add(quarter[2], quarter[3]))


def _tree_sum(builder, v):
    """The 8 lanes of ``v`` summed in a fixed tree: (0+4 + 2+6) + (1+5 + 3+7)."""
    for half in (4, 2, 1):
        hi = builder.shuffle_vector(v, v, ir.Constant(_V8I, [(i + half) % 8 for i in range(8)]))
        v = builder.fadd(v, hi)
    return builder.extract_element(v, _I32(0))


def _rows_blocks_dot(kind, n):
    """``dot(q, qi, xq, t0, wd, xd, wm, xs, xsum)``: the weight row whose blocks start at byte
    ``qi`` of ``q`` times the ``n`` quantized activation rows ``t0 .. t0 + n - 1`` of ``xq``
    (int8 [T, cols]) -> a tuple of n float32. ``wd`` and ``wm`` are the weight row's block
    scales and offsets (1-D; ``wm`` read for Q4_1 only), ``xd``, ``xs`` and ``xsum`` the
    activations' (2-D, a row per activation row). Blocks go two at a time (one 512-bit vpdpbusd
    where the CPU has it), each block's weights unpacked once for the n rows; every row gets the
    same operations as with n = 1 (its own accumulators)."""
    bbytes, qoff = {WQ4_0: (18, 2), WQ4_1: (20, 4), WQ5_0: (22, 2), WQ5_1: (24, 4), WQ8_0: (34, 2)}[kind]
    zero = {WQ4_0: 8, WQ5_0: 16}.get(kind, 0)  # quants stored as n + zero (none for the others)

    @intrinsic
    def dot(typingctx, q, qi, xq, t0, wd, xd, wm, xs, xsum):
        def codegen(context, builder, sig, args):
            qa, xqa, wda, xda, wma, xsa, suma = (context.make_array(sig.args[i])(context, builder, args[i])
                                                 for i in (0, 2, 4, 5, 6, 7, 8))
            nb = cgutils.unpack_tuple(builder, wda.shape, 1)[0]  # the row's blocks
            i64 = nb.type

            def rows(a):
                """Pointers to rows t0 .. t0 + n - 1 of the C-contiguous 2-D array ``a``."""
                width = cgutils.unpack_tuple(builder, a.shape, 2)[1]
                return [builder.gep(a.data, [builder.mul(builder.add(args[3], i64(i)), width)], inbounds=True)
                        for i in range(n)]

            def at(ptr, i):
                return builder.load(builder.gep(ptr, [i], inbounds=True))

            def vector(ptr, i, vt):
                where = builder.bitcast(builder.gep(ptr, [i], inbounds=True), vt.as_pointer())
                return builder.load(where, align=1)

            xq_rows, xd_rows, xs_rows, sum_rows = rows(xqa), rows(xda), rows(xsa), rows(suma)
            v16, v32 = ir.VectorType(_I8, 16), ir.VectorType(_I8, 32)
            # per activation row: even and odd blocks in the low and high 8 lanes of one 16-lane
            # accumulator (two chains of float adds), a last odd-numbered block in an 8-lane one
            pair_accs = [cgutils.alloca_once_value(builder, ir.Constant(_V16F, [0.0] * 16)) for _ in range(n)]
            tail_accs = [cgutils.alloca_once_value(builder, ir.Constant(_V8F, [0.0] * 8)) for _ in range(n)]
            offsets = [cgutils.alloca_once_value(builder, _F32(0.0)) for _ in range(n)]

            def weights(b):
                """Block b's 32 quants as unsigned bytes (Q8_0: magnitudes, and the sign mask)."""
                quants = builder.add(args[1], builder.add(builder.mul(b, i64(bbytes)), i64(qoff)))
                if kind == WQ8_0:  # |w| (u8) times x with w's sign, so the product is u8 x s8 as
                    # for the nibbles (llama.cpp's AVX2 sign trick); |x| <= 127, so -x cannot overflow
                    w = vector(qa.data, quants, v32)
                    negative = builder.icmp_signed("<", w, ir.Constant(v32, [0] * 32))
                    return builder.select(negative, builder.neg(w), w), negative
                v = vector(qa.data, builder.add(quants, i64(4)) if kind in (WQ5_0, WQ5_1) else quants, v16)
                w = _concat(builder, _field(builder, v, 0, 0xF), _field(builder, v, 4, 0xF))
                if kind == WQ5_0 or kind == WQ5_1:  # 4 bytes of fifth bits (bit j: weight j) first
                    bits = builder.bitcast(vector(qa.data, quants, ir.VectorType(_I8, 4)),
                                           ir.VectorType(ir.IntType(1), 32))  # x86 is little-endian
                    w = builder.or_(w, builder.shl(builder.zext(bits, v32), ir.Constant(v32, [4] * 32)))
                return w, None

            def unit(b, k, accs):
                """Blocks b .. b + k - 1 (k = 1 or 2) of the row times each activation row, into
                ``accs`` (8 k lanes per row: lanes 8j .. 8j + 7 take block b + j)."""
                parts = [weights(builder.add(b, i64(j))) for j in range(k)]
                w = parts[0][0] if k == 1 else _concat(builder, parts[0][0], parts[1][0])
                vt, ft = ir.VectorType(_I8, 32 * k), ir.VectorType(_F32, 8 * k)
                it = ir.VectorType(_I32, 8 * k)
                for i in range(n):
                    xv = vector(xq_rows[i], builder.mul(b, i64(32)), vt)
                    if kind == WQ8_0:
                        negative = parts[0][1] if k == 1 else _concat(builder, parts[0][1], parts[1][1])
                        xv = builder.select(negative, builder.neg(xv), xv)
                    lanes = _lanes_dot(builder, w, xv)
                    scales, fix = ir.Constant(ft, ir.Undefined), ir.Constant(it, [0] * (8 * k))
                    for j in range(k):
                        bj = builder.add(b, i64(j))
                        scale = builder.fmul(at(wda.data, bj), at(xd_rows[i], bj))
                        scales = builder.insert_element(scales, scale, _I32(8 * j))
                        if zero:  # quants are n + zero: subtract zero * sum(x quants) in the block's lane 0
                            fix = builder.insert_element(fix, builder.mul(at(sum_rows[i], bj), _I32(-zero)),
                                                         _I32(8 * j))
                        if kind == WQ4_1 or kind == WQ5_1:  # + m * s per block
                            term = builder.fmul(at(wma.data, bj), at(xs_rows[i], bj))
                            builder.store(builder.fadd(builder.load(offsets[i]), term), offsets[i])
                    if zero:
                        lanes = builder.add(lanes, fix)
                    spread = ir.Constant(it, [8 * (m // 8) for m in range(8 * k)])
                    scales = builder.shuffle_vector(scales, scales, spread)
                    scaled = builder.fmul(builder.sitofp(lanes, ft), scales)
                    builder.store(builder.fadd(builder.load(accs[i]), scaled), accs[i])

            with cgutils.for_range(builder, builder.udiv(nb, i64(2))) as loop:
                unit(builder.mul(loop.index, i64(2)), 2, pair_accs)
            with builder.if_then(builder.icmp_unsigned("==", builder.urem(nb, i64(2)), i64(1))):
                unit(builder.sub(nb, i64(1)), 1, tail_accs)
            sums = []
            for i in range(n):
                pair = builder.load(pair_accs[i])
                low, high = (builder.shuffle_vector(pair, pair, ir.Constant(_V8I, list(range(h, h + 8))))
                             for h in (0, 8))
                acc = builder.fadd(builder.fadd(low, builder.load(tail_accs[i])), high)
                sums.append(builder.fadd(_tree_sum(builder, acc), builder.load(offsets[i])))
            return context.make_tuple(builder, sig.return_type, sums)
        return types.UniTuple(types.float32, n)(q, qi, xq, t0, wd, xd, wm, xs, xsum), codegen
    return dot


ROWS_AT_ONCE = 4  # activation rows per pass over a weight row (batched decode, short prompts)
_ROW_KINDS = (WQ4_0, WQ4_1, WQ5_0, WQ5_1, WQ8_0)


def _by_kind(n):
    """One function over the whole-row dots of n activation rows, picking the format's by kind."""
    q4_0, q4_1, q5_0, q5_1, q8_0 = (_rows_blocks_dot(k, n) for k in _ROW_KINDS)

    @njit(inline="always")
    def dot(kind, q, row, qs, t, wd, d, wm, s, sums):
        if kind == WQ4_0:
            return q4_0(q, row, qs, t, wd, d, wm, s, sums)
        if kind == WQ4_1:
            return q4_1(q, row, qs, t, wd, d, wm, s, sums)
        if kind == WQ5_0:
            return q5_0(q, row, qs, t, wd, d, wm, s, sums)
        if kind == WQ5_1:
            return q5_1(q, row, qs, t, wd, d, wm, s, sums)
        return q8_0(q, row, qs, t, wd, d, wm, s, sums)
    return dot


_dot_one, _dot_many = _by_kind(1), _by_kind(ROWS_AT_ONCE)


@njit(inline="always")
def _has_row_dots(kind):
    return kind == WQ4_0 or kind == WQ4_1 or kind == WQ5_0 or kind == WQ5_1 or kind == WQ8_0


@njit(inline="always")
def _blocks_row_products(kind, q, r, wd, wm, qs, d, s, sums, out):
    """``out[:, r]`` for weight row r of a format with whole-row dots: ROWS_AT_ONCE activation
    rows per call, then the rest one by one (the same bits either way)."""
    row = r * (q.shape[0] // wd.shape[0])
    with_offsets = kind == WQ4_1 or kind == WQ5_1
    wdr, wmr = wd[r], wm[r] if with_offsets else wd[r]  # no offsets: any row of the right length
    T, t = qs.shape[0], 0
    while t + ROWS_AT_ONCE <= T:
        v = _dot_many(kind, q, row, qs, t, wdr, d, wmr, s, sums)
        for i in range(ROWS_AT_ONCE):
            out[t + i, r] = v[i]
        t += ROWS_AT_ONCE
    while t < T:
        out[t, r] = _dot_one(kind, q, row, qs, t, wdr, d, wmr, s, sums)[0]
        t += 1


_dot_q6_0, _dot_q6_1, _dot_q6_2, _dot_q6_3 = _q6_dot(0, 0), _q6_dot(0, 2), _q6_dot(4, 4), _q6_dot(4, 6)


@njit(inline="always")
def _i(v):
    return I32(v)


@njit(inline="always")
def _row_dot(kind, q, r, wd, wm, wsc, wmn, xq, xd, xs, xsum):
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
def _int8_matmul(kind, akind, q, wd, wm, wsc, wmn, X, out):
    """``out[t, r]`` = weight row r times row t of ``X`` quantized to ``akind``. Each (r, t) is
    the same operations whatever T is, so a row of X gets the same bits alone or among others."""
    qs, d, s, sums = _activation_buffers(akind, X.shape[0], X.shape[1])
    _quantize_rows(akind, X, qs, d, s, sums)
    rows = wd.shape[0]
    q2 = q.reshape(rows, -1)  # rows of blocks, for prefetch_row
    for c in prange((rows + ROW_CHUNK - 1) // ROW_CHUNK):
        for r in range(c * ROW_CHUNK, min(rows, c * ROW_CHUNK + ROW_CHUNK)):
            prefetch_row(q2, r)
            if _has_row_dots(kind):
                _blocks_row_products(kind, q, r, wd, wm, qs, d, s, sums, out)
            else:
                for t in range(X.shape[0]):
                    out[t, r] = _row_dot(kind, q, r, wd, wm, wsc, wmn, qs[t], d[t], s[t], sums[t])


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
    return (kind, akind, raw.reshape(-1), *(_read_only(np.ascontiguousarray(a)) for a in (wd, wm, wsc, wmn)))


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
    out = np.empty((X.shape[0], qm.shape[0]), F32)
    _pace()
    _int8_matmul(*_side(qm), _read_only(X), out)
    return out


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
