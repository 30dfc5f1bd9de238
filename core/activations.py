"""Loom's activations (spec §1.2) and the derivatives its backward pass uses.

Every function works on any array module; the math runs in the dtype of ``v``.

The ReLU family (ReLU, LeakyReLU, ReLU2) on a contiguous float32/float64 numpy array runs one
compiled loop (:mod:`.activations_kernel`, numba, imported on first use): one read and one write
of ``v``. numpy's ``where(v < 0, 0, v)`` made a mask, then a select that branches per element
(~3.5 ns an element on random signs), then a copy (``astype``): 230 µs for 64 x 1024 float32,
where the loop takes ~3 µs. ``maximum(v, 0)`` is one pass too, but which zero it returns for
``-0.0`` is implementation-defined (array API), and Loom's ``v<0 ? 0 : v`` keeps ``-0.0`` and NaN.
Any other array (CuPy, other dtypes, strided views) takes the array-module expression.
"""

from __future__ import annotations

import math

import numpy as np

from .backend import array_module

RELU, SILU, GELU, TANH, SIGMOID, LEAKY_RELU, RELU2, LINEAR = 0, 1, 2, 3, 4, 5, 6, -1

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def sigmoid(v):
    xp = array_module(v)
    # exp of a large positive argument overflows to inf and 1/(1+inf) is the right limit 0.
    with _quiet(xp):
        return 1.0 / (1.0 + xp.exp(-v))


def activate(act: int, v):
    """f(v) for Loom activation id ``act``."""
    xp = array_module(v)
    if act in _RELU_FAMILY:
        fast = _compiled(act, v) if xp is np else None
        if fast is not None:
            return fast
    if act == RELU:
        return xp.astype(xp.where(v < 0, 0, v), v.dtype, copy=False)
    if act == SILU:
        return v * sigmoid(v)
    if act == GELU:
        # v * v * v, not v**3: numpy's float power is powf per element (~45 ns; 0.1 ms for a
        # gemma3 MLP row), and two multiplies are what torch's pow(x, 3.0) computes (transformers'
        # gelu_pytorch_tanh)
        return 0.5 * v * (1.0 + xp.tanh(SQRT_2_OVER_PI * (v + 0.044715 * (v * v * v))))
    if act == TANH:
        return xp.tanh(v)
    if act == SIGMOID:
        return sigmoid(v)
    if act == LEAKY_RELU:
        return xp.astype(xp.where(v < 0, v * 0.01, v), v.dtype, copy=False)
    if act == RELU2:
        return xp.astype(xp.where(v < 0, 0, v * v), v.dtype, copy=False)
    return v


_RELU_FAMILY = frozenset((RELU, LEAKY_RELU, RELU2))
_KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
_kernels = None


def _compiled(act: int, v):
    """The ReLU-family activation of a numpy array by the compiled loop, or None where the loop
    does not apply (not a C-contiguous float32/float64 array)."""
    if v.dtype not in _KERNEL_DTYPES or not v.flags.c_contiguous:
        return None
    global _kernels
    if _kernels is None:
        from . import activations_kernel

        _kernels = {RELU: activations_kernel.relu, LEAKY_RELU: activations_kernel.leaky_relu,
                    RELU2: activations_kernel.relu2}
    out = np.empty_like(v)
    if v.size:
        _kernels[act](v.reshape(-1), out.reshape(-1))
    return out


def derivative(act: int, v):
    """f'(v) at the pre-activation, as Loom's backward uses it.

    This is the exact derivative of :func:`activate` for every activation; ReLU-family kinks
    take the left derivative (v<=0) as Loom does.
    """
    xp = array_module(v)
    if act == RELU:
        return xp.astype(v > 0, v.dtype)
    if act == SILU:
        s = sigmoid(v)
        return s * (1.0 + v * (1.0 - s))
    if act == GELU:
        # The exact derivative of the tanh approximation, not Loom's "mixed approximation"
        # (spec §1.2), so gradients agree with finite differences (docs/compat.md).
        u = SQRT_2_OVER_PI * (v + 0.044715 * (v * v * v))
        t = xp.tanh(u)
        du = SQRT_2_OVER_PI * (1.0 + 3 * 0.044715 * v * v)
        return 0.5 * (1.0 + t) + 0.5 * v * (1.0 - t * t) * du
    if act == TANH:
        t = xp.tanh(v)
        return 1.0 - t * t
    if act == SIGMOID:
        s = sigmoid(v)
        return s * (1.0 - s)
    if act == LEAKY_RELU:
        return xp.where(v > 0, 1.0, xp.full_like(v, 0.01))
    if act == RELU2:
        return xp.astype(xp.where(v > 0, 2.0 * v, 0.0), v.dtype, copy=False)
    return xp.ones_like(v)


class _quiet:
    """Silence overflow warnings of numpy (CuPy has no errstate)."""

    def __init__(self, xp):
        self._ctx = xp.errstate(over="ignore") if hasattr(xp, "errstate") else None

    def __enter__(self):
        if self._ctx is not None:
            self._ctx.__enter__()

    def __exit__(self, *exc):
        if self._ctx is not None:
            self._ctx.__exit__(*exc)
