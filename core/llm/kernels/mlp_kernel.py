"""The gated MLP's activation, ``act(gate) * up``, as one vectorized loop, for the int8 mode.

The int8 mode's grid path (``LLMGatedMLP`` under :func:`~.quant_int8.int8_activations`) and its
compiled decode step (:mod:`loomlab.core.llm.model.fused_decode`) both call it, so the two give
the same bits. Both
activations are ``g * sigmoid(z)``: SiLU with ``z = g``, tanh-GELU with ``z = 2c (g + 0.044715
g^3)`` (``0.5 (1 + tanh(u)) = sigmoid(2u)``, which also never cancels as ``1 + tanh`` does for
negative gates), and the exponential is :func:`~.attention_kernel.exp_poly` (within 2 ulp), so
the loop vectorizes, where numba's ``exp`` / ``tanh`` call libm per element. The float32 mode
keeps numpy's formula (its reference is transformers, compared within tolerance).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...activations import GELU, SILU, SQRT_2_OVER_PI
from .attention_kernel import exp_poly

F32 = np.float32
GATED_ACTIVATIONS = (SILU, GELU)
_2C = F32(2 * SQRT_2_OVER_PI)


@njit(inline="always")
def _times_sigmoid(g, z, u):
    """``g * sigmoid(z) * u``; sigmoid is 0 below z = -88, where e**-z no longer fits a float32
    (and :func:`exp_poly` would stop at e**88: a huge gate times its floor is not small)."""
    s = F32(1.0) / (F32(1.0) + exp_poly(-z))
    return (g * (F32(0.0) if z < F32(-88.0) else s)) * u


@njit(cache=True, nogil=True, error_model="numpy")  # no division-by-zero check: the loops vectorize
def gated_range(act, gate, up, out, lo, hi):
    """``out[i] = act(gate[i]) * up[i]`` for i in ``lo .. hi - 1`` of float32 vectors (``act``
    SILU or GELU), one loop per activation so that each vectorizes."""
    if act == SILU:
        for i in range(np.uint64(lo), np.uint64(hi)):
            out[i] = _times_sigmoid(gate[i], gate[i], up[i])
    else:
        for i in range(np.uint64(lo), np.uint64(hi)):
            g = gate[i]
            out[i] = _times_sigmoid(g, _2C * (g + F32(0.044715) * (g * g * g)), up[i])


def gated(act: int, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``act(gate) * up`` of two float32 arrays of one shape (``act`` one of
    :data:`GATED_ACTIVATIONS`), in one compiled loop."""
    g = np.ascontiguousarray(gate, dtype=F32).reshape(-1)
    u = np.ascontiguousarray(up, dtype=F32).reshape(-1)
    out = np.empty(g.size, F32)
    gated_range(act, g, u, out, 0, g.size)
    return out.reshape(np.shape(gate))
