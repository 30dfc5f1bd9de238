"""The volumetric network: a depth x rows x cols grid with ``layers_per_cell`` layers per cell.

Forward is Loom's strict chain in flat-index order (spec §5.1): every enabled cell receives the
previous cell's output. Containers (Parallel, Sequential) run their children through the same
:class:`Run`, which resolves remote links, records what backward needs and emits observer
events.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from .backend import Backend, get_backend
from .enums import LAYER_TYPES, dtype_nbytes, lookup
from .errors import LoomConfigError, LoomShapeError
from .layers.base import Layer
from .observe import LayerEvent, LayerStats, Observer

Coord = tuple[int, int, int, int]

# "loom": each grid layer computes in float64 and its output is rounded to the activation dtype,
# as Loom accumulates in f64 and stores float32 tensors. "fast": everything in the input dtype.
PRECISIONS = ("loom", "fast")


def compute_dtypes(input_dtype, precision: str, xp=np) -> tuple[type, type]:
    """``(act, compute)``: the dtype between grid layers for an input of ``input_dtype`` (float64
    stays float64, anything else is float32) and the dtype layers compute in under ``precision``,
    as dtypes of the array namespace ``xp``."""
    act = xp.float64 if input_dtype == xp.float64 else xp.float32
    return act, (xp.float64 if precision == "loom" else act)


class Run:
    """One forward pass (and the backward pass over what it recorded)."""

    def __init__(self, net: VolumetricNetwork, train: bool):
        self.net = net
        self.xp = net.backend.xp
        self.train = train
        # asked once per pass: observers that skip it cost nothing while it runs
        self.listeners = [o for o in net.observers if o.wants(net.step_count)]

    def resolve(self, child: Layer) -> Layer:
        """The layer a container child stands for: its remote-link target, if it has one."""
        if child.cfg.is_remote_link:
            target = self.net.layer_at(child.cfg.target)
            if target is not None:
                return target
        return child

    def call(self, layer: Layer, x, skip=None):
        """Run ``layer`` forward; returns ``(y, token)`` where token feeds :meth:`back`."""
        y, cache = layer.forward(x, self, skip)
        if self.listeners:
            self.net._emit("forward", layer, y, self.listeners)
        return y, (layer, cache)

    def back(self, token, gy):
        layer, cache = token
        if self.listeners:
            self.net._emit("backward", layer, gy, self.listeners)
        return layer.backward(cache, gy, self)

    @staticmethod
    def skip_grad(token, gy):
        layer, cache = token
        return layer.skip_grad(cache, gy)


@dataclass
class Trace:
    """One forward pass through the grid: per executed cell its flat index, its output (kept
    only when training) and its backward token."""

    run: Run
    act: type  # the activation dtype between grid layers
    compute: type  # the dtype layers compute in
    cells: list[int] = field(default_factory=list)
    outputs: list = field(default_factory=list)
    tokens: list = field(default_factory=list)
    output: object = None


@dataclass
class BlueprintRow:
    index: int
    z: int
    y: int
    x: int
    l: int  # noqa: E741
    path: str
    type: str
    activation: str
    dtype: str
    parameters: int
    bytes: int
    input_shape: list[int]
    output_shape: list[int]
    disabled: bool
    remote_target: Coord | None


class VolumetricNetwork:
    """A 3-D grid of polymorphic layers.

    >>> net = VolumetricNetwork(1, 1, 1, 2)
    >>> net[0, 0, 0, 0] = make_layer("Dense", input_height=2, output_height=3, activation="Tanh")
    """

    def __init__(self, depth: int, rows: int, cols: int, layers_per_cell: int, *,
                 backend: str | Backend = "numpy", precision: str = "loom"):
        for name, v in (("depth", depth), ("rows", rows), ("cols", cols),
                        ("layers_per_cell", layers_per_cell)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise LoomConfigError(f"{name} must be a positive integer, got {v!r}")
        self.depth, self.rows, self.cols, self.layers_per_cell = depth, rows, cols, layers_per_cell
        self.cells: list[Layer | None] = [None] * (depth * rows * cols * layers_per_cell)
        self.backend = backend if isinstance(backend, Backend) else get_backend(backend)
        self.precision = precision
        self.observers: list[Observer] = []
        self.step_count = 0
        self._tape: list | None = None
        self._act_dtype = np.float32

    # ----- geometry ----------------------------------------------------------------
    @property
    def shape(self) -> Coord:
        return (self.depth, self.rows, self.cols, self.layers_per_cell)

    @property
    def precision(self) -> str:
        return self._precision

    @precision.setter
    def precision(self, value: str) -> None:
        if value not in PRECISIONS:
            raise LoomConfigError(f"precision must be one of {PRECISIONS}, got {value!r}")
        self._precision = value

    def index(self, coord: Coord) -> int:
        """Flat index ``((z*rows + y)*cols + x)*layers_per_cell + l`` of an in-grid coordinate."""
        if len(coord) != 4 or any(not 0 <= c < n for c, n in zip(coord, self.shape, strict=True)):
            raise IndexError(f"coordinate {tuple(coord)} is outside the grid {self.shape}")
        z, y, x, l = coord  # noqa: E741
        return ((z * self.rows + y) * self.cols + x) * self.layers_per_cell + l

    def coord(self, index: int) -> Coord:
        index, l = divmod(index, self.layers_per_cell)  # noqa: E741
        index, x = divmod(index, self.cols)
        z, y = divmod(index, self.rows)
        return (z, y, x, l)

    def __getitem__(self, coord: Coord) -> Layer | None:
        return self.cells[self.index(coord)]

    def __setitem__(self, coord: Coord, layer: Layer) -> None:
        if not isinstance(layer, Layer):
            raise TypeError(f"expected a Layer, got {type(layer).__name__}")
        self.cells[self.index(coord)] = layer
        _place(layer, tuple(coord), "")

    def layer_at(self, coord: Coord) -> Layer | None:
        try:
            return self[coord]
        except IndexError:
            return None

    def layers(self) -> Iterator[tuple[Coord, Layer]]:
        """Grid layers in flat-index order (empty cells skipped)."""
        for i, layer in enumerate(self.cells):
            if layer is not None:
                yield self.coord(i), layer

    def all_layers(self) -> Iterator[Layer]:
        """Every layer object once, nested children included."""
        seen: set[int] = set()
        for _, top in self.layers():
            for layer in top.walk():
                if id(layer) not in seen:
                    seen.add(id(layer))
                    yield layer

    def weighted_layers(self) -> list[Layer]:
        return [la for la in self.all_layers() if la.weights is not None]

    # ----- computation -------------------------------------------------------------
    def forward(self, x, *, train: bool = False):
        """Run ``x`` through every enabled cell in flat order.

        ``x`` is float32 (float64 input keeps float64 end to end, used by gradient checks).
        With ``train=True`` the pass is recorded for :meth:`backward`.
        Returns an array of the input's float dtype on this network's backend.
        """
        trace = self.trace(x, train=train)
        self._tape = trace if train else None
        return trace.output

    def trace(self, x, *, train: bool = True) -> Trace:
        """Forward ``x`` and return the record of the pass (what :meth:`forward` is built on);
        trainers that need every layer's output and token use it directly."""
        xp = self.backend.xp
        if self.precision == "loom" and not self.backend.has_float64:
            raise LoomConfigError(f"precision 'loom' computes in float64, which the {self.backend.name!r} "
                                  "backend's device lacks; use precision='fast' (float32)")
        x = xp.asarray(x)
        trace = Trace(Run(self, train), *compute_dtypes(x.dtype, self.precision, xp))
        act = trace.act
        current = xp.astype(x, act)
        for i, layer in enumerate(self.cells):
            if layer is None:
                raise LoomShapeError(f"grid cell {self.coord(i)} holds no layer")
            if layer.cfg.is_disabled:
                continue
            y, token = trace.run.call(layer, xp.astype(current, trace.compute, copy=False))
            current = xp.astype(y, act, copy=False)
            if train:
                trace.cells.append(i)
                trace.outputs.append(current)
                trace.tokens.append(token)
        self.step_count += 1
        trace.output = current
        return trace

    def count_pass(self) -> None:
        """Record a forward pass made for this network elsewhere (many networks batched together):
        the step count advances and no pass is left for :meth:`backward`, as after ``forward``."""
        self.step_count += 1
        self._tape = None

    def backward(self, grad):
        """Back-propagate dL/d(output) of the last ``forward(train=True)``; returns dL/d(input).

        Parameter gradients are added to each layer's ``grad`` (see :meth:`zero_grad`).
        """
        if self._tape is None:
            raise LoomConfigError("backward() needs a preceding forward(..., train=True)")
        trace, xp = self._tape, self.backend.xp
        g = xp.asarray(grad, dtype=trace.compute, copy=True)  # a float64 host gradient may not fit the device
        for token in reversed(trace.tokens):
            g = trace.run.back(token, g)
        return xp.astype(g, trace.act, copy=False)

    def zero_grad(self) -> None:
        for layer in self.all_layers():
            layer.grad = None

    def reset_state(self) -> None:
        """Clear state kept between calls (attention KV caches and positions)."""
        for layer in self.all_layers():
            layer.reset_state()

    # ----- observers ---------------------------------------------------------------
    def attach(self, observer: Observer) -> Observer:
        self.observers.append(observer)
        return observer

    def detach(self, observer: Observer) -> None:
        self.observers.remove(observer)

    def _emit(self, direction: str, layer: Layer, tensor, listeners: list[Observer]) -> None:
        z, y, x, l = getattr(layer, "coords", (0, 0, 0, 0))  # noqa: E741
        event = LayerEvent(direction, z, y, x, l, lookup(LAYER_TYPES, layer.type_name).id,
                           LayerStats.of(tensor), self.step_count, getattr(layer, "path", ""),
                           mode=self.backend.name)
        for obs in listeners:
            obs.on_event(event)

    # ----- description -------------------------------------------------------------
    def parameter_count(self) -> int:
        """Elements of every weight tensor, a tensor shared by two layers counted once (a language
        model's tied LM head multiplies with its embedding's own matrix)."""
        sizes: dict[int, int] = {}
        for la in self.weighted_layers():
            sizes.update(la.weights.tensor_sizes())
        return sum(sizes.values())

    def memory_bytes(self) -> int:
        """Loom's CalculateTotalMemory: packed bytes of every weight in its dtype (spec §4.9)."""
        return sum(self.memory_by_dtype().values())

    def memory_by_dtype(self) -> dict[str, int]:
        """Bytes of weights per encoding: packed bytes of each layer's dtype, or for a language
        model's matrices the bytes of their GGUF blocks. Tensors two layers share (a tied head not
        morphed apart from its embedding) are one copy in memory, so they count once."""
        out: dict[str, int] = {}
        seen: set[tuple] = set()
        for la in self.weighted_layers():
            for key, (encoding, n) in la.weights.stored(la.cfg.dtype).items():
                if key not in seen:
                    seen.add(key)
                    out[encoding] = out.get(encoding, 0) + n
        return out

    def blueprint(self) -> list[BlueprintRow]:
        """One row per layer (grid cells and nested children), in traversal order."""
        rows: list[BlueprintRow] = []
        for i, layer in enumerate(self.cells):
            if layer is not None:
                _blueprint_rows(layer, i, self.coord(i), "", rows)
        return rows

    def summary(self) -> dict:
        """Sizes for a status line: ``cells`` is depth x rows x cols, each holding up to
        ``layers_per_cell`` layers; ``layers`` counts the grid layers present (nested children not)."""
        return {
            "shape": list(self.shape),
            "cells": self.depth * self.rows * self.cols,
            "layers_per_cell": self.layers_per_cell,
            "layers": sum(1 for _ in self.layers()),
            "parameters": self.parameter_count(),
            "memory_bytes": self.memory_bytes(),
            "memory_by_dtype": self.memory_by_dtype(),
        }


def _place(layer: Layer, coords: Coord, path: str) -> None:
    """Record where a layer sits, for events and the blueprint (children inherit the cell)."""
    layer.coords = coords
    layer.path = path
    for name, kids in _child_groups(layer):
        for j, child in enumerate(kids):
            _place(child, coords, f"{path}.{name}[{j}]" if path else f"{name}[{j}]")


def _child_groups(layer: Layer):
    return [(layer.children_key, layer.children)] if layer.children else []


def _blueprint_rows(layer: Layer, index: int, coord: Coord, path: str, rows: list) -> None:
    cfg = layer.cfg
    n = len(layer.weights) if layer.weights is not None else 0
    ins, outs = layer.describe_shapes()
    rows.append(BlueprintRow(index, *coord, path, layer.type_name, cfg.activation, cfg.dtype, n,
                             dtype_nbytes(cfg.dtype, n), list(ins), list(outs), cfg.is_disabled,
                             cfg.target if cfg.is_remote_link else None))
    for name, kids in _child_groups(layer):
        for j, child in enumerate(kids):
            _blueprint_rows(child, index, coord, f"{path}.{name}[{j}]" if path else f"{name}[{j}]", rows)
