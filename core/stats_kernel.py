"""One pass over a float32 vector for Loom's ComputeLayerStats (spec §8.2).

Why a compiled loop: a live view samples ~10 passes a second of a decoding language model, 273
layer outputs each; numpy's seven separate reductions cost ~8 µs per small tensor, which at two
panels was ~9% of SmolLM2's decode speed. One sequential loop is ~1 µs and, accumulating in the
order Loom does (``sum += f``, ``sumSq += f·f``, min/max from element 0), Loom-exact where
numpy's pairwise sums were not. Imported on first use: ``loomlab.core`` stays quick to import.
"""

from __future__ import annotations

import numba
import numpy as np

_ACTIVE = np.float32(1e-6)


@numba.njit(cache=True, nogil=True)
def float32_stats(f):
    """``(avg, std, min, max, active)`` of a non-empty 1-D float32 array as Loom computes them:
    sums accumulated in float32 in index order, ``var = sumSq/n - avg²`` clamped at 0,
    ``active`` counting ``|f| > 1e-6``."""
    total = np.float32(0.0)
    squares = np.float32(0.0)
    lo = f[0]
    hi = f[0]
    active = 0
    for i in range(f.size):
        v = f[i]
        total += v
        squares += v * v
        if v < lo:
            lo = v
        if v > hi:
            hi = v
        if abs(v) > _ACTIVE:
            active += 1
    n = np.float32(f.size)
    avg = total / n
    var = max(squares / n - avg * avg, np.float32(0.0))
    return avg, np.sqrt(var), lo, hi, active


@numba.njit(cache=True, nogil=True)
def error_sums(r, v):
    """``(||r||², ||v||², ||v - r||², r·v)`` of two float32 vectors, accumulated in float64 in one
    pass: comparing a language model's layer with the file's weights reads each weight once
    instead of making float64 copies of both (7 s of a 13 s Revert of SmolLM2 before)."""
    rr = vv = dd = rv = 0.0
    for i in range(r.size):
        a = np.float64(r[i])
        b = np.float64(v[i])
        d = b - a
        rr += a * a
        vv += b * b
        dd += d * d
        rv += a * b
    return rr, vv, dd, rv
