"""KMeans: soft assignment of the whole input tensor to ``K`` learned centers (spec §5.4.12).

The whole tensor (batch included) is ONE feature vector of length ``D = input_height``.
``logit_k = -|x - c_k|^2 / (2 tau^2)`` and ``a = softmax(logit)``; the output has the input's
shape with the last dimension replaced by ``K`` (probabilities, ``post = act(a)``) or by ``D``
(``output_mode == "features"``, ``post = act(sum_k a_k c_k)``). Only the first ``K`` (or ``D``)
entries are written, as in Loom; the rest stay 0.
"""

from __future__ import annotations

import math

from ..activations import activate, derivative
from ..errors import LoomFormatError, LoomShapeError
from .base import Layer, register

_INTEGER_LOGIT_DTYPES = frozenset({"int8", "uint8", "int16", "uint16", "int32", "uint32", "int64",
                                   "uint64"})


@register
class KMeans(Layer):
    type_name = "KMeans"
    weighted = True

    @staticmethod
    def param_count(cfg) -> int:
        return cfg.num_clusters * cfg.input_height

    def check(self, path: str) -> None:
        if self.cfg.input_height <= 0 or self.cfg.num_clusters <= 0:
            raise LoomFormatError(path, "KMeans needs input_height > 0 and num_clusters > 0, got "
                                        f"{self.cfg.input_height} and {self.cfg.num_clusters}")

    @property
    def features_mode(self) -> bool:
        # Loom compares the exact string; "Features" or "probabilities" mean probabilities.
        return self.cfg.output_mode == "features"

    @property
    def integer_logits(self) -> bool:
        # Loom computes the logits in the integer element type of these dtypes (spec §4.5)
        return self.cfg.dtype in _INTEGER_LOGIT_DTYPES

    @property
    def tau_squared(self) -> float:
        tau = self.cfg.kmeans_temperature or 1.0
        return tau * tau

    def describe_shapes(self):
        D, K = self.cfg.input_height, self.cfg.num_clusters
        return [D], [D if self.features_mode else K]

    def forward(self, x, ctx, skip=None):
        xp = ctx.xp
        D, K = self.cfg.input_height, self.cfg.num_clusters
        if x.size != D:
            raise LoomShapeError(f"KMeans reads the whole tensor as one feature vector of "
                                 f"input_height={D} values; got shape {tuple(x.shape)} ({x.size} values)")
        centers = xp.reshape(self.params(xp, x.dtype), (K, D))
        diff = xp.reshape(x, (1, D)) - centers
        logits = -xp.sum(diff * diff, axis=1) / (2 * self.tau_squared)
        if self.integer_logits:
            logits = logits * 0  # Loom truncates these logits to integer 0: uniform (spec §4.5)
        e = xp.exp(logits - xp.max(logits))
        a = e / xp.sum(e)
        pre = a @ centers if self.features_mode else a
        lead = x.shape[:-1] if x.ndim else ()
        # the first pre.size values of a tensor of the input's leading shape and pre.size last
        out = xp.zeros(math.prod(lead) * pre.size, dtype=x.dtype)
        out[: pre.size] = activate(self.cfg.act_id, pre)
        out = xp.reshape(out, (*lead, pre.size))
        cache = (diff, a, pre, centers, x.shape) if ctx.train else None
        return out, cache

    def backward(self, cache, gy, ctx):
        diff, a, pre, centers, x_shape = cache
        xp = ctx.xp
        gpre = xp.reshape(gy, (-1,))[: pre.size] * derivative(self.cfg.act_id, pre)
        if self.features_mode:
            ga = centers @ gpre
            g_centers = a[:, None] * gpre[None, :]
        else:
            ga = gpre
            g_centers = xp.zeros_like(centers)
        glogits = a * (ga - xp.sum(a * ga)) * (0 if self.integer_logits else 1)
        # d logit_k / d x = -(x - c_k) / tau^2 and d logit_k / d c_k = +(x - c_k) / tau^2
        g_diff = glogits[:, None] * diff / self.tau_squared
        self.add_grad(g_centers + g_diff)
        return xp.reshape(-xp.sum(g_diff, axis=0), x_shape)
