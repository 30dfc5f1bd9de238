"""Qwen2 and Qwen3: the llama block with biases on Q/K/V (qwen2) or RMSNorm on each Q/K head (qwen3).

Their GGUF Q/K rows are in transformers' order (llama.cpp's NEOX rotation), so RoPE is half-split
for either source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layer_builders import GGUF_BLOCK_NAMES, build_decoder
from .model_args import ModelArgs, Settings

__all__ = ["Args", "GGUF_BLOCK_NAMES", "build"]


@dataclass
class Args(ModelArgs):
    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        return {**super().gguf_fields(s, arch), **_variant(arch)}

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        return {**super().hf_fields(s, config), **_variant(config["model_type"])}


def _variant(arch: str) -> dict[str, Any]:
    return {"qk_norm": True} if arch == "qwen3" else {"attention_biases": ("q", "k", "v")}


build = build_decoder
