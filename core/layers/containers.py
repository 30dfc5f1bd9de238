"""Container layers (spec §5.4.13, 5.4.15, 5.4.16): Residual, Parallel and Sequential.

Children run through the network's :class:`~loomlab.core.network.Run`, so remote links, observer
events and backward recording work the same at any nesting depth.
"""

from __future__ import annotations

import math

from ..backend import array_module
from ..errors import LoomConfigError, LoomShapeError
from .base import Layer, register


@register
class Residual(Layer):
    """``x + skip`` when a skip tensor of equal size is supplied (only Sequential does), else x."""

    type_name = "Residual"

    def forward(self, x, ctx, skip=None):
        xp = ctx.xp
        used = skip is not None and skip.size == x.size
        y = x + xp.reshape(skip, x.shape) if used else xp.asarray(x, copy=True)
        return y, ((skip.shape if used else None) if ctx.train else None)

    def backward(self, cache, gy, ctx):
        return gy

    def skip_grad(self, cache, gy):
        return None if cache is None else array_module(gy).reshape(gy, cache)


@register
class Parallel(Layer):
    """Every branch sees the same input; outputs are combined per ``combine_mode``.

    ``gate`` (in memory only, as in Loom) is the layer whose first ``len(branches)`` outputs,
    softmaxed, weight the branches in ``"filter"`` mode.
    """

    type_name = "Parallel"

    def __init__(self, cfg, weights=None, children=None):
        super().__init__(cfg, weights, children)
        self.gate: Layer | None = None

    def walk(self):
        yield from super().walk()
        if self.gate is not None:
            yield from self.gate.walk()

    def forward(self, x, ctx, skip=None):
        xp = ctx.xp
        if not self.children:
            return xp.asarray(x, copy=True), None
        batch = max(x.shape[0], 1) if x.ndim else 1
        tokens, outs = [], []
        for child in self.children:
            y, token = ctx.call(ctx.resolve(child), x)
            tokens.append(token)
            outs.append(y)
        flat = [xp.reshape(o, (batch, -1)) for o in outs]
        mode = self.cfg.combine_mode
        if mode in ("concat", "", "grid_scatter"):
            return xp.concat(flat, axis=1), (tokens, outs, None)
        _check_same_size(flat)
        if mode in ("add", "avg"):
            y = sum(flat[1:], flat[0])
            return (y / len(flat) if mode == "avg" else y), (tokens, outs, None)
        if mode == "filter":
            return self._filter(x, flat, tokens, outs, ctx)
        raise LoomConfigError(f"unknown combine_mode {mode!r}")

    def _filter(self, x, flat, tokens, outs, ctx):
        if self.gate is None:
            # Loom outputs zeros here; a silent zero is never what the user meant.
            raise LoomConfigError("Parallel combine_mode 'filter' needs a gate layer (Parallel.gate)")
        xp = ctx.xp
        g, gate_token = ctx.call(self.gate, x)
        n = len(flat)
        if g.size < n:
            raise LoomShapeError(f"filter gate gives {g.size} values for {n} branches")
        z = xp.reshape(g, (-1,))[:n]
        e = xp.exp(z - xp.max(z))
        w = e / xp.sum(e)
        y = sum(w[i] * flat[i] for i in range(n))
        return y, (tokens, outs, (gate_token, g.shape, w, flat))

    def backward(self, cache, gy, ctx):
        if cache is None:
            return gy
        tokens, outs, filt = cache
        xp, mode = ctx.xp, self.cfg.combine_mode
        if mode in ("concat", "", "grid_scatter"):
            sizes = [o.size // gy.shape[0] for o in outs]
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            grads = [xp.reshape(gy[:, s:s + n], o.shape) for s, n, o in zip(starts, sizes, outs, strict=True)]
        elif mode == "filter":
            gate_token, gate_shape, w, flat = filt
            grads = [xp.reshape(w[i] * gy, o.shape) for i, o in enumerate(outs)]
            gw = xp.stack([xp.sum(gy * f) for f in flat])
            gz = w * (gw - xp.sum(w * gw))
            g_gate = xp.zeros(math.prod(gate_shape), dtype=gy.dtype)
            g_gate[: gz.size] = gz
            gx = ctx.back(gate_token, xp.reshape(g_gate, gate_shape))
            return gx + self._branch_grads(tokens, grads, ctx)
        else:
            scale = 1.0 / len(outs) if mode == "avg" else 1.0
            grads = [xp.reshape(gy * scale, o.shape) for o in outs]
        return self._branch_grads(tokens, grads, ctx)

    @staticmethod
    def _branch_grads(tokens, grads, ctx):
        gx = None
        for token, g in zip(tokens, grads, strict=True):
            gi = ctx.back(token, g)
            gx = gi if gx is None else gx + gi
        return gx


@register
class Sequential(Layer):
    """Children in order; child i receives as skip the input of the previously executed child."""

    type_name = "Sequential"

    def forward(self, x, ctx, skip=None):
        tokens = []
        prev_input = None
        current = x
        for child in self.children:
            if child.cfg.is_disabled:
                continue
            y, token = ctx.call(ctx.resolve(child), current, prev_input)
            tokens.append(token)
            prev_input, current = current, y
        return (ctx.xp.asarray(current, copy=True) if not tokens else current), tokens

    def backward(self, cache, gy, ctx):
        g = gy
        skip_g = None  # gradient reaching a child's input through the next child's skip
        for token in reversed(cache):
            g_in = ctx.back(token, g)
            if skip_g is not None:
                g_in = g_in + ctx.xp.reshape(skip_g, g_in.shape)
            skip_g = ctx.skip_grad(token, g)
            g = g_in
        return g


def _check_same_size(flat) -> None:
    sizes = {f.shape[1] for f in flat}
    if len(sizes) > 1:
        raise LoomShapeError(f"Parallel add/avg/filter needs equal branch sizes, got {sorted(sizes)}")


