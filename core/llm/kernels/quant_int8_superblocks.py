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

from .quant_int8_rows import (
    accumulators,
    dot_frame,
    dot_scales,
    fmuladd,
    half_to_float,
    lanes_dot_scaled,
    rows_driver,
    splat,
    totals,
)

WQ4_K, WQ6_K, WQ5_K = 5, 6, 10  # quant_int8's numbering: after quant_int8_rows' five and the tiles'
SUPER_KINDS = (WQ4_K, WQ6_K, WQ5_K)
_FILE_BYTES = {WQ4_K: 144, WQ6_K: 210, WQ5_K: 176}  # a super-block in the file
_BYTES = {WQ4_K: 148, WQ6_K: 210, WQ5_K: 180}  # repacked

_I8, _I16, _I32, _F32 = ir.IntType(8), ir.IntType(16), ir.IntType(32), ir.FloatType()


def q4_k_scales(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K blocks ``[rows, nb, 144]`` -> their 6-bit scales and mins, ``[rows, nb, 8]`` each
    (``get_scale_min_k4`` of ggml-quants.c)."""
    packed = blocks[:, :, 4:16].reshape(*blocks.shape[:2], 3, 4)
    lo, mid, top = packed[:, :, 0], packed[:, :, 1], packed[:, :, 2]
    scales = np.concatenate([lo & 0x3F, (top & 0x0F) | ((lo >> 2) & 0x30)], axis=-1)
    mins = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 2) & 0x30)], axis=-1)
    return scales, mins


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


def repack(kind: int, raw: np.ndarray, nb: int) -> np.ndarray:
    """The file's super-blocks ``raw`` (uint8, ``rows * nb`` of them) as repacked rows (module
    doc): uint8 ``[rows, nb * _BYTES[kind]]``."""
    blocks = raw.reshape(-1, nb, _FILE_BYTES[kind])
    rows = blocks.shape[0]
    q = _q6_k_quants(blocks) if kind == WQ6_K else _q4_k_quants(blocks, 48 if kind == WQ5_K else 16)
    parts = [(q[:, :, :128] & 0x0F) | ((q[:, :, 128:] & 0x0F) << 4)]
    if kind == WQ5_K:
        parts.append(blocks[:, :, 16:48])
    if kind != WQ6_K:
        parts += [np.concatenate(q4_k_scales(blocks), axis=-1), blocks[:, :, 0:2], blocks[:, :, 2:4]]
    else:
        top = q.reshape(rows, nb, 4, 64) >> 4
        parts += [top[:, :, 0] | (top[:, :, 1] << 2) | (top[:, :, 2] << 4) | (top[:, :, 3] << 6),
                  blocks[:, :, 192:208], blocks[:, :, 208:210]]
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

    @intrinsic
    def dot(typingctx, w, wi, stride, nb, xq, t0, xd, nsum16, bsum32):
        def codegen(context, builder, sig, args):
            load, i64, nblocks, weight_rows, activation_rows = dot_frame(context, builder, sig, args, m, n)
            xq_rows, xd_rows, n16_rows, b32_rows = activation_rows
            v64 = ir.VectorType(_I8, 64)
            v16i, v16f = ir.VectorType(_I32, 16), ir.VectorType(_F32, 16)
            v8i, v8f = ir.VectorType(_I32, 8), ir.VectorType(_F32, 8)

            def scalar_f16(row, at):
                one = half_to_float(builder, load(row, at, ir.VectorType(_I16, 1)))
                return builder.extract_element(one, _I32(0))

            aux_at = builder.mul(nblocks, i64(128))  # Q4_K's scales and mins, Q5_K's and Q6_K's plane
            plane_bytes = {WQ4_K: 0, WQ5_K: 32, WQ6_K: 64}[kind]
            scales_at = builder.add(aux_at, builder.mul(nblocks, i64(plane_bytes)))
            d_at = builder.add(scales_at, builder.mul(nblocks, i64(16)))
            dmin_at = builder.add(d_at, builder.mul(nblocks, i64(2)))

            accs, mins = accumulators(builder, v16f, m, n), accumulators(builder, v8f, m, n)

            def fifth_bits(row, at, w):
                """Q5_K: bit 4 of the weights of chunk c (64c + i) from plane byte i % 32, bit
                2c + i // 32, or-ed into the nibbles ``w[c]``."""
                plane = load(row, at, ir.VectorType(_I8, 32))
                both = builder.shuffle_vector(plane, plane, ir.Constant(ir.VectorType(_I32, 64),
                                                                        [i % 32 for i in range(64)]))
                zero, sixteen = ir.Constant(v64, [0] * 64), ir.Constant(v64, [16] * 64)
                for c in range(4):
                    mask = ir.Constant(v64, [1 << (2 * c + i // 32) for i in range(64)])
                    isset = builder.icmp_unsigned("!=", builder.and_(both, mask), zero)
                    w[c] = builder.or_(w[c], builder.select(isset, sixteen, zero))

            def superblock(b):
                acts = []
                for i in range(n):
                    x_at = builder.mul(b, i64(256))
                    chunks = [load(xq_rows[i], builder.add(x_at, i64(64 * c)), v64) for c in range(4)]
                    starts = [ir.Constant(v16i, [0] * 16)] * 4
                    if kind == WQ6_K:  # -32 * bsum of each sub-block of 16 in its first lane
                        at = [builder.add(builder.mul(b, i64(64)), i64(16 * c)) for c in range(4)]
                        five = ir.Constant(v16i, [5] * 16)
                        starts = [builder.shl(load(n16_rows[i], a, v16i), five) for a in at]
                    xd_b = builder.load(builder.gep(xd_rows[i], [b], inbounds=True))
                    bsums = load(b32_rows[i], builder.mul(b, i64(8)), v8i) if kind != WQ6_K else None
                    acts.append((chunks, starts, xd_b, bsums))
                for j, row in enumerate(weight_rows):
                    nib = [load(row, builder.add(builder.mul(b, i64(128)), i64(64 * h)), v64) for h in (0, 1)]
                    low = [builder.and_(v, ir.Constant(v64, [0x0F] * 64)) for v in nib]
                    high = [builder.lshr(v, ir.Constant(v64, [4] * 64)) for v in nib]
                    w = [low[0], low[1], high[0], high[1]]  # weights 0-63, 64-127, 128-191, 192-255
                    if kind == WQ6_K:
                        plane = load(row, builder.add(aux_at, builder.mul(b, i64(64))), v64)
                        for c in range(4):  # the top 2 bits of chunk c are bits 2c, 2c+1 of the plane
                            top = builder.and_(builder.lshr(plane, ir.Constant(v64, [2 * c] * 64)),
                                               ir.Constant(v64, [3] * 64))
                            w[c] = builder.or_(w[c], builder.shl(top, ir.Constant(v64, [4] * 64)))
                        sc = builder.sext(load(row, builder.add(scales_at, builder.mul(b, i64(16))),
                                               ir.VectorType(_I8, 16)), v16i)
                        # a scale per 16 weights: 4 lanes
                        per_lane = [[4 * c + k // 4 for k in range(16)] for c in range(4)]
                    else:
                        if kind == WQ5_K:
                            fifth_bits(row, builder.add(aux_at, builder.mul(b, i64(32))), w)
                        at = builder.add(scales_at, builder.mul(b, i64(16)))
                        sc = builder.zext(load(row, at, ir.VectorType(_I8, 8)), v8i)
                        mn = builder.zext(load(row, builder.add(at, i64(8)), ir.VectorType(_I8, 8)), v8i)
                        # a scale per 32 weights: 8 lanes
                        per_lane = [[2 * c + k // 8 for k in range(16)] for c in range(4)]
                    spreads = [builder.shuffle_vector(sc, sc, ir.Constant(v16i, lanes)) for lanes in per_lane]
                    d = scalar_f16(row, builder.add(d_at, builder.mul(b, i64(2))))
                    dmin = None
                    if kind != WQ6_K:
                        dmin = scalar_f16(row, builder.add(dmin_at, builder.mul(b, i64(2))))
                    prepared = [dot_scales(builder, spread) for spread in spreads]
                    for i, (chunks, starts, xd_b, bsums) in enumerate(acts):
                        total = ir.Constant(v16i, [0] * 16)
                        for c in range(4):  # (start + dot) * scale, lane by lane
                            scaled = lanes_dot_scaled(builder, w[c], chunks[c], prepared[c])
                            total = builder.add(total, scaled)
                            if kind == WQ6_K:
                                total = builder.add(total, builder.mul(starts[c], spreads[c]))
                        scale, acc = splat(builder, builder.fmul(d, xd_b), 16), accs[j][i]
                        summed = fmuladd(builder, builder.sitofp(total, v16f), scale, builder.load(acc))
                        builder.store(summed, acc)
                        if dmin is not None:
                            prod = builder.sitofp(builder.mul(mn, bsums), v8f)
                            scale = splat(builder, builder.fmul(dmin, xd_b), 8)
                            builder.store(fmuladd(builder, prod, scale, builder.load(mins[j][i])), mins[j][i])

            with cgutils.for_range(builder, nblocks) as loop:
                superblock(loop.index)
            sums = totals(builder, accs, mins, builder.fsub if kind != WQ6_K else None)
            return context.make_tuple(builder, sig.return_type, sums)
        return types.UniTuple(types.float32, m * n)(w, wi, stride, nb, xq, t0, xd, nsum16, bsum32), codegen
    return dot


def _by_kind(m, n):
    """One function over the super-block dots of m weight rows and n activation rows."""
    q4_k, q6_k, q5_k = (_super_dot(k, m, n) for k in SUPER_KINDS)

    @njit(inline="always")
    def dot(kind, w, wi, stride, nb, xq, t, xd, nsum16, bsum32):
        if kind == WQ4_K:
            return q4_k(w, wi, stride, nb, xq, t, xd, nsum16, bsum32)
        if kind == WQ5_K:
            return q5_k(w, wi, stride, nb, xq, t, xd, nsum16, bsum32)
        return q6_k(w, wi, stride, nb, xq, t, xd, nsum16, bsum32)
    return dot


superblock_products = rows_driver(_by_kind)  # with Q8_K's (qs, d) and superblock_sums'
