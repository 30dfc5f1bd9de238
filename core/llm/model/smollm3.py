"""SmolLM3: the llama decoder with some layers that use no RoPE ("NoPE").

config.json names them in ``no_rope_layers`` (1: the layer rotates Q/K, 0: it does not) or by
``no_rope_layer_interval`` (every n-th layer has none, default 4), as transformers reads them; a
GGUF file has no key for them and llama.cpp fixes the interval at 4 (:data:`GGUF_NO_ROPE_STEP`).
A layer without RoPE gets a :class:`~.rope.Rope` whose frequencies are all zero: cos 1 and sin 0
give back every value bit for bit (``x * 1 - y * 0 = x``), so the layer is an ordinary attention
layer to the grid and the compiled decode step alike. Its converter permutes Q/K rows as llama's,
so a GGUF model rotates interleaved pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ModelFormatError
from . import llama
from .causal_lm import CausalLM
from .layer_builders import GGUF_BLOCK_NAMES, assemble_causal_lm, llama_block, standard_rope
from .llm_layers import Matrix
from .model_args import Settings
from .rope import Rope

__all__ = ["Args", "GGUF_BLOCK_NAMES", "build"]

GGUF_NO_ROPE_STEP = 4  # llama.cpp's hparams.n_no_rope_layer_step for smollm3 (no GGUF key)


@dataclass
class Args(llama.Args):
    rope_layers: tuple[bool, ...] = ()  # per layer: whether it rotates Q/K

    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        f = super().gguf_fields(s, arch)
        return {**f, "rope_layers": _every(f["num_layers"], GGUF_NO_ROPE_STEP)}

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        f = super().hf_fields(s, config)
        n = f["num_layers"]
        flags = s.sequence("no_rope_layers")
        if not flags:
            return {**f, "rope_layers": _every(n, s.count("no_rope_layer_interval", GGUF_NO_ROPE_STEP))}
        if len(flags) != n or any(type(flag) is not int or flag not in (0, 1) for flag in flags):
            raise ModelFormatError(s.field("no_rope_layers"), f"expected {n} entries of 0 (no RoPE) or 1")
        return {**f, "rope_layers": tuple(flag == 1 for flag in flags)}


def _every(n_layers: int, step: int) -> tuple[bool, ...]:
    """Layers step-1, 2 step-1 ... without RoPE, the others with it."""
    return tuple((i + 1) % step != 0 for i in range(n_layers))


def build(args: Args, weights: dict[str, Matrix]) -> CausalLM:
    rope = standard_rope(args, weights)
    still = Rope(np.zeros_like(rope.inv_freq), rope.interleaved)  # cos 1, sin 0: the identity
    blocks = [llama_block(args, weights, i, rope if not args.rope_layers or args.rope_layers[i] else still)
              for i in range(args.num_layers)]
    return assemble_causal_lm(args, weights, blocks)
