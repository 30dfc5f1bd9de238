"""ConvTransposed1D/2D/3D, the scatter form (spec §5.4.8), no bias:
``out[b, f, i·s − p + k] += x[b, c, i]·K[f, c, k]`` wherever the target is inside the output.

The output is the adjoint of a convolution's window gather (:class:`~.conv.WindowMap` with the
output as source grid and the input positions as window positions). Loom adds in float32 in a
fixed order; this sums in the compute dtype (docs/compat.md).
"""

from __future__ import annotations

from .base import register
from .conv import SpatialLayer, WindowMap


class Transposed(SpatialLayer):
    """Scatter form: every input position adds a kernel-weighted window into the output."""

    def forward(self, x, ctx, skip=None):
        xp, F, kp = ctx.xp, self.cfg.filters, self.kernel ** len(self.in_fields)
        xb = self.batched(x)
        wmap = WindowMap(ctx.xp, self.out_sizes, self.in_sizes, self.kernel, self.cfg.stride,
                         self.cfg.padding)
        # K[F][C][k..] as [F·k^n, C], so kmat @ x gives each filter's windows per input position.
        kmat = xp.reshape(xp.permute_dims(xp.reshape(self.params(xp, x.dtype), (F, -1, kp)), (0, 2, 1)),
                          (F * kp, -1))
        pre = wmap.scatter(kmat @ xb, F)
        if self.cfg.dtype not in ("float32", "float64"):
            # Loom's transposed convolutions output zeros, activation unapplied, for every
            # other dtype (spec §4.5); nothing then depends on input or weights.
            return ctx.xp.zeros_like(pre), ((None, x.shape) if ctx.train else None)
        cache = (xb, pre, kmat, wmap, x.shape) if ctx.train else None
        return self.activated(pre), cache

    def backward(self, cache, gy, ctx):
        if cache[0] is None:
            return ctx.xp.zeros(cache[1], dtype=gy.dtype)
        xb, pre, kmat, wmap, x_shape = cache
        F, C, kp = self.cfg.filters, self.cfg.input_channels, wmap.kp
        gcols = wmap.gather(self.pre_grad(gy, pre))  # [B, F·k^n, P]
        gk = ctx.xp.tensordot(gcols, xb, axes=([0, 2], [0, 2]))  # [F·k^n, C]
        self.add_grad(ctx.xp.permute_dims(ctx.xp.reshape(gk, (F, kp, C)), (0, 2, 1)))
        return ctx.xp.reshape(kmat.T @ gcols, x_shape)


@register
class ConvTransposed1D(Transposed):
    """``[B, C, inW] -> [B, F, outW]``: the 1-D form reads the width fields, not the height."""

    type_name = "ConvTransposed1D"
    in_fields = ("input_width",)
    out_fields = ("output_width",)


@register
class ConvTransposed2D(Transposed):
    type_name = "ConvTransposed2D"
    in_fields = ("input_height", "input_width")
    out_fields = ("output_height", "output_width")


@register
class ConvTransposed3D(Transposed):
    type_name = "ConvTransposed3D"
    in_fields = ("input_depth", "input_height", "input_width")
    out_fields = ("output_depth", "output_height", "output_width")
