"""NEAT mutation as Loom does it (``NEATConfig`` / ``NEATMutate``, spec §7.3-7.5).

Every random number comes from Go's ``math/rand`` seeded with ``config.seed``, drawn in Loom's
order, so a seed gives Loom's child. Where Loom's re-initialisation builds a layer that cannot
run (a CNN1 given a 2-D kernel, 2-D/3-D convolutions with zero-size axes, a Parallel keeping a
Dense's weights), the same draws make the same choices but the layer built runs: the differences
are listed in docs/compat.md.

A CNN1 or ConvTransposed1D re-initialised by NEAT holds F·C·k² weights in Loom, a 2-D kernel, and
F·C·k here: its store (:class:`LoomShapedWeights`) keeps Loom's other values beside the runnable
ones, so that a later mutation of it (a population's next generation) perturbs as many weights
as Loom does and every draw after it, in this layer and in the layers and children that follow,
stays Loom's.
"""

from __future__ import annotations

import dataclasses
import os
import reprlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...enums import LAYER_TYPES, by_id
from ...errors import LoomConfigError
from ...layers.base import Layer, LayerConfig, layer_class
from ...network import VolumetricNetwork
from ...weights import LoomShapedWeights, WeightStore
from .budget import check_fits
from .clone import clone_network
from .gorand import GoRand
from .values import check_number

#: Loom's default: every layer type but Parallel, Sequential and Metacognition
DEFAULT_ALLOWED_TYPES = (0, 7, 8, 3, 2, 1, 9, 4, 5, 6, 10, 11, 12, 13, 14, 15, 18)
#: what an activation mutation picks from, in Loom's order
MUTATION_ACTIVATIONS = ("ReLU", "Silu", "GELU", "Tanh", "Sigmoid", "Linear")
INIT_SCALE = np.float32(0.05)  # Loom's Randomize(seed, 0.05) for a re-initialised layer
INT64_MAX = (1 << 63) - 1
FLOAT32_MAX = float(np.finfo(np.float32).max)

_RATES = ("weight_perturb_rate", "node_mutate_rate", "connection_add_rate", "connection_drop_rate",
          "activation_mut_rate", "layer_toggle_rate")
#: the sizes of re-initialised layers and their least values (0: Loom's fallback, as in its code)
_SIZES = {"d_model": 1, "default_num_heads": 0, "default_in_channels": 0, "default_filters": 0,
          "default_kernel_size": 0, "default_vocab_size": 1, "default_num_clusters": 1}
#: the layer types whose NEAT re-initialisation Loom gives a 2-D kernel (F·C·k², spec §7.5) where
#: ours, 1-D, runs on F·C·k weights
_LOOM_SQUARE_KERNEL = ("CNN1", "ConvTransposed1D")
#: the sizes that set the weight count of a re-initialised layer of a type (else d_model alone)
_SIZES_OF = {"Embedding": ("default_vocab_size", "d_model"), "KMeans": ("default_num_clusters", "d_model"),
             "CNN": ("default_filters", "default_in_channels", "default_kernel_size"),
             "ConvTransposed": ("default_filters", "default_in_channels", "default_kernel_size")}
_LOOM_NAMES = {
    "weight_perturb_rate": "WeightPerturbRate", "weight_perturb_scale": "WeightPerturbScale",
    "node_mutate_rate": "NodeMutateRate", "connection_add_rate": "ConnectionAddRate",
    "connection_drop_rate": "ConnectionDropRate", "activation_mut_rate": "ActivationMutRate",
    "layer_toggle_rate": "LayerToggleRate", "allowed_layer_types": "AllowedLayerTypes",
    "d_model": "DModel", "default_num_heads": "DefaultNumHeads",
    "default_in_channels": "DefaultInChannels", "default_filters": "DefaultFilters",
    "default_kernel_size": "DefaultKernelSize", "default_vocab_size": "DefaultVocabSize",
    "default_num_clusters": "DefaultNumClusters", "seed": "Seed",
}


def random_seed() -> int:
    """A fresh int64 seed (Loom takes the clock; a run that is to be repeated names its seed)."""
    return int.from_bytes(os.urandom(8), "little") & INT64_MAX


@dataclass(frozen=True)
class NEATConfig:
    """Loom's ``NEATConfig`` in snake_case; rates are probabilities per layer (per network for
    connections), ``d_model`` is the width of re-initialised layers, ``seed`` the generator's."""

    weight_perturb_rate: float = 0.8
    weight_perturb_scale: float = 0.05
    node_mutate_rate: float = 0.1
    connection_add_rate: float = 0.05
    connection_drop_rate: float = 0.02
    activation_mut_rate: float = 0.1
    layer_toggle_rate: float = 0.02
    allowed_layer_types: tuple[int, ...] = DEFAULT_ALLOWED_TYPES
    d_model: int = 16
    default_num_heads: int = 4
    default_in_channels: int = 1
    default_filters: int = 4
    default_kernel_size: int = 3
    default_vocab_size: int = 256
    default_num_clusters: int = 8
    seed: int = field(default_factory=random_seed)

    def __post_init__(self):
        for name in (*_RATES, "weight_perturb_scale"):
            v = check_number(f"NEAT {name}", getattr(self, name))
            if name in _RATES and not 0 <= v <= 1:
                raise LoomConfigError(f"NEAT {name} must lie in [0, 1], got {v}")
        scale = check_number("NEAT weight_perturb_scale", self.weight_perturb_scale)
        if not 0 <= scale <= FLOAT32_MAX:
            raise LoomConfigError(f"NEAT weight_perturb_scale must lie in [0, {FLOAT32_MAX:.4g}] "
                                  f"(a float32), got {scale}")
        object.__setattr__(self, "weight_perturb_scale", float(np.float32(scale)))
        for name in (*_SIZES, "seed"):
            _check_integer(name, getattr(self, name))
        for name, low in _SIZES.items():
            if getattr(self, name) < low:
                zero = " (0: Loom's default)" if low == 0 else ""
                raise LoomConfigError(f"NEAT {name} must be >= {low}{zero}, got {getattr(self, name)}")
        if not -(1 << 63) <= self.seed <= INT64_MAX:
            raise LoomConfigError(f"NEAT seed must be an int64, got {self.seed}")
        types = self.allowed_layer_types
        if isinstance(types, (str, bytes)) or not hasattr(types, "__iter__"):
            raise LoomConfigError("NEAT allowed_layer_types must be a list of layer type ids, "
                                  f"got {reprlib.repr(types)}")
        types = tuple(types)
        for t in types:
            if isinstance(t, bool) or not isinstance(t, (int, np.integer)):
                raise LoomConfigError(f"NEAT allowed_layer_types holds {reprlib.repr(t)}, "
                                      "not a layer type id")
            try:
                name = by_id(LAYER_TYPES, int(t)).name
            except KeyError:
                raise LoomConfigError(f"NEAT allowed_layer_types holds {t}, which is no Loom layer type "
                                      "(ids 0-19)") from None
            if layer_class(name) is None:
                raise LoomConfigError(f"NEAT allowed_layer_types holds {t} ({name}), which Loom Lab "
                                      "cannot build")
        object.__setattr__(self, "allowed_layer_types", tuple(int(t) for t in types))
        self._check_new_layer_fits()

    def _check_new_layer_fits(self) -> None:
        """Refuse sizes whose largest re-initialised layer could not be allocated here (a kernel
        of 100000 makes a CNN3 of 10^15 weights), before any layer is built."""
        new_type, weights = self.largest_new_layer()
        sizes = next((v for k, v in _SIZES_OF.items() if new_type.startswith(k)), ("d_model",))
        named = ", ".join(f"{name} {getattr(self, name)}" for name in sizes)
        check_fits(4 * weights, f"NEAT {named}: a re-initialised {new_type} layer of {weights:,} weights")

    def largest_new_layer(self) -> tuple[str, int]:
        """The allowed layer type NEAT re-initialises with the most weights at these sizes, and
        that weight count, Loom's (what the layer holds, :func:`loom_weight_count`; ``("", 0)``
        when no allowed type has weights)."""
        best = ("", 0)
        for t in dict.fromkeys(self.allowed_layer_types):
            cls = layer_class(by_id(LAYER_TYPES, t).name)
            if cls.weighted:
                weights = loom_weight_count(cls, _reinit_config(LayerConfig(type="Dense"), cls, self,
                                                                GoRand(0))[0])
                best = max(best, (cls.type_name, weights), key=lambda pair: pair[1])
        return best

    @classmethod
    def default(cls, d_model: int, seed: int | None = None) -> NEATConfig:
        """Loom's ``DefaultNEATConfig(d)``; ``seed`` None draws a random one."""
        _check_integer("d_model", d_model)
        return cls(d_model=d_model, default_num_heads=4 if d_model >= 4 else 1,
                   default_filters=max(1, d_model // 4), seed=random_seed() if seed is None else seed)

    def with_seed(self, seed: int) -> NEATConfig:
        return dataclasses.replace(self, seed=seed)

    def to_loom(self) -> dict:
        out = {loom: getattr(self, ours) for ours, loom in _LOOM_NAMES.items()}
        out["AllowedLayerTypes"] = list(self.allowed_layer_types)
        return out

    @classmethod
    def from_loom(cls, obj: Any) -> NEATConfig:
        """Read Loom's keys; every key must be known, and a missing one is Loom's zero value."""
        if not isinstance(obj, dict):
            raise LoomConfigError(f"a NEAT config is an object, got {type(obj).__name__}")
        by_loom = {loom: ours for ours, loom in _LOOM_NAMES.items()}
        unknown = set(obj) - set(by_loom)
        if unknown:
            raise LoomConfigError(f"unknown NEAT config keys: {', '.join(sorted(unknown))}")
        values = {ours: 0 for ours in _LOOM_NAMES}
        values["allowed_layer_types"] = ()
        values.update({by_loom[k]: v for k, v in obj.items()})
        return cls(**values)


def _check_integer(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise LoomConfigError(f"NEAT {name} must be an integer, got {reprlib.repr(value)}")


def neat_mutate(net: VolumetricNetwork, config: NEATConfig) -> VolumetricNetwork:
    """Loom's ``NEATMutate``: a mutated copy of ``net`` (``net`` itself is not changed)."""
    child = clone_network(net)
    rng = GoRand(config.seed)
    layers = list(child.layers())
    for coord, layer in layers:
        child[coord] = _mutate_layer(layer, config, rng)
    if rng.float64() < config.connection_add_rate and len(layers) >= 2:
        _add_connection(child, [c for c, _ in layers], rng)
    if rng.float64() < config.connection_drop_rate:
        _drop_connection(child, rng)
    return child


def _mutate_layer(layer: Layer, config: NEATConfig, rng: GoRand) -> Layer:
    store = layer.weights
    if rng.float64() < config.weight_perturb_rate and store is not None and len(store):
        # one draw per weight Loom's layer holds, in Loom's order: the runnable ones, then any
        # more that Loom's re-initialisation gave it (LoomShapedWeights)
        rest = store.loom_rest if isinstance(store, LoomShapedWeights) else None
        n = len(store)
        noise = (rng.float32_array(n + (0 if rest is None else rest.size)) * np.float32(2) - np.float32(1)) \
            * np.float32(config.weight_perturb_scale)
        store.master = store.master + noise[:n]
        if rest is not None:
            store.loom_rest = rest + noise[n:]
        store.touch()
    if rng.float64() < config.activation_mut_rate:
        layer.cfg.activation = MUTATION_ACTIVATIONS[rng.intn(len(MUTATION_ACTIVATIONS))]
    if rng.float64() < config.node_mutate_rate:
        current = LAYER_TYPES[layer.cfg.type.lower()].id
        candidates = [t for t in config.allowed_layer_types if t != current]
        if candidates:
            new_type = candidates[rng.intn(len(candidates))]
            layer = reinitialised(layer, by_id(LAYER_TYPES, new_type).name, config, rng)
    if rng.float64() < config.layer_toggle_rate:
        layer.cfg.is_disabled = not layer.cfg.is_disabled
    return layer


def loom_weight_count(cls: type[Layer], cfg: LayerConfig) -> int:
    """How many weights Loom's NEAT re-initialisation gives a ``cls`` layer of ``cfg`` (spec §7.5):
    the layer's own count, but F·C·k² for a CNN1 or ConvTransposed1D."""
    if cls.type_name in _LOOM_SQUARE_KERNEL:
        return cfg.filters * cfg.input_channels * cfg.kernel_size ** 2
    return cls.param_count(cfg)


def reinitialised(layer: Layer, new_type: str, config: NEATConfig, rng: GoRand) -> Layer:
    """``layer`` turned into a fresh ``new_type`` layer of width ``config.d_model`` (spec §7.5),
    drawing the new weights' seed from ``rng`` as Loom does (one ``Int63``, whatever the layer)."""
    cls = layer_class(new_type)
    cfg, weights_seed = _reinit_config(layer.cfg, cls, config, rng)
    out = cls(cfg, None, layer.children)
    out.children_key = layer.children_key
    if cls.weighted:
        n, loom_n = cls.param_count(cfg), loom_weight_count(cls, cfg)
        # Loom's Randomize(seed, 0.05): a generator of its own, one Float32 per weight of Loom's
        # layer; ours runs on the first n (all but a CNN1's or ConvTransposed1D's: F·C·k of F·C·k²)
        values = (GoRand(weights_seed).float32_array(loom_n) * np.float32(2) - np.float32(1)) * INIT_SCALE
        out.weights = WeightStore(values, 1.0) if loom_n == n else LoomShapedWeights(values[:n], values[n:])
    return out


def _reinit_config(old: LayerConfig, cls: type[Layer], config: NEATConfig,
                   rng: GoRand) -> tuple[LayerConfig, int | None]:
    d, new_type = config.d_model, cls.type_name
    cfg = dataclasses.replace(old, type=new_type, input_height=d, output_height=d)
    if new_type in ("Softmax", "Residual", "Parallel", "Sequential"):
        return cfg, None  # no weights, no draw
    if new_type in ("RNN", "LSTM"):
        cfg.input_channels, cfg.seq_length = d, 1
    elif new_type == "SwiGLU":
        cfg.output_height = 2 * d
    elif new_type == "MultiHeadAttention":
        heads = min(max(1, config.default_num_heads), d)  # Loom counts down from above d to d
        while d % heads:
            heads -= 1
        cfg.num_heads = cfg.num_kv_heads = heads
        cfg.head_dim, cfg.d_model, cfg.seq_length = d // heads, d, 1
    elif new_type == "Embedding":
        cfg.vocab_size = cfg.input_height = config.default_vocab_size
        cfg.embedding_dim = d
    elif new_type == "KMeans":
        cfg.num_clusters = cfg.output_height = config.default_num_clusters
        cfg.kmeans_temperature, cfg.output_mode = 1.0, "probabilities"
    elif new_type.startswith(("CNN", "ConvTransposed")):
        cfg.input_channels = max(1, config.default_in_channels)
        cfg.filters = max(1, config.default_filters)
        cfg.kernel_size = config.default_kernel_size if config.default_kernel_size >= 1 else 3
        # Loom sizes only the height axis, leaving any other at 0 (an empty layer); ours gives
        # such an axis size 1, or d when it is the layer's only one (ConvTransposed1D's width)
        for axes in (cls.in_fields, cls.out_fields):
            for name in axes:
                setattr(cfg, name, getattr(cfg, name) or (d if len(axes) == 1 else 1))
    return cfg, rng.int63()


def _add_connection(net: VolumetricNetwork, coords: list, rng: GoRand) -> None:
    n = len(coords)
    a = rng.intn(n)
    b = rng.intn(n)
    while b == a:
        b = rng.intn(n)
    source = net[coords[a]]
    tz, ty, tx, tl = coords[b]
    # a remote link holds Loom's zero-value config (Dense, ReLU, float64) besides its target,
    # but seq_length 1: our reader reads Loom's 0 as 1, so a saved link reloads unchanged
    link = layer_class("Dense")(LayerConfig(type="Dense", activation="ReLU", dtype="float64",
                                            is_remote_link=True, target_z=tz, target_y=ty,
                                            target_x=tx, target_l=tl))
    source.children.append(link)
    if not source.cfg.combine_mode:
        source.cfg.combine_mode = "add"
    net[coords[a]] = source  # places the new child (coordinates and path)


def _drop_connection(net: VolumetricNetwork, rng: GoRand) -> None:
    links = [(layer, child) for _, layer in net.layers() for child in layer.children
             if child.cfg.is_remote_link]
    if links:
        layer, child = links[rng.intn(len(links))]
        layer.children.remove(child)
