"""What a model file is, without loading it: architecture, sizes, quantization, context, memory,
and whether it can chat (:func:`supports_chat`) or is an embedding model."""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import LoomConfigError, ModelFormatError
from ...io.bounded_read import parse_json_text, read_small_text
from ...units import format_bytes
from ..files.architectures import unsupported
from ..files.hf_files import TOKENIZER_CONFIG
from ..files.weights_source import WeightSource, open_source
from ..kernels.quant import DECODED_TYPES
from .loader import ARCHITECTURES, makes_embeddings, read_args
from .model_args import MAX_DIM, MAX_TOKENS, Settings

# An f32 K and V row per layer and position: what a full-context KV cache costs on top of weights.
KV_BYTES = 4
CHAT, COMPLETION, EMBEDDING = "chat", "completion only", "embedding"
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
    decoded_types: tuple[str, ...] = ()  # tensor types without a matrix kernel: float32 copies at load
    decoded_bytes: int = 0  # what those copies cost
    problem: str = ""  # why this build cannot run the model ("" when it can)
    embedding_model: bool = False  # an encoder (BERT family): it computes embeddings, makes no text

    @property
    def mode(self) -> str:
        """What the model is for: :data:`CHAT`, :data:`COMPLETION` (a base model) or
        :data:`EMBEDDING` (an embedding model, for ``/v1/embeddings``)."""
        if self.embedding_model:
            return EMBEDDING
        return CHAT if self.supports_chat else COMPLETION

    @property
    def types_text(self) -> str:
        """The tensor types with their counts, and which are decoded at load and what that costs."""
        text = ", ".join(f"{name} × {n}" for name, n in self.tensor_types.items())
        if not self.decoded_types:
            return text
        return (f"{text} ({', '.join(self.decoded_types)} decoded to float32 at load, no kernel yet: "
                f"+{format_bytes(self.decoded_bytes)})")

    @property
    def memory_text(self) -> str:
        """The memory estimate and its parts."""
        decoded = f" + float32 copies {format_bytes(self.decoded_bytes)}" if self.decoded_bytes else ""
        return (f"{format_bytes(self.estimated_memory)} (weights {format_bytes(self.file_bytes)} + KV cache "
                f"{format_bytes(self.kv_cache_bytes)} at full context{decoded})")

    @property
    def estimated_memory(self) -> int:
        """Weights stay memory-mapped as in the file; the KV cache and the float32 copies of
        matrices in types without a kernel (:attr:`decoded_types`) come on top."""
        return self.file_bytes + self.kv_cache_bytes + self.decoded_bytes


def describe(path: str | Path) -> ModelInfo:
    """Describe a GGUF file or a Hugging Face model directory (raises ModelFormatError)."""
    path = Path(path)
    if not path.exists():
        raise ModelFormatError("path", f"{path} does not exist")
    source = open_source(path)
    try:
        return _describe_gguf(source) if source.kind == "gguf" else _describe_hf(source)
    finally:
        source.close()


# ModelInfo's sizes -> (GGUF key after "{arch}.", config.json key, largest value) for an
# architecture this build does not run; one it runs is read by its own Args.
_SIZE_KEYS = {"blocks": ("block_count", "num_hidden_layers", MAX_DIM),
              "hidden_size": ("embedding_length", "hidden_size", MAX_DIM),
              "heads": ("attention.head_count", "num_attention_heads", MAX_DIM),
              "kv_heads": ("attention.head_count_kv", "num_key_value_heads", MAX_DIM),
              "head_dim": ("attention.key_length", "head_dim", MAX_DIM),
              "context_length": ("context_length", "max_position_embeddings", MAX_TOKENS),
              "vocab_size": ("vocab_size", "vocab_size", MAX_TOKENS)}


def _sizes(source: WeightSource) -> dict[str, int]:
    """The sizes ``generate`` would use, read and checked as it reads them (:func:`read_args`), so
    a file it refuses is refused here with the same error. An architecture it cannot run gets the
    same typed reads of the common keys, absent ones as 0."""
    if source.architecture in ARCHITECTURES:
        a = read_args(source)[1]
        return dict(blocks=a.num_layers, hidden_size=a.hidden_size, heads=a.num_heads,
                    kv_heads=a.num_kv_heads, head_dim=a.head_dim, context_length=a.context_length,
                    vocab_size=a.vocab_size)
    gguf = source.kind == "gguf"
    s = (Settings(source.metadata, f"{source.architecture}.", offsets=source.offsets) if gguf
         else Settings(source.metadata, label="config.json:"))
    n = {name: s.count(keys[0] if gguf else keys[1], 0, keys[2]) for name, keys in _SIZE_KEYS.items()}
    n["kv_heads"] = n["kv_heads"] or n["heads"]
    n["head_dim"] = n["head_dim"] or (n["hidden_size"] // n["heads"] if n["heads"] else 0)
    return n


def _describe_gguf(source: WeightSource) -> ModelInfo:
    path, meta, tensors = source.path, source.metadata, source.tensors.values()
    n = _sizes(source)
    tokens = meta.get("tokenizer.ggml.tokens")
    if isinstance(tokens, list):  # the tokenizer's vocabulary, when the file carries one
        n["vocab_size"] = len(tokens)
    template = "tokenizer.chat_template" in meta
    embedding = makes_embeddings(source.architecture)
    decoded = [t for t in tensors if t.type_name in DECODED_TYPES]
    return ModelInfo(
        str(path), "gguf", str(meta.get("general.name", path.stem)), source.architecture,
        sum(t.n_elements for t in tensors),
        tensor_types=dict(Counter(t.type_name for t in tensors).most_common()), chat_template=template,
        file_bytes=source.file.model_bytes, kv_cache_bytes=0 if embedding else _kv_bytes(n),
        supports_chat=not embedding and supports_chat(template, path, meta), embedding_model=embedding,
        problem=unsupported(source.architecture),
        decoded_types=tuple(sorted({t.type_name for t in decoded})),
        decoded_bytes=sum(4 * t.n_elements for t in decoded), **n)


def _describe_hf(source: WeightSource) -> ModelInfo:
    path, tensors = source.path, source.tensors.values()
    n = _sizes(source)
    template = _has_template(source.file.tokenizer_config_json)
    embedding = makes_embeddings(source.architecture)
    return ModelInfo(
        str(path), "hf", path.name, source.architecture, sum(math.prod(t.shape) for t in tensors),
        tensor_types=dict(Counter(t.dtype for t in tensors).most_common()), chat_template=template,
        file_bytes=sum(Path(f).stat().st_size for f in {t.file for t in tensors}),
        kv_cache_bytes=0 if embedding else _kv_bytes(n), embedding_model=embedding,
        supports_chat=not embedding and supports_chat(template, path, source.metadata),
        problem=unsupported(source.architecture), **n)


def _kv_bytes(n: dict[str, int]) -> int:
    return 2 * n["blocks"] * n["context_length"] * n["kv_heads"] * n["head_dim"] * KV_BYTES


def _has_template(tokenizer_config: Path | None) -> bool:
    """Whether tokenizer_config.json names a chat template; an unreadable one names none (loading
    the tokenizer says what is wrong with it)."""
    if tokenizer_config is None:
        return False
    try:
        config = parse_json_text(read_small_text(tokenizer_config, "tokenizer_config.json"), TOKENIZER_CONFIG)
    except LoomConfigError:
        return False
    return isinstance(config, dict) and "chat_template" in config
