"""Integer dots for Q4_0, Q4_1 and Q8_0 on tiles of 16 weight rows, one row per int32 lane.

Why: :mod:`.quant_int8_rows` keeps a row's blocks side by side, so a vector's 16 int32 lanes hold
four lanes of each of four blocks of one row, and every group of four blocks then needs its lanes
converted to float and scaled (convert, multiply, shuffle, multiply-add) per activation row.
With several activation rows (a batch, a speculative verification) those 512-bit operations run
on the same port as the integer dots and cost more than the dots themselves (docs/kernels.md).
Here 16 rows are interleaved: lane j of a vector is row j, so ``vpdpbusd`` with four activation
bytes broadcast to every lane adds four products to each of 16 rows at once; a block's integer
sums of 16 rows are then one vector, converted and scaled by the 16 rows' scales in three
operations for all of them (llama.cpp's ``q4_0_8x8`` repacking does the same for the same
reason).

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
from .quant_int8_rows import (
    WQ4_0,
    WQ4_1,
    WQ8_0,
    dot_frame,
    fmuladd,
    half_to_float,
    lanes_dot_sum,
    madd_dots,
    q8_dot,
    q8_offset,
    splat,
)

TILE = 16  # rows per tile: the int32 lanes of a 512-bit vector
# Kinds after quant_int8_rows' five and quant_int8_superblocks' two.
WQ4_0_T, WQ4_1_T, WQ8_0_T = 7, 8, 9
TILE_KINDS = (WQ4_0_T, WQ4_1_T, WQ8_0_T)
ROW_KIND = {WQ4_0_T: WQ4_0, WQ4_1_T: WQ4_1, WQ8_0_T: WQ8_0}
TILE_KIND = {v: k for k, v in ROW_KIND.items()}
_BLOCK_BYTES = {WQ4_0_T: 18, WQ4_1_T: 20, WQ8_0_T: 34}  # the file's
_CHUNKS = {WQ4_0_T: 4, WQ4_1_T: 4, WQ8_0_T: 8}
_ZERO_SHIFT = {WQ4_0_T: 3, WQ8_0_T: 7}  # stored quants are value + 2^shift
# Activation rows per pass over a tile (then 1-3 in one more call). With vpdpbusd, 4: a pass's
# 16-lane accumulators (rows x tiles) fit AVX-512's 32 registers. With AVX2's vpmaddubsw, 1:
# they are twice as many 256-bit halves against 16 registers, and spilling them made passes of 4
# rows x 2 tiles 1.4-1.5x slower than a pass per row over tiles still in the L1 cache (Q4_0,
# Q4_1 and Q8_0 at 4-8 rows, machine A).
_ROWS_AT_ONCE = 1 if madd_dots(64) else 4
TILES_AT_ONCE = 2  # tiles per pass (_tile_dot's doc); ranges of a multiple of this many tiles
# take no single-tile pass

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


def _tile_dot(kind: int, n: int, nt: int):
    """``dot(w, wi, stride, nb, xg, t0, xd, xs, nsum, out, r)``: the ``nt`` tiles at bytes ``wi,
    wi + stride, ...`` of ``w`` (``nb`` blocks each) times activation rows t0 .. t0 + n - 1
    (grouped Q8_1, :func:`.quant_int8_rows.quantize_grouped`), stored straight into ``out[t0 + i,
    r + 16 tt + j]`` (row j of tile tt) as one 16-float vector per tile and activation row.

    Each broadcast of four activation bytes feeds the nt tiles' ``vpdpbusd``: broadcasting a word
    from memory for every ``vpdpbusd`` holds the kernel to about one broadcast a cycle
    (docs/kernels.md), and a second tile halves the broadcasts."""
    chunks = _CHUNKS[kind]
    record = 64 * chunks + 32 * (2 if kind == WQ4_1_T else 1)  # bytes a block of a tile takes

    @intrinsic
    def dot(typingctx, w, wi, stride, nb, xg, t0, xd, xs, nsum, out, r):
        if not (isinstance(out, types.Array) and out.layout == "C" and out.dtype == types.float32):
            return None  # the vector stores below need contiguous float32 rows

        def codegen(context, builder, sig, args):
            load, i64, nblocks, tiles, (xg_rows, xd_rows, xs_rows, nsum_rows) = \
                dot_frame(context, builder, sig, args, nt, n)
            v64, v16i, v16f = ir.VectorType(_I8, 64), ir.VectorType(_I32, TILE), ir.VectorType(_F32, TILE)
            zero = ir.Constant(v16f, [0.0] * TILE)
            accs = [[cgutils.alloca_once_value(builder, zero) for _ in range(n)] for _ in range(nt)]
            mins = [[cgutils.alloca_once_value(builder, zero) for _ in range(n)] for _ in range(nt)]

            def block(b, g, j, k):
                """Block b, the j-th of the activations' group of k blocks starting at block g."""
                at = builder.mul(b, i64(record))
                group_at = builder.mul(g, i64(32))
                totals = []  # [activation row][tile]: the block's integer sums
                for i in range(n):
                    start = ir.Constant(v16i, [0] * TILE)
                    if kind in _ZERO_SHIFT and (kind != WQ8_0_T or q8_offset(64)):
                        # -zero * sum(x quants): the block's nsum, shifted
                        nsum = load(nsum_rows[i], builder.mul(b, i64(4)), _I32)
                        start = splat(builder, builder.shl(nsum, _I32(_ZERO_SHIFT[kind])), TILE)
                    totals.append([start] * nt)
                pairs = [[[] for _ in range(nt)] for _ in range(n)]  # [row][tile]: (weights, activations)
                for c in range(chunks):
                    vs = [load(tile, builder.add(at, i64(64 * c)), v64) for tile in tiles]
                    if kind == WQ8_0_T:
                        parts = [(vs, c // 4, 4 * (c % 4))]
                    else:  # low nibbles: weights 4c .., high nibbles: 16 + 4c ..
                        parts = [([builder.and_(v, ir.Constant(v64, [0xF] * 64)) for v in vs], 0, 4 * c),
                                 ([builder.lshr(v, ir.Constant(v64, [4] * 64)) for v in vs], 1, 4 * c)]
                    for weights, half, within in parts:
                        x_at = builder.add(group_at, i64(16 * (half * k + j) + within))
                        for i in range(n):
                            x4 = builder.bitcast(splat(builder, load(xg_rows[i], x_at, _I32), TILE), v64)
                            if kind == WQ8_0_T:  # quants stored as w + 128: no int16 sums
                                totals[i] = [q8_dot(builder, total, v, x4)
                                             for total, v in zip(totals[i], weights, strict=True)]
                            else:
                                for tt, v in enumerate(weights):
                                    pairs[i][tt].append((v, x4))
                if kind != WQ8_0_T:  # nibbles: the block's dots summed in int16 where that is faster
                    totals = [[lanes_dot_sum(builder, total, pairs[i][tt], 15)
                               for tt, total in enumerate(totals[i])] for i in range(n)]
                scales_at = builder.add(at, i64(64 * chunks))
                halves = ir.VectorType(_I16, TILE)
                for tt, tile in enumerate(tiles):
                    d = half_to_float(builder, load(tile, scales_at, halves))
                    m = None
                    if kind == WQ4_1_T:
                        m = half_to_float(builder, load(tile, builder.add(scales_at, i64(32)), halves))
                    for i in range(n):
                        scale = builder.fmul(d, splat(builder, load(xd_rows[i], b, _F32), TILE))
                        acc = accs[tt][i]
                        builder.store(fmuladd(builder, builder.sitofp(totals[i][tt], v16f), scale,
                                              builder.load(acc)), acc)
                        if m is not None:  # + m * s
                            s = splat(builder, load(xs_rows[i], b, _F32), TILE)
                            builder.store(fmuladd(builder, m, s, builder.load(mins[tt][i])), mins[tt][i])

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
            result = context.make_array(sig.args[9])(context, builder, args[9])
            width = cgutils.unpack_tuple(builder, result.shape, 2)[1]
            for i in range(n):
                row = builder.mul(builder.add(args[5], i64(i)), width)
                for tt in range(nt):
                    total = builder.load(accs[tt][i])
                    if kind == WQ4_1_T:
                        total = builder.fadd(total, builder.load(mins[tt][i]))
                    at = builder.add(row, builder.add(args[10], i64(TILE * tt)))
                    where = builder.gep(result.data, [at], inbounds=True)
                    builder.store(total, builder.bitcast(where, v16f.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.none(w, wi, stride, nb, xg, t0, xd, xs, nsum, out, r), codegen
    return dot


def _by_kind(n, nt):
    """One function over the three formats' dots of nt tiles and n activation rows, by kind."""
    q4_0, q4_1, q8_0 = (_tile_dot(k, n, nt) for k in TILE_KINDS)

    @njit(inline="always")
    def dot(kind, w, wi, stride, nb, xg, t, xd, xs, nsum, out, r):
        if kind == WQ4_0_T:
            q4_0(w, wi, stride, nb, xg, t, xd, xs, nsum, out, r)
        elif kind == WQ4_1_T:
            q4_1(w, wi, stride, nb, xg, t, xd, xs, nsum, out, r)
        else:
            q8_0(w, wi, stride, nb, xg, t, xd, xs, nsum, out, r)
    return dot


def _passes(nt):
    """``passes(kind, w, wi, stride, nb, xg, xd, xs, nsum, out, r)``: every activation row times
    the nt tiles at byte wi, ROWS_AT_ONCE rows a pass while that many remain, then the other 1-3
    in one pass (a row's result is the same operations in any pass)."""
    dots = {n: _by_kind(n, nt) for n in {1, 2, 3, _ROWS_AT_ONCE} if n <= _ROWS_AT_ONCE}
    one, many = dots[1], dots[_ROWS_AT_ONCE]
    two, three = dots.get(2, one), dots.get(3, one)  # (never called when a pass takes one row)

    @njit(inline="always")
    def passes(kind, w, wi, stride, nb, xg, xd, xs, nsum, out, r):
        T = xg.shape[0]
        rest = T // _ROWS_AT_ONCE * _ROWS_AT_ONCE
        for t in range(0, rest, _ROWS_AT_ONCE):
            many(kind, w, wi, stride, nb, xg, t, xd, xs, nsum, out, r)
        if T - rest == 3:
            three(kind, w, wi, stride, nb, xg, rest, xd, xs, nsum, out, r)
        elif T - rest == 2:
            two(kind, w, wi, stride, nb, xg, rest, xd, xs, nsum, out, r)
        elif T - rest == 1:
            one(kind, w, wi, stride, nb, xg, rest, xd, xs, nsum, out, r)
    return passes


_single, _several = _passes(1), _passes(TILES_AT_ONCE)


@njit(inline="always")
def tiles_products(kind, w2, r0, r1, xg, xd, xs, nsum, out):
    """``out[:, r0:r1]`` for rows r0 .. r1 - 1 of tiled ``w2`` (``[rows, row bytes]``; r0 and r1
    multiples of TILE) and grouped Q8_1 activations: TILES_AT_ONCE tiles at a time (then one at a
    time), each
    pass over them taking ROWS_AT_ONCE activation rows while that many remain, then the other 1-3.
    The weights stream by, prefetched AHEAD_BYTES past the tiles being multiplied as they go (with
    several activation rows the later passes over them find them in the L1 cache)."""
    w = w2.reshape(-1)
    row_bytes, nb = w2.shape[1], xd.shape[1]
    stride = TILE * row_bytes
    ahead = r0 * row_bytes + AHEAD_BYTES
    r = r0
    while r + TILES_AT_ONCE * TILE <= r1:
        ahead = prefetch_until(w, ahead, (r + TILES_AT_ONCE * TILE) * row_bytes + AHEAD_BYTES)
        _several(kind, w, r * row_bytes, stride, nb, xg, xd, xs, nsum, out, r)
        r += TILES_AT_ONCE * TILE
    while r < r1:
        ahead = prefetch_until(w, ahead, (r + TILE) * row_bytes + AHEAD_BYTES)
        _single(kind, w, r * row_bytes, stride, nb, xg, xd, xs, nsum, out, r)
        r += TILE
