"""Mixture-of-experts blocks of the llama-style decoder (mixtral, qwen3moe): their settings, each
family's tensor names, and the builder of a block's feed-forward layer.

Settings: GGUF ``{arch}.expert_count``, ``expert_used_count``, ``expert_feed_forward_length``
(else ``feed_forward_length``) and ``expert_weights_norm`` (llama.cpp renormalises the chosen
weights of both families); config.json ``num_experts`` (qwen3_moe; transformers 5 writes
``num_local_experts``, mixtral's name), ``num_experts_per_tok``, ``moe_intermediate_size`` (else
``intermediate_size``), ``norm_topk_prob``, and qwen3_moe's dense layers (``mlp_only_layers``,
``decoder_sparse_step``).

Weights are keyed per expert as checkpoints name them (``mlp.experts.3.up_proj``,
``block_sparse_moe.experts.3.w3``): a GGUF's stacked ``ffn_*_exps`` tensors are sliced into
those names when read (``weights_source``), and :func:`sanitize` splits transformers 5's fused
in-memory form (``experts.gate_up_proj [E, 2F, D]``, ``experts.down_proj [E, D, F]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ModelFormatError
from ...layers.base import Layer
from .layer_builders import mlp_layer, require
from .llm_layers import LLMGatedMLP, Matrix
from .model_args import ModelArgs, Settings
from .moe_layer import LLMMixtureOfExperts

__all__ = ["MoESpec", "feed_forward", "gguf_moe", "hf_moe", "sanitize"]


@dataclass(frozen=True)
class ExpertNames:
    """A family's MoE tensor names within ``model.layers.N.``: ``{prefix}.{router}`` and
    ``{prefix}.experts.{e}.{gate|up|down}``; ``normalise_key`` is the config.json switch that
    renormalises the chosen weights (None: always renormalised)."""

    prefix: str
    router: str
    gate: str
    up: str
    down: str
    normalise_key: str | None


QWEN3_MOE = ExpertNames("mlp", "gate", "gate_proj", "up_proj", "down_proj", "norm_topk_prob")
MIXTRAL = ExpertNames("block_sparse_moe", "gate", "w1", "w3", "w2", None)
# model name (GGUF general.architecture or model_type) -> its MoE names; GGUF's llama holds mixtral
EXPERT_NAMES = {"llama": MIXTRAL, "mixtral": MIXTRAL, "qwen3moe": QWEN3_MOE, "qwen3_moe": QWEN3_MOE}
# the families that are nothing but MoE: their expert settings are required
MOE_ONLY = ("mixtral", "qwen3moe", "qwen3_moe")
# GGUF block stems of the MoE tensors -> each family's transformers names (stacked over experts)
GGUF_NAMES = {n: {"ffn_gate_inp": f"{n.prefix}.{n.router}", **{
    f"ffn_{part}_exps": f"{n.prefix}.experts.{getattr(n, part)}" for part in ("gate", "up", "down")}}
    for n in (QWEN3_MOE, MIXTRAL)}


@dataclass(frozen=True)
class MoESpec:
    """``experts`` of width ``width``, ``used`` per token, their weights renormalised when
    ``normalise``; blocks in ``dense_layers`` have a plain MLP instead."""

    experts: int
    used: int
    width: int
    normalise: bool
    names: ExpertNames
    dense_layers: tuple[int, ...] = ()

    def sparse(self, i: int) -> bool:
        return i not in self.dense_layers


def gguf_moe(s: Settings, arch: str) -> MoESpec | None:
    """The MoE settings of GGUF metadata (None for a dense model)."""
    if s.raw("expert_count") is None and arch not in MOE_ONLY:
        return None
    n = s.count("expert_count")
    names = _names(s, arch, "expert_count")
    width = s.count("expert_feed_forward_length", None) or s.count("feed_forward_length")
    normalise = s.get("expert_weights_norm", bool, True)
    return MoESpec(n, _used(s, "expert_used_count", n), width, normalise, names)


def hf_moe(s: Settings, config: dict[str, Any]) -> MoESpec | None:
    """The MoE settings of config.json (None for a dense model)."""
    model_type = config.get("model_type")
    own = "num_local_experts" if model_type == "mixtral" else "num_experts"  # the family's own name
    key = next((k for k in ("num_experts", "num_local_experts") if k in config), own)
    if s.raw(key) is None and model_type not in MOE_ONLY:
        return None
    n = s.count(key)
    names = _names(s, model_type, key)
    normalise = True if names.normalise_key is None else s.get(names.normalise_key, bool, False)
    width = s.count("moe_intermediate_size", None) or s.count("intermediate_size")
    return MoESpec(n, _used(s, "num_experts_per_tok", n), width, normalise, names, _dense_layers(s))


def _names(s: Settings, arch: str, key: str) -> ExpertNames:
    names = EXPERT_NAMES.get(arch)
    if names is None:
        raise ModelFormatError(s.field(key), f"experts in a {arch!r} model are not supported "
                                             f"(mixture of experts: {', '.join(sorted(EXPERT_NAMES))})")
    return names


def _used(s: Settings, key: str, n: int) -> int:
    k = s.count(key)
    if k > n:
        raise ModelFormatError(s.field(key), f"{k} experts per token, but the model has {n}",
                               s.offsets.get(s.prefix + key))
    return k


def _dense_layers(s: Settings) -> tuple[int, ...]:
    """qwen3_moe's blocks with a plain MLP: those in ``mlp_only_layers`` and, with
    ``decoder_sparse_step`` n, all but every n-th (transformers' Qwen3MoeDecoderLayer)."""
    layers = s.count("num_hidden_layers")
    listed = s.sequence("mlp_only_layers")
    if not all(isinstance(i, int) and not isinstance(i, bool) for i in listed):
        raise ModelFormatError(s.field("mlp_only_layers"), "expected a list of block numbers")
    step = s.count("decoder_sparse_step", 1)
    return tuple(i for i in range(layers) if i in listed or (i + 1) % step)


def feed_forward(args: ModelArgs, weights: dict[str, Matrix], i: int) -> Layer:
    """Block ``i``'s feed-forward layer: its mixture of experts, or the gated MLP of a dense block
    (``args`` of a family with a ``moe`` field: llama's, qwen's)."""
    moe: MoESpec | None = args.moe
    if moe is None or not moe.sparse(i):
        return mlp_layer(args, weights, i)
    names, d, f = moe.names, args.hidden_size, moe.width
    p = f"model.layers.{i}.{names.prefix}."
    router = require(weights, f"{p}{names.router}.weight", (moe.experts, d))
    experts = []
    for e in range(moe.experts):
        q = f"{p}experts.{e}."
        experts.append(LLMGatedMLP({"gate": require(weights, f"{q}{names.gate}.weight", (f, d)),
                                    "up": require(weights, f"{q}{names.up}.weight", (f, d)),
                                    "down": require(weights, f"{q}{names.down}.weight", (d, f))}))
    return LLMMixtureOfExperts(router, experts, moe.used, moe.normalise)


# transformers 5's fused experts (as its modules hold them): model.layers.N.mlp.experts.gate_up_proj
_FUSED = re.compile(r"model\.layers\.(\d+)\.(\w+)\.experts\.(gate_up_proj|down_proj)")


def sanitize(weights: dict[str, Matrix], args: ModelArgs) -> dict[str, Matrix]:
    """Fused expert tensors split into the family's per-expert names (the router moved along
    when it sits under another prefix): ``gate_up_proj[e]`` is expert e's gate rows, then its up
    rows."""
    moe: MoESpec | None = args.moe
    if moe is None:
        return weights
    names = moe.names
    for key in [k for k in weights if _FUSED.fullmatch(k)]:
        block, prefix, kind = _FUSED.fullmatch(key).groups()
        w = np.asarray(weights.pop(key), np.float32)
        if w.ndim != 3 or (kind == "gate_up_proj" and w.shape[1] % 2):
            raise ModelFormatError(key, f"shape {w.shape}, expected [experts, rows, cols]"
                                        f"{' with gate and up rows' if kind == 'gate_up_proj' else ''}")
        p = f"model.layers.{block}.{names.prefix}."
        parts = {names.gate: slice(0, w.shape[1] // 2), names.up: slice(w.shape[1] // 2, None)} \
            if kind == "gate_up_proj" else {names.down: slice(None)}
        for e in range(w.shape[0]):
            for name, rows in parts.items():
                weights[f"{p}experts.{e}.{name}.weight"] = w[e, rows]
        router = f"model.layers.{block}.{prefix}.gate.weight"
        if router in weights and prefix != names.prefix:
            weights[f"{p}{names.router}.weight"] = weights.pop(router)
    return weights
