"""Language models as grid networks, in floors that import downward only:
``kernels`` (quantized products, attention, norms) < ``files`` (GGUF / safetensors readers,
registry, discovery) < ``model`` (layers, architectures, loader) < ``text`` (tokenizer, chat
templates) < ``generate`` (sampling, constraints, batching, ``TextModel``) < ``quality``
(recipes, drift, GGUF export, merges).

The names a program needs are re-exported here (``from loomlab.core.llm import load_model``).
Each is imported on first use, not with this package: the registry and file readers, which the
headless listing commands need, should not pay for numba's kernels and HF tokenizers.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .generate.batching import BatchEngine
    from .generate.textmodel import TextModel, load_model
    from .quality.gguf_export import export_gguf
    from .quality.merge import merge_models
    from .quality.recipe import morph_planned, plan_recipe, resolve_recipe

# name -> the module that holds it, below this package
_EXPORTS = {
    "TextModel": "generate.textmodel", "load_model": "generate.textmodel",
    "BatchEngine": "generate.batching",
    "resolve_recipe": "quality.recipe", "plan_recipe": "quality.recipe", "morph_planned": "quality.recipe",
    "export_gguf": "quality.gguf_export",
    "merge_models": "quality.merge",
}
__all__ = ["BatchEngine", "TextModel", "export_gguf", "load_model", "merge_models", "morph_planned",
           "plan_recipe", "resolve_recipe"]
assert sorted(__all__) == sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
