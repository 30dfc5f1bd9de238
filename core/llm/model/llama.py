"""Llama (SmolLM2, TinyLlama, Llama 3), Mistral and Mixtral: pre-norm blocks, GQA, RoPE, SwiGLU
(Mixtral: a mixture of experts, see :mod:`.moe`).

GGUF stores llama's Q/K rows permuted (llama.cpp rotates adjacent pairs), so a GGUF model rotates
interleaved pairs, which gives transformers' half-split numbers on the original rows. Mistral is
llama with an optional sliding window over every layer. A Mixtral GGUF is a ``llama`` one with
expert settings and stacked expert tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .causal_lm import CausalLM
from .layer_builders import GGUF_BLOCK_NAMES, build_decoder
from .llm_layers import Matrix
from .model_args import SLIDING, ModelArgs, Settings
from .moe import GGUF_NAMES, MIXTRAL, MoESpec, feed_forward, gguf_moe, hf_moe, sanitize

__all__ = ["Args", "GGUF_BLOCK_NAMES", "build", "sanitize"]

GGUF_BLOCK_NAMES = {**GGUF_BLOCK_NAMES, **GGUF_NAMES[MIXTRAL]}


@dataclass
class Args(ModelArgs):
    moe: MoESpec | None = None

    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        return {**super().gguf_fields(s, arch), "rope_interleaved": True, "moe": gguf_moe(s, arch)}

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        f = super().hf_fields(s, config)
        if f["sliding_window"] and not f["layer_types"]:  # mistral: one window for every layer
            f["layer_types"] = (SLIDING,) * f["num_layers"]
        return {**f, "moe": hf_moe(s, config)}


def build(args: Args, weights: dict[str, Matrix]) -> CausalLM:
    return build_decoder(args, weights, feed_forward)
