"""SwiGLU gated MLP (spec §5.4.5): ``y = Wdown·(silu(Wgate·x + bg) * (Wup·x + bu)) + bd``.

The activation field is ignored (the gate is always SiLU), as in Loom. Rows of ``input_height``
values are processed independently.
"""

from __future__ import annotations

from ..activations import SILU, activate, derivative
from ..errors import LoomFormatError, LoomShapeError
from .base import Layer, register, rows_to_input


@register
class SwiGLU(Layer):
    type_name = "SwiGLU"
    weighted = True

    @staticmethod
    def param_count(cfg) -> int:
        d, h = cfg.input_height, cfg.output_height
        return 3 * d * h + 2 * h + d

    def check(self, path: str) -> None:
        if self.cfg.input_height <= 0 or self.cfg.output_height <= 0:
            raise LoomFormatError(path, "SwiGLU needs input_height > 0 and output_height > 0")

    def describe_shapes(self):
        return [self.cfg.input_height], [self.cfg.input_height]

    def _split(self, p, xp):
        """Views of the flat vector: Wgate[I][d], Wup[I][d], Wdown[d][I], bgate, bup, bdown."""
        d, h = self.cfg.input_height, self.cfg.output_height
        o = [0, h * d, 2 * h * d, 3 * h * d, 3 * h * d + h, 3 * h * d + 2 * h, 3 * h * d + 2 * h + d]
        return (xp.reshape(p[o[0]:o[1]], (h, d)), xp.reshape(p[o[1]:o[2]], (h, d)),
                xp.reshape(p[o[2]:o[3]], (d, h)), p[o[3]:o[4]], p[o[4]:o[5]], p[o[5]:o[6]])

    def forward(self, x, ctx, skip=None):
        d = self.cfg.input_height
        if x.size < d:
            raise LoomShapeError(f"SwiGLU: input of shape {tuple(x.shape)} holds no row of {d} values")
        xp = ctx.xp
        # R = len // in rows, batch folded in
        rows = xp.reshape(xp.reshape(x, (-1,))[: x.size // d * d], (-1, d))
        wg, wu, wd, bg, bu, bd = self._split(self.params(xp, x.dtype), xp)
        g = rows @ wg.T + bg
        u = rows @ wu.T + bu
        a = activate(SILU, g)
        h = a * u
        y = h @ wd.T + bd
        cache = (rows, g, u, a, h, x.shape) if ctx.train else None
        return y, cache

    def backward(self, cache, gy, ctx):
        rows, g, u, a, h, x_shape = cache
        xp = ctx.xp
        wg, wu, wd, _, _, _ = self._split(self.params(xp, rows.dtype), xp)
        gy = xp.reshape(gy, (-1, self.cfg.input_height))
        gh = gy @ wd
        gg = gh * u * derivative(SILU, g)
        gu = gh * a
        self.add_grad(xp.concat([
            xp.reshape(gg.T @ rows, (-1,)), xp.reshape(gu.T @ rows, (-1,)), xp.reshape(gy.T @ h, (-1,)),
            xp.sum(gg, axis=0), xp.sum(gu, axis=0), xp.sum(gy, axis=0)]))
        return rows_to_input(gg @ wg + gu @ wu, x_shape, xp)
