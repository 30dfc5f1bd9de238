"""Qwen2, Qwen3 and Qwen3-MoE: the llama block with biases on Q/K/V (qwen2) or RMSNorm on each
Q/K head (qwen3, qwen3moe); qwen3moe's feed-forward is a mixture of experts (see :mod:`.moe`).

Their GGUF Q/K rows are in transformers' order (llama.cpp's NEOX rotation), so RoPE is half-split
for either source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .causal_lm import CausalLM
from .layer_builders import GGUF_BLOCK_NAMES, build_decoder
from .llm_layers import Matrix
from .model_args import ModelArgs, Settings
from .moe import GGUF_NAMES, QWEN3_MOE, MoESpec, feed_forward, gguf_moe, hf_moe, sanitize

__all__ = ["Args", "GGUF_BLOCK_NAMES", "build", "sanitize"]

GGUF_BLOCK_NAMES = {**GGUF_BLOCK_NAMES, **GGUF_NAMES[QWEN3_MOE]}
QK_NORM = ("qwen3", "qwen3moe", "qwen3_moe")


@dataclass
class Args(ModelArgs):
    moe: MoESpec | None = None

    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        return {**super().gguf_fields(s, arch), **_variant(arch), "moe": gguf_moe(s, arch)}

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        return {**super().hf_fields(s, config), **_variant(config["model_type"]), "moe": hf_moe(s, config)}


def _variant(arch: str) -> dict[str, Any]:
    return {"qk_norm": True} if arch in QK_NORM else {"attention_biases": ("q", "k", "v")}


def build(args: Args, weights: dict[str, Matrix]) -> CausalLM:
    return build_decoder(args, weights, feed_forward)
