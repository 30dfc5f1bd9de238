"""nomic-bert embedding models (nomic-embed-text): BERT's post-LayerNorm encoder with rotary
positions (half-split, as transformers and llama.cpp's NEOX rotation) instead of a position
table, a fused QKV projection, a SwiGLU MLP (``down(silu(fc12 x) * fc11 x)``) and no biases but
the LayerNorms'.

The checkpoint's own names are nomic's (``encoder.layers.{i}.attn.Wqkv``, ``mlp.fc11``, ``norm1``,
``emb_ln`` ...: what nomic publishes and transformers saves), the GGUF's llama.cpp's
(``blk.{i}.attn_qkv`` ...). config.json may use transformers' keys (``hidden_size`` ...) or
nomic's own (``n_embd``, ``rotary_emb_base`` ...); nomic's switches for variants this module does
not build (pre-norm, interleaved or partial rotary, biases, another activation) are refused,
naming the key. Pooling, normalisation and renaming are BERT's (:mod:`.bert`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from ...errors import ModelFormatError
from ...layers.base import make_layer
from .bert import Args as BertArgs
from .bert import layer_norm_of, sanitize, source_args
from .encoder import Encoder
from .encoder_layers import EncoderAttention, EncoderEmbedding
from .layer_builders import require
from .llm_layers import LLMGatedMLP, Matrix, dense
from .rope import Rope

__all__ = ["EMBEDDING_MODEL", "Args", "GGUF_BLOCK_NAMES", "build", "sanitize", "source_args"]

EMBEDDING_MODEL = True
GGUF_BLOCK_NAMES = {
    "attn_qkv": "attn.Wqkv", "attn_output": "attn.out_proj", "attn_output_norm": "norm1",
    "ffn_up": "mlp.fc11", "ffn_gate": "mlp.fc12", "ffn_down": "mlp.fc2", "layer_output_norm": "norm2",
}


# nomic's config.json keys -> transformers'
NOMIC_KEYS = {"n_embd": "hidden_size", "n_layer": "num_hidden_layers", "n_head": "num_attention_heads",
              "n_inner": "intermediate_size", "n_positions": "max_position_embeddings",
              "layer_norm_epsilon": "layer_norm_eps", "rotary_emb_base": "rope_theta"}
# nomic's switches and the only value built here
NOMIC_FIXED = {"prenorm": False, "parallel_block": False, "rotary_emb_fraction": 1.0,
               "rotary_emb_interleaved": False, "rotary_scaling_factor": None, "qkv_proj_bias": False,
               "mlp_fc1_bias": False, "mlp_fc2_bias": False, "activation_function": "swiglu"}


@dataclass
class Args(BertArgs):
    hidden_act: str = "silu"
    HIDDEN_ACTS: ClassVar[tuple[str, ...]] = ("silu",)

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> Args:
        for key, value in NOMIC_FIXED.items():
            if key in config and config[key] != value:
                raise ModelFormatError(f"config.json:{key}", f"{config[key]!r:.40} is not supported "
                                                             f"(nomic-bert is built with {value!r})")
        ours = {mine: config[theirs] for theirs, mine in NOMIC_KEYS.items() if theirs in config}
        return super().from_hf({**ours, **config})


def build(args: Args, weights: dict[str, Matrix]) -> Encoder:
    d, f = args.hidden_size, args.intermediate_size
    table = require(weights, "model.embed_tokens.weight", (args.vocab_size or None, d))
    layers = [EncoderEmbedding(table, require(weights, "token_types.weight", (None, d))),
              layer_norm_of(args, weights, "token_embd_norm")]
    rope = Rope(args.rope.inv_freq(args.head_dim))
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        # the fused projection's rows are Q, then K, then V (transformers chunks it in three)
        q, k, v = np.split(dense(require(weights, p + "attn.Wqkv.weight", (3 * d, d))), 3)
        w = {"wq": q, "wk": k, "wv": v, "wo": require(weights, p + "attn.out_proj.weight", (d, d))}
        w |= {name: np.zeros(d, np.float32) for name in ("bq", "bk", "bv", "bo")}
        mlp = LLMGatedMLP({"gate": require(weights, p + "mlp.fc12.weight", (f, d)),
                           "up": require(weights, p + "mlp.fc11.weight", (f, d)),
                           "down": require(weights, p + "mlp.fc2.weight", (d, f))}, "Silu")
        layers.append(make_layer("Sequential", children=[
            EncoderAttention(args.num_heads, w, rope), make_layer("Residual"),
            layer_norm_of(args, weights, p + "norm1"),
            mlp, make_layer("Residual"), layer_norm_of(args, weights, p + "norm2")]))
    return Encoder(replace(args, vocab_size=table.shape[0]), layers, args.pooling)
