"""The polymorphic layer: its configuration, the family registry and the forward/backward contract.

A layer family is a subclass of :class:`Layer` registered under Loom's canonical type name
(``@register``). The network never branches on layer types: it asks the registry for the class
and calls the contract below.

Contract of a family:
* ``param_count(cfg)`` — length of the flat parameter vector (spec §3.5); 0 for unweighted types.
* ``check(path)`` — reject an impossible configuration with :class:`LoomFormatError`.
* ``forward(x, ctx, skip=None) -> (y, cache)`` — ``x`` is an array on ``ctx.xp``; the math runs in
  ``x.dtype``; ``cache`` is whatever backward needs (None when ``ctx.train`` is false is fine).
* ``backward(cache, gy, ctx) -> gx`` — returns dL/dx and *adds* dL/dparams with :meth:`Layer.add_grad`
  into ``self.device_grad`` (a flat vector in the master's layout, on the device it was computed
  on, in the widest float there: float64 on the host); ``self.grad`` is its host float64 copy.
* ``skip_grad(cache, gy)`` — dL/dskip for layers that consume a skip tensor (Residual).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, ClassVar

import numpy as np

from .. import edits
from ..activations import LINEAR
from ..backend import array_module, host_dtype, to_host, widest_float
from ..enums import ACTIVATIONS, lookup
from ..errors import LoomFormatError
from ..weights import WeightStore, uniform_weights


@dataclass
class LayerConfig:
    """Every field of Loom's layer object (spec §2.3), in the serializer's key order.

    Enumerations are held as canonical strings (``"Dense"``, ``"Tanh"``, ``"float32"``).
    """

    type: str = "Dense"
    activation: str = "Linear"
    dtype: str = "float32"
    input_height: int = 0
    input_width: int = 0
    input_depth: int = 0
    output_height: int = 0
    output_width: int = 0
    output_depth: int = 0
    input_channels: int = 0
    filters: int = 0
    kernel_size: int = 0
    stride: int = 0
    padding: int = 0
    output_padding: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    query_dim: int = 0
    d_model: int = 0
    seq_length: int = 1
    rope_freq_base: float = 0.0
    vocab_size: int = 0
    embedding_dim: int = 0
    num_clusters: int = 0
    kmeans_temperature: float = 0.0
    output_mode: str = ""
    softmax_type: str = "Standard"
    temperature: float = 0.0
    softmax_rows: int = 0
    softmax_cols: int = 0
    entmax_alpha: float = 0.0
    gumbel_noise: bool = False
    combine_mode: str = ""
    use_tiling: bool = False
    tile_size: int = 0
    is_disabled: bool = False
    # In memory only in Loom's persistence schema (build schema reads them).
    mask: list[bool] | None = None
    hierarchy_levels: list[int] | None = None
    is_remote_link: bool = False
    target_z: int = 0
    target_y: int = 0
    target_x: int = 0
    target_l: int = 0

    @property
    def act_id(self) -> int:
        entry = lookup(ACTIVATIONS, self.activation)
        return LINEAR if entry is None else entry.id

    @property
    def target(self) -> tuple[int, int, int, int]:
        return (self.target_z, self.target_y, self.target_x, self.target_l)

    def __setattr__(self, name, value):
        object.__setattr__(self, name, value)
        edits.bump()  # a compiled step built from this layer looks again (core.edits)

    @classmethod
    def defaults(cls) -> LayerConfig:
        """A config of every default, made without the per-field edit record of ``__init__``: a
        reader builds one per layer, and a file may hold tens of thousands."""
        cfg = object.__new__(cls)
        cfg.__dict__.update(_DEFAULTS.__dict__)
        return cfg


CONFIG_FIELDS = tuple(f.name for f in fields(LayerConfig))
_DEFAULTS = LayerConfig()


class Layer:
    """One polymorphic layer; subclasses implement one family each."""

    type_name: ClassVar[str] = ""
    weighted: ClassVar[bool] = False
    # dL/dparams where backward computed it (the backend's device; numpy: the host); optimizers
    # update from it there. ``grad`` is its host copy, made when something reads it.
    device_grad = None
    _host_grad: np.ndarray | None = None

    def __setattr__(self, name, value):
        if name == "children" and type(value) is not edits.EditedList:
            value = edits.EditedList(value)  # its changes are edits too
        object.__setattr__(self, name, value)
        edits.bump()  # a compiled step built from this layer looks again (core.edits)

    def __init__(self, cfg: LayerConfig, weights: WeightStore | None = None,
                 children: list[Layer] | None = None):
        self.cfg = cfg
        self.weights = weights
        self.children: list[Layer] = list(children or [])
        # Loom's JSON key for the children: a Sequential's are "sequential_layers"; any other
        # layer's are "parallel_branches" (NEAT hangs remote links there on any layer type)
        self.children_key = "sequential_layers" if self.type_name == "Sequential" else "parallel_branches"

    # ----- description -------------------------------------------------------------
    @staticmethod
    def param_count(cfg: LayerConfig) -> int:
        return 0

    def check(self, path: str) -> None:
        """Raise :class:`LoomFormatError` naming ``path`` if the configuration cannot run."""

    def describe_shapes(self) -> tuple[list[int], list[int]]:
        """Per-sample input and output shapes for the blueprint (best effort)."""
        return [], []

    def __repr__(self) -> str:
        c = self.cfg
        return f"{type(self).__name__}({c.activation}, {c.dtype}, params={self.param_count(c)})"

    # ----- parameters --------------------------------------------------------------
    def params(self, xp, dtype):
        """The flat parameter vector on ``xp`` in ``dtype``, dequantized from the layer's dtype."""
        return self.weights.values(xp, host_dtype(dtype), self.cfg.dtype)

    def add_grad(self, g) -> None:
        """Accumulate a flat parameter gradient into ``device_grad``, on g's device, in the widest
        float it computes in (float64 on the host, as Loom; float32 on a device without float64)."""
        xp = array_module(g)
        wide = widest_float(xp, g.device)
        if self.device_grad is None:
            self.device_grad = xp.reshape(xp.astype(g, wide, copy=True), (-1,))
        else:
            self.device_grad += xp.reshape(xp.astype(g, wide, copy=False), (-1,))
        self._host_grad = None

    @property
    def grad(self) -> np.ndarray | None:
        """The accumulated parameter gradient as a host float64 vector (None before backward).
        From a device this copies it to the host, once per change; on numpy it is ``device_grad``."""
        if self._host_grad is None and self.device_grad is not None:
            self._host_grad = to_host(self.device_grad).astype(np.float64, copy=False)
        return self._host_grad

    @grad.setter
    def grad(self, value) -> None:
        self.device_grad, self._host_grad = value, None

    def walk(self):
        """This layer and every nested child, depth first."""
        yield self
        for child in self.children:
            yield from child.walk()

    # ----- computation -------------------------------------------------------------
    def forward(self, x, ctx, skip=None):  # pragma: no cover - abstract
        raise NotImplementedError(f"{self.type_name} forward")

    def backward(self, cache, gy, ctx):  # pragma: no cover - abstract
        raise NotImplementedError(f"{self.type_name} backward")

    def skip_grad(self, cache, gy):
        return None

    def reset_state(self) -> None:
        """Forget per-call state kept between calls (attention KV caches)."""


_REGISTRY: dict[str, type[Layer]] = {}


def register(cls: type[Layer]) -> type[Layer]:
    """Class decorator: make ``cls`` the implementation of ``cls.type_name``."""
    _REGISTRY[cls.type_name] = cls
    return cls


def layer_class(type_name: str) -> type[Layer] | None:
    return _REGISTRY.get(type_name)


def implemented_types() -> list[str]:
    return sorted(_REGISTRY)


def make_layer(type_name: str, *, weights=None, scale: float = 1.0, children=None,
               rng: np.random.Generator | None = None, init_scale: float = 0.1,
               **cfg_fields: Any) -> Layer:
    """Build a layer from keyword configuration, e.g.
    ``make_layer("Dense", input_height=4, output_height=2, activation="Tanh")``.

    Weighted layers get ``weights`` if given, else uniform values in [-init_scale, init_scale)
    from ``rng`` (Loom's build-schema initialisation with init_scale=0.1).
    """
    cls = layer_class(type_name)
    if cls is None:
        raise LoomFormatError("$.type", f"layer type {type_name!r} is not implemented")
    unknown = set(cfg_fields) - set(CONFIG_FIELDS)
    if unknown:
        raise TypeError(f"unknown layer fields: {sorted(unknown)}")
    cfg = LayerConfig(type=type_name, **cfg_fields)
    layer = cls(cfg, None, children)
    layer.check("$")
    n = cls.param_count(cfg)
    if cls.weighted:
        if weights is None:
            rng = rng if rng is not None else np.random.default_rng()
            weights = uniform_weights(n, rng, init_scale)
        weights = np.asarray(weights, dtype=np.float32).reshape(-1)
        if weights.size != n:
            raise LoomFormatError("$.weights", f"{type_name} needs {n} weights, got {weights.size}")
        layer.weights = WeightStore(weights, scale)
    return layer


def batch_rows(x, width: int, what: str):
    """The ``B x width`` rows Loom's row-wise layers read: ``B = shape[0]`` rows starting at
    ``b*width`` of the flat tensor, whatever the other dimensions are (spec §5.2). A ``[1, S, d]``
    tensor therefore yields one row: pass ``[S, d]`` to process S rows.
    """
    from ..errors import LoomShapeError

    batch = x.shape[0] if x.ndim else 1
    if width <= 0 or batch <= 0 or x.size < batch * width:
        raise LoomShapeError(f"{what}: input of shape {tuple(x.shape)} does not hold "
                             f"{batch} rows of {width} values")
    xp = array_module(x)
    return xp.reshape(xp.reshape(x, (-1,))[: batch * width], (batch, width))


def rows_to_input(g_rows, x_shape, xp):
    """Inverse of :func:`batch_rows` for gradients: place row gradients back in ``x_shape``.

    Values :func:`batch_rows` did not read get a zero gradient.
    """
    if g_rows.size == math.prod(x_shape):
        return xp.reshape(g_rows, x_shape)
    flat = xp.zeros(math.prod(x_shape), dtype=g_rows.dtype)
    flat[: g_rows.size] = xp.reshape(g_rows, (-1,))
    return xp.reshape(flat, x_shape)
