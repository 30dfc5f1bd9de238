"""Llama (SmolLM2, TinyLlama, Llama 3) and Mistral: pre-norm blocks, GQA, RoPE, SwiGLU.

GGUF stores llama's Q/K rows permuted (llama.cpp rotates adjacent pairs), so a GGUF model rotates
interleaved pairs, which gives transformers' half-split numbers on the original rows. Mistral is
llama with an optional sliding window over every layer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .layer_builders import GGUF_BLOCK_NAMES, build_decoder
from .model_args import SLIDING, ModelArgs, Settings

__all__ = ["Args", "GGUF_BLOCK_NAMES", "build"]


@dataclass
class Args(ModelArgs):
    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        return {**super().gguf_fields(s, arch), "rope_interleaved": True}

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        f = super().hf_fields(s, config)
        if f["sliding_window"] and not f["layer_types"]:  # mistral: one window for every layer
            f["layer_types"] = (SLIDING,) * f["num_layers"]
        return f


build = build_decoder
