"""BERT-family embedding models (BERT, MiniLM, BGE, ... as sentence-transformers and llama.cpp
ship them): word + position + token-type embeddings and their LayerNorm, post-LayerNorm blocks of
bidirectional attention and a GELU MLP, every projection with a bias; then pooling.

How the token states are pooled is the model's: GGUF ``bert.pooling_type`` (llama.cpp's enum:
1 mean, 2 CLS), or an HF folder's sentence-transformers modules (``modules.json``, its Pooling
module's ``config.json``; a ``Normalize`` module scales to unit length); without either, mean.
A GGUF embedding is always L2-normalised, as llama.cpp's server returns it (its ``/v1/embeddings``
normalises unless asked not to); the file has no setting for it.

Weights are keyed by the names the GGUF route gives them (GGUF block stems mapped to transformers'
``model.layers.{i}.attention.self.query`` ..., ``position_embd.weight`` ...); :func:`sanitize`
renames an HF checkpoint's ``embeddings.*`` / ``encoder.layer.{i}.*`` tensors onto them (nomic-bert's
``encoder.layers.{i}.*`` and ``emb_ln`` too), and errors still name the checkpoint's own tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from ...errors import LoomConfigError, ModelFormatError
from ...io.bounded_read import parse_json_text, read_small_bytes
from ...layers.base import make_layer
from ..files.hf_files import MAX_JSON_FILE_BYTES
from ..files.weights_source import Weights, WeightSource
from .encoder import CLS, MEAN, Encoder, Pooling
from .encoder_layers import ACTIVATIONS, BiasedDense, EncoderAttention, EncoderEmbedding, LLMLayerNorm
from .layer_builders import require
from .llm_layers import Matrix
from .model_args import ModelArgs, Settings

__all__ = ["EMBEDDING_MODEL", "Args", "GGUF_BLOCK_NAMES", "build", "layer_norm_of", "sanitize", "source_args"]

EMBEDDING_MODEL = True

GGUF_BLOCK_NAMES = {
    "attn_q": "attention.self.query", "attn_k": "attention.self.key", "attn_v": "attention.self.value",
    "attn_output": "attention.output.dense", "attn_output_norm": "attention.output.LayerNorm",
    "ffn_up": "intermediate.dense", "ffn_down": "output.dense", "layer_output_norm": "output.LayerNorm",
}
# an HF checkpoint's embedding tensors -> their names here (the GGUF route's)
HF_TOP_NAMES = {
    "embeddings.word_embeddings.weight": "model.embed_tokens.weight",
    "embeddings.position_embeddings.weight": "position_embd.weight",
    "embeddings.token_type_embeddings.weight": "token_types.weight",
    "embeddings.LayerNorm.weight": "token_embd_norm.weight",
    "embeddings.LayerNorm.bias": "token_embd_norm.bias",
}
NOMIC_TOP_NAMES = {"emb_ln.weight": "token_embd_norm.weight", "emb_ln.bias": "token_embd_norm.bias"}
HF_BLOCK = re.compile(r"encoder\.layers?\.(\d{1,18})\.")  # BERT's encoder.layer.N, nomic's encoder.layers.N
# Loom's attention parts (wq ... bo) -> their stems
ATTENTION = (("q", "attention.self.query"), ("k", "attention.self.key"), ("v", "attention.self.value"),
             ("o", "attention.output.dense"))
GGUF_POOLING = {1: MEAN, 2: CLS}  # llama.cpp's LLAMA_POOLING_TYPE_MEAN, _CLS
ST_MODULES, ST_POOLING_MODES = "modules.json", {"mean": MEAN, "cls": CLS}


@dataclass
class Args(ModelArgs):
    norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pooling: Pooling = Pooling()
    TIE_DEFAULT: ClassVar[bool] = True
    HIDDEN_ACTS: ClassVar[tuple[str, ...]] = tuple(ACTIVATIONS)  # the MLP activations built here

    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        kind = s.get("pooling_type", int, 1)
        if kind not in GGUF_POOLING:
            raise ModelFormatError(s.field("pooling_type"), f"pooling type {kind} is not supported (1: mean, "
                                   "2: CLS)", s.offsets.get(s.prefix + "pooling_type"))
        eps = s.positive("attention.layer_norm_epsilon", 1e-12)
        return {**super().gguf_fields(s, arch), "norm_eps": eps,
                "pooling": Pooling(GGUF_POOLING[kind], normalize=True)}

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        act = s.get("hidden_act", str, cls.hidden_act)
        if act not in cls.HIDDEN_ACTS:
            raise ModelFormatError(s.field("hidden_act"),
                                   f"{act!r:.40} is not supported ({', '.join(cls.HIDDEN_ACTS)})")
        eps = s.positive("layer_norm_eps", 1e-12)
        return {**super().hf_fields(s, config), "norm_eps": eps, "hidden_act": act}


def source_args(args: Args, source: WeightSource) -> Args:
    """``args`` with the pooling an HF folder's sentence-transformers modules give (GGUF metadata
    says it itself)."""
    return args if source.kind == "gguf" else replace(args, pooling=folder_pooling(Path(source.path)))


def folder_pooling(folder: Path) -> Pooling:
    """The pooling of sentence-transformers' ``modules.json`` in ``folder`` (mean without one)."""
    modules = _json(folder / ST_MODULES, list)
    if modules is None:
        return Pooling(MEAN)
    types = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
    mode = MEAN
    if "Pooling" in types:
        where = folder / str(types["Pooling"].get("path", "")) / "config.json"
        mode = _pooling_mode(_json(where, dict) or {}, where)
    return Pooling(mode, normalize="Normalize" in types)


def _pooling_mode(config: dict, where: Path) -> str:
    """sentence-transformers' ``pooling_mode`` ("mean", "cls"), or its older ``pooling_mode_*`` flags."""
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        mode = mode[0] if isinstance(mode, list) and len(mode) == 1 else mode
        if mode not in ST_POOLING_MODES:
            raise ModelFormatError(f"{where}:pooling_mode", f"{mode!r:.60} is not supported (mean, cls)")
        return ST_POOLING_MODES[mode]
    prefix = "pooling_mode_"
    flags = [k[len(prefix):] for k, v in config.items() if k.startswith(prefix) and v is True]
    known = {"mean_tokens": MEAN, "cls_token": CLS}
    if len(flags) != 1 or flags[0] not in known:
        raise ModelFormatError(f"{where}:{prefix}*", f"{flags or 'none'} set; supported: one of "
                                                     f"{prefix}mean_tokens, {prefix}cls_token")
    return known[flags[0]]


def _json(path: Path, kind: type) -> Any:
    """A sentence-transformers settings file (None when absent), read as a small regular file:
    a FIFO or ``/dev/zero`` in its place is refused, not waited on."""
    if not path.exists():
        return None
    try:
        value = parse_json_text(read_small_bytes(path, path.name, MAX_JSON_FILE_BYTES), path.name)
    except LoomConfigError as e:
        raise ModelFormatError(str(path), str(e)) from None
    if not isinstance(value, kind):
        raise ModelFormatError(str(path), f"expected a JSON {kind.__name__}")
    return value


class _Renamed(Weights):
    """An HF checkpoint's weights under the names used here; errors name the checkpoint's tensor
    (one it lacks by the name its blocks' prefix, ``encoder.layer.`` or ``encoder.layers.``, gives)."""

    def __init__(self, weights: dict[str, Matrix], original: dict[str, str], block_prefix: str):
        super().__init__(weights)
        self.original = original  # name here -> the checkpoint's
        self.block_prefix = block_prefix

    def file_name(self, name: str) -> str:
        top = {v: k for k, v in HF_TOP_NAMES.items()}
        return (self.original.get(name) or top.get(name)
                or name.replace("model.layers.", self.block_prefix, 1))


def _our_name(name: str) -> str:
    name = name.removeprefix("bert.")
    top = HF_TOP_NAMES.get(name) or NOMIC_TOP_NAMES.get(name)
    if top:
        return top
    m = HF_BLOCK.match(name)
    return f"model.layers.{m[1]}.{name[m.end():]}" if m else name


def sanitize(weights: Weights, args: Args) -> Weights:
    """An HF checkpoint's tensors renamed to the GGUF route's names (a GGUF's are those already)."""
    renamed = {_our_name(name): name for name in weights}
    if all(ours == name for ours, name in renamed.items()):
        return weights
    prefix = "encoder.layers." if any(n.startswith("encoder.layers.") for n in weights) else "encoder.layer."
    out = _Renamed({ours: weights[name] for ours, name in renamed.items()}, renamed, prefix)
    out.offsets.update({ours: weights.offsets[name] for ours, name in renamed.items()
                        if name in weights.offsets})
    return out


def layer_norm_of(args: Args, weights: dict[str, Matrix], stem: str) -> LLMLayerNorm:
    """The LayerNorm whose gamma and beta are ``{stem}.weight`` and ``{stem}.bias``."""
    d = (args.hidden_size,)
    gamma, beta = require(weights, f"{stem}.weight", d), require(weights, f"{stem}.bias", d)
    return LLMLayerNorm(gamma, beta, args.norm_eps)


def _dense(weights: dict[str, Matrix], stem: str, shape: tuple[int, int], act: str | None = None):
    weight, bias = require(weights, f"{stem}.weight", shape), require(weights, f"{stem}.bias", shape[:1])
    return BiasedDense(weight, bias, act)


def build(args: Args, weights: dict[str, Matrix]) -> Encoder:
    d, f = args.hidden_size, args.intermediate_size
    table = require(weights, "model.embed_tokens.weight", (args.vocab_size or None, d))
    positions = require(weights, "position_embd.weight", (None, d))
    layers = [EncoderEmbedding(table, require(weights, "token_types.weight", (None, d)), positions),
              layer_norm_of(args, weights, "token_embd_norm")]
    for i in range(args.num_layers):
        p = f"model.layers.{i}."
        w = {f"w{n}": require(weights, f"{p}{stem}.weight", (d, d)) for n, stem in ATTENTION}
        w |= {f"b{n}": np.asarray(require(weights, f"{p}{stem}.bias", (d,)), np.float32)
              for n, stem in ATTENTION}
        mlp = make_layer("Sequential", children=[
            _dense(weights, p + "intermediate.dense", (f, d), args.hidden_act),
            _dense(weights, p + "output.dense", (d, f))])
        layers.append(make_layer("Sequential", children=[
            EncoderAttention(args.num_heads, w), make_layer("Residual"),
            layer_norm_of(args, weights, p + "attention.output.LayerNorm"),
            mlp, make_layer("Residual"), layer_norm_of(args, weights, p + "output.LayerNorm")]))
    # a sequence holds at most as many tokens as there are position rows
    context = min(args.context_length, positions.shape[0])
    return Encoder(replace(args, vocab_size=table.shape[0], context_length=context), layers, args.pooling)

