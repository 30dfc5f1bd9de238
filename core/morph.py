"""Precision morphing (spec §4.1, §4.6): switch layers between Loom's 21 numeric types.

Morphing never changes the float32 master, so going back to float32 is lossless; the first morph
of a layer fixes its scale for good (Loom's rule). Each morph returns a :class:`MorphReport`
saying what the new dtype costs and how far its weights are from the master.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import dtypes
from .cancel import as_cancel_check
from .errors import LoomConfigError
from .layers.base import Layer
from .network import VolumetricNetwork
from .run_inputs import first_input_layer


@dataclass(frozen=True)
class MorphReport:
    """One layer's weights in its current dtype versus its float32 master."""

    index: int  # flat grid index of the cell holding the layer
    path: str  # "" for a grid cell, "parallel_branches[1]" ... inside containers
    type: str
    dtype: str
    scale: float
    parameters: int
    native_bytes: int
    float32_bytes: int
    rel_error: float  # ||dequantized - master|| / ||master||
    cosine: float  # cosine similarity of dequantized and master (1 when both are zero)


def morph_layer(net: VolumetricNetwork, index: int, dtype: str) -> MorphReport:
    """Morph the grid layer at flat ``index`` to ``dtype`` (Loom's MorphLayer)."""
    if not 0 <= index < len(net.cells) or net.cells[index] is None:
        raise LoomConfigError(f"no layer at flat index {index} (grid has {len(net.cells)} cells)")
    layer = net.cells[index]
    if layer.weights is None:
        raise LoomConfigError(f"layer {index} ({layer.type_name}) has no weights to morph")
    return morph_sublayer(layer, index, dtype)


def morph_all(net: VolumetricNetwork, dtype: str) -> list[MorphReport]:
    """Morph every weighted layer, nested children included, to ``dtype``."""
    cells = weighted_cells(net)
    for index, layer in cells:  # every layer takes it, checked before any changes
        check_target(layer, index, dtype)
    return [morph_sublayer(layer, index, dtype) for index, layer in cells]


def morph_mixed(net: VolumetricNetwork, plan: dict[int, str]) -> list[MorphReport]:
    """Morph grid layers to per-layer dtypes: ``{flat_index: dtype}``."""
    for index, dtype in plan.items():
        if not 0 <= index < len(net.cells) or net.cells[index] is None or net.cells[index].weights is None:
            raise LoomConfigError(f"no weighted layer at flat index {index}")
        check_target(net.cells[index], index, dtype)
    return [morph_layer(net, index, dtype) for index, dtype in plan.items()]


def report(net: VolumetricNetwork) -> list[MorphReport]:
    """A report for every weighted layer in its current dtype."""
    return [layer_report(layer, index) for index, layer in weighted_cells(net)]


def layer_report(layer: Layer, index: int = 0) -> MorphReport:
    store, dtype = layer.weights, layer.cfg.dtype
    rel, cos = store.error(dtype)
    stored = sum(n for _, n in store.stored(dtype).values())
    return MorphReport(index, getattr(layer, "path", ""), layer.type_name, store.encoding(dtype), store.scale,
                       len(store), stored, store.nbytes("float32"), rel, cos)


def morph_sublayer(layer: Layer, index: int, dtype: str) -> MorphReport:
    """Morph one layer object (a grid cell or a child of a container, as a language model's
    layers are) to ``dtype``, one of its weights' targets (Loom's dtypes; a language model's
    matrices also GGUF's block formats); ``index`` is the flat index of the cell holding it."""
    check_target(layer, index, dtype)
    layer.cfg.dtype = layer.weights.morph_to(dtype)
    return layer_report(layer, index)


def check_target(layer: Layer, index: int, dtype: str) -> None:
    """Raise :class:`LoomConfigError` unless ``layer`` (at cell ``index``) can morph to ``dtype``."""
    problem = layer.weights.refusal(dtype)
    if problem:
        raise LoomConfigError(f"{layer.type_name} at cell {index} cannot morph to {dtype!r}: {problem}")


def weighted_cells(net: VolumetricNetwork) -> list[tuple[int, Layer]]:
    """``(flat cell index, layer)`` for every weighted layer, nested ones included."""
    return [(index, layer) for index, top in enumerate(net.cells) if top is not None
            for layer in top.walk() if layer.weights is not None]


@dataclass(frozen=True)
class DtypeSweepRow:
    """The whole network morphed to one dtype, compared with float32 (``morph-report``)."""

    dtype: str
    weight_bytes: int
    rel_error: float  # over all weights: ||dequantized - master|| / ||master||
    output_drift: float  # ||y_dtype - y_float32|| / ||y_float32|| on the probe input


def output_drift(reference: np.ndarray, outputs: np.ndarray) -> float:
    """How far ``outputs`` moved from ``reference``: ``||y - y_ref|| / ||y_ref||`` (the plain
    norm when the reference is all zeros). Relative, so it reads the same at any output scale."""
    reference = np.asarray(reference, dtype=np.float64)
    diff = np.asarray(outputs, dtype=np.float64) - reference
    return float(np.linalg.norm(diff) / (np.linalg.norm(reference) or 1.0))


def probe_input(net: VolumetricNetwork, seed: int = 0, batch: int = 2) -> np.ndarray:
    """A seeded input that fits the network's first layer (token ids for an Embedding)."""
    found = first_input_layer(net)
    if found is None:
        raise LoomConfigError("cannot infer an input shape for this network; give a probe input")
    layer, shape = found
    rng = np.random.default_rng(seed)
    if layer.type_name == "Embedding":
        return rng.integers(0, layer.cfg.vocab_size, (batch, 8)).astype(np.float32)
    if layer.type_name == "KMeans":  # reads the whole tensor as one vector
        return rng.standard_normal((1, *shape)).astype(np.float32)
    if layer.type_name == "MultiHeadAttention":
        return rng.standard_normal((4, *shape)).astype(np.float32)
    return rng.standard_normal((batch, *shape)).astype(np.float32)


def dtype_sweep(load, probe: np.ndarray, dtype_names=None, on_progress=None,
                cancel=None) -> list[DtypeSweepRow]:
    """Morph a fresh copy of a network (``load()``) to each dtype and measure the damage.

    ``on_progress(done, total, dtype)`` is called after each dtype; ``cancel()`` returning True
    stops early (the rows so far are returned).
    """
    stop = as_cancel_check(cancel)
    names = list(dtype_names or [f.name for f in dtypes.FORMATS.values()])
    reference = load()
    y32 = reference.backend.to_numpy(reference.forward(probe)).astype(np.float64)
    rows = []
    for i, name in enumerate(names):
        if stop():
            break
        net = load()
        morph_all(net, name)
        y = net.backend.to_numpy(net.forward(probe)).astype(np.float64)
        rows.append(DtypeSweepRow(name, net.memory_bytes(), _weight_error(net), output_drift(y32, y)))
        if on_progress is not None:
            on_progress(i + 1, len(names), name)
    return rows


def _weight_error(net: VolumetricNetwork) -> float:
    """Relative L2 error of all weights together, dequantized versus master."""
    err2 = norm2 = 0.0
    for layer in net.weighted_layers():
        master = layer.weights.master.astype(np.float64)
        deq = layer.weights.dequantized(layer.cfg.dtype).astype(np.float64)
        err2 += float(np.sum((deq - master) ** 2))
        norm2 += float(np.sum(master ** 2))
    return float(np.sqrt(err2 / norm2)) if norm2 else 0.0
