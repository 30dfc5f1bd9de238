"""Compiled loops for the ReLU family on contiguous float32/float64 arrays (see
:mod:`loomlab.core.activations`): one read of ``v`` and one write of ``out`` per element, Loom's
exact expressions (spec §1.2) in the dtype of ``v``. Imported on first use: ``loomlab.core`` stays
quick to import.

``v < 0`` is false for NaN and for ``-0.0``, so both pass through as Loom's ``v<0 ? 0 : v`` does.
LeakyReLU multiplies by ``0.01`` in the dtype of ``v`` (the constant is converted to it first, as
numpy's ``float32 * 0.01`` and Go's ``T(v·0.01)`` do), ReLU2 squares in that dtype.
"""

from __future__ import annotations

import numba


@numba.njit(cache=True, nogil=True)
def relu(v, out):
    """``out[i] = v[i] < 0 ? 0 : v[i]`` over two 1-D arrays of one dtype."""
    zero = v.dtype.type(0)
    for i in range(v.size):
        x = v[i]
        out[i] = zero if x < 0 else x


@numba.njit(cache=True, nogil=True)
def leaky_relu(v, out):
    """``out[i] = v[i] < 0 ? v[i]·0.01 : v[i]``, the product in the dtype of ``v``."""
    slope = v.dtype.type(0.01)
    for i in range(v.size):
        x = v[i]
        out[i] = x * slope if x < 0 else x


@numba.njit(cache=True, nogil=True)
def relu2(v, out):
    """``out[i] = v[i] < 0 ? 0 : v[i]·v[i]``, the product in the dtype of ``v``."""
    zero = v.dtype.type(0)
    for i in range(v.size):
        x = v[i]
        out[i] = zero if x < 0 else x * x

