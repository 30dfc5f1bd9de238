"""Compiled forward of a stack of Dense networks (see :mod:`.batched`): the CPU fast path for small
layers and few input rows. Imported on first use: ``loomlab.core`` stays quick to import.

numpy's stacked ``matmul`` makes one BLAS call per member, whose fixed cost is more than a small
layer's arithmetic. Here ONE compiled call runs a run of consecutive layers of every member: each
member's whole chain (every layer and its activation) runs on one thread in small scratch vectors,
so the weights stream through once and no ``[N, B, out]`` array is made between layers. A member's
weights lie together (layer after layer, each ``[out, in]``), and each output is the dot product of
an input row with a weight row, both contiguous slices. The dot product may be summed in any order
(``fastmath`` reassociation, so LLVM vectorises it): the order depends only on the row length and
the machine, never on which members share the stack or how they are spread over threads, so a
member's result is bit-identical whether it is evaluated alone, in a chunk or in a whole population.
It equals numpy's/BLAS's sum to rounding (a different order). On 2 cores it runs 1,000 MLPs
32-64-64-8 at batch 1 in about the time their 26.6 MB of weights take to stream (``python
tests/bench/bench_batched.py`` times the whole pass).

The "loom" precision reads float32 inputs and weights and accumulates in float64 (their products
are exact in float64): what it computes with float64 copies of the weights, from half the bytes.
Activations follow :func:`loomlab.core.activations.activate` in the accumulator's dtype, with one
exception: tanh (Tanh, GELU) is a rational function evaluated in float64 (:func:`_tanh`, relative
error below 1.1e-10), because the scalar libm ``tanhf`` numba calls costs several times the whole
matmul here, while the rational one vectorises; rounded to float32 it is within one ulp of numpy's
float32 tanh. Sigmoid (and Silu) call libm's float64 ``exp`` per element (scalar): a formula
through tanh would lose the tiny outputs' relative precision.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

from ...activations import GELU, LEAKY_RELU, RELU, RELU2, SIGMOID, SILU, SQRT_2_OVER_PI, TANH
from ...numba_cache import install

install()  # before the kernels here are defined: their cache follows the files they take code from

# tanh(v) = v * P(v^2) / Q(v^2) on |v| <= _TANH_LIMIT: a least-squares fit of the relative error,
# reweighted towards minimax (max relative error 1.03e-10 measured on 0 < v <= 9.1). Beyond the
# limit float32(tanh(v)) is +-1 (from 9.0109).
_TANH_P = (9.9999999989980037e-01, 1.3852549534645459e-01, 4.0899443067164256e-03,
           3.2907208665573964e-05, 4.5438315670436177e-08, -3.1350909292956161e-11,
           2.5244906405138336e-14)
_TANH_Q = (1.0, 4.7185882760155734e-01, 2.8042888768207506e-02, 4.3427889518435185e-04,
           1.6625399353305727e-06)
_TANH_LIMIT = 9.1
_FAST = {"reassoc"}  # lets LLVM vectorise the dot product's sum; nothing else (no FMA contraction)
# members per scratch allocation: a compiled allocation costs ~0.1 µs, one per member was 0.1 ms
_BLOCK = 16


@njit(inline="always")
def _tanh(v):
    """tanh of a float64; NaN stays NaN, -0.0 stays -0.0 (both pass the limits' comparisons)."""
    t = v * v
    p = _TANH_P[6]
    for k in range(5, -1, -1):
        p = p * t + _TANH_P[k]
    q = _TANH_Q[4]
    for k in range(3, -1, -1):
        q = q * t + _TANH_Q[k]
    if v > _TANH_LIMIT:
        return 1.0
    if v < -_TANH_LIMIT:
        return -1.0
    return v * p / q


@njit(inline="always")
def _exp(v, acc):
    """``exp(v)`` rounded to ``acc``: libm's float64 ``exp`` (numba's float32 ``expf`` was 4 ulp
    from numpy's in a sigmoid)."""
    return acc(np.exp(np.float64(v)))


@njit(inline="always")
def _activate(act, s, n, out, at, acc):
    """``out[at + o] = f(s[o])`` for ``o < n``, ``f`` Loom activation ``act`` in the dtype ``acc``
    of ``s`` (one loop per activation, so each vectorises), the result rounded to float32."""
    zero = acc(0)
    if act == RELU:
        for o in range(n):
            v = s[o]
            out[at + o] = zero if v < zero else v  # -0.0 and NaN pass, as Loom's v<0 ? 0 : v
    elif act == LEAKY_RELU:
        slope = acc(0.01)
        for o in range(n):
            v = s[o]
            out[at + o] = v * slope if v < zero else v
    elif act == RELU2:
        for o in range(n):
            v = s[o]
            out[at + o] = zero if v < zero else v * v
    elif act == TANH:
        for o in range(n):
            out[at + o] = _tanh(np.float64(s[o]))
    elif act == SIGMOID:
        for o in range(n):
            out[at + o] = acc(1) / (acc(1) + _exp(-s[o], acc))
    elif act == SILU:
        for o in range(n):
            v = s[o]
            out[at + o] = v * (acc(1) / (acc(1) + _exp(-v, acc)))
    elif act == GELU:
        for o in range(n):
            v = s[o]
            u = acc(SQRT_2_OVER_PI) * (v + acc(0.044715) * acc(np.float64(v) ** 3))  # pow rounds once
            out[at + o] = acc(0.5) * v * (acc(1) + acc(_tanh(np.float64(u))))
    else:  # Linear, and any id activate() passes through
        for o in range(n):
            out[at + o] = s[o]


@njit(inline="always")
def _sums(row_in, wn, at, n_in, n_out, s, acc):
    """``s[o]`` = the dot product of input row ``row_in`` with weight row ``o`` of the layer at
    ``wn[at:]`` (``[n_out, n_in]``): the one order of sums every kernel here uses."""
    for o in range(n_out):
        row_w = wn[at + o * n_in: at + (o + 1) * n_in]
        total = acc(0)
        for i in range(n_in):
            total += acc(row_in[i]) * acc(row_w[i])
        s[o] = total


@njit(inline="always")
def _stack(x, w, layers, acts, out, acc):
    n_members = w.shape[0]
    n_layers = layers.shape[0]
    batch = out.shape[1] // layers[n_layers - 1, 1]
    width = batch * max(layers[0, 0], layers[:, 1].max())
    for block in prange((n_members + _BLOCK - 1) // _BLOCK):
        h = np.empty(2 * width, np.float32)  # the layer's input rows, then its output rows
        s = np.empty(width, acc)  # one output row's sums
        for n in range(block * _BLOCK, min(n_members, (block + 1) * _BLOCK)):
            wn, xn = w[n], x[n if x.shape[0] > 1 else 0]
            for k in range(batch * layers[0, 0]):
                h[k] = xn[k]
            src, dst = 0, width
            for j in range(n_layers):
                n_in, n_out, at = layers[j, 0], layers[j, 1], layers[j, 2]
                for b in range(batch):
                    # rows of n_in from the flat input, as batch_rows reads them; contiguous
                    # slices, not computed indices, are what LLVM vectorises (2x faster)
                    _sums(h[src + b * n_in: src + (b + 1) * n_in], wn, at, n_in, n_out, s, acc)
                    _activate(acts[n, j], s, n_out, h, dst + b * n_out, acc)
                src, dst = dst, src
            for k in range(out.shape[1]):
                out[n, k] = h[src + k]


@njit(inline="always")
def _rows(x, w, members, layers, acts, out, acc):
    """Row ``r`` of ``x`` through the layers of member ``members[r]``: :func:`_stack`'s loop at
    batch 1 (the same sums in the same order), one row at a time."""
    n_layers = layers.shape[0]
    width = max(layers[0, 0], layers[:, 1].max())
    for block in prange((x.shape[0] + _BLOCK - 1) // _BLOCK):
        h = np.empty(2 * width, np.float32)
        s = np.empty(width, acc)
        for r in range(block * _BLOCK, min(x.shape[0], (block + 1) * _BLOCK)):
            n = members[r]
            wn = w[n]
            for k in range(layers[0, 0]):
                h[k] = x[r, k]
            src, dst = 0, width
            for j in range(n_layers):
                n_in, n_out, at = layers[j, 0], layers[j, 1], layers[j, 2]
                _sums(h[src: src + n_in], wn, at, n_in, n_out, s, acc)
                _activate(acts[n, j], s, n_out, h, dst, acc)
                src, dst = dst, src
            for k in range(out.shape[1]):
                out[r, k] = h[src + k]


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FAST)
def rows_f32(x, w, members, layers, acts, out):
    """Each row ``x[r]`` (``[R, in]`` float32) through member ``members[r]``'s layers in float32
    (``w``, ``layers``, ``acts`` as :func:`stack_f32` takes them); ``out`` ``[R, out]``."""
    _rows(x, w, members, layers, acts, out, np.float32)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FAST)
def rows_f64(x, w, members, layers, acts, out):
    """:func:`rows_f32` accumulated in float64."""
    _rows(x, w, members, layers, acts, out, np.float64)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FAST)
def stack_f32(x, w, layers, acts, out):
    """Every member's layers in float32, on the calling thread. ``x`` ``[1 or N, >= B*in]``: the
    input rows, shared or per member; ``w`` ``[N, total]``: each member's weights, layer ``j``
    ``[out, in]`` from ``layers[j] = (in, out, offset)``; ``acts`` ``[N, L]`` activation ids;
    ``out`` ``[N, B*out]``. numpy's error model: a division by zero gives inf as in numpy, and
    divisions vectorise (Python's raises, a branch per division)."""
    _stack(x, w, layers, acts, out, np.float32)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FAST)
def stack_f64(x, w, layers, acts, out):
    """:func:`stack_f32` accumulated in float64."""
    _stack(x, w, layers, acts, out, np.float64)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FAST, parallel=True)
def stack_f32_parallel(x, w, layers, acts, out):
    """:func:`stack_f32` with members spread over numba's threads."""
    _stack(x, w, layers, acts, out, np.float32)


@njit(cache=True, nogil=True, error_model="numpy", fastmath=_FAST, parallel=True)
def stack_f64_parallel(x, w, layers, acts, out):
    """:func:`stack_f64` with members spread over numba's threads."""
    _stack(x, w, layers, acts, out, np.float64)


# Below this many multiply-adds a call stays on the calling thread: waking numba's pool and
# waiting at its barrier costs more than it saves, and a thread another process deschedules would
# stall the whole call (docs/kernels.md, "Threads"). Twice this already runs faster on 2 threads.
PARALLEL_MIN_MACS = 1 << 18


def forward(h: np.ndarray, w: np.ndarray, layers: np.ndarray, acts: np.ndarray, compute) -> np.ndarray:
    """The layers ``layers`` (``(in, out, offset)`` rows into ``w``) of every member with
    activations ``acts`` ``[N, L]``: ``h`` is the input, ``[B, in]`` read by every member or
    ``[N, B, width]``, float32; ``w`` ``[N, total]`` float32; the result ``[N, B, out]``
    float32, accumulated in ``compute``."""
    n_members = len(w)
    batch = h.shape[-2]
    out = np.empty((n_members, batch * int(layers[-1, 1])), np.float32)
    parallel = (n_members > 1 and numba.get_num_threads() > 1
                and n_members * batch * int(layers[:, 0] @ layers[:, 1]) >= PARALLEL_MIN_MACS)
    x = np.ascontiguousarray(h).reshape(1 if h.ndim == 2 else n_members, -1)
    if not parallel:
        (stack_f64 if np.dtype(compute) == np.float64 else stack_f32)(x, w, layers, acts, out)
        return out.reshape(n_members, batch, -1)
    # blocks handed out one at a time, not split evenly up front: a thread another process
    # deschedules then holds back one block, not half the population
    chunksize = numba.set_parallel_chunksize(1)
    kernel = stack_f64_parallel if np.dtype(compute) == np.float64 else stack_f32_parallel
    try:
        kernel(x, w, layers, acts, out)
    finally:
        numba.set_parallel_chunksize(chunksize)
    return out.reshape(n_members, batch, -1)


def forward_rows(x: np.ndarray, w: np.ndarray, members: np.ndarray, layers: np.ndarray, acts: np.ndarray,
                 compute) -> np.ndarray:
    """Row ``r`` of ``x`` (``[R, in]`` float32) through the layers of member ``members[r]``: each
    member acting on its own observations (:meth:`.batched.NetworkStack.forward_rows`). A row's
    result is bit-identical to :func:`forward` of that member alone on that row. On the calling
    thread: a control task's step is a few thousand small rows."""
    out = np.empty((len(x), int(layers[-1, 1])), np.float32)
    kernel = rows_f64 if np.dtype(compute) == np.float64 else rows_f32
    kernel(np.ascontiguousarray(x, np.float32), w, np.ascontiguousarray(members, np.int64), layers, acts, out)
    return out
