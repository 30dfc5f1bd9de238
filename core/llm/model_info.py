"""What a model file is, without loading it: architecture, sizes, quantization, context, memory,
and whether it can chat (:func:`supports_chat`)."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import ModelFormatError
from .gguf_file import open_gguf
from .hf_files import open_hf

# An f32 K and V row per layer and position: what a full-context KV cache costs on top of weights.
KV_BYTES = 4
CHAT, COMPLETION = "chat", "completion only"
# How instruction-tuned releases are named ("SmolLM2-135M-Instruct", "gemma-3-270m-it", "…-chat"):
# "it" only as a word of its own, so "Digit" or "Smith" do not count.
_INSTRUCT_NAME = re.compile(r"instruct|chat|(?<![a-z0-9])it(?![a-z0-9])", re.IGNORECASE)
# Where a file says what it is: GGUF general.* keys, an HF config's origin.
_NAME_KEYS = ("general.name", "general.finetune", "general.basename", "_name_or_path")


def supports_chat(template_in_file: bool, path: str | Path, metadata: Mapping[str, Any]) -> bool:
    """Whether a model can hold a chat, or only continue text.

    A model that ships its own chat template was trained on it. Without one, a built-in family
    template (see ``ChatTemplate.for_model``) suits an instruction-tuned release named as one
    (``-Instruct``, ``-it``, ``chat`` in its file or metadata names); a base model never learned
    the turn markers and echoes the prompt back, so it is completion only.
    """
    if template_in_file:
        return True
    names = [Path(path).name, *(str(metadata[k]) for k in _NAME_KEYS if k in metadata)]
    return any(_INSTRUCT_NAME.search(name) for name in names)


@dataclass(frozen=True)
class ModelInfo:
    path: str
    format: str  # "gguf" | "hf"
    name: str
    architecture: str
    parameters: int
    blocks: int
    hidden_size: int
    heads: int
    kv_heads: int
    head_dim: int
    context_length: int
    vocab_size: int
    tensor_types: dict[str, int] = field(default_factory=dict)  # quant type -> tensor count
    chat_template: bool = False  # the file carries its own template
    file_bytes: int = 0
    kv_cache_bytes: int = 0  # at the full context length
    supports_chat: bool = False  # see supports_chat()

    @property
    def mode(self) -> str:
        """What the model is for: :data:`CHAT` or :data:`COMPLETION` (a base model)."""
        return CHAT if self.supports_chat else COMPLETION

    @property
    def estimated_memory(self) -> int:
        """Weights stay memory-mapped as in the file; the KV cache comes on top."""
        return self.file_bytes + self.kv_cache_bytes


def describe(path: str | Path) -> ModelInfo:
    """Describe a GGUF file or a Hugging Face model directory (raises ModelFormatError)."""
    path = Path(path)
    if path.is_dir():
        return _describe_hf(path)
    if not path.exists():
        raise ModelFormatError("path", f"{path} does not exist")
    return _describe_gguf(path)


def _describe_gguf(path: Path) -> ModelInfo:
    with open_gguf(path) as g:
        arch = g.architecture
        meta = g.metadata

        def num(key: str, default: int = 0) -> int:
            v = meta.get(f"{arch}.{key}", default)
            return int(v) if isinstance(v, int | float) else default

        d, heads = num("embedding_length"), num("attention.head_count")
        kv_heads = num("attention.head_count_kv", heads)
        head_dim = num("attention.key_length", d // heads if heads else 0)
        blocks, ctx = num("block_count"), num("context_length")
        tokens = meta.get("tokenizer.ggml.tokens")
        return ModelInfo(
            str(path), "gguf", str(meta.get("general.name", path.stem)), arch,
            sum(t.n_elements for t in g.tensors.values()), blocks, d, heads, kv_heads, head_dim, ctx,
            len(tokens) if tokens is not None else 0,
            dict(Counter(t.type_name for t in g.tensors.values()).most_common()),
            "tokenizer.chat_template" in meta, g.file_size,
            2 * blocks * ctx * kv_heads * head_dim * KV_BYTES,
            supports_chat("tokenizer.chat_template" in meta, path, meta))


def _describe_hf(path: Path) -> ModelInfo:
    with open_hf(path) as hf:
        c = hf.config
        d, heads = int(c.get("hidden_size", 0)), int(c.get("num_attention_heads", 0))
        kv_heads = int(c.get("num_key_value_heads") or heads)
        head_dim = int(c.get("head_dim") or (d // heads if heads else 0))
        blocks, ctx = int(c.get("num_hidden_layers", 0)), int(c.get("max_position_embeddings", 0))
        template = False
        if hf.tokenizer_config_json is not None:
            import json

            try:
                template = "chat_template" in json.loads(hf.tokenizer_config_json.read_text())
            except (OSError, ValueError):
                template = False
        files = {t.file for t in hf.tensors.values()}
        return ModelInfo(
            str(path), "hf", path.name, str(c.get("model_type", "")),
            sum(math.prod(t.shape) for t in hf.tensors.values()), blocks, d, heads, kv_heads, head_dim, ctx,
            int(c.get("vocab_size", 0)),
            dict(Counter(t.dtype for t in hf.tensors.values()).most_common()), template,
            sum(Path(f).stat().st_size for f in files), 2 * blocks * ctx * kv_heads * head_dim * KV_BYTES,
            supports_chat(template, path, c))
