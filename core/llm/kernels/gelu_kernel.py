"""The exact GELU, ``x * Phi(x) = 0.5 * x * (1 + erf(x / sqrt(2)))``, over float32 arrays.

BERT's ``hidden_act: "gelu"`` is this form (torch's ``gelu`` without approximation), not the tanh
one :func:`~loomlab.core.activations.activate` computes for Loom's GELU. numpy has no ``erf``; a
compiled ufunc evaluates C's ``erf`` per element in float64 and rounds once to float32.
"""

from __future__ import annotations

import math

import numpy as np
from numba import vectorize

_SQRT_HALF = math.sqrt(0.5)


@vectorize(["float32(float32)"], cache=True, nopython=True)
def _gelu_erf(x):
    v = np.float64(x)
    return np.float32(0.5 * v * (1.0 + math.erf(v * _SQRT_HALF)))


def gelu_erf(x: np.ndarray) -> np.ndarray:
    """The exact GELU of a float32 array, elementwise (float32)."""
    return _gelu_erf(np.asarray(x, dtype=np.float32))
