"""What every architecture reads from a model's settings: typed reads of GGUF metadata or
config.json (:class:`Settings`), RoPE settings, and the :class:`ModelArgs` dataclass that each
architecture module extends with its own fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from ...errors import ModelFormatError
from .rope import RopeConfig

MAX_DIM = 1 << 20  # no real model has a width, head or layer count near this
MAX_TOKENS = 1 << 24  # vocabulary and context bound
ROPE_BASE_ABOVE = 1.0  # frequencies base^(-2i/d) fall with i; a base near 0 overflows float32
FLOAT32_MAX = float(np.finfo(np.float32).max)
SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' layer_types values
_REQUIRED = object()


class Settings:
    """Typed reads of a model's settings (GGUF metadata or config.json); errors name the field."""

    def __init__(self, values: dict[str, Any], prefix: str = "", label: str = "",
                 offsets: dict[str, int] | None = None):
        self.values, self.prefix, self.label, self.offsets = values, prefix, label, offsets or {}

    def field(self, key: str) -> str:
        return f"{self.label}{self.prefix}{key}"

    def raw(self, key: str) -> Any:
        return self.values.get(self.prefix + key)

    def get(self, key: str, kind: type, default: Any = _REQUIRED) -> Any:
        """``key`` as ``kind`` (int, float or bool; float accepts an int); absent or null gives
        ``default``."""
        value = self.raw(key)
        if value is None:
            if default is _REQUIRED:
                raise ModelFormatError(self.field(key), "required setting is missing")
            return default
        is_bool = isinstance(value, bool | np.bool_)
        kinds = (float, int) if kind is float else kind
        ok = is_bool if kind is bool else not is_bool and isinstance(value, kinds)
        if not ok:
            raise ModelFormatError(self.field(key), f"expected {kind.__name__}, got {type(value).__name__}",
                                   self.offsets.get(self.prefix + key))
        return kind(value)

    def positive(self, key: str, default: Any = _REQUIRED, above: float = 0.0) -> float:
        """A float above ``above`` (zero: positive) that float32, in which the model computes with
        it, holds (or ``default`` when absent)."""
        value = self.get(key, float, default)
        if value is not default and not above < value <= FLOAT32_MAX:
            what = "a positive float32 number" if above == 0 else f"a float32 number above {above:g}"
            raise ModelFormatError(self.field(key), f"{value} is not {what}",
                                   self.offsets.get(self.prefix + key))
        return value

    def sequence(self, key: str) -> tuple:
        """A JSON list as a tuple (empty when absent)."""
        value = self.raw(key)
        if value is not None and not isinstance(value, list):
            raise ModelFormatError(self.field(key), f"expected a list, got {type(value).__name__}")
        return tuple(value or ())

    def count(self, key: str, default: Any = _REQUIRED, limit: int = MAX_DIM) -> int:
        """A positive integer no larger than ``limit`` (or ``default`` when absent)."""
        if self.raw(key) is None and default is not _REQUIRED:
            return default
        value = self.get(key, int)
        if not 1 <= value <= limit:
            raise ModelFormatError(self.field(key), f"{value} is not in 1..{limit}",
                                   self.offsets.get(self.prefix + key))
        return value


def gguf_rope(s: Settings) -> RopeConfig:
    """Base and scaling from GGUF ``{arch}.rope.*`` keys, as llama.cpp reads them: the scaling
    type is linear unless the file says otherwise, its factor ``rope.scaling.factor`` (or the
    older ``rope.scale_linear``); type none ignores the factor."""
    kind = s.get("rope.scaling.type", str, "linear")
    if kind not in ("none", "linear"):
        raise ModelFormatError(s.field("rope.scaling.type"), f"unsupported RoPE scaling {kind!r:.80}")
    factor = 1.0
    if kind == "linear":
        factor = s.positive("rope.scaling.factor", None) or s.positive("rope.scale_linear", 1.0)
    return RopeConfig(base=s.positive("rope.freq_base", 10000.0, ROPE_BASE_ABOVE),
                      kind="linear" if factor != 1.0 else "default", factor=factor)


# transformers' RoPE types and the keys each requires (its rope_config_validation)
HF_ROPE_KEYS = {"default": (), "linear": ("factor",), "llama3": (
    "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}


def hf_rope(config: dict[str, Any], layer_type: str = FULL) -> RopeConfig:
    """Base and scaling from config.json: transformers 5's ``rope_parameters`` (possibly per
    layer type) or transformers 4's ``rope_theta`` + ``rope_scaling``.

    What a model cannot run as written is refused, naming the field, never replaced by defaults:
    settings that are not an object, a per-layer-type form without ``layer_type``, an unknown
    type, a key the type requires that is missing, not a number or not positive, and llama3
    frequency factors that do not bound a band."""
    params, theta = _rope_settings(config, layer_type)
    key = "type" if "type" in params.values and "rope_type" not in params.values else "rope_type"
    kind = params.values.get(key, "default")
    if not isinstance(kind, str) or kind not in HF_ROPE_KEYS:
        raise ModelFormatError(params.field(key), f"unsupported RoPE type {kind!r:.80}; "
                                                  f"supported: {sorted(HF_ROPE_KEYS)}")
    def default(name: str, value: Any) -> Any:
        return _REQUIRED if name in HF_ROPE_KEYS[kind] else value

    low = params.positive("low_freq_factor", default("low_freq_factor", 1.0))
    high = params.positive("high_freq_factor", default("high_freq_factor", 4.0))
    if kind == "llama3" and not low < high:
        raise ModelFormatError(params.field("high_freq_factor"), f"{high} is not above low_freq_factor {low}")
    context = "original_max_position_embeddings"
    return RopeConfig(
        base=theta.positive("rope_theta", 10000.0, ROPE_BASE_ABOVE), kind=kind,
        factor=params.positive("factor", default("factor", 1.0)), low_freq_factor=low, high_freq_factor=high,
        original_context=params.count(context, default(context, 8192), MAX_TOKENS))


def _rope_settings(config: dict[str, Any], layer_type: str) -> tuple[Settings, Settings]:
    """The RoPE scaling settings of ``layer_type`` layers, and the settings holding their
    ``rope_theta`` (the same object in transformers 5, the config itself in transformers 4)."""
    params = config.get("rope_parameters")
    if params is None:  # transformers 4
        scaling = config.get("rope_scaling")
        if scaling is not None and not isinstance(scaling, dict):
            raise ModelFormatError("config.json:rope_scaling", f"expected an object, got {scaling!r:.80}")
        return (Settings(scaling or {}, label="config.json:rope_scaling."),
                Settings(config, label="config.json:"))
    label = "config.json:rope_parameters"
    if isinstance(params, dict) and params.keys() & {FULL, SLIDING}:  # one object per layer type
        params, label = params.get(layer_type), f"{label}.{layer_type}"
        if params is None:
            raise ModelFormatError(label, f"missing: the settings are per layer type, none for {layer_type}")
    if not isinstance(params, dict):
        raise ModelFormatError(label, f"expected an object, got {params!r:.80}")
    s = Settings(params, label=label + ".")
    return s, s


@dataclass
class ModelArgs:
    """What every architecture here needs from a file's settings.

    ``tie_embeddings`` None means "tied when the file has no output matrix" (GGUF);
    ``layer_types`` holds "full_attention" / "sliding_attention" per layer (empty: all full).
    """

    architecture: str
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float = 1e-6
    vocab_size: int = 0  # 0: taken from the embedding table
    context_length: int = 2048
    rope: RopeConfig = field(default_factory=RopeConfig)
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    tie_embeddings: bool | None = None
    rope_interleaved: bool = False  # GGUF llama: Q/K rows permuted for pairwise rotation
    qk_norm: bool = False
    attention_biases: tuple[str, ...] = ()  # projections ("q", "k", "v", "o") that have a bias
    TIE_DEFAULT: ClassVar[bool] = False  # transformers' tie_word_embeddings default for the family

    @classmethod
    def from_gguf(cls, metadata: dict[str, Any], offsets: dict[str, int] | None = None) -> ModelArgs:
        arch = Settings(metadata, offsets=offsets).get("general.architecture", str)
        s = Settings(metadata, f"{arch}.", offsets=offsets)
        return cls(**cls._check(s, cls.gguf_fields(s, arch)))

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> ModelArgs:
        s = Settings(config, label="config.json:")
        return cls(**cls._check(s, cls.hf_fields(s, config)))

    @classmethod
    def gguf_fields(cls, s: Settings, arch: str) -> dict[str, Any]:
        """Constructor arguments from GGUF metadata (subclasses add theirs)."""
        d, heads = s.count("embedding_length"), s.count("attention.head_count")
        head_dim = s.count("attention.key_length", None) or _split(s, d, heads, "attention.head_count")
        for key in ("attention.value_length", "rope.dimension_count"):
            if s.get(key, int, head_dim) != head_dim:
                raise ModelFormatError(s.field(key), f"differs from the head size {head_dim} (not supported)")
        return dict(architecture=arch, hidden_size=d, num_layers=s.count("block_count"), num_heads=heads,
                    num_kv_heads=s.count("attention.head_count_kv", heads), head_dim=head_dim,
                    intermediate_size=s.count("feed_forward_length"),
                    norm_eps=s.positive("attention.layer_norm_rms_epsilon", 1e-6),
                    vocab_size=s.count("vocab_size", 0, MAX_TOKENS),
                    context_length=s.count("context_length", 2048, MAX_TOKENS), rope=gguf_rope(s))

    @classmethod
    def hf_fields(cls, s: Settings, config: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments from config.json (subclasses add theirs)."""
        d, heads = s.count("hidden_size"), s.count("num_attention_heads")
        return dict(architecture=s.get("model_type", str), hidden_size=d,
                    num_layers=s.count("num_hidden_layers"), num_heads=heads,
                    num_kv_heads=s.count("num_key_value_heads", heads),
                    head_dim=s.count("head_dim", None) or _split(s, d, heads, "num_attention_heads"),
                    intermediate_size=s.count("intermediate_size"),
                    norm_eps=s.positive("rms_norm_eps", 1e-6),
                    vocab_size=s.count("vocab_size", 0, MAX_TOKENS),
                    context_length=s.count("max_position_embeddings", 2048, MAX_TOKENS),
                    rope=hf_rope(config), layer_types=s.sequence("layer_types"),
                    sliding_window=s.count("sliding_window", None, MAX_TOKENS),
                    tie_embeddings=s.get("tie_word_embeddings", bool, cls.TIE_DEFAULT),
                    attention_biases=("q", "k", "v", "o") if s.get("attention_bias", bool, False) else ())

    @staticmethod
    def _check(s: Settings, f: dict[str, Any]) -> dict[str, Any]:
        if f["num_heads"] % f["num_kv_heads"]:
            raise ModelFormatError(s.field("num_key_value_heads" if s.label else "attention.head_count_kv"),
                                   f"{f['num_heads']} heads do not split into {f['num_kv_heads']} KV groups")
        types = f.get("layer_types", ())
        if types and (len(types) != f["num_layers"] or not all(t in (FULL, SLIDING) for t in types)):
            raise ModelFormatError(s.field("layer_types"), f"expected {f['num_layers']} entries of "
                                                           f"{FULL!r} / {SLIDING!r}")
        if SLIDING in types and not f.get("sliding_window"):
            raise ModelFormatError(s.field("sliding_window"), "sliding layers need a window size")
        return f

    def layer_window(self, i: int) -> int | None:
        """The sliding window of layer ``i``, None for full attention."""
        return self.sliding_window if self.layer_types and self.layer_types[i] == SLIDING else None


def _split(s: Settings, d: int, heads: int, key: str) -> int:
    if d % heads:
        raise ModelFormatError(s.field(key), f"width {d} does not split into {heads} heads")
    return d // heads
