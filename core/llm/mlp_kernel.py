"""The gated MLP's activation, ``act(gate) * up``, as one compiled loop, for the int8 mode.

The int8 mode's grid path (``LLMGatedMLP`` under :func:`~.quant_int8.int8_activations`) and its
compiled decode step (:mod:`.fused_decode`) both call it, so the two give the same bits: numpy's
float32 ``exp`` and ``tanh`` are its own vector routines, numba's are libm's ``expf`` / ``tanhf``,
and the two differ in the last bit now and then. The float32 mode keeps numpy's (its reference
is transformers, compared within tolerance, and its bits stay as they were).

The formulas are :func:`loomlab.core.activations.activate`'s, operation for operation in float32:
SiLU ``v * (1 / (1 + exp(-v)))``, tanh-GELU ``0.5 * v * (1 + tanh(c * (v + 0.044715 * v^3)))``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..activations import _SQRT_2_OVER_PI, GELU, SILU

F32 = np.float32
GATED_ACTIVATIONS = (SILU, GELU)
_C = F32(_SQRT_2_OVER_PI)


@njit(inline="always")
def gated_value(act, g, u):
    """``act(g) * u`` for one float32 pair (``act`` SILU or GELU)."""
    if act == SILU:
        return (g * (F32(1.0) / (F32(1.0) + np.exp(-g)))) * u
    return (F32(0.5) * g * (F32(1.0) + np.tanh(_C * (g + F32(0.044715) * (g * g * g))))) * u


@njit(cache=True, nogil=True)
def gated_range(act, gate, up, out, lo, hi):
    """``out[i] = act(gate[i]) * up[i]`` for i in ``lo .. hi - 1`` of float32 vectors."""
    for i in range(lo, hi):
        out[i] = gated_value(act, gate[i], up[i])


def gated(act: int, gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """``act(gate) * up`` of two float32 arrays of one shape (``act`` one of
    :data:`GATED_ACTIVATIONS`), in one compiled loop."""
    g = np.ascontiguousarray(gate, dtype=F32).reshape(-1)
    u = np.ascontiguousarray(up, dtype=F32).reshape(-1)
    out = np.empty(g.size, F32)
    gated_range(act, g, u, out, 0, g.size)
    return out.reshape(np.shape(gate))
