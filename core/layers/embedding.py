"""Embedding (spec §5.4.11): every input value is a token id ``trunc(v)``; ids outside
``[0, vocab_size)`` give a zero row; the activation is applied to every row (zero rows too)."""

from __future__ import annotations

from ..activations import activate, derivative
from ..errors import LoomFormatError
from .base import Layer, register
from .scatter import scatter_add


@register
class Embedding(Layer):
    type_name = "Embedding"
    weighted = True

    @staticmethod
    def param_count(cfg) -> int:
        return cfg.vocab_size * cfg.embedding_dim

    def check(self, path: str) -> None:
        if self.cfg.vocab_size <= 0 or self.cfg.embedding_dim <= 0:
            raise LoomFormatError(path, "Embedding needs vocab_size > 0 and embedding_dim > 0")

    def describe_shapes(self):
        return [1], [self.cfg.embedding_dim]

    def forward(self, x, ctx, skip=None):
        xp = ctx.xp
        v, e = self.cfg.vocab_size, self.cfg.embedding_dim
        table = xp.reshape(self.params(xp, x.dtype), (v, e))
        ids = xp.reshape(xp.trunc(x), (-1,))
        valid = (ids >= 0) & (ids < v)
        ids = xp.astype(xp.where(valid, ids, 0), xp.int64)
        pre = xp.astype(xp.where(valid[:, None], xp.take(table, ids, axis=0), 0), x.dtype)
        post = activate(self.cfg.act_id, pre)
        return xp.reshape(post, (*x.shape, e)), ((ids, valid, pre, x.shape) if ctx.train else None)

    def backward(self, cache, gy, ctx):
        ids, valid, pre, x_shape = cache
        xp = ctx.xp
        gpre = xp.reshape(gy, pre.shape) * derivative(self.cfg.act_id, pre)
        # invalid ids read row 0 as a zero row; their zeroed rows add nothing to it (no boolean
        # index, whose data-dependent shape would make a GPU wait)
        gpre = xp.where(valid[:, None], gpre, 0)
        self.add_grad(scatter_add(xp, ids, gpre.T, self.cfg.vocab_size).T)  # [V, E]
        return xp.zeros(x_shape, dtype=gy.dtype)  # token ids have no gradient
