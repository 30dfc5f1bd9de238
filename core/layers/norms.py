"""RMSNorm and LayerNorm (spec §5.4.2–5.4.3): row-wise normalisation with learned gamma (and beta).

``B = shape[0]`` rows of ``n = output_height`` values are normalised, the rest of the tensor
becomes zero (Loom's rule: a ``[1, S, d]`` input normalises one row; pass ``[S, d]``).
``input_height`` sizes the parameters; it must equal ``output_height``.
``eps`` is an in-memory attribute (Loom: 1e-6 for RMSNorm, 1e-5 for LayerNorm; imported LLMs
set their own), never written to JSON, as in Loom.
"""

from __future__ import annotations

from ..errors import LoomFormatError
from .base import Layer, batch_rows, register, rows_to_input


class _Norm(Layer):
    weighted = True
    n_param_blocks = 1
    default_eps = 1e-6

    def __init__(self, cfg, weights=None, children=None):
        super().__init__(cfg, weights, children)
        self.eps = self.default_eps

    @classmethod
    def param_count(cls, cfg) -> int:
        return cls.n_param_blocks * cfg.input_height

    @property
    def width(self) -> int:
        return self.cfg.output_height or self.cfg.input_height

    def check(self, path: str) -> None:
        c = self.cfg
        if c.input_height <= 0:
            raise LoomFormatError(path, f"{self.type_name} needs input_height > 0")
        if c.output_height not in (0, c.input_height):
            raise LoomFormatError(path, f"{self.type_name} needs output_height == input_height "
                                        f"({c.output_height} != {c.input_height})")

    def describe_shapes(self):
        return [self.width], [self.width]

    def forward(self, x, ctx, skip=None):
        n = self.width
        rows = batch_rows(x, n, self.type_name)
        p = self.params(ctx.xp, x.dtype)
        blocks = [p[i * n:(i + 1) * n] for i in range(self.n_param_blocks)]  # gamma (, beta)
        y, cache = self._normalise(rows, ctx.xp, *blocks)
        # Loom normalises B = shape[0] rows and leaves the rest of the tensor at zero (spec §5.4.2)
        out = rows_to_input(y, x.shape, ctx.xp)
        return out, ((cache, blocks[0], x.shape) if ctx.train else None)

    def backward(self, cache, gy, ctx):
        inner, gamma, x_shape = cache
        xp, n = ctx.xp, gamma.size
        # only the values the forward normalised carry gradient (see the zero tail above)
        g_rows = xp.reshape(xp.reshape(gy, (-1,))[: inner[0].size], (-1, n))
        gx_rows, gparams = self._grads(inner, gamma, g_rows, ctx.xp)
        self.add_grad(gparams)
        return rows_to_input(gx_rows, x_shape, ctx.xp)


@register
class RMSNorm(_Norm):
    type_name = "RMSNorm"

    def _normalise(self, rows, xp, gamma):
        inv = 1.0 / xp.sqrt(xp.mean(rows * rows, axis=1, keepdims=True) + self.eps)
        xhat = rows * inv
        return xhat * gamma, (xhat, inv)

    def _grads(self, inner, gamma, g, xp):
        xhat, inv = inner
        g_gamma = xp.sum(g * xhat, axis=0)
        gxhat = g * gamma
        gx = inv * (gxhat - xhat * xp.mean(gxhat * xhat, axis=1, keepdims=True))
        return gx, g_gamma


@register
class LayerNorm(_Norm):
    type_name = "LayerNorm"
    n_param_blocks = 2  # gamma then beta
    default_eps = 1e-5

    def _normalise(self, rows, xp, gamma, beta):
        mean = xp.mean(rows, axis=1, keepdims=True)
        var = xp.mean(rows * rows, axis=1, keepdims=True) - mean * mean  # Loom's E[x²] − mean²
        inv = 1.0 / xp.sqrt(var + self.eps)
        xhat = (rows - mean) * inv
        return xhat * gamma + beta, (xhat, inv)

    def _grads(self, inner, gamma, g, xp):
        xhat, inv = inner
        gxhat = g * gamma
        gx = inv * (gxhat - xp.mean(gxhat, axis=1, keepdims=True)
                    - xhat * xp.mean(gxhat * xhat, axis=1, keepdims=True))
        return gx, xp.concat([xp.sum(g * xhat, axis=0), xp.sum(g, axis=0)])
