"""Direct logit attribution: how much each head, each MLP and the embedding add to one token's
logit at one position, through the residual stream.

The final residual is a sum: the embedding plus every block's attention and MLP outputs. The
logit is ``(r / rms(r)) . (gamma * W_U[token]) / divisor`` (then a soft cap, gemma2's, which is
left out: attributions are of the logit before it). The usual linearisation freezes the final
norm's ``1 / rms(r)`` at its value in this run; the logit is then linear in ``r``, and each
component's share is its vector's product with the same direction. The shares sum to the logit
(before the cap) up to float rounding.

A head's output is its slice of the output projection applied to its values, times the layer's
multiplier; where a post-norm sits between the attention and the residual (gemma2, gemma3, olmo2)
its ``1 / rms`` is frozen too, which keeps the heads' shares summing to that half's. The output
projection's bias is reported apart (``attn_bias``), as TransformerLens does.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backend import to_host
from ..cancel import Cancel
from ..errors import InspectError
from ..llm.model.llm_layers import LLMRMSNorm
from .trace import Block, Progress, Tracer, one_sequence


@dataclass
class Attribution:
    """The shares of ``token``'s logit at ``position``; ``logit`` is the model's (before any soft cap)."""

    tokens: list[int]
    position: int
    token: int
    logit: float
    embed: float
    heads: np.ndarray  # [layers, heads]
    attn_bias: np.ndarray  # [layers]
    mlp: np.ndarray  # [layers]

    def total(self) -> float:
        """The sum of every share: the logit, up to rounding."""
        return float(self.embed + self.heads.sum() + self.attn_bias.sum() + self.mlp.sum())

    def components(self) -> list[tuple[str, int, int | None, float]]:
        """``(kind, layer, head, share)`` of every component (kind "embed", "head", "attn_bias",
        "mlp"), largest magnitude first."""
        rows = [("embed", -1, None, float(self.embed))]
        for i in range(self.heads.shape[0]):
            rows += [("head", i, h, float(v)) for h, v in enumerate(self.heads[i])]
            rows += [("attn_bias", i, None, float(self.attn_bias[i])), ("mlp", i, None, float(self.mlp[i]))]
        return sorted(rows, key=lambda r: -abs(r[3]))


def attribute(net, ids, token: int | None = None, position: int = -1, *,
              progress: Progress | None = None, cancel: Cancel = None) -> Attribution:
    """The direct logit attribution of ``token`` (default: the model's top prediction there) at
    ``position`` (default the last) of one sequence ``ids``; ``progress(blocks done, blocks)``."""
    tracer = Tracer(net)
    x = one_sequence(tracer, ids)
    T = x.shape[1]
    if not -T <= position < T:
        raise InspectError(f"position {position} is outside the sequence of {T} tokens")
    position %= T
    trace = tracer.run(x, keep=("resid_pre", "z", "attn_raw", "mlp_out"), cancel=cancel, progress=progress)
    final = to_host(trace.final)[0, position]
    if token is None:
        token = int(np.argmax(to_host(tracer.logits(trace.final[:, position:position + 1, :]))[0, 0]))
    vocab = tracer.embedding.cfg.vocab_size
    if not 0 <= token < vocab:
        raise InspectError(f"token {token} is outside the vocabulary 0..{vocab - 1}")
    norm = tracer.final_norm
    gamma = norm.weights.current(norm.cfg.dtype)["gamma"]
    direction = gamma * tracer.unembedding([token])[0] / np.float32(tracer.head.divisor)
    direction = direction * _inverse_rms(final, norm.eps)

    def share(v: np.ndarray) -> float:
        return float(v @ direction)

    L, H = tracer.n_layers, tracer.n_heads
    heads, bias, mlp = np.zeros((L, H)), np.zeros(L), np.zeros(L)
    for i, block in enumerate(tracer.blocks):
        if ("z", i) not in trace.values:  # a block switched off adds nothing
            continue
        z = to_host(trace["z", i])[0, position]  # [heads, hd]
        frozen = _post_norm_scale(block, to_host(trace["attn_raw", i])[0, position])
        wo = tracer.output_matrix(i)
        hd, scale = tracer.head_dim, np.float32(block.attention.spec.output_scale)
        heads[i] = [share(wo[:, h * hd:(h + 1) * hd] @ z[h] * scale * frozen) for h in range(H)]
        w = block.attention.weights
        current = w.current(block.attention.cfg.dtype)
        if not w.is_filler("bo", current["bo"]):
            bias[i] = share(np.asarray(to_host(current["bo"]), np.float32) * scale * frozen)
        mlp[i] = share(to_host(trace["mlp_out", i])[0, position])
    logit = float(final @ direction)
    return Attribution([int(t) for t in x[0]], position, token, logit,
                       share(to_host(trace["resid_pre", 0])[0, position]), heads, bias, mlp)


def _inverse_rms(v: np.ndarray, eps: float) -> np.float32:
    return np.float32(1.0 / np.sqrt(np.mean(v.astype(np.float32) ** 2) + np.float32(eps)))


def _post_norm_scale(block: Block, raw: np.ndarray) -> np.ndarray:
    """The post-norms after the attention, frozen at this run's ``1 / rms``: one vector that maps
    the attention's output onto what it adds to the residual (ones where there are none)."""
    scale = np.ones_like(raw)
    value = raw
    for layer in block.post_norms:
        if layer.cfg.is_disabled:
            continue
        if not isinstance(layer, LLMRMSNorm):
            raise InspectError(f"{type(layer).__name__} after the attention cannot be linearised "
                               "(only RMSNorm post-norms are)")
        step = layer.weights.current(layer.cfg.dtype)["gamma"] * _inverse_rms(value, layer.eps)
        scale, value = scale * step, value * step
    return scale
