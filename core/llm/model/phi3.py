"""Phi-3: the llama decoder with Q, K and V in one matrix (``qkv_proj``, GGUF ``attn_qkv``) and
the MLP's gate and up in one (``gate_up_proj``, GGUF ``ffn_up``; gate rows first).

:func:`sanitize` splits them into the llama layout, each part the file's own rows (a quantized
matrix's rows are a byte range: ``QuantMatrix.row_range``, nothing dequantized), so the rest is
the llama decoder and every fast kernel applies. GGUF's Q/K rows are in transformers' order
(llama.cpp's NEOX rotation), so RoPE is half-split from either source. A sliding window is read
as each reference runs it: over every layer from config.json (transformers), not at all from GGUF
(llama.cpp turns phi3's off).

Refused, naming the setting or tensor: "longrope" scaling (Phi-3 128k's per-frequency factors,
chosen by the sequence's length, with rescaled cos/sin) and a partial rotary factor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ModelFormatError
from . import llama
from .layer_builders import GGUF_BLOCK_NAMES, build_decoder, require
from .llm_layers import Matrix
from .model_args import Settings

__all__ = ["Args", "GGUF_BLOCK_NAMES", "build", "sanitize"]

GGUF_BLOCK_NAMES = {**GGUF_BLOCK_NAMES, "attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
LONGROPE_TENSORS = ("rope_factors_long.weight", "rope_factors_short.weight")  # GGUF's longrope factors


@dataclass
class Args(llama.Args):
    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        return {**super().gguf_fields(s, arch), "rope_interleaved": False}

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        params = config.get("rope_parameters")
        places = [s]  # transformers 4 keeps the factor at the top, 5 in rope_parameters
        if isinstance(params, dict):
            places.insert(0, Settings(params, label="config.json:rope_parameters."))
        for where in places:
            factor = where.positive("partial_rotary_factor", 1.0)
            if factor != 1.0:
                raise ModelFormatError(where.field("partial_rotary_factor"),
                                       f"{factor}: RoPE over part of each head is not supported")
        return super().hf_fields(s, config)


def sanitize(weights: dict[str, Matrix], args: Args) -> dict[str, Matrix]:
    """The fused matrices split into transformers' llama names (a GGUF file may hold Q, K and V
    apart already, which llama.cpp reads as well)."""
    for name in LONGROPE_TENSORS:
        if name in weights:
            raise ModelFormatError(name, "longrope RoPE scaling (Phi-3 128k's frequency factors) is not "
                                         "supported")
    q, kv = args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    d, f = args.hidden_size, args.intermediate_size
    for i in range(args.num_layers):
        attn, mlp = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        _split(weights, attn + "qkv_proj.weight", d,
               {attn + "q_proj.weight": q, attn + "k_proj.weight": kv, attn + "v_proj.weight": kv})
        _split(weights, mlp + "gate_up_proj.weight", d,
               {mlp + "gate_proj.weight": f, mlp + "up_proj.weight": f})
    return weights


def _split(weights: dict[str, Matrix], name: str, cols: int, parts: dict[str, int]) -> None:
    """``weights[name]`` replaced by its consecutive row ranges ``parts`` (name -> rows)."""
    if name not in weights and all(part in weights for part in parts):
        return
    fused = require(weights, name, (sum(parts.values()), cols))
    del weights[name]
    at = 0
    for part, rows in parts.items():
        is_array = isinstance(fused, np.ndarray)
        weights[part] = fused[at:at + rows] if is_array else fused.row_range(at, at + rows)
        at += rows


build = build_decoder
