"""Dense: ``y = act(W x)`` with ``W[out][in]`` and no bias (spec §5.4.1)."""

from __future__ import annotations

from ..activations import activate, derivative
from ..errors import LoomFormatError
from .base import Layer, batch_rows, register, rows_to_input


@register
class Dense(Layer):
    type_name = "Dense"
    weighted = True

    @staticmethod
    def param_count(cfg) -> int:
        return cfg.input_height * cfg.output_height

    def check(self, path: str) -> None:
        if self.cfg.input_height <= 0 or self.cfg.output_height <= 0:
            raise LoomFormatError(path, "Dense needs input_height > 0 and output_height > 0")

    def describe_shapes(self):
        return [self.cfg.input_height], [self.cfg.output_height]

    def forward(self, x, ctx, skip=None):
        xp, n_in, n_out = ctx.xp, self.cfg.input_height, self.cfg.output_height
        w = xp.reshape(self.params(xp, x.dtype), (n_out, n_in))
        # the usual [B, n_in] input already is the rows batch_rows would read: skip its slicing
        rows = x if x.ndim == 2 and x.shape[1] == n_in and x.shape[0] else batch_rows(x, n_in, "Dense")
        pre = rows @ w.T
        post = activate(self.cfg.act_id, pre)
        return post, ((rows, pre, w, x.shape) if ctx.train else None)

    def backward(self, cache, gy, ctx):
        rows, pre, w, x_shape = cache
        gpre = ctx.xp.reshape(gy, pre.shape) * derivative(self.cfg.act_id, pre)
        self.add_grad(gpre.T @ rows)
        return rows_to_input(gpre @ w, x_shape, ctx.xp)
