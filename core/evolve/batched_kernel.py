"""Compiled Dense layer over a stack of networks (see :mod:`.batched`): the CPU fast path of
``h @ W.T`` for every member at once, for small layers and few input rows. Imported on first use:
``loomlab.core`` stays quick to import.

numpy's stacked ``matmul`` makes one BLAS call per member, about 0.5 µs each before any arithmetic,
which for 1,000 MLPs 32-64-64-8 at batch 1 costs more than the arithmetic (6.7 M multiply-adds,
26.6 MB of float32 weights). Here one compiled loop runs every member: each output is a dot product
of an input row with a weight row, both contiguous, so the weights stream through once. The dot
product may be summed in any order (``fastmath`` reassociation, so LLVM vectorises it): the order
depends only on the row length and the machine, never on which members share the stack or how
they are spread over threads, so a member's result is bit-identical whether it is evaluated alone,
in a chunk or in a whole population. It equals numpy's/BLAS's sum to rounding (a different order).

``dense_f64`` reads float32 inputs and weights and accumulates in float64 (their products are exact
in float64): what the "loom" precision computes with float64 copies of the weights, from half the
bytes.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

_FAST = {"reassoc"}  # lets LLVM vectorise the dot product's sum; nothing else (no FMA contraction)


@njit(inline="always")
def _dense(h, w, out, acc):
    n_members, batch, n_in = h.shape
    n_out = w.shape[1]
    for n in prange(n_members):
        for b in range(batch):
            x = h[n, b]
            for o in range(n_out):
                row = w[n, o]
                total = acc(0)
                for i in range(n_in):
                    total += acc(x[i]) * acc(row[i])
                out[n, b, o] = total


@njit(cache=True, nogil=True, fastmath=_FAST)
def dense_f32(h, w, out):
    """``out[n, b, o] = sum_i h[n, b, i] * w[n, o, i]`` in float32, on the calling thread."""
    _dense(h, w, out, np.float32)


@njit(cache=True, nogil=True, fastmath=_FAST)
def dense_f64(h, w, out):
    """:func:`dense_f32` accumulated in float64 (``out`` float64), on the calling thread."""
    _dense(h, w, out, np.float64)


@njit(cache=True, nogil=True, fastmath=_FAST, parallel=True)
def dense_f32_parallel(h, w, out):
    """:func:`dense_f32` with members spread over numba's threads."""
    _dense(h, w, out, np.float32)


@njit(cache=True, nogil=True, fastmath=_FAST, parallel=True)
def dense_f64_parallel(h, w, out):
    """:func:`dense_f64` with members spread over numba's threads."""
    _dense(h, w, out, np.float64)


# Below this many multiply-adds a call stays on the calling thread: waking numba's pool and
# waiting at its barrier costs more than it saves, and a thread another process deschedules would
# stall the whole call (see loomlab.core.llm.quant's notes on 2 shared cores). Measured on 2 cores:
# 1,000 members' 64->8 layer (0.5 M multiply-adds, 2 MB of weights) took 0.053 ms on one thread
# and 0.020 ms on two.
PARALLEL_MIN_MACS = 1 << 18


def dense(h: np.ndarray, w: np.ndarray, compute) -> np.ndarray:
    """``h @ w[n].T`` per member: ``h`` ``[N, B, in]`` and ``w`` ``[N, out, in]``, both float32 and
    C-contiguous; the result ``[N, B, out]`` in ``compute`` (float32, or float64 accumulated in
    float64)."""
    n_members, batch, n_in = h.shape
    out = np.empty((n_members, batch, w.shape[1]), compute)
    parallel = (n_members > 1 and numba.get_num_threads() > 1
                and n_members * batch * n_in * w.shape[1] >= PARALLEL_MIN_MACS)
    if out.dtype == np.float64:
        (dense_f64_parallel if parallel else dense_f64)(h, w, out)
    else:
        (dense_f32_parallel if parallel else dense_f32)(h, w, out)
    return out
