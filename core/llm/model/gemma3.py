"""Gemma 3 (text): pre- and post-norms around attention and MLP, QK-norm, a tanh-GELU gate,
embeddings scaled by sqrt(d), and sliding-window layers with their own RoPE base (every
``pattern``-th layer attends globally).

transformers stores each norm's gamma as ``w`` and multiplies by ``1 + w``; GGUF files store
``1 + w`` already (llama.cpp's converter adds it), so :func:`sanitize` adds 1 for HF weights only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .causal_lm import CausalLM
from .layer_builders import (
    GGUF_BLOCK_NAMES,
    assemble_causal_lm,
    attention_layer,
    decoder_block,
    mlp_layer,
    norm_layer,
)
from .llm_layers import Matrix
from .model_args import FULL, ROPE_BASE_ABOVE, SLIDING, ModelArgs, Settings, hf_rope
from .rope import Rope, RopeConfig

GGUF_BLOCK_NAMES = {**GGUF_BLOCK_NAMES, "ffn_norm": "pre_feedforward_layernorm",
                    "post_attention_norm": "post_attention_layernorm",
                    "post_ffw_norm": "post_feedforward_layernorm"}

DEFAULT_PATTERN = 6  # llama.cpp and transformers: layers 5, 11, 17 ... are global
LOCAL_ROPE_BASE = 10000.0


@dataclass
class Args(ModelArgs):
    qk_norm: bool = True
    local_rope: RopeConfig = field(default_factory=lambda: RopeConfig(LOCAL_ROPE_BASE))
    query_scale: float | None = None  # query_pre_attn_scalar ** -0.5; None: head_dim ** -0.5
    norm_shift: float = 0.0  # added to every stored norm gamma
    attn_softcap: float | None = None  # attention scores soft-capped (gemma2); None: uncapped
    final_softcap: float | None = None  # the logits soft-capped (gemma2); None: uncapped
    TIE_DEFAULT: ClassVar[bool] = True
    PATTERN: ClassVar[int] = DEFAULT_PATTERN  # every PATTERN-th layer global when no layer says

    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        f = super().gguf_fields(s, arch)
        flags = s.raw("attention.sliding_window_pattern")  # a period, or one "sliding?" flag per layer
        if isinstance(flags, np.ndarray) and flags.dtype == np.bool_:
            types = tuple(SLIDING if flag else FULL for flag in flags)
        else:
            types = _pattern(f["num_layers"], s.count("attention.sliding_window_pattern", cls.PATTERN))
        return {**f, "sliding_window": s.count("attention.sliding_window", 4096, 1 << 24),
                "layer_types": types,
                "local_rope": RopeConfig(s.positive("rope.freq_base_swa", LOCAL_ROPE_BASE, ROPE_BASE_ABOVE))}

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        f = super().hf_fields(s, config)
        if not f["layer_types"]:
            key = next((k for k in ("sliding_window_pattern", "_sliding_window_pattern") if k in config),
                       "sliding_window_pattern")
            f["layer_types"] = _pattern(f["num_layers"], s.count(key, cls.PATTERN))
        local = s.positive("rope_local_base_freq", None, ROPE_BASE_ABOVE)  # transformers 4 configs
        return {**f, "sliding_window": s.count("sliding_window", 4096, 1 << 24),
                "local_rope": RopeConfig(local) if local else hf_rope(config, SLIDING),
                "query_scale": s.positive("query_pre_attn_scalar", 256.0) ** -0.5, "norm_shift": 1.0}


def _pattern(n_layers: int, pattern: int) -> tuple[str, ...]:
    return tuple(FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n_layers))


def sanitize(weights: dict[str, Matrix], args: Args) -> dict[str, Matrix]:
    """Norm gammas as the multiplier itself (``1 + w`` for transformers checkpoints)."""
    if not args.norm_shift:
        return weights
    shift = np.float32(args.norm_shift)
    for name, w in weights.items():
        if name.endswith("norm.weight"):
            weights[name] = np.asarray(w, np.float32) + shift
    return weights


def build(args: Args, weights: dict[str, Matrix]) -> CausalLM:
    ropes = {FULL: Rope(args.rope.inv_freq(args.head_dim)),
             SLIDING: Rope(args.local_rope.inv_freq(args.head_dim))}
    blocks = []
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        window = args.layer_window(i)
        attention = attention_layer(args, weights, i, ropes[SLIDING if window else FULL], window=window,
                                    scale=args.query_scale, softcap=args.attn_softcap)
        blocks.append(decoder_block(
            [norm_layer(args, weights, p + "input_layernorm.weight"), attention,
             norm_layer(args, weights, p + "post_attention_layernorm.weight")],
            [norm_layer(args, weights, p + "pre_feedforward_layernorm.weight"),
             mlp_layer(args, weights, i, "GELU"),
             norm_layer(args, weights, p + "post_feedforward_layernorm.weight")]))
    # transformers keeps sqrt(d) as a float32 tensor: the scale is rounded to float32
    embed_scale = float(np.float32(math.sqrt(args.hidden_size)))
    return assemble_causal_lm(args, weights, blocks, embed_scale=embed_scale,
                              logit_softcap=args.final_softcap)
