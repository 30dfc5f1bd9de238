"""Loading a model file as a :class:`~.causal_lm.CausalLM`, and the table of architectures.

An architecture is one module (``llama``, ``qwen``, ``gemma3``, ``phi3`` ...; mixtral is llama's,
qwen3moe qwen's) found by name in :data:`ARCHITECTURES`. It provides, as in mlx-lm:

* ``Args`` — a :class:`~.model_args.ModelArgs` dataclass built by ``Args.from_gguf(metadata,
  offsets)`` or ``Args.from_hf(config)``; keys it does not know are ignored;
* ``GGUF_BLOCK_NAMES`` — GGUF block tensor stems -> transformers names (weights are keyed by
  transformers names whatever the file);
* ``source_args(args, source)`` (optional) — settings the model keeps outside its metadata (an
  HF embedding model's sentence-transformers pooling);
* ``sanitize(weights, args)`` (optional) — value fixes after renaming;
* ``build(args, weights) -> CausalLM`` (an :class:`~.encoder.Encoder` for an embedding model);
* ``EMBEDDING_MODEL`` (optional, False when absent) — True for an embedding model (an encoder),
  which makes no text.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from types import ModuleType

from ...errors import ModelFormatError
from ..files.architectures import unsupported
from ..files.weights_source import Progress, WeightSource, open_source
from . import bert, gemma2, gemma3, granite, llama, nomic_bert, olmo2, phi3, qwen, smollm3
from .causal_lm import CausalLM
from .model_args import ModelArgs

# A block tensor's number in GGUF and transformers names (18 digits at most: int() stays cheap).
_BLOCK_INDEX = {"gguf": re.compile(r"blk\.(\d{1,18})\."), "hf": re.compile(r"model\.layers\.(\d{1,18})\.")}

# Model name (GGUF general.architecture or config.json model_type) -> the module that builds it.
ARCHITECTURES: dict[str, ModuleType] = {
    "llama": llama, "mistral": llama,
    "qwen2": qwen, "qwen3": qwen, "qwen3moe": qwen, "qwen3_moe": qwen, "mixtral": llama,
    "gemma3": gemma3, "gemma3_text": gemma3,
    "bert": bert, "nomic_bert": nomic_bert, "nomic-bert": nomic_bert,
    "phi3": phi3, "granite": granite, "smollm3": smollm3, "gemma2": gemma2, "olmo2": olmo2,
}


def architecture(name: str, fld: str = "general.architecture") -> ModuleType:
    """The module implementing architecture ``name``; ModelFormatError naming ``fld`` if none does."""
    module = ARCHITECTURES.get(name)
    if module is None:
        raise ModelFormatError(fld, unsupported(name) or f"architecture {name!r} has no module")
    return module


def makes_embeddings(name: str) -> bool:
    """Whether architecture ``name`` is an embedding model (an encoder such as BERT: no text)."""
    return bool(getattr(ARCHITECTURES.get(name), "EMBEDDING_MODEL", False))


def read_args(source: WeightSource) -> tuple[ModuleType, ModelArgs]:
    """The architecture module of an opened model and its settings (GGUF metadata or config.json),
    checked against the blocks its tensors hold."""
    fld = "general.architecture" if source.kind == "gguf" else "config.json:model_type"
    module = architecture(source.architecture, fld)
    if source.kind == "gguf":
        args = module.Args.from_gguf(source.metadata, source.offsets)
    else:
        args = module.Args.from_hf(source.metadata)
    source_args: Callable | None = getattr(module, "source_args", None)  # settings in other files
    if source_args is not None:
        args = source_args(args, source)
    check_block_count(source, args.num_layers)
    return module, args


def check_block_count(source: WeightSource, num_layers: int) -> None:
    """Refuse a block count below the blocks the tensors hold, as llama.cpp does: building the
    first ``num_layers`` blocks would silently drop the rest. (Fewer blocks than the count fail
    later, naming the first missing tensor.)"""
    pattern = _BLOCK_INDEX[source.kind]
    present = 1 + max((int(m[1]) for m in map(pattern.match, source.tensors) if m), default=-1)
    if present > num_layers:
        name = "block_count" if source.kind == "gguf" else "num_hidden_layers"
        key = f"{source.architecture}.{name}" if source.kind == "gguf" else f"config.json:{name}"
        raise ModelFormatError(key, f"the model has {present} blocks of tensors but {name} says {num_layers}",
                               source.offsets.get(key))


def load_causal_lm(path: str | os.PathLike[str], progress: Progress | None = None, *,
                   source: WeightSource | None = None) -> CausalLM:
    """Open a GGUF file or HF directory (or take its ``source``, already open) and build its
    network (weights stay in the file's encoding). The network owns the source: closed with it,
    or here if building fails."""
    source = open_source(path) if source is None else source
    try:
        module, args = read_args(source)
        weights = source.load(module.GGUF_BLOCK_NAMES, progress)
        sanitize: Callable | None = getattr(module, "sanitize", None)
        net = module.build(args, sanitize(weights, args) if sanitize else weights)
    except BaseException:
        source.close()
        raise
    net.source = source
    return net
