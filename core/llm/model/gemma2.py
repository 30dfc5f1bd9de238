"""Gemma 2: :mod:`.gemma3`'s blocks (a norm before and after attention and MLP, tanh-GELU gate,
embeddings scaled by sqrt(d), norms stored as ``1 + w`` in GGUF) without Q/K norms, with
soft-capping (``tanh(s / c) * c``) of the attention scores and of the final logits, one RoPE for
every layer, and a sliding window on layers 0, 2, 4 ... (every second layer global).

GGUF files hold no query scale and may leave the caps out: llama.cpp then takes caps of 50 and 30
(transformers' defaults too), the score scale ``head_dim ** -0.5`` except for the 46-block (27B)
model, whose ``query_pre_attn_scalar`` is ``hidden_size / heads``, and the embedding table as the
output matrix.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

from . import gemma3
from .gemma3 import GGUF_BLOCK_NAMES, build, sanitize
from .model_args import ROPE_BASE_ABOVE, Settings

__all__ = ["Args", "GGUF_BLOCK_NAMES", "build", "sanitize"]

ATTN_CAP, FINAL_CAP = 50.0, 30.0  # the caps transformers and llama.cpp take when a file names none
BLOCKS_27B = 46  # llama.cpp tells the 27B model by its block count


@dataclass
class Args(gemma3.Args):
    qk_norm: bool = False
    PATTERN: ClassVar[int] = 2

    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        f = super().gguf_fields(s, arch)
        scale = (f["hidden_size"] // f["num_heads"]) ** -0.5 if f["num_layers"] == BLOCKS_27B else None
        local = s.positive("rope.freq_base_swa", f["rope"].base, ROPE_BASE_ABOVE)
        return {**f, "local_rope": replace(f["rope"], base=local), "query_scale": scale,
                "tie_embeddings": True, "attn_softcap": s.positive("attn_logit_softcapping", ATTN_CAP),
                "final_softcap": s.positive("final_logit_softcapping", FINAL_CAP)}

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        return {**super().hf_fields(s, config),
                "attn_softcap": _cap(s, config, "attn_logit_softcapping", ATTN_CAP),
                "final_softcap": _cap(s, config, "final_logit_softcapping", FINAL_CAP)}


def _cap(s: Settings, config: dict[str, Any], key: str, default: float) -> float | None:
    """A cap from config.json: transformers' default when the key is absent, none when it is null."""
    return s.positive(key, None) if key in config else default
