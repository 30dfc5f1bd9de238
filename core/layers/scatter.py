"""Scatter-add with repeated targets: the one step of the layers the array API standard lacks.

``out[..., index[j]] += values[..., j]`` with duplicate indices summed has no standard function
(the standard's ``__setitem__`` keeps one of the duplicates). numpy and CuPy have a fast
non-standard one, ``bincount`` with weights; any other namespace (array_api_strict) gets the
standard but quadratic form, a product with a one-hot matrix, exact and small enough for the
checking backend's tests.
"""

from __future__ import annotations

import math


def scatter_add(xp, index, values, n: int):
    """``out[..., n]`` with ``out[..., index[j]] += values[..., j]`` (duplicates summed).

    ``index`` is 1-D and indexes the last axis of ``values``. On numpy and CuPy the sums run in
    float64 and come back as float64 (callers cast to the dtype they compute in).
    """
    lead = values.shape[:-1]
    if hasattr(xp, "bincount"):
        rows = math.prod(lead)
        # row r's targets are offset by r*n, so one bincount sums every row at once
        flat = xp.reshape(xp.arange(rows)[:, None] * n + index[None, :], (-1,))
        out = xp.bincount(flat, weights=xp.reshape(values, (-1,)), minlength=rows * n)
        return xp.reshape(out, (*lead, n))
    one_hot = xp.astype(index[:, None] == xp.arange(n)[None, :], values.dtype)  # [len(index), n]
    return values @ one_hot
