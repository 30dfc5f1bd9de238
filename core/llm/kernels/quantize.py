"""Float32 matrices encoded in GGUF's block formats, as llama.cpp's reference quantizer does.

``quantize(W, "Q4_0")`` gives the bytes of ``W``'s blocks, one row of blocks per row of ``W``: what
a :class:`~loomlab.core.llm.kernels.quant.QuantMatrix` takes (``quantize_matrix`` builds one). Formats:
Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (blocks of 32 weights) and Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (super-blocks
of 256).

Each encoder is a line-by-line port of ``quantize_row_*_ref`` in llama.cpp's
``ggml/src/ggml-quants.c`` (with ``make_qkx2_quants``, ``make_qx_quants``, ``make_q3_quants`` and
``nearest_int`` for the K-quants, in the paths they call): every step in float32, in C's order of
operations and without fused multiply-adds, float16 scales through ggml's own ``ggml_compute_fp32_to_fp16``
(round to nearest even), ``nearest_int`` by its magic-number trick. The blocks are therefore
byte-identical to gguf-py's ``quants.quantize`` for the five formats it implements and to
llama.cpp's C for all ten (``tests/core/llm/kernels/test_quantize.py`` compiles the C as its oracle).

With an importance vector (``quantize(W, fmt, importance=w)``: llama.cpp's imatrix, one weight
per column, e.g. the mean square of that column's input) the encoders follow llama.cpp's
``quantize_<type>(src, dst, nrow, n_per_row, quant_weights)`` instead, its ``*_impl`` paths:
each block's scales fitted by weighted least squares with ``make_qkx3_quants``, ``make_qp_quants``
and ``make_qx_quants``, byte-identical to that C too (``test_quantize_imatrix.py``). Q8_0 has no
such path: llama.cpp ignores the weights, and so does ``quantize``.

The kernels run over rows in parallel on numba's threads and release the GIL: SmolLM2-135M's
134 M weights take seconds (``tests/bench/bench_quantize.py``).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as GT
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from ...errors import LoomConfigError, LoomShapeError
from .quant import FORMATS, KERNEL_OPTIONS, QuantMatrix

F32 = np.float32
QUANTIZE_FORMATS: tuple[str, ...] = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q6_K", "Q5_K", "Q3_K",
                                     "Q2_K")
_CODE = {name: i for i, name in enumerate(QUANTIZE_FORMATS)}
_GROUP_MAX_EPS = F32(1e-15)
# The fits divide as C does, to inf or NaN, where numba's default would raise: make_qkx2_quants
# can move its min up to its max and then divide by max - min (an importance of zero on a block's
# only nonzero weight does it), and llama.cpp's C goes on with the infinite scale.
_C_DIVISION = dict(error_model="numpy")



def quantize(matrix: np.ndarray, fmt: str, importance: np.ndarray | None = None) -> np.ndarray:
    """``matrix`` (float ``[rows, cols]``, converted to float32) encoded in format ``fmt``.

    Args:
        importance: None for llama.cpp's reference quantizer (``quantize_row_<type>_ref``), or
            the importance of each column (float ``[cols]``, finite, >= 0: llama.cpp's imatrix
            entry for this matrix) for its importance-weighted one. Zeros are allowed, as in
            llama.cpp, where a block whose weights are all zero may decode to all zeros.

    Returns:
        uint8 ``[rows, cols // block_elems * block_bytes]``: each row's blocks in GGUF's layout.

    Raises:
        LoomConfigError: ``fmt`` is not one of :data:`QUANTIZE_FORMATS`, ``matrix`` or
            ``importance`` is not a floating-point array, or holds values that are not finite in
            float32, or ``importance`` holds a negative weight.
        LoomShapeError: ``matrix`` is not 2-D and non-empty, or its rows are not whole blocks, or
            ``importance`` is not one weight per column.
    """
    W, spec = _checked(matrix, fmt)
    qw = _checked_importance(importance, W.shape[1])
    out = np.empty((W.shape[0], W.shape[1] // spec.block_elems * spec.block_bytes), np.uint8)
    _quantize_rows(W, _CODE[fmt], spec.block_elems, spec.block_bytes, qw, out)
    return out


def quantize_matrix(matrix: np.ndarray, fmt: str, *, name: str = "tensor",
                    importance: np.ndarray | None = None) -> QuantMatrix:
    """A :class:`QuantMatrix` holding ``quantize(matrix, fmt, importance)``."""
    blocks = quantize(matrix, fmt, importance)
    return QuantMatrix(blocks, int(GT[fmt]), (blocks.shape[0], int(np.shape(matrix)[1])), name=name)


def _checked(matrix, fmt):
    """Every check before any work: the format, then the shape, then the values."""
    if not isinstance(fmt, str) or fmt not in _CODE:
        raise LoomConfigError(f"cannot quantize to {fmt!r}; formats: {', '.join(QUANTIZE_FORMATS)}")
    spec = FORMATS[int(GT[fmt])]
    if not isinstance(matrix, np.ndarray):
        raise LoomConfigError(f"the matrix to quantize must be a numpy array, not {type(matrix).__name__}")
    if matrix.ndim != 2 or matrix.size == 0:
        raise LoomShapeError(f"the matrix to quantize must be 2-D [rows, cols] and not empty; "
                             f"got shape {matrix.shape}")
    if matrix.shape[1] % spec.block_elems:
        raise LoomShapeError(f"{fmt} needs rows of whole {spec.block_elems}-weight blocks; the matrix "
                             f"{matrix.shape} has {matrix.shape[1]} columns")
    if not np.issubdtype(matrix.dtype, np.floating):
        raise LoomConfigError(f"the matrix to quantize must hold floats; got {matrix.dtype}")
    with np.errstate(over="ignore"):  # a float64 beyond float32's range: reported just below
        W = np.ascontiguousarray(matrix, dtype=F32)
    finite = np.isfinite(W).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise LoomConfigError(f"the matrix to quantize holds values that are not finite (as float32) "
                              f"in {bad.size} rows, first row {bad[0]}")
    return W, spec


def _checked_importance(importance, cols):
    """``importance`` as contiguous float32 ``[cols]``; None as an empty array (the kernels' sign
    for llama.cpp's reference path)."""
    if importance is None:
        return np.zeros(0, F32)
    if not isinstance(importance, np.ndarray) or not np.issubdtype(importance.dtype, np.floating):
        what = importance.dtype if isinstance(importance, np.ndarray) else type(importance).__name__
        raise LoomConfigError(f"the importance must be a numpy array of floats; got {what}")
    if importance.shape != (cols,):
        raise LoomShapeError(f"the importance must hold one weight per column of the matrix, shape "
                             f"({cols},); got shape {importance.shape}")
    with np.errstate(over="ignore"):  # a float64 beyond float32's range: reported just below
        qw = np.ascontiguousarray(importance, dtype=F32)
    for bad, what in ((~np.isfinite(qw), "not finite (as float32)"), (qw < 0, "negative")):
        if bad.any():
            at = np.flatnonzero(bad)
            raise LoomConfigError(f"the importance holds {at.size} weights that are {what}, first at "
                                  f"column {at[0]} ({importance[at[0]]}); they must be finite and >= 0")
    return qw


# ---------------------------------------------------------------------------------------------
# Bits: float32 <-> its IEEE bits (as int64, zero-extended), and ggml's float16 conversions.


@intrinsic
def _bits(typingctx, f):
    """The bits of float32 ``f`` as a non-negative int64 (C's memcpy to uint32)."""
    def codegen(context, builder, sig, args):
        return builder.zext(builder.bitcast(args[0], ir.IntType(32)), ir.IntType(64))
    return types.int64(types.float32), codegen


@intrinsic
def from_bits(typingctx, i):
    """The float32 whose bits are the low 32 bits of int64 ``i``."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())
    return types.float32(types.int64), codegen


@njit(inline="always")
def _fp16(f):
    """ggml_compute_fp32_to_fp16: float32 ``f`` as float16 bits (round to nearest even)."""
    base = (abs(f) * F32(2.0**112)) * F32(2.0**-110)
    w = _bits(f)
    shl1_w = (w + w) & 0xFFFFFFFF
    sign = w & 0x80000000
    bias = max(shl1_w & 0xFF000000, 0x71000000)
    base = from_bits((bias >> 1) + 0x07800000) + base
    bits = _bits(base)
    nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF)
    return ((sign >> 16) | (0x7E00 if shl1_w > 0xFF000000 else nonsign)) & 0xFFFF


@njit(inline="always")
def _fp32(h):
    """ggml_compute_fp16_to_fp32: float16 bits ``h`` as float32 (exact)."""
    w = h << 16
    sign = w & 0x80000000
    two_w = (w + w) & 0xFFFFFFFF
    normalized = from_bits((two_w >> 4) + (0xE0 << 23)) * F32(2.0**-112)
    denormalized = from_bits((two_w >> 17) | (126 << 23)) - F32(0.5)
    return from_bits(sign | (_bits(denormalized) if two_w < (1 << 27) else _bits(normalized)))


@njit(inline="always")
def _nearest_int(fval):
    """ggml's nearest_int: round to nearest even through the float32 sum with 1.5 * 2**23."""
    return (_bits(fval + F32(12582912.0)) & 0x007FFFFF) - 0x00400000


@njit(inline="always")
def _c_int(v):
    """C's float -> int conversion as x86 does it (cvttss2si): truncation toward zero, and
    INT_MIN for NaN, infinities and values out of int's range (undefined behaviour in C; a block
    whose scale d is a float32 subnormal has an infinite 1 / d and meets it)."""
    if abs(v) < F32(2147483648.0):
        return np.int64(v)
    return -2147483648


@njit(inline="always")
def _int8(n):
    """C's (int8_t) of an int: its low byte, signed."""
    return ((n & 0xFF) ^ 0x80) - 0x80


@njit(inline="always")
def _roundf(v):
    """C's roundf: halves away from zero."""
    if not abs(v) < F32(8388608.0):  # 2**23: already whole (or not finite)
        return v
    t = F32(np.int64(v))
    r = v - t
    if r >= F32(0.5):
        return t + F32(1)
    if r <= F32(-0.5):
        return t - F32(1)
    return t


@njit(inline="always")
def _put16(o, at, h):
    o[at] = h & 0xFF
    o[at + 1] = h >> 8



@njit(inline="always")
def _sum_squares(x, n):
    """x[0]**2 + ... + x[n-1]**2 in float32, left to right (the C's ``sum_x2``)."""
    total = F32(0)
    for i in range(n):
        total += x[i] * x[i]
    return total


@njit(inline="always")
def _importance_weights(qw, x, n, sigma2, out):
    """llama.cpp's weights for an imatrix fit, ``qw[i] * sqrtf(sigma2 + x[i]**2)``, into out[:n];
    returns their sum (the C's ``sw[j]``)."""
    total = F32(0)
    for i in range(n):
        out[i] = qw[i] * np.sqrt(sigma2 + x[i] * x[i])
        total += out[i]
    return total


# ---------------------------------------------------------------------------------------------
# Blocks of 32: Q8_0 (roundf), Q4_0 / Q5_0 (scale from the signed absolute maximum, 2**(b-1)
# levels each side) and Q4_1 / Q5_1 (scale and minimum, 2**b - 1 steps). ``L`` gets the quants;
# _pack_32 writes them as nibbles at ``qs`` and, for 5 bits, the fifth bits at ``qh``. With
# importance ``qw`` (non-empty) the scales are llama.cpp's quantize_row_q*_impl fits instead, each
# weight's importance times sqrt(sigma2 + x**2), sigma2 the mean square of the whole row.


@njit
def _q8_0_block(x, o):
    amax = F32(0)
    for j in range(32):
        amax = max(amax, abs(x[j]))
    d = amax / F32(127)
    inv = F32(1) / d if d != 0 else F32(0)
    _put16(o, 0, _fp16(d))
    for j in range(32):
        o[2 + j] = _c_int(_roundf(x[j] * inv)) & 0xFF


@njit
def _symmetric_block(x, o, half, L, qw, sigma2, weights):
    """Q4_0 (half 8) / Q5_0 (half 16): the f16 scale, and the quants in L."""
    if qw.size:  # make_qx_quants's weighted least-squares scale, its sign included
        _importance_weights(qw, x, 32, sigma2, weights)
        _put16(o, 0, _fp16(_make_qx_quants(32, half, x, L, weights)))
        return
    amax = F32(0)
    vmax = F32(0)
    for j in range(32):
        if amax < abs(x[j]):
            amax = abs(x[j])
            vmax = x[j]
    d = vmax / F32(-half)
    inv = F32(1) / d if d != 0 else F32(0)
    _put16(o, 0, _fp16(d))
    top = 2 * half - 1
    for j in range(32):
        L[j] = min(top, _int8(_c_int(x[j] * inv + (F32(half) + F32(0.5)))))


@njit
def _affine_block(x, o, levels, L, qw, sigma2, weights, Laux):
    """Q4_1 (levels 15) / Q5_1 (levels 31): the f16 scale and f16 minimum, and the quants in L."""
    if qw.size:
        _importance_weights(qw, x, 32, sigma2, weights)
        d, neg_min = _make_qkx2_quants(32, levels, x, weights, L, Laux, F32(-0.9), F32(0.05), 36, False)
        _put16(o, 0, _fp16(d))
        _put16(o, 2, _fp16(-neg_min))
        return
    vmin = F32(np.finfo(np.float32).max)
    vmax = -vmin
    for j in range(32):
        if x[j] < vmin:
            vmin = x[j]
        if x[j] > vmax:
            vmax = x[j]
    d = (vmax - vmin) / F32(levels)
    inv = F32(1) / d if d != 0 else F32(0)
    _put16(o, 0, _fp16(d))
    _put16(o, 2, _fp16(vmin))
    for j in range(32):
        L[j] = min(levels, _int8(_c_int((x[j] - vmin) * inv + F32(0.5))))  # Q5_1's C: no min, never > 31


@njit
def _pack_32(o, qs, qh, L):
    """Nibbles of L[j] and L[j + 16] in byte qs + j; with qh >= 0 their fifth bits there."""
    high = 0
    for j in range(16):
        o[qs + j] = (L[j] & 15) | ((L[j + 16] & 15) << 4)
        high |= ((L[j] >> 4) & 1) << j
        high |= ((L[j + 16] >> 4) & 1) << (j + 16)
    if qh >= 0:
        for k in range(4):
            o[qh + k] = (high >> (8 * k)) & 0xFF


# ---------------------------------------------------------------------------------------------
# K-quants: make_qkx2_quants (as Q2_K, Q4_K and Q5_K call it; with importance, make_qkx3_quants),
# make_qx_quants (rmse_type 1, as Q6_K and the imatrix Q3_K call it), make_q3_quants (do_rmse, as
# the reference Q3_K calls it) and make_qp_quants (the imatrix fits of the scales themselves).


@njit(inline="always")
def _error(diff, use_mad):
    return abs(diff) if use_mad else diff * diff


@njit(**_C_DIVISION)
def _make_qkx2_quants(n, nmax, x, weights, L, Laux, rmin, rdelta, nstep, use_mad):
    """Returns (scale, -min); L[:n] gets the quants. Also make_qkx3_quants given weights: its C
    differs only in ``max <= min`` for ``max == min``, the same once min is clamped to <= 0."""
    vmin = x[0]
    vmax = x[0]
    sum_w = weights[0]
    sum_x = sum_w * x[0]
    for i in range(1, n):
        if x[i] < vmin:
            vmin = x[i]
        if x[i] > vmax:
            vmax = x[i]
        w = weights[i]
        sum_w += w
        sum_x += w * x[i]
    if vmin > 0:
        vmin = F32(0)
    if vmax == vmin:
        L[:n] = 0
        return F32(0), -vmin
    iscale = F32(nmax) / (vmax - vmin)
    scale = F32(1) / iscale
    best_error = F32(0)
    for i in range(n):
        L[i] = max(0, min(nmax, _nearest_int(iscale * (x[i] - vmin))))
        diff = scale * F32(L[i]) + vmin - x[i]
        best_error += weights[i] * _error(diff, use_mad)
    if nstep < 1:
        return scale, -vmin
    for step in range(nstep + 1):
        iscale = (rmin + rdelta * F32(step) + F32(nmax)) / (vmax - vmin)
        sum_l = F32(0)
        sum_l2 = F32(0)
        sum_xl = F32(0)
        for i in range(n):
            lv = max(0, min(nmax, _nearest_int(iscale * (x[i] - vmin))))
            Laux[i] = lv
            w = weights[i]
            lf = F32(lv)
            sum_l += w * lf
            sum_l2 += w * lf * lf
            sum_xl += w * lf * x[i]
        D = sum_w * sum_l2 - sum_l * sum_l
        if D > 0:
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            if this_min > 0:
                this_min = F32(0)
                this_scale = sum_xl / sum_l2
            cur_error = F32(0)
            for i in range(n):
                diff = this_scale * F32(Laux[i]) + this_min - x[i]
                cur_error += weights[i] * _error(diff, use_mad)
            if cur_error < best_error:
                L[:n] = Laux[:n]
                best_error = cur_error
                scale = this_scale
                vmin = this_min
    return scale, -vmin


@njit(inline="always")
def _signed_max(n, x):
    """The value of largest magnitude among x[:n] (the first on ties) and that magnitude."""
    vmax = F32(0)
    amax = F32(0)
    for i in range(n):
        ax = abs(x[i])
        if ax > amax:
            amax = ax
            vmax = x[i]
    return vmax, amax


@njit
def _largest(n, x):
    """The largest of 0 and x[:n]: the reference K-quants' ``if (scale > max_scale) ...``."""
    top = F32(0)
    for i in range(n):
        if x[i] > top:
            top = x[i]
    return top


@njit(inline="always")
def _squares(x, n, out):
    """out[:n] = x[:n]**2: make_qx_quants's weights when it is given none (rmse_type 1)."""
    for i in range(n):
        out[i] = x[i] * x[i]


@njit(**_C_DIVISION)
def _make_qx_quants(n, nmax, x, L, w):
    """rmse_type 1 with weights w[:n]: returns the scale; L[:n] gets quants + nmax (zeros where
    x[:n] is all zero)."""
    vmax, amax = _signed_max(n, x)
    if amax < _GROUP_MAX_EPS:
        L[:n] = 0
        return F32(0)
    iscale = F32(-nmax) / vmax
    sumlx = F32(0)
    suml2 = F32(0)
    for i in range(n):
        lv = max(-nmax, min(nmax - 1, _nearest_int(iscale * x[i])))
        L[i] = lv + nmax
        lf = F32(lv)
        sumlx += w[i] * x[i] * lf
        suml2 += w[i] * lf * lf
    scale = sumlx / suml2 if suml2 != 0 else F32(0)
    best = scale * sumlx
    for step in range(-9, 10):
        if step == 0:
            continue
        iscale = -(F32(nmax) + F32(0.1) * F32(step)) / vmax
        sumlx = F32(0)
        suml2 = F32(0)
        for i in range(n):
            lf = F32(max(-nmax, min(nmax - 1, _nearest_int(iscale * x[i]))))
            sumlx += w[i] * x[i] * lf
            suml2 += w[i] * lf * lf
        if suml2 > 0 and sumlx * sumlx > best * suml2:
            for i in range(n):
                L[i] = nmax + max(-nmax, min(nmax - 1, _nearest_int(iscale * x[i])))
            scale = sumlx / suml2
            best = scale * sumlx
    return scale


@njit(**_C_DIVISION)
def _make_qp_quants(n, nmax, x, L, qw):
    """The scale of x[:n] (a super-block's group scales or minimums, >= 0) on levels 0..nmax,
    fitted with weights qw[:n]; L[:n] gets the levels. The C keeps them in uint8_t, so a level of a
    negative x wraps there: ``& 0xFF`` does the same here, and the sums use the unwrapped level."""
    vmax = F32(0)
    for i in range(n):
        vmax = vmax if vmax > x[i] else x[i]  # the C's MAX(max, x[i])
    if vmax < _GROUP_MAX_EPS:
        L[:n] = 0
        return F32(0)
    iscale = F32(nmax) / vmax
    for i in range(n):
        L[i] = _nearest_int(iscale * x[i]) & 0xFF
    scale = F32(1) / iscale
    best_mse = F32(0)
    for i in range(n):
        diff = x[i] - scale * F32(L[i])
        best_mse += qw[i] * diff * diff
    for step in range(-4, 5):
        if step == 0:
            continue
        iscale_step = (F32(0.1) * F32(step) + F32(nmax)) / vmax
        scale_step = F32(1) / iscale_step
        mse = F32(0)
        for i in range(n):
            diff = x[i] - scale_step * F32(min(nmax, _nearest_int(iscale_step * x[i])))
            mse += qw[i] * diff * diff
        if mse < best_mse:
            best_mse = mse
            iscale = iscale_step
    sumlx = F32(0)
    suml2 = F32(0)
    for i in range(n):
        lv = min(nmax, _nearest_int(iscale * x[i]))
        L[i] = lv & 0xFF
        sumlx += qw[i] * x[i] * F32(lv)
        suml2 += qw[i] * F32(lv) * F32(lv)
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = qw[i]
            slx = sumlx - w * x[i] * F32(L[i])
            sl2 = suml2 - w * F32(L[i]) * F32(L[i])
            if slx > 0 and sl2 > 0:
                new_l = min(nmax, _nearest_int(x[i] * sl2 / slx))
                if new_l != L[i]:
                    slx += w * x[i] * F32(new_l)
                    sl2 += w * F32(new_l) * F32(new_l)
                    if slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l & 0xFF
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    return sumlx / suml2 if suml2 > F32(0) else F32(0)


@njit
def _q45_k_block(x, o, L, Laux, weights, scales, mins, nmax, qw, sw, Ls, Lm):
    """Q4_K (nmax 15): 144 bytes, f16 d, f16 dmin, 12 bytes of packed 6-bit scales and mins, 128 of
    nibbles. Q5_K (nmax 31): 176 bytes, the same with 32 bytes of fifth bits before the nibbles."""
    five = nmax == 31
    weighted = qw.size > 0  # quantize_row_q4_K_impl / q5_K_impl
    sigma2 = F32(2) * _sum_squares(x, 256) / F32(256) if weighted else F32(0)
    for j in range(8):
        xs = x[32 * j:32 * j + 32]
        if weighted:
            sw[j] = _importance_weights(qw[32 * j:], xs, 32, sigma2, weights)
        else:
            av_x = np.sqrt(_sum_squares(xs, 32) / F32(32))
            for i in range(32):
                weights[i] = av_x + abs(xs[i])
        scales[j], mins[j] = _make_qkx2_quants(32, nmax, xs, weights, L[32 * j:], Laux,
                                               F32(-0.9) if weighted else F32(-0.5) if five else F32(-1),
                                               F32(0.05) if weighted else F32(0.1),
                                               36 if weighted else 15 if five else 20, False)
    if weighted:
        d = _make_qp_quants(8, 63, scales, Ls, sw)
        dmin = _make_qp_quants(8, 63, mins, Lm, sw)
        if five:  # Q5_K's C clamps the levels to 63, Q4_K's does not (they exceed it only wrapped)
            for j in range(8):
                Ls[j] = min(63, Ls[j])
                Lm[j] = min(63, Lm[j])
    else:
        max_scale, max_min = _largest(8, scales), _largest(8, mins)
        inv_scale = F32(63) / max_scale if max_scale > 0 else F32(0)
        inv_min = F32(63) / max_min if max_min > 0 else F32(0)
        for j in range(8):
            Ls[j] = min(63, _nearest_int(inv_scale * scales[j]) & 0xFF)
            Lm[j] = min(63, _nearest_int(inv_min * mins[j]) & 0xFF)
        d = max_scale / F32(63)
        dmin = max_min / F32(63)
    for j in range(8):
        if j < 4:
            o[4 + j] = Ls[j]
            o[4 + j + 4] = Lm[j]
        else:
            o[4 + j + 4] = (Ls[j] & 0xF) | ((Lm[j] & 0xF) << 4)
            o[4 + j - 4] |= ((Ls[j] >> 4) << 6) & 0xFF
            o[4 + j] |= ((Lm[j] >> 4) << 6) & 0xFF
    d16, dmin16 = _fp16(d), _fp16(dmin)
    _put16(o, 0, d16)
    _put16(o, 2, dmin16)
    for j in range(8):  # get_scale_min_k4
        if j < 4:
            sc, m = o[4 + j] & 63, o[4 + j + 4] & 63
        else:
            sc = (o[4 + j + 4] & 0xF) | ((o[4 + j - 4] >> 6) << 4)
            m = (o[4 + j + 4] >> 4) | ((o[4 + j] >> 6) << 4)
        d = _fp32(d16) * F32(sc)
        if d == 0:
            continue
        dm = _fp32(dmin16) * F32(m)
        for i in range(32):
            L[32 * j + i] = max(0, min(nmax, _nearest_int((x[32 * j + i] + dm) / d)))
    qs = 48 if five else 16
    if five:
        o[16:48] = 0
    for h in range(4):
        for i in range(32):
            lo, hi = L[64 * h + i], L[64 * h + 32 + i]
            if five:
                o[16 + i] |= ((lo >> 4) << (2 * h)) | ((hi >> 4) << (2 * h + 1))
            o[qs + 32 * h + i] = (lo & 15) | ((hi & 15) << 4)


@njit
def _q2_k_block(x, o, L, Laux, weights, scales, mins, qw, sw, Ls, Lm):
    """84 bytes: 16 bytes of 4-bit scale and min pairs, 64 of 2-bit quants, f16 d, f16 dmin."""
    weighted = qw.size > 0  # quantize_row_q2_K_impl: sigma2 without Q3_K-Q5_K's factor 2, squared errors
    sigma2 = _sum_squares(x, 256) / F32(256) if weighted else F32(0)
    for j in range(16):
        xs = x[16 * j:16 * j + 16]
        if weighted:
            sw[j] = _importance_weights(qw[16 * j:], xs, 16, sigma2, weights)
        else:
            for i in range(16):
                weights[i] = abs(xs[i])
        scales[j], mins[j] = _make_qkx2_quants(16, 3, xs, weights, L[16 * j:], Laux,
                                               F32(-0.9) if weighted else F32(-0.5),
                                               F32(0.05) if weighted else F32(0.1),
                                               36 if weighted else 15, not weighted)
    if weighted:
        _put16(o, 80, _fp16(_make_qp_quants(16, 15, scales, Ls, sw)))
        _put16(o, 82, _fp16(_make_qp_quants(16, 15, mins, Lm, sw)))
        for j in range(16):
            o[j] = (Ls[j] | (Lm[j] << 4)) & 0xFF
    else:
        _q2_k_scales(o, scales, mins)
    d16, dmin16 = _byte(o, 80) | (_byte(o, 81) << 8), _byte(o, 82) | (_byte(o, 83) << 8)
    for j in range(16):
        d = _fp32(d16) * F32(_byte(o, j) & 0xF)
        if d == 0:
            continue
        dm = _fp32(dmin16) * F32(_byte(o, j) >> 4)
        for i in range(16):
            L[16 * j + i] = max(0, min(3, _nearest_int((x[16 * j + i] + dm) / d)))
    _pack_2_bit(o, 16, L)


@njit
def _q2_k_scales(o, scales, mins):
    """quantize_row_q2_K_ref's 4-bit scales and mins of the groups' fits, d and dmin."""
    max_scale, max_min = _largest(16, scales), _largest(16, mins)
    o[0:16] = 0
    if max_scale > 0:
        iscale = F32(15) / max_scale
        for j in range(16):
            o[j] = _nearest_int(iscale * scales[j]) & 0xFF
        _put16(o, 80, _fp16(max_scale / F32(15)))
    else:
        _put16(o, 80, _fp16(F32(0)))
    if max_min > 0:
        iscale = F32(15) / max_min
        for j in range(16):
            o[j] |= (_nearest_int(iscale * mins[j]) << 4) & 0xFF
        _put16(o, 82, _fp16(max_min / F32(15)))
    else:
        _put16(o, 82, _fp16(F32(0)))


@njit(inline="always")
def _byte(o, i):
    """Byte i of a block as a signed integer (uint8 mixed with int64 would become float64)."""
    return np.int64(o[i])


@njit
def _pack_2_bit(o, at, L):
    """Q2_K's / Q3_K's quants (0-3) at byte ``at``: per 128 weights, byte l holds weights l, l + 32,
    l + 64, l + 96 in bits 0-1, 2-3, 4-5, 6-7."""
    for j in range(0, 256, 128):
        for i in range(32):
            o[at + j // 4 + i] = L[j + i] | (L[j + i + 32] << 2) | (L[j + i + 64] << 4) | (L[j + i + 96] << 6)


@njit(**_C_DIVISION)
def _make_q3_quants(n, nmax, x, L):
    """do_rmse true: returns the scale; L[:n] gets quants + nmax."""
    vmax, amax = _signed_max(n, x)
    if amax < _GROUP_MAX_EPS:
        L[:n] = 0
        return F32(0)
    iscale = F32(-nmax) / vmax
    sumlx = F32(0)
    suml2 = F32(0)
    for i in range(n):
        lv = max(-nmax, min(nmax - 1, _nearest_int(iscale * x[i])))
        L[i] = lv
        w = x[i] * x[i]
        sumlx += w * x[i] * F32(lv)
        suml2 += w * F32(lv) * F32(lv)
    for _ in range(5):
        changed = 0
        for i in range(n):
            w = x[i] * x[i]
            slx = sumlx - w * x[i] * F32(L[i])
            if slx > 0:
                sl2 = suml2 - w * F32(L[i]) * F32(L[i])
                new_l = max(-nmax, min(nmax - 1, _nearest_int(x[i] * sl2 / slx)))
                if new_l != L[i]:
                    slx += w * x[i] * F32(new_l)
                    sl2 += w * F32(new_l) * F32(new_l)
                    if sl2 > 0 and slx * slx * suml2 > sumlx * sumlx * sl2:
                        L[i] = new_l
                        sumlx = slx
                        suml2 = sl2
                        changed += 1
        if changed == 0:
            break
    for i in range(n):
        L[i] += nmax
    return sumlx / suml2 if suml2 > F32(0) else F32(0)


@njit(inline="always")
def _put_q3_scale(o, j, lv):
    """Q3_K's 6-bit scale ``lv`` (0-63) of group j: low nibble in bytes 96-103, high bits 104-107."""
    if j < 8:
        o[96 + j] = lv & 0xF
    else:
        o[96 + j - 8] |= (lv & 0xF) << 4
    o[96 + 8 + j % 4] |= (lv >> 4) << (2 * (j // 4))


@njit
def _q3_k_block(x, o, L, scales, qw, weights, sw, Ls):
    """110 bytes: 32 bytes of third bits, 64 of 2-bit quants, 12 of packed 6-bit scales, f16 d."""
    o[96:108] = 0
    if qw.size:  # quantize_row_q3_K_impl: make_qx_quants for the groups and for their scales
        sigma2 = F32(2) * _sum_squares(x, 256) / F32(256)
        for j in range(16):
            xs = x[16 * j:16 * j + 16]
            sw[j] = _importance_weights(qw[16 * j:], xs, 16, sigma2, weights)
            scales[j] = _make_qx_quants(16, 4, xs, L[16 * j:], weights)
        d = _make_qx_quants(16, 32, scales, Ls, sw)
        for j in range(16):
            _put_q3_scale(o, j, Ls[j])
        _put16(o, 108, _fp16(d))
    else:
        max_scale = F32(0)
        amax = F32(0)
        for j in range(16):
            scales[j] = _make_q3_quants(16, 4, x[16 * j:16 * j + 16], L[16 * j:])
            if abs(scales[j]) > amax:
                amax = abs(scales[j])
                max_scale = scales[j]
        if max_scale != 0:
            iscale = F32(-32) / max_scale
            for j in range(16):
                lv = _int8(_nearest_int(iscale * scales[j]))
                _put_q3_scale(o, j, max(-32, min(31, lv)) + 32)
            _put16(o, 108, _fp16(F32(1) / iscale))
        else:
            _put16(o, 108, _fp16(F32(0)))
    d16 = _byte(o, 108) | (_byte(o, 109) << 8)
    for j in range(16):
        sc = (_byte(o, 96 + j) & 0xF) if j < 8 else (_byte(o, 96 + j - 8) >> 4)
        sc = (sc | (((_byte(o, 96 + 8 + j % 4) >> (2 * (j // 4))) & 3) << 4)) - 32
        d = _fp32(d16) * F32(sc)
        if d == 0:
            continue
        for i in range(16):
            L[16 * j + i] = max(-4, min(3, _nearest_int(x[16 * j + i] / d))) + 4
    o[0:32] = 0
    for j in range(256):  # the third bit of weight j at bit j // 32 of byte j % 32
        if L[j] > 3:
            o[j % 32] |= 1 << (j // 32)
            L[j] -= 4
    _pack_2_bit(o, 32, L)


@njit
def _q6_k_block(x, o, L, scales, qw, weights):
    """210 bytes: 128 of low nibbles, 64 of 2-bit high parts, 16 int8 scales, f16 d. With importance,
    quantize_row_q6_K_impl: the weights are the importance alone (no sigma2 term, unlike the others)."""
    max_scale = F32(0)
    max_abs_scale = F32(0)
    for ib in range(16):
        xs = x[16 * ib:16 * ib + 16]
        if qw.size:
            weights[:16] = qw[16 * ib:16 * ib + 16]
        else:
            _squares(xs, 16, weights)
        scale = _make_qx_quants(16, 32, xs, L[16 * ib:], weights)
        scales[ib] = scale
        if abs(scale) > max_abs_scale:
            max_abs_scale = abs(scale)
            max_scale = scale
    if max_abs_scale < _GROUP_MAX_EPS:
        o[:] = 0
        return
    iscale = F32(-128) / max_scale
    d16 = _fp16(F32(1) / iscale)
    _put16(o, 208, d16)
    for ib in range(16):
        o[192 + ib] = min(127, _nearest_int(iscale * scales[ib])) & 0xFF
    for j in range(16):
        d = _fp32(d16) * F32(np.int64(o[192 + j]) - (256 if o[192 + j] > 127 else 0))
        if d == 0:
            continue
        for i in range(16):
            L[16 * j + i] = max(-32, min(31, _nearest_int(x[16 * j + i] / d))) + 32
    for half in range(2):
        ql, qh, a = 64 * half, 128 + 32 * half, 128 * half
        for i in range(32):
            q1, q2, q3, q4 = L[a + i], L[a + i + 32], L[a + i + 64], L[a + i + 96]
            o[ql + i] = (q1 & 0xF) | ((q3 & 0xF) << 4)
            o[ql + i + 32] = (q2 & 0xF) | ((q4 & 0xF) << 4)
            o[qh + i] = (q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) | ((q4 >> 4) << 6)


# ---------------------------------------------------------------------------------------------


@njit(**KERNEL_OPTIONS)
def _quantize_rows(W, code, belems, bbytes, qw, out):
    """Row r of W into row r of out, block by block; ``code`` indexes QUANTIZE_FORMATS. ``qw``: the
    importance of each column, or empty for the reference quantizers (each block gets its slice)."""
    rows, cols = W.shape
    nb = cols // belems
    for r in prange(rows):
        L = np.zeros(256, np.int64)
        Laux = np.zeros(32, np.int64)
        weights = np.zeros(32, F32)
        scales = np.zeros(16, F32)
        mins = np.zeros(16, F32)
        sw = np.zeros(16, F32)
        Ls = np.zeros(16, np.int64)
        Lm = np.zeros(16, np.int64)
        # the imatrix Q4_0-Q5_1 weigh by the mean square of the whole row, not of the block
        sigma2 = _sum_squares(W[r], cols) / F32(cols) if qw.size and 1 <= code <= 4 else F32(0)
        for b in range(nb):
            x = W[r, b * belems:(b + 1) * belems]
            o = out[r, b * bbytes:(b + 1) * bbytes]
            q = qw[b * belems:(b + 1) * belems]  # empty without importance
            # the formats' numbers are chosen at run time, not passed as literals: numba compiles
            # a helper once per literal it is given, which lengthens the cold compile for no speed
            if code == 0:  # Q8_0: llama.cpp's quantize_q8_0 ignores the importance too
                _q8_0_block(x, o)
            elif code == 1 or code == 3:  # Q4_0: d, nibbles; Q5_0: d, fifth bits, nibbles
                _symmetric_block(x, o, 8 if code == 1 else 16, L, q, sigma2, weights)
                _pack_32(o, 2 if code == 1 else 6, -1 if code == 1 else 2, L)
            elif code == 2 or code == 4:  # Q4_1: d, m, nibbles; Q5_1: d, m, fifth bits, nibbles
                _affine_block(x, o, 15 if code == 2 else 31, L, q, sigma2, weights, Laux)
                _pack_32(o, 4 if code == 2 else 8, -1 if code == 2 else 4, L)
            elif code == 5 or code == 7:
                _q45_k_block(x, o, L, Laux, weights, scales, mins, 15 if code == 5 else 31, q, sw, Ls, Lm)
            elif code == 6:
                _q6_k_block(x, o, L, scales, q, weights)
            elif code == 8:
                _q3_k_block(x, o, L, scales, q, weights, sw, Ls)
            else:
                _q2_k_block(x, o, L, Laux, weights, scales, mins, q, sw, Ls, Lm)
