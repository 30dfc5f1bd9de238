"""Whole-row integer dots for Q4_K, Q5_K and Q6_K (256-weight super-blocks) on repacked rows, as
:mod:`.quant_int8_rows` does for the 32-weight formats.

The file's super-blocks keep their quants in an order made for 32-byte vectors (Q4_K: groups of
32 bytes whose low nibbles are one sub-block and high nibbles the next; Q6_K: four runs of 32
weights built from two nibble runs and a 2-bit plane), and Q4_K (Q5_K too) packs its sixteen
6-bit scales and mins into 12 bytes. Each row is repacked once into the order of the weights, so that 64
consecutive weights are one 64-byte vector whatever the format:

    nibbles: byte i (0-127) holds the low 4 bits of weight i and (high nibble) of weight 128 + i;
    Q6_K's plane: byte i (0-63) holds the top 2 bits of weights i, 64 + i, 128 + i, 192 + i;
    Q5_K's plane, the file's own: byte i (0-31) bit k holds the fifth bit of weight 32k + i;
    then per super-block Q4_K's (Q5_K's) 8 scales and 8 mins as bytes (148 bytes a super-block
    where the file has 144; 180 for 176), or Q6_K's 16 int8 scales; then the f16 d (and Q4_K's and
    Q5_K's dmin) of every super-block.

A super-block is four 64-weight chunks; a chunk's ``vpdpbusd`` against the activations (Q8_K,
natural order) leaves sub-block j's products in lanes 4j' .. (16 or 32 weights per sub-block);
each lane is multiplied by its sub-block's integer scale and summed over the chunks in int32
(Q6_K's ``-32 * bsum`` per sub-block enters as the lanes' starting value), then converted to
float once per super-block and multiplied by ``d * d_x``. Q4_K's (Q5_K's) mins meet the activations'
sums per 32 in an 8-lane product per super-block (``- dmin * d_x * sum(min * bsum)``).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .quant import IQ4_VALUES, iq4_xs_scales, q3_k_scales, q4_k_scales
from .quant_int8_rows import (
    accumulators,
    dot_frame,
    dot_scales,
    fmuladd,
    half_to_float,
    lanes_dot_scaled,
    rows_driver,
    sign_moved,
    splat,
    table_lookup,
    totals,
)

# quant_int8's numbering (after the rows' and the tiles' kinds)
WQ4_K, WQ6_K, WQ5_K, WQ2_K, WQ3_K, WIQ4_XS = 5, 6, 10, 11, 12, 13
SUPER_KINDS = (WQ4_K, WQ6_K, WQ5_K, WQ2_K, WQ3_K, WIQ4_XS)
# bytes of a super-block: in the file; repacked, of the planes after the quants and of the scales (and mins)
_FILE_BYTES = {WQ4_K: 144, WQ6_K: 210, WQ5_K: 176, WQ2_K: 84, WQ3_K: 110, WIQ4_XS: 136}
_PLANE_BYTES = {WQ4_K: 0, WQ5_K: 32, WQ6_K: 64, WQ2_K: 0, WQ3_K: 32, WIQ4_XS: 0}
_SCALE_BYTES = {WQ4_K: 16, WQ5_K: 16, WQ6_K: 16, WQ2_K: 32, WQ3_K: 16, WIQ4_XS: 8}

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()


def _q4_k_quants(blocks: np.ndarray, at: int = 16) -> np.ndarray:
    """Q4_K's 256 nibbles per super-block in the weights' order, ``[rows, nb, 256]`` (Q5_K's low
    four bits: its nibbles ``at`` byte 48)."""
    qs = blocks[:, :, at:at + 128].reshape(*blocks.shape[:2], 4, 32)
    return np.stack([qs & 0x0F, qs >> 4], axis=3).reshape(*blocks.shape[:2], 256)


def _q6_k_quants(blocks: np.ndarray) -> np.ndarray:
    """Q6_K's 256 unsigned 6-bit quants per super-block in the weights' order (``dequantize_row_q6_K``)."""
    rows, nb = blocks.shape[:2]
    ql = blocks[:, :, 0:128].reshape(rows, nb, 2, 2, 32)  # half, run of 32 bytes, byte
    qh = blocks[:, :, 128:192].reshape(rows, nb, 2, 1, 32)
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=3)  # half, k (weights 32k + l), l
    high = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=3)
    return (low | (high << 4)).reshape(rows, nb, 256)


@njit(inline="always")
def is_superblock_kind(kind):
    """Whether ``kind`` is one of :data:`SUPER_KINDS` (in compiled code)."""
    return (kind == WQ4_K or kind == WQ6_K or kind == WQ5_K or kind == WQ2_K or kind == WQ3_K
            or kind == WIQ4_XS)


def signed_dot_scaled(builder, w, x, scales):
    """:func:`lanes_dot_scaled` for signed weights (|w| <= 127) by llama.cpp's sign trick."""
    return lanes_dot_scaled(builder, *sign_moved(builder, w, x), scales)


def _two_bit_quants(runs: np.ndarray) -> np.ndarray:
    """Q2_K's / Q3_K's 64 bytes of 2-bit runs per super-block ``[rows, nb, 64]`` -> the 256 2-bit
    quants in the weights' order (half h, byte l, bits 2p: weight 128h + 32p + l)."""
    rows, nb = runs.shape[:2]
    q = runs.reshape(rows, nb, 2, 1, 32) >> np.array([0, 2, 4, 6], np.uint8).reshape(1, 1, 1, 4, 1)
    return (q & 3).reshape(rows, nb, 256)


def _pairs_plane(q: np.ndarray) -> np.ndarray:
    """2-bit values ``[rows, nb, 256]`` as 64 bytes a super-block: byte i holds those of weights
    i, 64 + i, 128 + i, 192 + i in bits 0-1, 2-3, 4-5, 6-7."""
    c = q.reshape(*q.shape[:2], 4, 64)
    return c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)


def repack(kind: int, raw: np.ndarray, nb: int) -> np.ndarray:
    """The file's super-blocks ``raw`` (uint8, ``rows * nb`` of them) as repacked rows (module
    doc): uint8 ``[rows, nb * repacked bytes]``."""
    blocks = raw.reshape(-1, nb, _FILE_BYTES[kind])
    rows = blocks.shape[0]
    if kind == WQ2_K:  # 2-bit pairs; 4-bit scales, 4-bit mins; d; dmin
        sub = blocks[:, :, 0:16]
        scales_mins = np.concatenate([sub & 0x0F, sub >> 4], -1)
        parts = [_pairs_plane(_two_bit_quants(blocks[:, :, 16:80])), scales_mins, blocks[:, :, 80:82],
                 blocks[:, :, 82:84]]
    elif kind == WIQ4_XS:  # nibbles; int8 scales; d
        qs = blocks[:, :, 8:136].reshape(rows, nb, 8, 16)
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, nb, 256)
        parts = [q[:, :, :128] | (q[:, :, 128:] << 4), iq4_xs_scales(blocks).view(np.uint8),
                 blocks[:, :, 0:2]]
    elif kind == WQ3_K:  # 2-bit pairs; the file's mask of third bits; int8 scales; d
        parts = [_pairs_plane(_two_bit_quants(blocks[:, :, 32:96])), blocks[:, :, 0:32],
                 q3_k_scales(blocks[:, :, 96:108]).view(np.uint8), blocks[:, :, 108:110]]
    else:
        q = _q6_k_quants(blocks) if kind == WQ6_K else _q4_k_quants(blocks, 48 if kind == WQ5_K else 16)
        parts = [(q[:, :, :128] & 0x0F) | ((q[:, :, 128:] & 0x0F) << 4)]
        if kind == WQ6_K:
            parts += [_pairs_plane(q >> 4), blocks[:, :, 192:208], blocks[:, :, 208:210]]
        else:
            if kind == WQ5_K:
                parts.append(blocks[:, :, 16:48])
            parts += [np.concatenate(q4_k_scales(blocks), axis=-1), blocks[:, :, 0:2], blocks[:, :, 2:4]]
    flat = [np.ascontiguousarray(p).reshape(rows, -1) for p in parts]
    return np.ascontiguousarray(np.concatenate(flat, axis=1), dtype=np.uint8)


@njit(cache=True, nogil=True)
def superblock_sums(sums, spread, per32):
    """From Q8_K's sums per 16 ``[T, n / 16]``: minus each at lane 4j of ``spread`` ``[T, n / 4]``
    (Q6_K's zero point, shifted into the lanes' starting values; the other lanes stay zero) and
    the sums per 32 into ``per32`` ``[T, n / 32]`` (what Q4_K's mins multiply)."""
    T, m = sums.shape
    for t in range(T):
        for j in range(m):
            spread[t, 4 * j] = -sums[t, j]
        for j in range(m // 2):
            per32[t, j] = sums[t, 2 * j] + sums[t, 2 * j + 1]


def _super_dot(kind: int, m: int, n: int):
    """``dot(w, wi, stride, nb, xq, t0, xd, nsum16, bsum32)``: ``m`` repacked rows (bytes ``wi,
    wi + stride, ...`` of ``w``, ``nb`` super-blocks) times ``n`` Q8_K activation rows t0 ..
    (quants ``xq``, scales ``xd`` and :func:`superblock_sums`' arrays) -> m * n float32."""
    two_bit = kind in (WQ2_K, WQ3_K)
    per16 = kind in (WQ2_K, WQ3_K, WQ6_K)  # a scale per 16 weights (else per 32, with a min)
    zero_shift = {WQ6_K: 5, WQ3_K: 2}.get(kind)  # log2 of the zero point the quants are stored above

    @intrinsic
    def dot(typingctx, w, wi, stride, nb, xq, t0, xd, nsum16, bsum32):
        def codegen(context, builder, sig, args):
            load, i64, nblocks, weight_rows, activation_rows = dot_frame(context, builder, sig, args, m, n)
            xq_rows, xd_rows, n16_rows, b32_rows = activation_rows
            v64 = ir.VectorType(_I8, 64)
            v16i, v16f = ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
            v8i, v8f = ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)

            def const(v):
                return ir.Constant(v64, [v] * 64)

            def scalar_f16(row, at):
                one = half_to_float(builder, load(row, at, ir.VectorType(_I16, 1)))
                return builder.extract_element(one, _I32(0))

            def at(start, b, size):
                return builder.add(start, builder.mul(b, i64(size)))

            # the parts of a row (module doc): quants, planes, scales (and mins), d (and dmin)
            aux_at = builder.mul(nblocks, i64(64 if two_bit else 128))
            scales_at = builder.add(aux_at, builder.mul(nblocks, i64(_PLANE_BYTES[kind])))
            d_at = builder.add(scales_at, builder.mul(nblocks, i64(_SCALE_BYTES[kind])))
            dmin_at = builder.add(d_at, builder.mul(nblocks, i64(2)))

            accs = accumulators(builder, v16f, m, n)
            mins = accumulators(builder, v16f if kind == WQ2_K else v8f, m, n)

            def or_bit_plane(row, start, w, value):
                """Q5_K's fifth / Q3_K's third bit of the weights of chunk c (64c + i), from byte
                i % 32 of the 32-byte plane at ``start``, bit 2c + i // 32: ``value`` or-ed into
                ``w[c]`` where it is set."""
                plane = load(row, start, ir.VectorType(_I8, 32))
                both = builder.shuffle_vector(plane, plane, ir.Constant(ir.VectorType(_I32, 64),
                                                                        [i % 32 for i in range(64)]))
                for c in range(4):
                    mask = ir.Constant(v64, [1 << (2 * c + i // 32) for i in range(64)])
                    isset = builder.icmp_unsigned("!=", builder.and_(both, mask), const(0))
                    w[c] = builder.or_(w[c], builder.select(isset, const(value), const(0)))

            def quants(row, b):
                """The weights' unsigned quants as four 64-lane chunks (weights 64c .. 64c + 63)."""
                if two_bit:  # byte i: weights i, 64 + i, 128 + i, 192 + i in bits 0-1, 2-3, 4-5, 6-7
                    plane = load(row, at(i64(0), b, 64), v64)
                    w = [builder.and_(builder.lshr(plane, const(2 * c)), const(3)) for c in range(4)]
                else:
                    nib = [load(row, builder.add(at(i64(0), b, 128), i64(64 * h)), v64) for h in (0, 1)]
                    low = [builder.and_(v, const(0x0F)) for v in nib]
                    high = [builder.lshr(v, const(4)) for v in nib]
                    w = [low[0], low[1], high[0], high[1]]
                if kind == WQ6_K:  # the top 2 bits of chunk c are bits 2c, 2c+1 of the plane
                    plane = load(row, at(aux_at, b, 64), v64)
                    for c in range(4):
                        top = builder.and_(builder.lshr(plane, const(2 * c)), const(3))
                        w[c] = builder.or_(w[c], builder.shl(top, const(4)))
                elif kind in (WQ5_K, WQ3_K):
                    or_bit_plane(row, at(aux_at, b, 32), w, 16 if kind == WQ5_K else 4)
                elif kind == WIQ4_XS:
                    w = [table_lookup(builder, IQ4_VALUES, v) for v in w]
                return w

            def superblock(b):
                acts = []
                for i in range(n):
                    x_at = builder.mul(b, i64(256))
                    chunks = [load(xq_rows[i], builder.add(x_at, i64(64 * c)), v64) for c in range(4)]
                    starts = None  # per16: minus the activations' sum of each 16 at lane 4j
                    if per16:
                        starts = [load(n16_rows[i], builder.add(builder.mul(b, i64(64)), i64(16 * c)), v16i)
                                  for c in range(4)]
                        if zero_shift is not None:  # times the zero point: the lanes' starting values
                            shift = ir.Constant(v16i, [zero_shift] * 16)
                            starts = [builder.shl(v, shift) for v in starts]
                    xd_b = builder.load(builder.gep(xd_rows[i], [b], inbounds=True))
                    bsums = load(b32_rows[i], builder.mul(b, i64(8)), v8i) if kind in (WQ4_K, WQ5_K) else None
                    acts.append((chunks, starts, xd_b, bsums))
                for j, row in enumerate(weight_rows):
                    w = quants(row, b)
                    sc_at = at(scales_at, b, _SCALE_BYTES[kind])
                    if per16:  # a scale per 16 weights: 4 lanes
                        sc = load(row, sc_at, ir.VectorType(_I8, 16))
                        sc = builder.zext(sc, v16i) if kind == WQ2_K else builder.sext(sc, v16i)
                        per_lane = [[4 * c + k // 4 for k in range(16)] for c in range(4)]
                        mn = builder.zext(load(row, builder.add(sc_at, i64(16)), ir.VectorType(_I8, 16)),
                                          v16i) if kind == WQ2_K else None
                    elif kind == WIQ4_XS:  # a signed scale per 32 weights: 8 lanes
                        sc, mn = builder.sext(load(row, sc_at, ir.VectorType(_I8, 8)), v8i), None
                        per_lane = [[2 * c + k // 8 for k in range(16)] for c in range(4)]
                    else:  # a scale and a min per 32 weights: 8 lanes
                        sc = builder.zext(load(row, sc_at, ir.VectorType(_I8, 8)), v8i)
                        mn = builder.zext(load(row, builder.add(sc_at, i64(8)), ir.VectorType(_I8, 8)), v8i)
                        per_lane = [[2 * c + k // 8 for k in range(16)] for c in range(4)]
                    spreads, min_spreads = ([builder.shuffle_vector(v, v, ir.Constant(v16i, lanes))
                                             for lanes in per_lane] if v is not None else None
                                            for v in (sc, mn if kind == WQ2_K else None))
                    d = scalar_f16(row, at(d_at, b, 2))
                    dmin = scalar_f16(row, at(dmin_at, b, 2)) if mn is not None else None
                    prepared = [dot_scales(builder, spread) for spread in spreads]
                    for i, (chunks, starts, xd_b, bsums) in enumerate(acts):
                        total = ir.Constant(v16i, [0] * 16)
                        min_total = ir.Constant(v16i, [0] * 16)
                        for c in range(4):  # (start + dot) * scale, lane by lane
                            dot = (signed_dot_scaled(builder, w[c], chunks[c], prepared[c]) if kind == WIQ4_XS
                                   else lanes_dot_scaled(builder, w[c], chunks[c], prepared[c]))
                            total = builder.add(total, dot)
                            if zero_shift is not None:
                                total = builder.add(total, builder.mul(starts[c], spreads[c]))
                            elif kind == WQ2_K:  # - min * sum per 16, at lane 4j
                                min_total = builder.add(min_total, builder.mul(starts[c], min_spreads[c]))
                        scale, acc = splat(builder, builder.fmul(d, xd_b), 16), accs[j][i]
                        summed = fmuladd(builder, builder.sitofp(total, v16f), scale, builder.load(acc))
                        builder.store(summed, acc)
                        if dmin is not None:
                            prod = (builder.sitofp(min_total, v16f) if kind == WQ2_K
                                    else builder.sitofp(builder.mul(mn, bsums), v8f))
                            scale = splat(builder, builder.fmul(dmin, xd_b), prod.type.count)
                            builder.store(fmuladd(builder, prod, scale, builder.load(mins[j][i])), mins[j][i])

            with cgutils.for_range(builder, nblocks) as loop:
                superblock(loop.index)
            # Q4_K, Q5_K: minus dmin * the mins' sums; Q2_K's are negative already
            combine = {WQ4_K: builder.fsub, WQ5_K: builder.fsub, WQ2_K: builder.fadd}.get(kind)
            sums = totals(builder, accs, mins, combine)
            return context.make_tuple(builder, sig.return_type, sums)
        return types.UniTuple(types.float32, m * n)(w, wi, stride, nb, xq, t0, xd, nsum16, bsum32), codegen
    return dot


def _by_kind(m, n):
    """One function over the super-block dots of m weight rows and n activation rows."""
    q4_k, q6_k, q5_k, q2_k, q3_k, iq4_xs = (_super_dot(k, m, n) for k in SUPER_KINDS)

    @njit(inline="always")
    def dot(kind, w, wi, stride, nb, xq, t, xd, nsum16, bsum32):
        if kind == WQ4_K:
            return q4_k(w, wi, stride, nb, xq, t, xd, nsum16, bsum32)
        if kind == WQ5_K:
            return q5_k(w, wi, stride, nb, xq, t, xd, nsum16, bsum32)
        if kind == WQ2_K:
            return q2_k(w, wi, stride, nb, xq, t, xd, nsum16, bsum32)
        if kind == WQ3_K:
            return q3_k(w, wi, stride, nb, xq, t, xd, nsum16, bsum32)
        if kind == WIQ4_XS:
            return iq4_xs(w, wi, stride, nb, xq, t, xd, nsum16, bsum32)
        return q6_k(w, wi, stride, nb, xq, t, xd, nsum16, bsum32)
    return dot


superblock_products = rows_driver(_by_kind)  # with Q8_K's (qs, d) and superblock_sums'
