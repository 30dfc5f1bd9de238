"""The pieces architectures build a :class:`~.causal_lm.CausalLM` from: checked weight lookup,
norm / attention / MLP layers of block ``i``, the decoder block made of core containers, and the
llama-style decoder that llama, mistral and qwen share.

Weights are keyed by transformers' names whatever the file; :data:`GGUF_BLOCK_NAMES` maps GGUF's
block tensor stems onto them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from ...errors import ModelFormatError
from ...layers.base import Layer, make_layer
from ..files.weights_source import Weights
from .causal_lm import CausalLM
from .llm_layers import AttentionSpec, LLMAttention, LLMEmbedding, LLMGatedMLP, LLMHead, LLMRMSNorm, Matrix
from .model_args import ModelArgs
from .rope import Rope

# GGUF block stems shared by every architecture here (gguf-py's tensor names).
GGUF_BLOCK_NAMES: dict[str, str] = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm", "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}



def require(weights: dict[str, Matrix], name: str, shape: tuple[int | None, ...]) -> Matrix:
    """``weights[name]`` checked against ``shape`` (None matches any size); errors name the
    tensor as the file does."""
    error = weights.error if isinstance(weights, Weights) else ModelFormatError
    m = weights.get(name)
    if m is None:
        raise error(name, f"tensor is missing ({name}, needed by this architecture)")
    got = tuple(m.shape)
    if len(got) != len(shape) or any(e is not None and g != e for g, e in zip(got, shape, strict=False)):
        want = tuple("*" if e is None else e for e in shape)
        raise error(name, f"shape {got}, expected {want} ({name})")
    return m


def norm_layer(args: ModelArgs, weights: dict[str, Matrix], name: str) -> LLMRMSNorm:
    return LLMRMSNorm(require(weights, name, (args.hidden_size,)), args.norm_eps)


def attention_layer(args: ModelArgs, weights: dict[str, Matrix], i: int, rope: Rope, *,
                    window: int | None = None, scale: float | None = None, softcap: float | None = None,
                    whole_qk_norm: bool = False, output_scale: float = 1.0) -> LLMAttention:
    """Block ``i``'s attention: projections, optional biases and Q/K norms (each head's, or with
    ``whole_qk_norm`` one over all heads: olmo2); ``scale`` the score scale (None: head_dim **
    -0.5), scores soft-capped at ``softcap`` (gemma2), ``output_scale`` a multiplier of its output."""
    p = f"model.layers.{i}.self_attn."
    d, q, kv = args.hidden_size, args.num_heads * args.head_dim, args.num_kv_heads * args.head_dim
    shapes = {"q": (q, d), "k": (kv, d), "v": (kv, d), "o": (d, q)}
    w = {f"w{n}": require(weights, f"{p}{n}_proj.weight", s) for n, s in shapes.items()}
    for n, (rows, _) in shapes.items():
        w[f"b{n}"] = (require(weights, f"{p}{n}_proj.bias", (rows,)) if n in args.attention_biases
                      else np.zeros(rows, np.float32))
    if args.qk_norm:
        w["q_norm"] = require(weights, f"{p}q_norm.weight", (q if whole_qk_norm else args.head_dim,))
        w["k_norm"] = require(weights, f"{p}k_norm.weight", (kv if whole_qk_norm else args.head_dim,))
    spec = AttentionSpec(args.num_heads, args.num_kv_heads, args.head_dim, rope, window, scale, args.norm_eps,
                         softcap, output_scale)
    return LLMAttention(i, spec, w)


def mlp_layer(args: ModelArgs, weights: dict[str, Matrix], i: int, activation: str = "Silu",
              output_scale: float = 1.0) -> LLMGatedMLP:
    """Block ``i``'s gated MLP, with the biases the file has (llama's ``mlp_bias``), its output
    times ``output_scale``."""
    p, d, f = f"model.layers.{i}.mlp.", args.hidden_size, args.intermediate_size
    w = {}
    for name, shape in (("gate", (f, d)), ("up", (f, d)), ("down", (d, f))):
        w[name] = require(weights, f"{p}{name}_proj.weight", shape)
        if f"{p}{name}_proj.bias" in weights:
            w[f"b_{name}"] = require(weights, f"{p}{name}_proj.bias", shape[:1])
    return LLMGatedMLP(w, activation, output_scale)


def decoder_block(attention_part: list[Layer], mlp_part: list[Layer]) -> Layer:
    """``h = x + attention_part(x); y = h + mlp_part(h)`` from core containers: in a Sequential a
    Residual adds the input of the child before it."""
    return make_layer("Sequential", children=[
        make_layer("Sequential", children=attention_part), make_layer("Residual"),
        make_layer("Sequential", children=mlp_part), make_layer("Residual")])


def standard_rope(args: ModelArgs, weights: dict[str, Matrix]) -> Rope:
    factors = weights.get("rope_freqs")
    if factors is not None:
        require(weights, "rope_freqs", (args.head_dim // 2,))
    return Rope(args.rope.inv_freq(args.head_dim, factors), args.rope_interleaved)


def llama_block(args: ModelArgs, weights: dict[str, Matrix], i: int, rope: Rope, *,
                scale: float | None = None, output_scale: float = 1.0,
                ffn: Callable[..., Layer] | None = None) -> Layer:
    """Block ``i`` of the llama-style decoder: pre-norm attention (score ``scale``), pre-norm
    SwiGLU MLP (or what ``ffn(args, weights, i)`` builds: mixtral's and qwen3moe's experts), each
    half's output times ``output_scale`` before its residual add."""
    p = f"model.layers.{i}."
    attention_part = [norm_layer(args, weights, p + "input_layernorm.weight"),
                      attention_layer(args, weights, i, rope, window=args.layer_window(i), scale=scale,
                                      output_scale=output_scale)]
    norm = norm_layer(args, weights, p + "post_attention_layernorm.weight")
    mlp = mlp_layer(args, weights, i, output_scale=output_scale) if ffn is None else ffn(args, weights, i)
    return decoder_block(attention_part, [norm, mlp])


def build_decoder(args: ModelArgs, weights: dict[str, Matrix],
                  ffn: Callable[..., Layer] | None = None) -> CausalLM:
    """The llama-style decoder (llama, mistral, qwen2, qwen3, phi3, mixtral, qwen3moe): pre-norm
    blocks, SwiGLU MLP (or ``ffn``'s, see :func:`llama_block`)."""
    rope = standard_rope(args, weights)
    blocks = [llama_block(args, weights, i, rope, ffn=ffn) for i in range(args.num_layers)]
    return assemble_causal_lm(args, weights, blocks)


def assemble_causal_lm(args: ModelArgs, weights: dict[str, Matrix], blocks: list[Layer], *,
                       embed_scale: float = 1.0, logit_divisor: float = 1.0,
                       logit_softcap: float | None = None) -> CausalLM:
    """Embedding (rows times ``embed_scale``), ``blocks``, final norm and LM head (the embedding
    table itself when tied; logits divided by ``logit_divisor``, soft-capped at ``logit_softcap``:
    gemma2)."""
    table = require(weights, "model.embed_tokens.weight", (args.vocab_size or None, args.hidden_size))
    args = replace(args, vocab_size=table.shape[0])
    tied = args.tie_embeddings if args.tie_embeddings is not None else "lm_head.weight" not in weights
    head = table if tied else require(weights, "lm_head.weight", (args.vocab_size, args.hidden_size))
    layers = [LLMEmbedding(table, embed_scale), *blocks, norm_layer(args, weights, "model.norm.weight"),
              LLMHead(head, logit_divisor, logit_softcap)]
    return CausalLM(args, layers)
