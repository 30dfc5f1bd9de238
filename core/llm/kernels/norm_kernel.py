"""RMSNorm of float32 rows in one compiled call, bit for bit numpy's.

The numpy form (``llm_layers.rms_norm``: ``add.reduce(x * x) / n``, ``1 / sqrt(. + eps)``, two
multiplies) is eight array operations of a microsecond each on a decode step's single row; a
token of SmolLM2 runs 61 norms. This kernel does the same float32 operations in the same order:
numpy sums a contiguous row pairwise (``pairwise_sum`` in numpy's ``loops_utils.h.src``: fewer
than 8 values in turn; up to 128 in 8 interleaved partial sums added as a fixed tree, then the
rest; more split in two at a multiple of 8), and so does :func:`_pairwise_sum`. Tests hold it to
numpy's bits.
"""

from __future__ import annotations

import numpy as np
from numba import njit

F32 = np.float32
_BLOCK = 128  # numpy's PW_BLOCKSIZE


@njit(inline="always")
def _block_sum(a, lo, n):
    """numpy's sum of at most 128 values: in turn below 8, else 8 interleaved partial sums."""
    if n < 8:
        res = F32(-0.0)  # numpy starts from -0.0, so a sum of -0.0s stays -0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r0, r1, r2, r3 = a[lo], a[lo + 1], a[lo + 2], a[lo + 3]
    r4, r5, r6, r7 = a[lo + 4], a[lo + 5], a[lo + 6], a[lo + 7]
    i = 8
    while i < n - n % 8:
        r0 += a[lo + i]
        r1 += a[lo + i + 1]
        r2 += a[lo + i + 2]
        r3 += a[lo + i + 3]
        r4 += a[lo + i + 4]
        r5 += a[lo + i + 5]
        r6 += a[lo + i + 6]
        r7 += a[lo + i + 7]
        i += 8
    res = ((r0 + r1) + (r2 + r3)) + ((r4 + r5) + (r6 + r7))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@njit(cache=True, nogil=True)
def _pairwise_sum(a, n):
    """numpy's pairwise sum of ``a[:n]``: blocks of at most 128 added as the halving recursion
    adds them (split at half rounded down to a multiple of 8). The recursion runs on an explicit
    stack: numba's cache cannot hold a recursive function."""
    depth = 64
    lo_at, n_at = np.empty(depth, np.int64), np.empty(depth, np.int64)
    left_done, left = np.zeros(depth, np.bool_), np.empty(depth, F32)
    lo_at[0], n_at[0], left_done[0] = 0, n, False
    top = 0
    value = F32(0)
    returning = False
    while top >= 0:
        if returning:  # ``value`` is a finished child of the node on top
            if not left_done[top]:
                left[top], left_done[top] = value, True
                half = n_at[top] // 2
                half -= half % 8
                top += 1  # now the right half
                lo_at[top], n_at[top], left_done[top] = lo_at[top - 1] + half, n_at[top - 1] - half, False
                returning = False
            else:
                value = left[top] + value
                top -= 1
        elif n_at[top] <= _BLOCK:
            value = _block_sum(a, lo_at[top], n_at[top])
            top -= 1
            returning = True
        else:
            half = n_at[top] // 2
            half -= half % 8
            top += 1  # the left half first
            lo_at[top], n_at[top], left_done[top] = lo_at[top - 1], half, False
    return value


@njit(cache=True, nogil=True)
def rms_norm_rows(x, gamma, eps, out):
    """``out[r] = (x[r] * (1 / sqrt(sum(x[r]^2) / n + eps))) * gamma`` for each row of the
    float32 ``x[R, n]``, numpy's operations (module doc)."""
    n = x.shape[1]
    squares = np.empty(n, F32)
    for r in range(x.shape[0]):
        for i in range(n):
            squares[i] = x[r, i] * x[r, i]
        inv = F32(1.0) / np.sqrt(_pairwise_sum(squares, n) / F32(n) + F32(eps))
        for i in range(n):
            out[r, i] = (x[r, i] * inv) * gamma[i]
