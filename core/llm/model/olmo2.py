"""OLMo 2: norms after the attention and MLP outputs and none before them (``h = x +
norm(attn(x))``, ``y = h + norm(mlp(h))``), Q and K each RMS-normed as one vector over all their
heads (not head by head as qwen3's), SwiGLU, and half-split RoPE from either source (llama.cpp's
converter leaves OLMo 2's Q/K rows in transformers' order).

llama.cpp also reads OLMo 3 files as "olmo2", with sliding-window layers and their own RoPE
settings; those are refused here, naming the window's key.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...errors import ModelFormatError
from .causal_lm import CausalLM
from .layer_builders import (
    GGUF_BLOCK_NAMES,
    assemble_causal_lm,
    attention_layer,
    decoder_block,
    mlp_layer,
    norm_layer,
    standard_rope,
)
from .llm_layers import Matrix
from .model_args import ModelArgs, Settings

__all__ = ["Args", "GGUF_BLOCK_NAMES", "build"]

GGUF_BLOCK_NAMES = {**{k: v for k, v in GGUF_BLOCK_NAMES.items() if k not in ("attn_norm", "ffn_norm")},
                    "post_attention_norm": "post_attention_layernorm",
                    "post_ffw_norm": "post_feedforward_layernorm"}


@dataclass
class Args(ModelArgs):
    qk_norm: bool = True

    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        if s.get("attention.sliding_window", int, 0):
            raise ModelFormatError(s.field("attention.sliding_window"),
                                   "sliding-window layers (OLMo 3) are not supported")
        return super().gguf_fields(s, arch)


def build(args: Args, weights: dict[str, Matrix]) -> CausalLM:
    rope = standard_rope(args, weights)
    blocks = []
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        blocks.append(decoder_block(
            [attention_layer(args, weights, i, rope, window=args.layer_window(i), whole_qk_norm=True),
             norm_layer(args, weights, p + "post_attention_layernorm.weight")],
            [mlp_layer(args, weights, i),
             norm_layer(args, weights, p + "post_feedforward_layernorm.weight")]))
    return assemble_causal_lm(args, weights, blocks)
