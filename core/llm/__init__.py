"""Language models as grid networks: registry, readers, architectures, tokenizer, generation.

``load_model`` is the entry point (``from loomlab.core.llm import load_model``). It is imported
on first use, not with this package: the registry and file readers, which the headless listing
commands need, should not pay for numba's kernels and HF tokenizers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .generate.textmodel import TextModel, load_model

__all__ = ["TextModel", "load_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from .generate import textmodel

        return getattr(textmodel, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
