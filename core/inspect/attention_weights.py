"""Attention as explicit weights: the softmax over positions that each head of an
:class:`~loomlab.core.llm.model.llm_layers.LLMAttention` computes, and the heads' mix of values.

The model's own kernels never form the ``[T, T]`` weights (they stream over keys); inspection
needs them, so this is the same computation written out in the order transformers' eager
attention uses: scores scaled, soft-capped (gemma2), masked to the causal window, softmaxed in
float32. Written over the arrays' own namespace, so a model placed on a device computes there.
"""

from __future__ import annotations

from ..backend import array_module
from ..llm.model.llm_layers import LLMAttention


def attention_weights(layer: LLMAttention, q, k):
    """Weights ``[B, heads, T, T]`` of queries ``q[B, T, heads, hd]`` over keys ``k[B, T, kv_heads,
    hd]`` (:meth:`LLMAttention.queries_keys_values` of fresh sequences); head ``h`` reads key head
    ``h // (heads / kv_heads)``, as grouped-query attention shares them."""
    xp = array_module(q)
    spec = layer.spec
    B, T, H, hd = q.shape
    kv = k.shape[2]
    qg = xp.reshape(xp.permute_dims(q, (0, 2, 1, 3)), (B, kv, H // kv, T, hd))
    kt = xp.reshape(xp.permute_dims(k, (0, 2, 3, 1)), (B, kv, 1, hd, T))
    scores = xp.reshape(xp.matmul(qg, kt), (B, H, T, T)) * float(layer.score_scale)
    if spec.softcap is not None:
        scores = xp.tanh(scores / float(spec.softcap)) * float(spec.softcap)
    query = xp.reshape(xp.arange(T), (T, 1))
    key = xp.reshape(xp.arange(T), (1, T))
    seen = key <= query
    if spec.window is not None:
        seen = xp.logical_and(seen, query - key < spec.window)
    scores = xp.where(seen, scores, xp.full_like(scores, -xp.inf))
    scores = scores - xp.max(scores, axis=-1, keepdims=True)
    e = xp.exp(scores)
    return e / xp.sum(e, axis=-1, keepdims=True)


def mix_values(weights, v):
    """Each head's weighted sum of values: ``z[B, T, heads, hd]`` from weights ``[B, heads, T, T]``
    and values ``v[B, T, kv_heads, hd]`` (the input of the output projection, head by head)."""
    xp = array_module(weights)
    B, H, T, _ = weights.shape
    kv, hd = v.shape[2], v.shape[3]
    wg = xp.reshape(weights, (B, kv, H // kv, T, T))
    vg = xp.reshape(xp.permute_dims(v, (0, 2, 1, 3)), (B, kv, 1, T, hd))
    z = xp.reshape(xp.matmul(wg, vg), (B, H, T, hd))
    return xp.permute_dims(z, (0, 2, 1, 3))
