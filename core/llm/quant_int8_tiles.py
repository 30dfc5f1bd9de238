"""Integer dots for Q4_0, Q4_1 and Q8_0 on tiles of 16 weight rows, one row per int32 lane.

Why: :mod:`.quant_int8_rows` keeps a row's blocks side by side, so a vector's 16 int32 lanes hold
four lanes of each of four blocks of one row, and every group of four blocks then needs its lanes
converted to float and scaled (convert, multiply, shuffle, multiply-add) per activation row.
With several activation rows (a batch, a speculative verification) those 512-bit operations run
on the same port as the integer dots and cost more than the dots themselves (~5.5 cycles per
group and row, measured with the weights in L1). Here 16 rows are interleaved: lane j of a
vector is row j, so ``vpdpbusd`` with four activation bytes broadcast to every lane adds four
products to each of 16 rows at once; a block's integer sums of 16 rows are then one vector,
converted and scaled by the 16 rows' scales in three operations for all of them (llama.cpp's
``q4_0_8x8`` repacking does the same for the same reason).

Layout: a matrix of ``16 * tiles`` rows becomes tiles one after another; a tile is its blocks in
order, each block ``chunks`` of 64 bytes then its 16 rows' f16 scales d, then (Q4_1) their f16
offsets m. Chunk c holds, for rows 0..15 in turn, bytes 4c .. 4c + 3 of the row's block quants:
for Q4_0 / Q4_1 (4 chunks of the 16 quant bytes) low nibbles are weights 4c .. 4c + 3 and high
nibbles weights 16 + 4c .. 16 + 4c + 3; for Q8_0 (8 chunks) weights 4c .. 4c + 3, stored as
``w + 128``. The bytes are the file's blocks' bytes rearranged, no more.

The activations are :func:`.quant_int8_rows.quantize_grouped`'s (so a step quantizes once for
both layouts); each row's result is its blocks' ``d * d_x * sum`` added in block order, plus
(Q4_1) its ``m * s`` added in block order: the same operations whichever number of activation
rows a call takes, so a row gets the same bits alone or among others.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .kernel_hints import AHEAD_BYTES, prefetch_until
from .quant_int8_rows import WQ4_0, WQ4_1, WQ8_0, dot_frame, fmuladd, half_to_float, lanes_dot

TILE = 16  # rows per tile: the int32 lanes of a 512-bit vector
# Kinds after quant_int8_rows' five and quant_int8_superblocks' two.
WQ4_0_T, WQ4_1_T, WQ8_0_T = 7, 8, 9
TILE_KINDS = (WQ4_0_T, WQ4_1_T, WQ8_0_T)
ROW_KIND = {WQ4_0_T: WQ4_0, WQ4_1_T: WQ4_1, WQ8_0_T: WQ8_0}
TILE_KIND = {v: k for k, v in ROW_KIND.items()}
_BLOCK_BYTES = {WQ4_0_T: 18, WQ4_1_T: 20, WQ8_0_T: 34}  # the file's
_CHUNKS = {WQ4_0_T: 4, WQ4_1_T: 4, WQ8_0_T: 8}
_ZERO_SHIFT = {WQ4_0_T: 3, WQ8_0_T: 7}  # stored quants are value + 2^shift
_ROWS_AT_ONCE = 4  # activation rows per pass over a tile (then 1-3 in one more call)

_I8, _I16, _I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
_F32 = ir.FloatType()


@njit(inline="always")
def is_tiled(kind):
    """Whether a repacked matrix of this kind is laid out in tiles (one of TILE_KINDS)."""
    return kind == WQ4_0_T or kind == WQ4_1_T or kind == WQ8_0_T


def tiles_fit(rows: int) -> bool:
    """Whether a matrix of ``rows`` rows can be laid out in tiles."""
    return rows % TILE == 0


def repack(kind: int, raw: np.ndarray, nb: int) -> np.ndarray:
    """The file's blocks ``raw`` (uint8, ``rows * nb`` blocks, rows a multiple of TILE) as tiles
    (module doc): uint8 ``[rows, nb * block bytes]`` (a tile is 16 of these rows' bytes)."""
    bbytes = _BLOCK_BYTES[kind]
    blocks = raw.reshape(-1, TILE, nb, bbytes)  # [tiles, row in tile, block, byte]
    tiles = blocks.shape[0]
    start = 4 if kind == WQ4_1_T else 2
    quants = blocks[:, :, :, start:]
    if kind == WQ8_0_T:
        quants = quants ^ np.uint8(0x80)
    chunks = quants.reshape(tiles, TILE, nb, _CHUNKS[kind], 4).transpose(0, 2, 3, 1, 4)  # [tile, b, c, j, 4]
    parts = [chunks.reshape(tiles, nb, -1), blocks[:, :, :, 0:2].transpose(0, 2, 1, 3).reshape(tiles, nb, -1)]
    if kind == WQ4_1_T:
        parts.append(blocks[:, :, :, 2:4].transpose(0, 2, 1, 3).reshape(tiles, nb, -1))
    return np.ascontiguousarray(np.concatenate(parts, axis=2)).reshape(tiles * TILE, nb * bbytes)


def _tile_dot(kind: int, n: int):
    """``dot(w, wi, stride, nb, xg, t0, xd, xs, nsum)``: the tile at byte ``wi`` of ``w`` (``nb``
    blocks; ``stride`` unused, the frame's) times activation rows t0 .. t0 + n - 1 (grouped
    Q8_1, :func:`.quant_int8_rows.quantize_grouped`) -> a tuple of 16 * n float32 (activation
    row major)."""
    chunks = _CHUNKS[kind]
    record = 64 * chunks + 32 * (2 if kind == WQ4_1_T else 1)  # bytes a block of a tile takes

    @intrinsic
    def dot(typingctx, w, wi, stride, nb, xg, t0, xd, xs, nsum):
        def codegen(context, builder, sig, args):
            load, i64, nblocks, (tile,), (xg_rows, xd_rows, xs_rows, nsum_rows) = \
                dot_frame(context, builder, sig, args, 1, n)
            v64, v16i, v16f = ir.VectorType(_I8, 64), ir.VectorType(_I32, TILE), ir.VectorType(_F32, TILE)
            splat = ir.Constant(v16i, [0] * TILE)

            def broadcast(value, vt):
                one = builder.insert_element(ir.Constant(vt, ir.Undefined), value, _I32(0))
                return builder.shuffle_vector(one, one, splat)

            zero = ir.Constant(v16f, [0.0] * TILE)
            accs = [cgutils.alloca_once_value(builder, zero) for _ in range(n)]
            mins = [cgutils.alloca_once_value(builder, zero) for _ in range(n)]

            def block(b, g, j, k):
                """Block b, the j-th of the activations' group of k blocks starting at block g."""
                at = builder.mul(b, i64(record))
                weights = []  # (unsigned bytes, x byte offset of their four weights) per vpdpbusd
                for c in range(chunks):
                    v = load(tile, builder.add(at, i64(64 * c)), v64)
                    if kind == WQ8_0_T:
                        weights.append((v, c // 4, 4 * (c % 4)))
                    else:
                        weights.append((builder.and_(v, ir.Constant(v64, [0xF] * 64)), 0, 4 * c))
                        weights.append((builder.lshr(v, ir.Constant(v64, [4] * 64)), 1, 4 * c))
                scales_at = builder.add(at, i64(64 * chunks))
                halves = ir.VectorType(_I16, TILE)
                d = half_to_float(builder, load(tile, scales_at, halves))
                m = None
                if kind == WQ4_1_T:
                    m = half_to_float(builder, load(tile, builder.add(scales_at, i64(32)), halves))
                group_at = builder.mul(g, i64(32))
                for i in range(n):
                    total = ir.Constant(v16i, [0] * TILE)
                    if kind in _ZERO_SHIFT:  # -zero * sum(x quants): the block's nsum, shifted
                        nsum = load(nsum_rows[i], builder.mul(b, i64(4)), _I32)
                        total = broadcast(builder.shl(nsum, _I32(_ZERO_SHIFT[kind])), v16i)
                    for v, half, within in weights:
                        x_at = builder.add(group_at, i64(16 * (half * k + j) + within))
                        x4 = broadcast(load(xg_rows[i], x_at, _I32), v16i)
                        total = lanes_dot(builder, total, v, builder.bitcast(x4, v64))
                    scale = builder.fmul(d, broadcast(load(xd_rows[i], b, _F32), v16f))
                    builder.store(fmuladd(builder, builder.sitofp(total, v16f), scale, builder.load(accs[i])),
                                  accs[i])
                    if m is not None:  # + m * s
                        s = broadcast(load(xs_rows[i], b, _F32), v16f)
                        builder.store(fmuladd(builder, m, s, builder.load(mins[i])), mins[i])

            # the activations' groups: fours, then a two, then a one (quantize_grouped's layout)
            full = builder.udiv(nblocks, i64(4))
            with cgutils.for_range(builder, full) as loop:
                g = builder.mul(loop.index, i64(4))
                for j in range(4):
                    block(builder.add(g, i64(j)), g, j, 4)
            g = builder.mul(full, i64(4))
            rest = builder.urem(nblocks, i64(4))
            with builder.if_then(builder.icmp_unsigned(">=", rest, i64(2))):
                for j in range(2):
                    block(builder.add(g, i64(j)), g, j, 2)
            with builder.if_then(builder.icmp_unsigned("==", builder.urem(rest, i64(2)), i64(1))):
                last = builder.sub(nblocks, i64(1))
                block(last, last, 0, 1)
            out = []
            for i in range(n):
                total = builder.load(accs[i])
                if kind == WQ4_1_T:
                    total = builder.fadd(total, builder.load(mins[i]))
                out += [builder.extract_element(total, _I32(r)) for r in range(TILE)]
            return context.make_tuple(builder, sig.return_type, out)
        return types.UniTuple(types.float32, TILE * n)(w, wi, stride, nb, xg, t0, xd, xs, nsum), codegen
    return dot


def _by_kind(n):
    q4_0, q4_1, q8_0 = (_tile_dot(k, n) for k in TILE_KINDS)

    @njit(inline="always")
    def dot(kind, w, wi, nb, xg, t, xd, xs, nsum):
        if kind == WQ4_0_T:
            return q4_0(w, wi, 0, nb, xg, t, xd, xs, nsum)
        if kind == WQ4_1_T:
            return q4_1(w, wi, 0, nb, xg, t, xd, xs, nsum)
        return q8_0(w, wi, 0, nb, xg, t, xd, xs, nsum)
    return dot


_one, _two, _three, _many = (_by_kind(n) for n in (1, 2, 3, _ROWS_AT_ONCE))


@njit(inline="always")
def _store(out, t, r, v, n):
    for i in range(n):
        for j in range(TILE):
            out[t + i, r + j] = v[i * TILE + j]


@njit(inline="always")
def tiles_products(kind, w2, r0, r1, xg, xd, xs, nsum, out):
    """``out[:, r0:r1]`` for rows r0 .. r1 - 1 of tiled ``w2`` (``[rows, row bytes]``; r0 and r1
    multiples of TILE) and grouped Q8_1 activations: for each tile, ROWS_AT_ONCE activation rows
    per call while that many remain, then the other 1-3 in one call. The weights stream by,
    prefetched AHEAD_BYTES past the tile being multiplied as they go (with several activation
    rows the later passes over a tile find it in the L1 cache)."""
    w = w2.reshape(-1)
    stride, nb = w2.shape[1], xd.shape[1]
    T = xg.shape[0]
    rest = T // _ROWS_AT_ONCE * _ROWS_AT_ONCE
    ahead = r0 * stride + AHEAD_BYTES
    for r in range(r0, r1, TILE):
        wi = r * stride
        ahead = prefetch_until(w, ahead, wi + TILE * stride + AHEAD_BYTES)
        if T == 1:
            _store(out, 0, r, _one(kind, w, wi, nb, xg, 0, xd, xs, nsum), 1)
            continue
        for t in range(0, rest, _ROWS_AT_ONCE):
            _store(out, t, r, _many(kind, w, wi, nb, xg, t, xd, xs, nsum), _ROWS_AT_ONCE)
        if T - rest == 3:
            _store(out, rest, r, _three(kind, w, wi, nb, xg, rest, xd, xs, nsum), 3)
        elif T - rest == 2:
            _store(out, rest, r, _two(kind, w, wi, nb, xg, rest, xd, xs, nsum), 2)
        elif T - rest == 1:
            _store(out, rest, r, _one(kind, w, wi, nb, xg, rest, xd, xs, nsum), 1)
