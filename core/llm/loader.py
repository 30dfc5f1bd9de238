"""Loading a model file as a :class:`~.causal_lm.CausalLM`, and the table of architectures.

An architecture is one module (``arch_llama``, ``arch_qwen``, ``arch_gemma3``) found by name in
:data:`ARCHITECTURES`. It provides, as in mlx-lm:

* ``Args`` — a :class:`~.model_args.ModelArgs` dataclass built by ``Args.from_gguf(metadata,
  offsets)`` or ``Args.from_hf(config)``; keys it does not know are ignored;
* ``GGUF_BLOCK_NAMES`` — GGUF block tensor stems -> transformers names (weights are keyed by
  transformers names whatever the file);
* ``sanitize(weights, args)`` (optional) — value fixes after renaming;
* ``build(args, weights) -> CausalLM``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from types import ModuleType

from ..errors import ModelFormatError
from . import arch_gemma3, arch_llama, arch_qwen
from .causal_lm import CausalLM
from .model_args import ModelArgs
from .weights_source import Progress, WeightSource, open_source

# Model name (GGUF general.architecture or config.json model_type) -> the module that builds it.
ARCHITECTURES: dict[str, ModuleType] = {
    "llama": arch_llama, "mistral": arch_llama,
    "qwen2": arch_qwen, "qwen3": arch_qwen,
    "gemma3": arch_gemma3, "gemma3_text": arch_gemma3,
}


def architecture(name: str, fld: str = "general.architecture") -> ModuleType:
    """The module implementing architecture ``name``; ModelFormatError naming ``fld`` if none does."""
    module = ARCHITECTURES.get(name)
    if module is None:
        raise ModelFormatError(fld, f"unsupported architecture {name!r}; supported: {sorted(ARCHITECTURES)}")
    return module


def read_args(source: WeightSource) -> tuple[ModuleType, ModelArgs]:
    """The architecture module of an opened model and its settings (GGUF metadata or config.json)."""
    fld = "general.architecture" if source.kind == "gguf" else "config.json:model_type"
    module = architecture(source.architecture, fld)
    if source.kind == "gguf":
        return module, module.Args.from_gguf(source.metadata, source.offsets)
    return module, module.Args.from_hf(source.metadata)


def load_causal_lm(path: str | os.PathLike[str], progress: Progress | None = None) -> CausalLM:
    """Open a GGUF file or HF directory and build its network (weights stay in the file's encoding)."""
    source = open_source(path)
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
