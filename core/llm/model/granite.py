"""Granite (IBM Granite 3): the llama decoder with four multipliers — the embeddings times
``embedding_multiplier``, each block's attention and MLP outputs times ``residual_multiplier``
before their residual adds, ``attention_multiplier`` as the score scale and the logits divided
by ``logits_scaling``.

GGUF keeps them as ``granite.embedding_scale``, ``granite.residual_scale``,
``granite.attention.scale`` and ``granite.logit_scale``; llama.cpp reads an absent or zero one as
no scaling (the score scale then head_dim ** -0.5) and requires the logit scale. Its converter
permutes Q/K rows as llama's, so a GGUF model rotates interleaved pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import llama
from .causal_lm import CausalLM
from .layer_builders import GGUF_BLOCK_NAMES, assemble_causal_lm, llama_block, standard_rope
from .llm_layers import Matrix
from .model_args import Settings

__all__ = ["Args", "GGUF_BLOCK_NAMES", "build"]


@dataclass
class Args(llama.Args):
    embedding_scale: float = 1.0
    residual_scale: float = 1.0
    attention_scale: float | None = None  # None: head_dim ** -0.5
    logit_scale: float = 1.0

    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        return {**super().gguf_fields(s, arch), "embedding_scale": _gguf_scale(s, "embedding_scale", 1.0),
                "residual_scale": _gguf_scale(s, "residual_scale", 1.0),
                "attention_scale": _gguf_scale(s, "attention.scale", None),
                "logit_scale": s.positive("logit_scale")}

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        return {**super().hf_fields(s, config), "embedding_scale": s.positive("embedding_multiplier", 1.0),
                "residual_scale": s.positive("residual_multiplier", 1.0),
                "attention_scale": s.positive("attention_multiplier", 1.0),
                "logit_scale": s.positive("logits_scaling", 1.0)}


def _gguf_scale(s: Settings, key: str, default: float | None) -> float | None:
    """A multiplier as llama.cpp reads it: absent or 0 is ``default``, anything else positive."""
    return default if s.get(key, float, 0.0) == 0 else s.positive(key)


def build(args: Args, weights: dict[str, Matrix]) -> CausalLM:
    rope = standard_rope(args, weights)
    blocks = [llama_block(args, weights, i, rope, scale=args.attention_scale,
                          output_scale=args.residual_scale) for i in range(args.num_layers)]
    return assemble_causal_lm(args, weights, blocks, embed_scale=args.embedding_scale,
                              logit_divisor=args.logit_scale)
