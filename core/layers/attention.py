"""MultiHeadAttention: causal self-attention with half-split RoPE, GQA/MQA and a stateful KV cache
(spec §5.4.4, parameter layout §3.5).

Loom keeps the K/V cache and the position counter inside the layer between calls: a call starts
a new sequence unless it feeds one token (``[1,1,d]``) to a non-empty cache, which continues the
sequence (incremental decode). Batch items share that one cache and counter, so the ``B*S`` input
rows form a single causal sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..backend import widest_float
from ..errors import LoomFormatError, LoomShapeError
from .base import Layer, LayerConfig, register, rows_to_input

DEFAULT_MAX_POSITIONS = 512  # Loom's cache capacity (it wraps silently beyond; we raise)
DEFAULT_ROPE_BASE = 10000.0


@dataclass(frozen=True)
class AttentionDims:
    """The layer's dimensions with Loom's defaults applied (spec §2.3/§2.4)."""

    d_model: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    query_dim: int
    rope_base: float

    @classmethod
    def from_cfg(cls, cfg: LayerConfig) -> AttentionDims:
        heads = cfg.num_heads
        head_dim = cfg.head_dim or (cfg.d_model // heads if heads > 0 else 0)
        return cls(cfg.d_model, heads, cfg.num_kv_heads or heads, head_dim,
                   cfg.query_dim or cfg.d_model,
                   cfg.rope_freq_base if cfg.rope_freq_base > 0 else DEFAULT_ROPE_BASE)

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim or self.d_model

    @property
    def group(self) -> int:
        """Query heads per KV head: query head ``h`` reads KV head ``h // group``."""
        return self.num_heads // self.num_kv_heads

    def block_sizes(self) -> tuple[int, ...]:
        """Sizes of Wq, Wk, Wv, Wo, bq, bk, bv, bo in the flat vector, in that order."""
        d, q, kv = self.d_model, self.query_dim, self.kv_dim
        return (q * d, kv * d, kv * d, d * q, q, kv, kv, d)


class KVCache:
    """RoPE-rotated keys and values of the positions seen so far, ``[positions, kv_heads, head_dim]``.

    Storage grows by doubling; ``reset`` drops it, so views handed out earlier stay valid.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.keys = self.values = None
        self.offset = 0

    def update_and_fetch(self, k, v, xp):
        """Append ``k``/``v`` rows; return the keys and values of every position so far."""
        end = self.offset + k.shape[0]
        if self.keys is None or end > self.keys.shape[0] or self.keys.dtype != k.dtype:
            self._grow(max(end, 2 * self.offset), k, xp)
        self.keys[self.offset:end, ...] = k
        self.values[self.offset:end, ...] = v
        self.offset = end
        return self.keys[:end, ...], self.values[:end, ...]

    def _grow(self, capacity: int, like, xp) -> None:
        keys = xp.zeros((capacity, *like.shape[1:]), dtype=like.dtype)
        values = xp.zeros_like(keys)
        if self.offset:
            keys[: self.offset, ...] = self.keys[: self.offset, ...]
            values[: self.offset, ...] = self.values[: self.offset, ...]
        self.keys, self.values = keys, values


def rope(v, positions, base: float, xp, inverse: bool = False):
    """Half-split (rotate-half) RoPE of ``v[N, heads, hd]`` at ``positions[N]``.

    Pair ``(v[j], v[j+hd//2])`` turns by ``p / base^(2j/hd)``; an odd last component stays.
    ``inverse`` turns the other way, which is also the gradient of the rotation.
    """
    hd = v.shape[-1]
    half = hd // 2
    wide = widest_float(xp, positions.device)  # angles of far positions lose turns in float32
    exponents = xp.arange(half, dtype=wide) * 2 / hd
    angle = xp.astype(positions, wide)[:, None, None] / base ** exponents
    cos, sin = xp.astype(xp.cos(angle), v.dtype), xp.astype(xp.sin(angle), v.dtype)
    if inverse:
        sin = -sin
    a, b = v[..., :half], v[..., half:2 * half]
    return xp.concat([a * cos - b * sin, a * sin + b * cos, v[..., 2 * half:]], axis=-1)


@register
class MultiHeadAttention(Layer):
    type_name = "MultiHeadAttention"
    weighted = True

    def __init__(self, cfg: LayerConfig, weights=None, children=None):
        super().__init__(cfg, weights, children)
        self.max_positions = DEFAULT_MAX_POSITIONS
        self.kv_cache = KVCache()

    @property
    def dims(self) -> AttentionDims:
        return AttentionDims.from_cfg(self.cfg)

    @staticmethod
    def param_count(cfg: LayerConfig) -> int:
        return sum(AttentionDims.from_cfg(cfg).block_sizes())

    def check(self, path: str) -> None:
        cfg, dm = self.cfg, self.dims
        if cfg.d_model <= 0 or cfg.num_heads <= 0:
            raise LoomFormatError(path, "MultiHeadAttention needs d_model > 0 and num_heads > 0")
        if min(cfg.num_kv_heads, cfg.head_dim, cfg.query_dim) < 0:
            raise LoomFormatError(path, "num_kv_heads, head_dim and query_dim must not be negative")
        if dm.d_model % dm.num_heads:
            raise LoomFormatError(path, f"d_model {dm.d_model} is not divisible by num_heads {dm.num_heads}")
        if dm.num_heads % dm.num_kv_heads:
            raise LoomFormatError(path, f"num_heads {dm.num_heads} is not divisible by "
                                        f"num_kv_heads {dm.num_kv_heads}")
        if dm.num_heads * dm.head_dim != dm.query_dim:
            raise LoomFormatError(path, f"num_heads*head_dim = {dm.num_heads * dm.head_dim} differs "
                                        f"from query_dim {dm.query_dim}")

    def describe_shapes(self):
        return [self.cfg.d_model], [self.cfg.d_model]

    def reset_state(self) -> None:
        self.kv_cache.reset()

    # ----- forward -----------------------------------------------------------------
    def _rows(self, x, xp):
        """Input rows ``[N, d]`` (all batch items in order) and the output shape (spec §5.4.4)."""
        d = self.cfg.d_model
        if x.ndim >= 1 and x.shape[-1] == d:
            rows, out_shape = xp.reshape(x, (-1, d)), (*x.shape[:-1], d)
        else:  # Loom's legacy layouts: the sequence length comes from the config
            batch = x.shape[0] if x.ndim == 3 else 1
            seq = self.cfg.seq_length if self.cfg.seq_length > 0 else x.size // max(batch * d, 1)
            if batch * seq * d > x.size:
                raise LoomShapeError(f"MultiHeadAttention: input of shape {tuple(x.shape)} holds fewer "
                                     f"than {batch}x{seq}x{d} values")
            rows = xp.reshape(xp.reshape(x, (-1,))[: batch * seq * d], (batch * seq, d))
            out_shape = (batch, seq, d) if x.ndim == 3 else (seq, d)
        if rows.shape[0] == 0:
            raise LoomShapeError(f"MultiHeadAttention: input of shape {tuple(x.shape)} has no rows")
        return rows, out_shape

    def _start(self, n: int) -> int:
        """First position of this call's rows (Loom's reset rule), checked against the capacity."""
        start = self.kv_cache.offset if n == 1 else 0
        if start + n > self.max_positions:
            raise LoomShapeError(f"MultiHeadAttention: {start + n} positions exceed max_positions "
                                 f"{self.max_positions} (Loom would wrap its cache silently)")
        if start == 0:
            self.kv_cache.reset()
        return start

    def _blocks(self, xp, dtype):
        dm = self.dims
        flat = self.params(xp, dtype)
        blocks, at = [], 0
        for size in dm.block_sizes():
            blocks.append(flat[at:at + size])
            at += size
        wq, wk, wv, wo, bq, bk, bv, bo = blocks
        d, q, kv = dm.d_model, dm.query_dim, dm.kv_dim
        return (xp.reshape(wq, (q, d)), xp.reshape(wk, (kv, d)), xp.reshape(wv, (kv, d)),
                xp.reshape(wo, (d, q)), bq, bk, bv, bo)

    def forward(self, x, ctx, skip=None):
        xp, dm = ctx.xp, self.dims
        rows, out_shape = self._rows(x, xp)
        n = rows.shape[0]
        start = self._start(n)
        wq, wk, wv, wo, bq, bk, bv, bo = self._blocks(xp, x.dtype)
        positions = xp.arange(start, start + n)
        heads = (n, dm.num_heads, dm.head_dim)
        kv_heads = (n, dm.num_kv_heads, dm.head_dim)
        q = rope(xp.reshape(rows @ wq.T + bq, heads), positions, dm.rope_base, xp)
        k = rope(xp.reshape(rows @ wk.T + bk, kv_heads), positions, dm.rope_base, xp)
        v = xp.reshape(rows @ wv.T + bv, kv_heads)
        keys, values = self.kv_cache.update_and_fetch(k, v, xp)
        att, probs = self._attend(q, keys, values, positions, xp)
        y = att @ wo.T + bo
        cache = (rows, x.shape, start, positions, q, keys, values, probs, att) if ctx.train else None
        return xp.reshape(y, out_shape), cache

    def _grouped(self, t, xp):
        """``[N, H, hd]`` -> ``[Hkv, g, N, hd]``: one matmul per KV head serves its query heads."""
        dm = self.dims
        t = xp.reshape(t, (t.shape[0], dm.num_kv_heads, dm.group, dm.head_dim))
        return xp.permute_dims(t, (1, 2, 0, 3))

    def _attend(self, q, keys, values, positions, xp):
        """Causal scaled dot-product attention; returns ``att[N, H*hd]`` and ``probs[Hkv, g, N, T]``."""
        dm = self.dims
        kt = xp.permute_dims(keys, (1, 2, 0))[:, None, ...]  # [Hkv, 1, hd, T]
        scores = (self._grouped(q, xp) @ kt) * (1.0 / math.sqrt(dm.head_dim))
        causal = xp.arange(keys.shape[0])[None, :] <= positions[:, None]
        scores = xp.where(causal, scores, -xp.inf)
        e = xp.exp(scores - xp.max(scores, axis=-1, keepdims=True))
        probs = e / xp.sum(e, axis=-1, keepdims=True)
        att = probs @ xp.permute_dims(values, (1, 0, 2))[:, None, ...]  # [Hkv, g, N, hd]
        return xp.reshape(xp.permute_dims(att, (2, 0, 1, 3)), (q.shape[0], -1)), probs

    # ----- backward ----------------------------------------------------------------
    def backward(self, cache, gy, ctx):
        # A decode call attended to K/V rows written by earlier calls; those rows are treated as
        # constants (their gradients would belong to calls whose backward has already run).
        rows, x_shape, start, positions, q, keys, values, probs, att = cache
        xp, dm = ctx.xp, self.dims
        wq, wk, wv, wo, *_ = self._blocks(xp, rows.dtype)
        gy = xp.reshape(gy, (rows.shape[0], dm.d_model))
        g_att = self._grouped(xp.reshape(gy @ wo, q.shape), xp)  # [Hkv, g, N, hd]
        g_probs = g_att @ xp.permute_dims(values, (1, 2, 0))[:, None, ...]  # [Hkv, g, N, T]
        g_scores = probs * (g_probs - xp.sum(g_probs * probs, axis=-1, keepdims=True))
        g_scores *= 1.0 / math.sqrt(dm.head_dim)
        g_q = xp.permute_dims(g_scores @ xp.permute_dims(keys, (1, 0, 2))[:, None, ...], (2, 0, 1, 3))
        g_keys = xp.sum(xp.matrix_transpose(g_scores) @ self._grouped(q, xp), axis=1)  # [Hkv, T, hd]
        g_values = xp.sum(xp.matrix_transpose(probs) @ g_att, axis=1)
        n = rows.shape[0]
        g_q = rope(xp.reshape(g_q, (n, -1, dm.head_dim)), positions, dm.rope_base, xp, inverse=True)
        g_k = rope(xp.permute_dims(g_keys[:, start:, :], (1, 0, 2)), positions, dm.rope_base, xp,
                   inverse=True)
        g_v = xp.permute_dims(g_values[:, start:, :], (1, 0, 2))
        g_q, g_k, g_v = (xp.reshape(g, (n, -1)) for g in (g_q, g_k, g_v))
        flat = [g_q.T @ rows, g_k.T @ rows, g_v.T @ rows, gy.T @ att]
        self.add_grad(xp.concat([xp.reshape(g, (-1,)) for g in flat]
                                + [xp.sum(g, axis=0) for g in (g_q, g_k, g_v, gy)]))
        return rows_to_input(g_q @ wq + g_k @ wk + g_v @ wv, x_shape, ctx.xp)
