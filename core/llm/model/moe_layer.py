"""A mixture-of-experts feed-forward layer (qwen3moe, mixtral) as a grid container.

:class:`LLMMixtureOfExperts` is a core ``Parallel`` (Loom's gated mixture: ``combine_mode``
"filter") whose branches are the experts, each an :class:`~.llm_layers.LLMGatedMLP`, and whose own
weights are the router. So the grid sees every expert as a layer: the 3-D view draws it, Morph
morphs it, DNA signs it, and observers get one event per expert that ran, its output holding the
rows (tokens) routed to it.

Routing, as transformers and llama.cpp do it for both families: the router's logits over the
experts, their softmax, the ``k`` largest probabilities, renormalised to sum to 1 when the model
says so (mixtral always; qwen3moe by ``norm_topk_prob``). Each token's output is the weighted sum
of its chosen experts' outputs; an expert no token chose does not run.
"""

from __future__ import annotations

import numpy as np

from ...backend import to_host
from ...layers.base import LayerConfig
from ...layers.containers import Parallel
from .llm_layers import InferenceOnly, LLMGatedMLP, Matrix, MatrixStore, linear


def route(logits: np.ndarray, k: int, normalise: bool) -> tuple[np.ndarray, np.ndarray]:
    """Each row's ``k`` chosen experts ``[R, k]`` (most probable first) and their weights ``[R, k]``
    (float32) from router logits ``[R, n_experts]``."""
    z = logits - logits.max(axis=-1, keepdims=True)
    p = np.exp(z)
    p /= p.sum(axis=-1, keepdims=True)
    chosen = np.argsort(-p, axis=-1, kind="stable")[:, :k]
    w = np.take_along_axis(p, chosen, axis=-1)
    if normalise:
        w = w / w.sum(axis=-1, keepdims=True)
    return chosen, w.astype(np.float32)


class LLMMixtureOfExperts(InferenceOnly, Parallel):
    """Top-``k`` routing over ``experts`` with ``router[n_experts, d]`` as this layer's weights.

    ``load[e]`` counts the tokens routed to expert ``e`` since the model was built (or
    :meth:`reset_load`); ``last_load`` those of the latest call. A disabled expert adds nothing to
    the tokens routed to it (their other experts' weights are not renormalised).
    """

    def __init__(self, router: Matrix, experts: list[LLMGatedMLP], k: int, normalise: bool):
        n, d = router.shape
        cfg = LayerConfig(type="Parallel", combine_mode="filter", input_height=d, output_height=d)
        super().__init__(cfg, MatrixStore({"router": router}), experts)
        self.k, self.normalise = k, normalise
        self.load = np.zeros(n, np.int64)
        self.last_load = np.zeros(n, np.int64)

    @property
    def n_experts(self) -> int:
        return len(self.children)

    def describe_shapes(self):
        return [self.cfg.input_height], [self.cfg.output_height]

    def reset_load(self) -> None:
        self.load[:] = 0
        self.last_load[:] = 0

    def forward(self, x, ctx, skip=None):
        d = x.shape[-1]
        if self.device_copy is not None:
            logits = self.device_copy.linear(x, self.device_copy.arrays(self, ctx)["router"])
            logits = to_host(logits)
        else:
            logits = linear(x, self.weights.current(self.cfg.dtype)["router"])
        chosen, weights = route(logits.reshape(-1, self.n_experts).astype(np.float32), self.k, self.normalise)
        rows = ctx.xp.reshape(x, (-1, d))
        counts = np.bincount(chosen.ravel(), minlength=self.n_experts)
        self.last_load[:] = counts
        self.load += counts
        y = None
        for e in np.flatnonzero(counts):
            expert = ctx.resolve(self.children[e])
            if expert.cfg.is_disabled:
                continue
            r, slot = np.nonzero(chosen == e)  # each row chooses an expert at most once
            out, _ = ctx.call(expert, self._take(rows, r, ctx))
            part = self._scatter(out * self._column(weights[r, slot], ctx), r, rows.shape[0], ctx)
            y = part if y is None else y + part
        if y is None:
            y = ctx.xp.zeros_like(rows)
        return ctx.xp.reshape(y, x.shape), None

    def _take(self, rows, r: np.ndarray, ctx):
        if self.device_copy is None:
            return rows[r]
        return ctx.xp.take(rows, ctx.xp.asarray(r), axis=0)

    def _column(self, w: np.ndarray, ctx):
        return w[:, None] if self.device_copy is None else ctx.xp.asarray(w[:, None])

    def _scatter(self, part, r: np.ndarray, n_rows: int, ctx):
        """``part``'s rows placed at rows ``r`` of ``n_rows`` zero rows."""
        if self.device_copy is None:
            out = np.zeros((n_rows, part.shape[-1]), np.float32)
            out[r] = part
            return out
        onehot = np.zeros((n_rows, len(r)), np.float32)  # a scatter as a product (the array API has none)
        onehot[r, np.arange(len(r))] = 1.0
        return ctx.xp.matmul(ctx.xp.asarray(onehot), part)
