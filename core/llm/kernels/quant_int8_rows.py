"""Whole-row integer dots for the 32-weight block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL,
MXFP4), on weight rows repacked once so that four blocks are one 64-byte load and no byte is
shuffled.

Why repack: a GGUF block keeps its f16 scale(s) before its quants (18, 20, 22, 24 or 34 bytes),
so two blocks' quants never sit side by side; gathering them into one 512-bit register takes
three cross-lane shuffles per two blocks, and x86 runs those on one port, which then bounds the
kernel. llama.cpp repacks Q4_0 for the same reason (its ``repack`` CPU buffer type). Here each
weight row becomes, in the same number of bytes as the file's blocks:

    nibble formats: the blocks' 16 quant bytes one after another (low nibble: weight i of the
                    block, high nibble: weight 16 + i), then for Q5_0 / Q5_1 the fifth bits of
                    weights 0-15 of every block (u16 each), then those of weights 16-31, then
                    every block's f16 scale d, then (Q4_1, Q5_1) every block's f16 offset m.
    Q8_0:           per group of blocks, bytes 0-15 of each block's quants, then bytes 16-31,
                    stored as ``w + 128`` (unsigned: vpdpbusd multiplies u8 by s8), then the
                    f16 scales.
    IQ4_NL, MXFP4:  as Q4_0: the nibbles, then the scales (MXFP4's E8M0 exponents as the
                    float32 scales they stand for: an exponent beyond float16's range is valid).

Blocks go in groups of four (then a group of two, then one, for the rest of a row). A group's
low halves (the low nibbles, or Q8_0's first 16 bytes) are one vector of 16 k bytes and its
high halves another; the activations are laid out alike per call (:func:`quantize_grouped`:
each block's first 16 quants, then its last 16). ``vpdpbusd`` of the low halves, then of the
high halves into the same 4 k int32 lanes, leaves block j's sum in lanes 4j .. 4j+3, the zero
point's correction (``-zero * sum(x quants)``, exact in integers) added as the starting value of
lane 4j. Then one float multiply-add per group by the scales ``d * d_x`` spread to four lanes
each; Q4_1 / Q5_1 add ``m * s`` per block in a separate float vector. IQ4_NL's and MXFP4's
nibbles index a table of signed values (looked up with ``vpshufb``), multiplied by llama.cpp's
sign trick (:func:`sign_moved`). Each activation row's sum is reduced in a fixed order, so a row
gets the same bits alone or among others.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from .kernel_hints import AHEAD_BYTES, prefetch_row, prefetch_until
from .quant import IQ4_VALUES, MXFP4_VALUES, mxfp4_scales

F32 = np.float32

# Weight kinds (quant_int8's numbering, which imports these) and the constants of their layout.
WQ4_0, WQ4_1, WQ5_0, WQ5_1, WQ8_0 = range(5)
WIQ4_NL, WMXFP4 = 14, 15  # after the tiles' and super-blocks' kinds
ROW_KINDS = (WQ4_0, WQ4_1, WQ5_0, WQ5_1, WQ8_0, WIQ4_NL, WMXFP4)
_BLOCK_BYTES = {WQ4_0: 18, WQ4_1: 20, WQ5_0: 22, WQ5_1: 24, WQ8_0: 34, WIQ4_NL: 18, WMXFP4: 17}
_TABLES = {WIQ4_NL: IQ4_VALUES, WMXFP4: MXFP4_VALUES}  # each nibble's signed value
_ZERO_SHIFT = {WQ4_0: 3, WQ5_0: 4, WQ8_0: 7}  # stored quants are value + 2^shift
_HAS_M = (WQ4_1, WQ5_1)
_HAS_QH = (WQ5_0, WQ5_1)
ROWS_AT_ONCE = 4  # activation rows per pass over a weight row (batched decode, short prompts)

_I1, _I8, _I16, _I32, _I64 = ir.IntType(1), ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.IntType(64)
_F16, _F32 = ir.HalfType(), ir.FloatType()


@njit(cache=True, nogil=True, parallel=True)
def _q8_0_halves(blocks):
    """Q8_0 blocks ``[rows, nb, 34]`` -> their quants in the group layout (per group, the first
    16 bytes of its blocks, then their last 16), each stored as ``w + 128`` (unsigned):
    ``[rows, nb * 32]``. One pass in parallel: a 168 MB LM head takes tenths of a second."""
    rows, nb = blocks.shape[0], blocks.shape[1]
    out = np.empty((rows, nb * 32), np.uint8)
    full = nb // 4 * 4
    for r in prange(rows):
        b = 0
        while b < nb:
            k = 4 if b < full else (2 if nb - b >= 2 else 1)
            for j in range(k):
                for half in range(2):
                    dst = b * 32 + 16 * (half * k + j)
                    for i in range(16):
                        out[r, dst + i] = blocks[r, b + j, 2 + 16 * half + i] ^ 0x80
            b += k
    return out


def repack(kind: int, raw: np.ndarray, nb: int) -> np.ndarray:
    """The file's blocks ``raw`` (uint8, ``rows * nb`` blocks) as repacked rows (module doc):
    uint8 ``[rows, nb * block bytes]``."""
    bbytes = _BLOCK_BYTES[kind]
    blocks = raw.reshape(-1, nb, bbytes)
    rows = blocks.shape[0]
    scales = [blocks[:, :, 0:2]] + ([blocks[:, :, 2:4]] if kind in _HAS_M else [])  # f16 d, then m
    if kind == WQ8_0:
        quants = (_q8_0_halves(blocks),)
    elif kind == WMXFP4:
        quants, scales = (blocks[:, :, 1:],), [mxfp4_scales(blocks).view(np.uint8)]
    else:
        start = 4 if kind in _HAS_M else 2
        quants = (blocks[:, :, start + 4 * (kind in _HAS_QH):],)
        if kind in _HAS_QH:  # the fifth bits' u32: weights 0-15 low, 16-31 high (little-endian)
            qh = blocks[:, :, start:start + 4]
            quants += (qh[:, :, 0:2], qh[:, :, 2:4])
    parts = [np.ascontiguousarray(p).reshape(rows, -1) for p in (*quants, *scales)]
    return np.ascontiguousarray(np.concatenate(parts, axis=1))


# ---------------------------------------------------------------------------------------------
# Activations: llama.cpp's Q8_0 / Q8_1 quantization (``quantize_row_q8_1_ref``), written straight
# into the group layout. Scalar helpers shared with quant_int8's other activation kinds.


@intrinsic
def _bits_of(typingctx, v):
    """A float32's bits as int32."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _I32)
    return types.int32(types.float32), codegen


@intrinsic
def _float_of(typingctx, u):
    """int32 bits as a float32."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(args[0], _F32)
    return types.float32(types.int32), codegen


@njit(inline="always")
def fp16_round(v):
    """float32 ``v`` rounded to the nearest float16 (ties to even, as F16C's conversion), as
    float32 (numba has no float16 type), in integer operations on its bits: ten fraction bits
    kept, rounding half to even by adding 0xFFF plus the lowest kept bit (a carry moves into the
    exponent, as it should); below fp16's smallest normal (2^-14) the step is 2^-24, which
    scaling by powers of two makes exact in float32. 65520 and up round to infinity."""
    u = _bits_of(F32(v))
    a = u & 0x7FFFFFFF
    if a > 0x7F800000:  # NaN stays NaN
        return F32(v)
    if a >= 0x477FF000:
        r = F32(np.inf)
    elif a < 0x38800000:
        r = np.rint(abs(F32(v)) * F32(2.0 ** 24)) * F32(2.0 ** -24)
    else:
        r = _float_of((a + 0xFFF + ((a >> 13) & 1)) & ~0x1FFF)
    return _float_of(_bits_of(r) | (u & ~0x7FFFFFFF))


@njit(inline="always")
def roundf(v):
    """C's ``roundf`` (halves away from zero; numpy's rint rounds them to even) as an int32, for
    ``|v| < 2**31`` (a quant's ``x / d`` is at most 127.5): truncated by the conversion, then one
    step away from zero where the dropped fraction is at least a half. No branch and no libm
    call, so a block's 32 roundings vectorize."""
    i = np.int32(v)
    step = np.int32(1) if v > 0 else np.int32(-1)
    return i + step if abs(v - F32(i)) >= F32(0.5) else i


@njit(inline="always")
def q8_scale(x, o):
    """Block ``x[o : o + 32]``'s Q8_0 scale ``max|x| / 127`` and its inverse (0 for a zero block).
    The maximum is taken over the magnitudes' bits as integers (the same order as the floats'),
    which vectorizes; a NaN in the block makes the scale NaN."""
    top = np.int32(0)
    for j in range(32):
        top = max(top, _bits_of(x[np.uint64(o + j)]) & 0x7FFFFFFF)
    dd = _float_of(top) / F32(127)
    return dd, (F32(1) / dd if dd != 0 else F32(0))


@njit(cache=True, nogil=True)
def quantize_grouped(X, xg, d, s, nsum):
    """Rows of ``X[T, n]`` (float32, n a multiple of 32) as Q8_1 in the group layout, written to
    the quants ``xg`` int8 ``[T, n]`` (per group, each block's first 16 quants, then each
    block's last 16), the scales ``d`` and Q8_1's ``s = fp16(d * sum)`` float32 ``[T, n / 32]``,
    and ``nsum`` int32 ``[T, n / 8]``: minus each block's quant sum at lane 4b (the other lanes
    stay as they are: zeros; the kernels shift it by the format's zero point). The quants, d and
    s are ``quantize_row_q8_1_ref``'s."""
    T, n = X.shape
    nb = n // 32
    full = nb // 4 * 4
    for t in range(T):
        x = X[t]
        for b in range(nb):
            if b < full:
                g, k = b // 4 * 4, 4
            elif nb - full >= 2 and b < full + 2:
                g, k = full, 2
            else:
                g, k = nb - 1, 1
            dd, inv = q8_scale(x, b * 32)
            acc = np.int32(0)
            for half in range(2):
                src, dst = b * 32 + 16 * half, g * 32 + 16 * (half * k + b - g)
                for i in range(16):
                    q = roundf(x[src + i] * inv)
                    xg[t, dst + i] = q
                    acc += q
            d[t, b] = fp16_round(dd)
            s[t, b] = fp16_round(F32(acc) * dd)
            nsum[t, 4 * b] = -acc


# ---------------------------------------------------------------------------------------------
# The IR.


def host_features() -> dict:
    """The CPU features numba compiles for: the host's, or none where NUMBA_CPU_NAME names
    another target (e.g. ``generic`` for a portable cache)."""
    from llvmlite import binding as llvm
    from numba.core import config

    if config.CPU_NAME and config.CPU_NAME != "host":
        return {}
    return llvm.get_host_cpu_features()


def host_has_vnni() -> bool:
    """Whether numba compiles for a CPU with VNNI on 128- and 256-bit vectors."""
    features = host_features()
    return bool(features.get("avxvnni") or (features.get("avx512vnni") and features.get("avx512vl")))


def host_has_vnni512() -> bool:
    """Whether numba compiles for a CPU with VNNI on 512-bit vectors (and byte ops on them)."""
    features = host_features()
    return bool(features.get("avx512vnni") and features.get("avx512bw"))


def lanes_dot(builder, acc, w, x):
    """``acc`` (int32, ``len(w) / 4`` lanes) plus the products ``w[j] * x[j]`` (w unsigned, x
    signed bytes; 16, 32 or 64 of them), lane i taking products 4i .. 4i+3: ``vpdpbusd``'s
    grouping, which the portable code follows exactly.

    On a CPU with AVX2 but no VNNI: llama.cpp's two instructions, ``vpmaddubsw`` (pairs of
    products summed in int16) and ``vpmaddwd`` by ones (pairs of those in int32), for weights
    below 128 (4-, 5- and 6-bit quants: a pair is at most 2 * 127 * 128, never saturated; Q8_0's
    take :func:`q8_dot`).

    The portable code multiplies in 16 bits (|w * x| <= 255 * 128 fits) and sums neighbours by
    reading the products as twice-wider lanes (low half sign-extended plus high half), twice, so
    no lane moves: strided shuffles of 64 int32 lanes cost LLVM's x86 back end about 4x the
    compile time on CPUs without VNNI, and ran no faster."""
    n = w.type.count
    vt = ir.VectorType(_I32, n // 4)
    if _vnni_dots(n):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                                            f"llvm.x86.avx512.vpdpbusd.{8 * n}")
        return builder.call(fn, [acc, builder.bitcast(w, vt), builder.bitcast(x, vt)])
    if madd_dots(n):
        return builder.add(acc, _madd_parts(builder, [(w, x)], _times(1)))
    products = ir.VectorType(_I16, n)
    p = builder.bitcast(builder.mul(builder.zext(w, products), builder.sext(x, products)),
                        ir.VectorType(_I32, n // 2))
    half = ir.Constant(p.type, [16] * (n // 2))
    pairs = builder.add(builder.ashr(builder.shl(p, half), half), builder.ashr(p, half))
    quads = builder.bitcast(pairs, ir.VectorType(_I64, n // 4))
    high = builder.lshr(quads, ir.Constant(quads.type, [32] * (n // 4)))
    return builder.add(acc, builder.add(builder.trunc(quads, vt), builder.trunc(high, vt)))


def q8_dot(builder, acc, w, x):
    """``acc`` plus :func:`lanes_dot`'s sums for Q8_0 quants stored as ``w + 128`` (unsigned)
    times x. Where :func:`q8_offset` says so, those are the stored bytes' products, which the
    caller corrects by ``-128 * sum(x)`` (``vpdpbusd`` multiplies unsigned by signed). On AVX2
    without VNNI they are the signed quants' own products, by llama.cpp's sign trick:
    ``vpmaddubsw(|q|, sign(q) * x)``, a pair at most 2 * 128 * 127, never saturated; two
    multiplies per 32 bytes where the stored bytes took four (each split in two halves below
    128), which made Q8_0's several-row products ~1.5x faster on machine A."""
    if q8_offset(w.type.count):
        return lanes_dot(builder, acc, w, x)
    return builder.add(acc, _madd_parts(builder, [(w, x)], _times(1), signed=True))


def q8_offset(n: int) -> bool:
    """Whether :func:`q8_dot` of ``n``-byte vectors multiplies the stored bytes ``q + 128``."""
    return not madd_dots(n)


def _vnni_dots(n: int) -> bool:
    """Whether :func:`lanes_dot` multiplies ``n``-byte vectors with ``vpdpbusd``."""
    return (n == 64 and host_has_vnni512()) or (n < 64 and host_has_vnni())


def madd_dots(n: int) -> bool:
    """Whether it multiplies them with ``vpmaddubsw`` + ``vpmaddwd`` (AVX2, no VNNI for them)."""
    return not _vnni_dots(n) and bool(host_features().get("avx2"))


def lanes_dot_sum(builder, acc, pairs, weight_max: int):
    """``acc`` plus :func:`lanes_dot` of every ``(w, x)`` in ``pairs`` (vectors of one width,
    every weight at most ``weight_max`` < 128), the same integers.

    On a CPU with AVX2 but no VNNI, llama.cpp's way: the pairs' ``vpmaddubsw`` sums are added in
    int16 and widened by one ``vpmaddwd`` per as many pairs as cannot overflow (a pair of products
    is at most 2 * weight_max * 128: eight for 4-bit weights), instead of one per pair. In
    registers that is 71 GMAC/s a core against 43 on machine A (the multiplier is the bound)."""
    per_sum = 32767 // (2 * weight_max * 128)
    if per_sum < 2 or not madd_dots(pairs[0][0].type.count):
        for w, x in pairs:
            acc = lanes_dot(builder, acc, w, x)
        return acc
    for first in range(0, len(pairs), per_sum):
        acc = builder.add(acc, _madd_parts(builder, pairs[first:first + per_sum], _times(1)))
    return acc


def dot_scales(builder, scales):
    """``scales`` (int32 lanes, each within int16) prepared for :func:`lanes_dot_scaled`: on a
    CPU with AVX2 but no VNNI each lane's scale twice, as int16 words (``vpmaddwd``'s operand);
    elsewhere as they are."""
    lanes = scales.type.count
    if not madd_dots(4 * lanes):
        return scales
    words = builder.trunc(scales, ir.VectorType(_I16, lanes))
    twice = ir.Constant(ir.VectorType(_I32, 2 * lanes), [k // 2 for k in range(2 * lanes)])
    return builder.shuffle_vector(words, words, twice)


def lanes_dot_scaled(builder, w, x, scales):
    """:func:`lanes_dot` of weights below 128 (from zero) times each lane's scale (prepared by
    :func:`dot_scales`), the same integers. On AVX2 without VNNI the scale is ``vpmaddwd``'s
    multiplier, as in llama.cpp's K-quant dots, instead of ones and then a ``vpmulld``."""
    n = w.type.count
    if not madd_dots(n):
        zero = ir.Constant(ir.VectorType(_I32, n // 4), [0] * (n // 4))
        return builder.mul(lanes_dot(builder, zero, w, x), scales)

    def part_scales(first: int, width: int):
        if width == n:
            return scales
        lanes = ir.Constant(ir.VectorType(_I32, width // 2), list(range(first // 2, (first + width) // 2)))
        return builder.shuffle_vector(scales, scales, lanes)

    return _madd_parts(builder, [(w, x)], part_scales)


def _madd_parts(builder, pairs, multiplier, signed: bool = False):
    """The int32 lanes ``vpmaddwd(sum of vpmaddubsw(w, x) over pairs, multiplier(first, width))``,
    32 bytes (16 for 16-byte vectors) at a time from byte ``first``, joined back into one vector.
    The word sums must not overflow int16: the callers bound the pairs (:func:`lanes_dot_sum`).
    ``signed``: w holds Q8_0's ``q + 128``, multiplied as q (:func:`q8_dot`)."""
    n = pairs[0][0].type.count
    width = min(n, 32)
    bytes_t, words_t, ints_t = (ir.VectorType(t, c) for t, c in ((_I8, width), (_I16, width // 2),
                                                                  (_I32, width // 4)))
    madd_bytes, madd_words, sign_bytes = _MADD[width]
    products = cgutils.get_or_insert_function(builder.module, ir.FunctionType(words_t, [bytes_t, bytes_t]),
                                              madd_bytes)
    sign = cgutils.get_or_insert_function(builder.module, ir.FunctionType(bytes_t, [bytes_t, bytes_t]),
                                          sign_bytes)
    widen = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ints_t, [words_t, words_t]),
                                           madd_words)
    parts = []
    for first in range(0, n, width):
        pick = ir.Constant(ir.VectorType(_I32, width), list(range(first, first + width)))
        words = None
        for w, x in pairs:
            ws, xs = (v if width == n else builder.shuffle_vector(v, v, pick) for v in (w, x))
            if signed:  # |q| times x with q's sign (x where q is 0 meets |q| = 0)
                q = builder.xor(ws, ir.Constant(bytes_t, [0x80] * width))
                ws, xs = builder.call(sign, [q, q]), builder.call(sign, [xs, q])
            p = builder.call(products, [ws, xs])
            words = p if words is None else builder.add(words, p)
        parts.append(builder.call(widen, [words, multiplier(first, width)]))
    return _joined(builder, parts, n)


def _times(factor: int):
    """A :func:`_madd_parts` multiplier: ``factor`` in every word."""
    return lambda first, width: ir.Constant(ir.VectorType(_I16, width // 2), [factor] * (width // 2))


def table_lookup(builder, table, idx):
    """Each byte of ``idx`` (16, 32 or 64 lanes, values 0-15) replaced by ``table[idx]`` (16 int8
    values): ``vpshufb`` on 16- or 32-byte parts where numba compiles for AVX2, a chain of
    selects elsewhere."""
    n = idx.type.count
    values = [int(v) for v in table]
    if host_features().get("avx2"):
        width = min(n, 32)
        vt = ir.VectorType(_I8, width)
        name = "llvm.x86.avx2.pshuf.b" if width == 32 else "llvm.x86.ssse3.pshuf.b.128"
        shuffle = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt]), name)
        tab = ir.Constant(vt, values * (width // 16))  # vpshufb looks up within each 16-byte lane

        def lanes(first, count):
            return ir.Constant(ir.VectorType(_I32, count), list(range(first, first + count)))

        pieces = [idx] if width == n else [builder.shuffle_vector(idx, idx, lanes(at, width))
                                           for at in range(0, n, width)]
        parts = [builder.call(shuffle, [tab, piece]) for piece in pieces]
        return parts[0] if len(parts) == 1 else builder.shuffle_vector(parts[0], parts[1], lanes(0, n))
    vt = idx.type
    out = ir.Constant(vt, [values[0]] * n)
    for k in range(1, 16):
        hit = builder.icmp_unsigned("==", idx, ir.Constant(vt, [k] * n))
        out = builder.select(hit, ir.Constant(vt, [values[k]] * n), out)
    return out


def sign_moved(builder, w, x):
    """``(|w|, x with w's sign)`` for signed weights (|w| <= 127): llama.cpp's sign trick, so that
    an unsigned-by-signed dot (:func:`lanes_dot`) multiplies signed weights (the activations lie
    in -127..127, so negating one never overflows)."""
    zero = ir.Constant(w.type, [0] * w.type.count)
    negative = builder.icmp_signed("<", w, zero)
    return (builder.select(negative, builder.sub(zero, w), w),
            builder.select(negative, builder.sub(zero, x), x))


_MADD = {16: ("llvm.x86.ssse3.pmadd.ub.sw.128", "llvm.x86.sse2.pmadd.wd", "llvm.x86.ssse3.psign.b.128"),
         32: ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd", "llvm.x86.avx2.psign.b")}


def _joined(builder, parts, n: int):
    """The int32 sums of 32-byte parts as one vector of ``n // 4`` lanes (one or two parts)."""
    if len(parts) == 1:
        return parts[0]
    return builder.shuffle_vector(parts[0], parts[1], ir.Constant(ir.VectorType(_I32, n // 4),
                                                                  list(range(n // 4))))


def half_to_float(builder, bits):
    """float16 values given as their ``<k x i16>`` bits -> ``<k x float>``, exactly: ``vcvtph2ps``
    where the CPU has F16C (a signalling NaN comes out quiet); elsewhere (LLVM would call a
    libgcc routine numba cannot link) the magnitude's bits moved to float32's exponent and
    fraction places and scaled by 2^112 (exact, subnormals included), inf and NaN (payload kept)
    by their bits, then the sign."""
    k = bits.type.count
    if host_features().get("f16c"):
        return builder.fpext(builder.bitcast(bits, ir.VectorType(_F16, k)), ir.VectorType(_F32, k))
    vi = ir.VectorType(_I32, k)

    def const(value):
        return ir.Constant(vi, [value] * k)

    wide = builder.zext(bits, vi)
    magnitude = builder.shl(builder.and_(wide, const(0x7FFF)), const(13))
    scaled = builder.fmul(builder.bitcast(magnitude, ir.VectorType(_F32, k)),
                          ir.Constant(ir.VectorType(_F32, k), [2.0 ** 112] * k))
    special = builder.icmp_unsigned("==", builder.and_(wide, const(0x7C00)), const(0x7C00))
    value = builder.select(special, builder.or_(magnitude, const(0x70000000)), builder.bitcast(scaled, vi))
    sign = builder.shl(builder.and_(wide, const(0x8000)), const(16))
    return builder.bitcast(builder.or_(value, sign), ir.VectorType(_F32, k))


def splat(builder, value, lanes: int):
    """``value`` in every lane of a ``lanes``-lane vector (one broadcast instruction)."""
    vt = ir.VectorType(value.type, lanes)
    one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, _I32(0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(_I32, lanes), [0] * lanes))


def fmuladd(builder, a, b, c):
    """``a * b + c`` lane by lane, fused where the target has FMA (``llvm.fmuladd``): one
    instruction instead of two on the ports the 512-bit integer dots also need."""
    fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(a.type, [a.type] * 3),
                                        f"llvm.fmuladd.v{a.type.count}f32")
    return builder.call(fn, [a, b, c])


def halves_sum(builder, v):
    """The lanes of a float vector (a power of two of them) summed as a fixed tree of halves."""
    while v.type.count > 1:
        h = v.type.count // 2
        lo, hi = (builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(_I32, h), list(range(s, s + h))))
                  for s in (0, h))
        v = builder.fadd(lo, hi)
    return builder.extract_element(v, _I32(0))


def _widen(builder, v, lanes):
    """Float vector ``v`` padded with zero lanes to ``lanes`` (itself when it has that many)."""
    have = v.type.count
    if have == lanes:
        return v
    zero = ir.Constant(v.type, [0.0] * have)
    return builder.shuffle_vector(v, zero, ir.Constant(ir.VectorType(_I32, lanes),
                                                        list(range(have)) + [have] * (lanes - have)))


def dot_frame(context, builder, sig, args, m: int, n: int):
    """What both families' dot intrinsics ``dot(w, wi, stride, nb, xq, t0, a, b, c)`` start from:
    ``(load, i64, nb, weight_rows, activation_rows)``, ``load(base, at, vector type)`` an
    unaligned vector load at element ``at`` of a pointer, the m weight rows' first bytes, and for
    each 2-D activation array (xq, a, b, c) pointers to its rows t0 .. t0 + n - 1."""
    arrays = [context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 4, 6, 7, 8)]
    i64 = args[1].type

    def load(base, at, vt):
        where = builder.bitcast(builder.gep(base, [at], inbounds=True), vt.as_pointer())
        return builder.load(where, align=1)

    def rows(a):
        width = cgutils.unpack_tuple(builder, a.shape, 2)[1]
        return [builder.gep(a.data, [builder.mul(builder.add(args[5], i64(i)), width)], inbounds=True)
                for i in range(n)]

    weight_rows = [builder.gep(arrays[0].data, [builder.add(args[1], builder.mul(args[2], i64(j)))],
                               inbounds=True) for j in range(m)]
    return load, i64, args[3], weight_rows, [rows(a) for a in arrays[1:]]


def accumulators(builder, vt, m: int, n: int):
    """Zeroed float accumulators of vector type ``vt``, one per (weight row, activation row)."""
    zero = ir.Constant(vt, [0.0] * vt.count)
    return [[cgutils.alloca_once_value(builder, zero) for _ in range(n)] for _ in range(m)]


def totals(builder, accs, mins, combine):
    """Each (weight row, activation row) pair's accumulator ``accs[j][i]`` summed as halves, its
    offsets ``mins[j][i]`` summed likewise and joined by ``combine`` (``builder.fadd`` or
    ``fsub``; None: no offsets): the float32 results, weight row major."""
    out = []
    for acc_row, min_row in zip(accs, mins, strict=True):
        for acc, mn in zip(acc_row, min_row, strict=True):
            total = halves_sum(builder, builder.load(acc))
            out.append(total if combine is None else combine(total, halves_sum(builder, builder.load(mn))))
    return out


def _group_dot(kind: int, m: int, n: int):
    """``dot(w, wi, stride, nb, xg, t0, xd, xs, nsum)``: the ``m`` repacked weight rows at bytes
    ``wi, wi + stride, ...`` of ``w`` (``nb`` blocks each) times the ``n`` activation rows t0 ..
    t0 + n - 1 -> a tuple of m * n float32 (weight row major). ``xg``, ``xd`` (scales), ``xs``
    (Q8_1's s) and ``nsum`` are :func:`quantize_grouped`'s arrays. Several weight rows per call
    share the activations' loads and run independent chains, which matters for one activation
    row (decode), where a row's fixed work (address set-up, the final reduction) cost as much as
    its blocks."""
    quant_bytes = 32 if kind == WQ8_0 else 16

    @intrinsic
    def dot(typingctx, w, wi, stride, nb, xg, t0, xd, xs, nsum):
        def codegen(context, builder, sig, args):
            load, i64, nblocks, weight_rows, activation_rows = dot_frame(context, builder, sig, args, m, n)
            xg_rows, xd_rows, xs_rows, nsum_rows = activation_rows
            # byte offsets within a row (module doc): fifth bits, scales d, offsets m
            qh_at = builder.mul(nblocks, i64(quant_bytes))
            d_at = builder.add(qh_at, builder.mul(nblocks, i64(4))) if kind in _HAS_QH else qh_at
            m_at = builder.add(d_at, builder.mul(nblocks, i64(2)))

            accs = accumulators(builder, ir.VectorType(_F32, 16), m, n)  # block j of a group: lanes 4j ..
            mins = accumulators(builder, ir.VectorType(_F32, 4), m, n)  # m * s, a lane per block

            def accumulate(slot, a, b):
                """``slot += a * b`` (a and b padded with zero lanes to the slot's width)."""
                lanes = slot.type.pointee.count
                a, b = _widen(builder, a, lanes), _widen(builder, b, lanes)
                builder.store(fmuladd(builder, a, b, builder.load(slot)), slot)

            def unpack(row, b, k):
                """The group's low and high halves of weight row ``row`` as unsigned bytes (a
                table format's: its signed values)."""
                vb = ir.VectorType(_I8, 16 * k)
                if kind == WQ8_0:
                    at = builder.mul(b, i64(32))
                    return load(row, at, vb), load(row, builder.add(at, i64(16 * k)), vb)
                v = load(row, builder.mul(b, i64(16)), vb)
                halves = [builder.and_(v, ir.Constant(vb, [0xF] * 16 * k)),
                          builder.lshr(v, ir.Constant(vb, [4] * 16 * k))]
                if kind in _TABLES:
                    return [table_lookup(builder, _TABLES[kind], h) for h in halves]
                if kind in _HAS_QH:  # fifth bits: bit i of the group's u16s is byte i's
                    for half, at in ((0, qh_at), (1, builder.add(qh_at, builder.mul(nblocks, i64(2))))):
                        bits = load(row, builder.add(at, builder.mul(b, i64(2))), ir.IntType(16 * k))
                        fifth = builder.zext(builder.bitcast(bits, ir.VectorType(_I1, 16 * k)), vb)
                        fifth = builder.shl(fifth, ir.Constant(vb, [4] * 16 * k))
                        halves[half] = builder.or_(halves[half], fifth)
                return halves

            def group(b, k):
                """Blocks b .. b + k - 1 of each weight row times each activation row."""
                vb = ir.VectorType(_I8, 16 * k)
                lanes, lanes_f = ir.VectorType(_I32, 4 * k), ir.VectorType(_F32, 4 * k)
                spread = ir.Constant(lanes, [j // 4 for j in range(4 * k)])
                x_at = builder.mul(b, i64(32))
                acts = []
                for i in range(n):
                    start = ir.Constant(lanes, [0] * 4 * k)
                    if kind in _ZERO_SHIFT and (kind != WQ8_0 or q8_offset(16 * k)):
                        # -zero * sum(x quants) in lane 4j of each block
                        start = builder.shl(load(nsum_rows[i], builder.mul(b, i64(4)), lanes),
                                            ir.Constant(lanes, [_ZERO_SHIFT[kind]] * 4 * k))
                    x_hi_at = builder.add(x_at, i64(16 * k))
                    xd_k = load(xd_rows[i], b, ir.VectorType(_F32, k))
                    xs_k = load(xs_rows[i], b, ir.VectorType(_F32, k)) if kind in _HAS_M else None
                    x_lo, x_hi = load(xg_rows[i], x_at, vb), load(xg_rows[i], x_hi_at, vb)
                    acts.append((x_lo, x_hi, start, xd_k, xs_k))
                for j, row in enumerate(weight_rows):
                    lo, hi = unpack(row, b, k)
                    if kind == WMXFP4:  # float32 scales
                        d = load(row, builder.add(d_at, builder.mul(b, i64(4))), ir.VectorType(_F32, k))
                    else:
                        d = half_to_float(builder, load(row, builder.add(d_at, builder.mul(b, i64(2))),
                                                        ir.VectorType(_I16, k)))
                    offset = half_to_float(builder, load(row, builder.add(m_at, builder.mul(b, i64(2))),
                                                         ir.VectorType(_I16, k))) if kind in _HAS_M else None
                    for i, (xlo, xhi, start, xd_k, xs_k) in enumerate(acts):
                        if kind == WQ8_0:  # quants stored as w + 128: no int16 sums
                            total = q8_dot(builder, q8_dot(builder, start, lo, xlo), hi, xhi)
                        elif kind in _TABLES:  # signed values
                            total = lanes_dot_sum(builder, start, [sign_moved(builder, lo, xlo),
                                                                   sign_moved(builder, hi, xhi)], 127)
                        else:
                            total = lanes_dot_sum(builder, start, [(lo, xlo), (hi, xhi)],
                                                  31 if kind in (WQ5_0, WQ5_1) else 15)
                        scale = builder.fmul(d, xd_k)
                        accumulate(accs[j][i], builder.sitofp(total, lanes_f),
                                   builder.shuffle_vector(scale, scale, spread))
                        if offset is not None:  # + m * s per block
                            accumulate(mins[j][i], offset, xs_k)

            full = builder.udiv(nblocks, i64(4))
            with cgutils.for_range(builder, full) as loop:
                group(builder.mul(loop.index, i64(4)), 4)
            rest = builder.urem(nblocks, i64(4))
            with builder.if_then(builder.icmp_unsigned(">=", rest, i64(2))):
                group(builder.mul(full, i64(4)), 2)
            with builder.if_then(builder.icmp_unsigned("==", builder.urem(rest, i64(2)), i64(1))):
                group(builder.sub(nblocks, i64(1)), 1)
            sums = totals(builder, accs, mins, builder.fadd if kind in _HAS_M else None)
            return context.make_tuple(builder, sig.return_type, sums)
        return types.UniTuple(types.float32, m * n)(w, wi, stride, nb, xg, t0, xd, xs, nsum), codegen
    return dot


def _by_kind(m, n):
    """One function over the group dots of m weight rows and n activation rows, picking the
    format's by kind."""
    q4_0, q4_1, q5_0, q5_1, q8_0, iq4_nl, mxfp4 = (_group_dot(k, m, n) for k in ROW_KINDS)

    @njit(inline="always")
    def dot(kind, w, wi, stride, nb, xg, t, xd, xs, nsum):
        if kind == WQ4_0:
            return q4_0(w, wi, stride, nb, xg, t, xd, xs, nsum)
        if kind == WQ4_1:
            return q4_1(w, wi, stride, nb, xg, t, xd, xs, nsum)
        if kind == WQ5_0:
            return q5_0(w, wi, stride, nb, xg, t, xd, xs, nsum)
        if kind == WQ5_1:
            return q5_1(w, wi, stride, nb, xg, t, xd, xs, nsum)
        if kind == WIQ4_NL:
            return iq4_nl(w, wi, stride, nb, xg, t, xd, xs, nsum)
        if kind == WMXFP4:
            return mxfp4(w, wi, stride, nb, xg, t, xd, xs, nsum)
        return q8_0(w, wi, stride, nb, xg, t, xd, xs, nsum)
    return dot


WEIGHT_ROWS_AT_ONCE = 2  # weight rows per call when fewer than ROWS_AT_ONCE activation rows remain


def rows_driver(by_kind):
    """The loop over a range of weight rows for a family of dots: ``by_kind(m, n)`` gives the
    function of m weight rows and n activation rows that picks the format's dot by kind."""
    one, pair = by_kind(1, 1), by_kind(WEIGHT_ROWS_AT_ONCE, 1)
    two, three, many = by_kind(1, 2), by_kind(1, 3), by_kind(1, ROWS_AT_ONCE)

    @njit(inline="always")
    def products(kind, w2, r0, r1, xq, xd, xa, xb, out):
        """``out[:, r0:r1]`` for repacked weight rows r0 .. r1 - 1 of ``w2`` (``[rows, row bytes]``)
        and quantized activations (``xq``, scales ``xd`` and two arrays of the family's): for
        several activation rows each weight row once, ROWS_AT_ONCE of them per call while that
        many remain, then the other 1-3 in one call; for one activation row WEIGHT_ROWS_AT_ONCE
        weight rows per call (each result the same operations, so the same bits, whichever call
        computes it)."""
        w = w2.reshape(-1)
        stride, nb = w2.shape[1], xd.shape[1]
        T = xq.shape[0]
        if T > 1:
            rest = T // ROWS_AT_ONCE * ROWS_AT_ONCE
            for r in range(r0, r1):
                prefetch_row(w2, r)
                for t in range(0, rest, ROWS_AT_ONCE):
                    v = many(kind, w, r * stride, stride, nb, xq, t, xd, xa, xb)
                    for i in range(ROWS_AT_ONCE):
                        out[t + i, r] = v[i]
                if T - rest == 3:
                    v3 = three(kind, w, r * stride, stride, nb, xq, rest, xd, xa, xb)
                    out[rest, r], out[rest + 1, r], out[rest + 2, r] = v3
                elif T - rest == 2:
                    v2 = two(kind, w, r * stride, stride, nb, xq, rest, xd, xa, xb)
                    out[rest, r], out[rest + 1, r] = v2
                elif T - rest == 1:
                    out[rest, r] = one(kind, w, r * stride, stride, nb, xq, rest, xd, xa, xb)[0]
            return
        # one activation row (decode): the weights stream by once, prefetched AHEAD_BYTES ahead
        # as the pass goes (across the range's end too: the next range a thread takes is usually
        # the next rows); prefetching a whole range before multiplying it leaves the core idle
        # while it comes
        ahead = r0 * stride + AHEAD_BYTES
        r = r0
        while r + WEIGHT_ROWS_AT_ONCE <= r1:
            ahead = prefetch_until(w, ahead, (r + WEIGHT_ROWS_AT_ONCE) * stride + AHEAD_BYTES)
            v = pair(kind, w, r * stride, stride, nb, xq, 0, xd, xa, xb)
            for j in range(WEIGHT_ROWS_AT_ONCE):
                out[0, r + j] = v[j]
            r += WEIGHT_ROWS_AT_ONCE
        while r < r1:
            out[0, r] = one(kind, w, r * stride, stride, nb, xq, 0, xd, xa, xb)[0]
            r += 1
    return products


rows_products = rows_driver(_by_kind)  # with quantize_grouped's (xg, d, s, nsum)
