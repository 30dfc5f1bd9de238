"""The layers of an encoder-only (BERT-family) model, as LLM variants of the core families.

Like :mod:`.llm_layers` they keep the file's matrices (:class:`~.llm_layers.MatrixStore`), compute
in float32 and run forward only; each keeps its core family's ``type_name`` (Embedding,
LayerNorm, MultiHeadAttention, Dense), so the grid, telemetry and morphing see an embedding model
like any other network. Every call is a whole sequence: attention is bidirectional (no causal
mask, no KV cache), positions start at 0.
"""

from __future__ import annotations

import numpy as np

from ...errors import LoomShapeError
from ...layers.attention import MultiHeadAttention
from ...layers.base import LayerConfig
from ...layers.dense import Dense
from ...layers.embedding import Embedding
from ...layers.norms import LayerNorm
from ..kernels.gelu_kernel import gelu_erf
from .llm_layers import InferenceOnly, Matrix, MatrixStore, linear, linears, plus_bias, token_ids
from .rope import Rope

# hidden_act names (transformers' ACT2FN) -> the float32 function; "gelu" is the exact (erf) GELU
SQRT_2_OVER_PI = np.float32(0.7978845608028654)
ACTIVATIONS = {
    "gelu": gelu_erf,
    "gelu_new": lambda v: 0.5 * v * (1.0 + np.tanh(SQRT_2_OVER_PI * (v + 0.044715 * v * v * v))),
    "relu": lambda v: np.maximum(v, np.float32(0)),
}


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * gamma + beta`` over the last axis, in float32 (the
    variance of the centred values, as torch computes it)."""
    centred = x - x.mean(axis=-1, keepdims=True)
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return centred / np.sqrt(var + np.float32(eps)) * gamma + beta


class EncoderEmbedding(InferenceOnly, Embedding):
    """Word + token-type (+ learned position) embeddings: ``table[id] + token_types[0] (+
    positions[t])``; every token is of type 0, "sentence A", as embedding models are used. A
    model with rotary positions (nomic-bert) has no position table."""

    def __init__(self, table: Matrix, token_types: Matrix, positions: Matrix | None = None):
        vocab, d = table.shape
        parts = {"table": table, "token_types": token_types}
        super().__init__(LayerConfig(type="Embedding", vocab_size=vocab, embedding_dim=d),
                         MatrixStore(parts if positions is None else {**parts, "positions": positions}))

    def forward(self, x, ctx, skip=None):
        w = self.weights.current(self.cfg.dtype)
        ids = token_ids(x, self.cfg.vocab_size)
        ids = ids[None] if ids.ndim == 1 else ids
        T = ids.shape[-1]
        y = _rows(w["table"], ids.reshape(-1)).reshape(*ids.shape, self.cfg.embedding_dim)
        y = y + _rows(w["token_types"], np.zeros(1, np.int64))  # transformers' order: type, then position
        if "positions" not in w:
            return y, None
        if T > w["positions"].shape[0]:
            raise LoomShapeError(f"{T} tokens exceed the model's {w['positions'].shape[0]} positions")
        return y + _rows(w["positions"], np.arange(T)), None


def _rows(m: Matrix, ids: np.ndarray) -> np.ndarray:
    return np.asarray(m[ids] if isinstance(m, np.ndarray) else m.rows(ids), dtype=np.float32)


class LLMLayerNorm(InferenceOnly, LayerNorm):
    """LayerNorm over the last axis with the file's gamma and beta (store layout: Loom's gamma,
    beta)."""

    def __init__(self, gamma: np.ndarray, beta: np.ndarray, eps: float):
        n = gamma.shape[0]
        super().__init__(LayerConfig(type="LayerNorm", input_height=n, output_height=n),
                         MatrixStore({"gamma": np.asarray(gamma, np.float32),
                                      "beta": np.asarray(beta, np.float32)}))
        self.eps = eps

    def forward(self, x, ctx, skip=None):
        w = self.weights.current(self.cfg.dtype)
        return layer_norm(x, w["gamma"], w["beta"], self.eps), None


class EncoderAttention(InferenceOnly, MultiHeadAttention):
    """Bidirectional self-attention: every token sees every token of its sequence; queries and
    keys rotated by ``rope`` when the model has rotary positions. Store layout: Loom's Wq, Wk, Wv,
    Wo, bq, bk, bv, bo (zeros where the model has no bias)."""

    def __init__(self, n_heads: int, weights: dict[str, Matrix], rope: Rope | None = None):
        d = weights["wq"].shape[1]
        head_dim = weights["wq"].shape[0] // n_heads
        cfg = LayerConfig(type="MultiHeadAttention", d_model=d, num_heads=n_heads, num_kv_heads=n_heads,
                          head_dim=head_dim, query_dim=n_heads * head_dim)
        super().__init__(cfg, MatrixStore(weights))
        self.rope = rope

    def forward(self, x, ctx, skip=None):
        w, st = self.weights.current(self.cfg.dtype), self.weights
        H, hd = self.cfg.num_heads, self.cfg.head_dim
        x3 = x.reshape(-1, *x.shape[-2:])
        B, T, _ = x3.shape
        q, k, v = (plus_bias(y, st, w, b).reshape(B, T, H, hd)
                   for y, b in zip(linears(x3, (w["wq"], w["wk"], w["wv"])), ("bq", "bk", "bv"), strict=True))
        if self.rope is not None:
            q, k = self.rope((0,) * B, T, q, k)
        q, k, v = (t.transpose(0, 2, 1, 3) for t in (q, k, v))
        scores = (q @ k.transpose(0, 1, 3, 2)) * np.float32(hd ** -0.5)  # [B, H, T, T]
        e = np.exp(scores - scores.max(axis=-1, keepdims=True))
        out = (e / e.sum(axis=-1, keepdims=True)) @ v  # [B, H, T, hd]
        y = plus_bias(linear(out.transpose(0, 2, 1, 3).reshape(B, T, H * hd), w["wo"]), st, w, "bo")
        return y.reshape(x.shape), None


class BiasedDense(InferenceOnly, Dense):
    """``act(x @ W.T + b)``: one matrix of BERT's MLP (``act`` a key of :data:`ACTIVATIONS`, or
    None for none). Store layout: Loom's W, then the bias."""

    def __init__(self, weight: Matrix, bias: np.ndarray, act: str | None = None):
        n_out, n_in = weight.shape
        cfg = LayerConfig(type="Dense", input_height=n_in, output_height=n_out,
                          activation="GELU" if act and act.startswith("gelu") else "Linear")
        super().__init__(cfg, MatrixStore({"weight": weight, "bias": np.asarray(bias, np.float32)}))
        self.act = ACTIVATIONS[act] if act else None

    def forward(self, x, ctx, skip=None):
        w = self.weights.current(self.cfg.dtype)
        y = plus_bias(linear(x, w["weight"]), self.weights, w, "bias")
        return (y if self.act is None else self.act(y)), None
