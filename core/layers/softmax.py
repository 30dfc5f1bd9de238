"""Softmax: Loom's ten normalising variants (spec §1.4, §5.4.14).

Every variant divides the logits by ``temperature`` (0 -> 1), then normalises groups of them:
the whole tensor (batch rows mixed, as Loom does) or, for Grid/Hierarchical, consecutive rows
of ``cols`` values. Backward is the exact Jacobian-vector product of this forward; Loom's own
backward reads the input logits where the probabilities belong (docs/compat.md).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from types import ModuleType
from typing import Any

import numpy as np

from ..enums import SOFTMAX_TYPES
from ..errors import LoomFormatError, LoomShapeError
from .base import Layer, register

MASKED_LOGIT = -1e9  # Loom's logit for masked-out entries
GUMBEL_U_MIN = 1e-10  # Loom clamps the uniform draw so ln(ln(u)) stays finite
GRID_VARIANTS = ("Grid", "Hierarchical")

# A normaliser maps (xp, logits (G, C)) to (probabilities, vjp) where vjp(g) = J^T g.
Normalised = tuple[Any, Callable[[Any], Any]]
Normaliser = Callable[[ModuleType, Any], Normalised]


def softmax(xp: ModuleType, z) -> Normalised:
    """Row-wise softmax of ``z`` (G, C) and its Jacobian-vector product."""
    e = xp.exp(z - xp.max(z, axis=-1, keepdims=True))
    p = e / xp.sum(e, axis=-1, keepdims=True)
    return p, lambda g: p * (g - xp.sum(p * g, axis=-1, keepdims=True))


def sparsemax(xp: ModuleType, z) -> Normalised:
    """Row-wise sparsemax (Martins & Astudillo) of ``z`` (G, C) and its Jacobian-vector product."""
    s = -xp.sort(-z, axis=-1)
    c = xp.cumulative_sum(s, axis=-1)
    i = xp.arange(1, z.shape[-1] + 1, dtype=z.dtype)
    # k counts the leading run of the test, as Loom stops at the first failure.
    run = xp.cumulative_prod(xp.astype(s - (c - 1) / i > 0, xp.int64), axis=-1)
    k = xp.sum(run, axis=-1, keepdims=True)
    tau = (xp.take_along_axis(c, k - 1, axis=-1) - 1) / xp.astype(k, z.dtype)
    p = xp.maximum(z - tau, 0)
    support = xp.astype(p > 0, z.dtype)

    def vjp(g):
        mean = xp.sum(g * support, axis=-1, keepdims=True) / xp.sum(support, axis=-1, keepdims=True)
        return xp.where(support > 0, g - mean, 0)

    return p, vjp


def entmax_blend(alpha: float) -> Normaliser:
    """Loom's "Entmax": softmax/sparsemax blended by w = alpha-1, renormalised by its sum."""
    if alpha <= 1:
        return softmax
    if alpha >= 2:
        return sparsemax
    w = alpha - 1

    def blend(xp: ModuleType, z) -> Normalised:
        s, s_vjp = softmax(xp, z)
        q, q_vjp = sparsemax(xp, z)
        r = (1 - w) * s + w * q
        total = xp.sum(r, axis=-1, keepdims=True)
        out = r / total

        def vjp(g):
            gr = (g - xp.sum(g * out, axis=-1, keepdims=True)) / total  # through r / sum(r)
            return (1 - w) * s_vjp(gr) + w * q_vjp(gr)

        return out, vjp

    return blend


@register
class Softmax(Layer):
    type_name = "Softmax"
    # Gumbel noise source, made on first use (a generator per layer would cost more than the
    # layer when a file holds thousands); tests set a seeded one.
    rng: np.random.Generator | None = None

    def check(self, path: str) -> None:
        cfg = self.cfg
        if cfg.softmax_type not in SOFTMAX_TYPES:
            raise LoomFormatError(path, f"softmax_type {cfg.softmax_type!r} is not one of {SOFTMAX_TYPES}")
        if cfg.softmax_rows < 0 or cfg.softmax_cols < 0:
            raise LoomFormatError(path, f"softmax_rows/cols must be >= 0, got "
                                        f"{cfg.softmax_rows}x{cfg.softmax_cols}")
        if not cfg.temperature >= 0:  # also rejects NaN
            raise LoomFormatError(path, f"temperature must be >= 0, got {cfg.temperature}")
        if cfg.mask is not None and not _is_list_of(cfg.mask, _is_bool):
            raise LoomFormatError(path, "mask must be a list of bool")
        if cfg.hierarchy_levels is not None and not _is_list_of(cfg.hierarchy_levels, _is_level):
            raise LoomFormatError(path, "hierarchy_levels must be a list of non-negative int")

    @property
    def temperature(self) -> float:
        return self.cfg.temperature or 1.0

    def normaliser(self) -> Normaliser:
        kind = self.cfg.softmax_type
        if kind == "Sparse":
            return sparsemax
        if kind == "Entmax":
            return entmax_blend(self.cfg.entmax_alpha or 1.5)
        return softmax

    def layout(self, n: int) -> tuple[int, int]:
        """(rows, cols) of the groups normalised independently; rows*cols may differ from n."""
        cfg = self.cfg
        if cfg.softmax_type not in GRID_VARIANTS:
            return 1, n
        rows, cols = cfg.softmax_rows, cfg.softmax_cols
        if cfg.softmax_type == "Hierarchical" and cfg.hierarchy_levels:
            cols = cfg.hierarchy_levels[-1]
            rows = n // cols if cols else 0
        if rows == 0 or cols == 0:
            return 1, n
        return min(rows, math.ceil(n / cols)), cols  # rows starting past the end hold nothing

    def forward(self, x, ctx, skip=None):
        xp = ctx.xp
        n = x.size
        if n == 0:
            raise LoomShapeError("Softmax: empty input tensor")
        z = xp.reshape(x, (-1,)) / self.temperature
        if self.cfg.softmax_type == "Gumbel":
            z = z + self._gumbel_noise(xp, n, z.dtype)
        keep = self._keep(xp, n)
        if keep is not None:
            z = xp.where(keep, z, MASKED_LOGIT)
        rows, cols = self.layout(n)
        used = min(rows * cols, n)
        # Pad a short last row with -inf: it takes no probability mass and gets no gradient.
        groups = xp.full(rows * cols, -xp.inf, dtype=z.dtype)
        groups[:used] = z[:used]
        p, vjp = self.normaliser()(xp, xp.reshape(groups, (rows, cols)))
        y = xp.zeros(n, dtype=z.dtype)
        y[:used] = xp.reshape(p, (-1,))[:used]
        # vjp holds this call's probabilities, so backward sees the same Gumbel noise.
        cache = (vjp, rows, cols, used, keep, x.shape) if ctx.train else None
        return xp.reshape(y, x.shape), cache

    def backward(self, cache, gy, ctx):
        xp = ctx.xp
        vjp, rows, cols, used, keep, x_shape = cache
        g = xp.zeros(rows * cols, dtype=gy.dtype)
        g[:used] = xp.reshape(gy, (-1,))[:used]
        gz = xp.zeros(gy.size, dtype=gy.dtype)
        gz[:used] = xp.reshape(vjp(xp.reshape(g, (rows, cols))), (-1,))[:used]
        if keep is not None:
            gz = xp.where(keep, gz, 0)  # masked logits are constants
        return xp.reshape(gz / self.temperature, x_shape)

    def _gumbel_noise(self, xp, n: int, dtype):
        # drawn on the host by the layer's numpy Generator (seedable, the same on every backend)
        # and copied to the device: one explicit transfer of n values per call
        if self.rng is None:
            self.rng = np.random.default_rng()
        u = np.maximum(self.rng.random(n), GUMBEL_U_MIN)
        return -xp.log(-xp.log(xp.asarray(u, dtype=dtype)))

    def _keep(self, xp, n: int):
        """Boolean array of unmasked entries for the Masked variant (None otherwise)."""
        if self.cfg.softmax_type != "Masked" or not self.cfg.mask:
            return None
        m = min(len(self.cfg.mask), n)
        keep = xp.ones(n, dtype=xp.bool)
        keep[:m] = xp.asarray(self.cfg.mask[:m], dtype=xp.bool)
        return keep


def _is_list_of(value, ok: Callable[[object], bool]) -> bool:
    return isinstance(value, list | tuple) and all(ok(v) for v in value)


def _is_bool(v) -> bool:
    return isinstance(v, bool | np.bool_)


def _is_level(v) -> bool:
    return isinstance(v, int | np.integer) and not isinstance(v, bool) and v >= 0
