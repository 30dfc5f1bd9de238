"""What a DNA comparison shows a person: per-layer rows and a heatmap grid, for two networks or
two language models (no Qt here; the DNA panel draws these).

* Two networks: :func:`network_report` is :func:`~.genetics.dna.compare_dna`; its heatmap has one row per
  grid cell ``(z, y, x)`` in the grid's flat order and one column per layer slot ``l``.
* Two language models: :func:`model_report` signs both by their count sketches
  (:mod:`.sketch`) and compares them as :func:`~.sketch.compare_models` does (the same numbers),
  and also compares each signed sub-layer (a block's norms, attention and MLP) with the one at the
  same place in the other model; its heatmap is blocks x sub-layers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...cancel import Cancel, as_cancel_check
from ...enums import DTYPES, LAYER_TYPES, lookup
from ...errors import LoomConfigError
from ...layer_names import layer_name
from ...network import VolumetricNetwork
from ..genetics.dna import (
    DNA,
    DNAComparison,
    LayerSignature,
    compare_dna,
    cosine_similarity,
    is_signed,
    signature_vector,
)
from .sketch import DEFAULT_WIDTH, Sketcher, check_width, signed_tree

NETWORK_SUFFIXES = (".json", ".loom")
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class OverlapRow:
    """One compared layer: its grid position ``"z,y,x,l"``, its path inside the cell ("" for the
    cell itself), what people call it, and the overlap of the two models there."""

    key: str
    path: str
    name: str
    overlap: float
    whole: bool = False  # a container (a block) as a whole: its sub-layers have rows of their own


@dataclass(frozen=True)
class Heatmap:
    """``values[r, c]`` (NaN where nothing was compared), with its rows' and columns' labels."""

    values: np.ndarray
    row_labels: list[str]
    col_labels: list[str]


@dataclass(frozen=True)
class DNAReport:
    """A comparison and how to show it. ``kind`` is ``"network"`` or ``"model"``."""

    kind: str
    comparison: DNAComparison
    rows: list[OverlapRow]
    heatmap: Heatmap


# ----- what a thing is --------------------------------------------------------------------------
def is_language_model(obj: Any) -> bool:
    """A loaded language model (a TextModel, or its CausalLM network)."""
    from ...llm.model.causal_lm import CausalLM

    return isinstance(getattr(obj, "net", obj), CausalLM)


def is_network_file(ref: str | os.PathLike) -> bool:
    return Path(ref).suffix.lower() in NETWORK_SUFFIXES


def kind_of(obj: Any) -> str:
    """``"network"`` for a Loom network or a .json / .loom path, ``"model"`` for a language model
    or anything else named by text (a model file, folder or alias)."""
    if isinstance(obj, str | os.PathLike):
        return "network" if is_network_file(obj) else "model"
    if is_language_model(obj):
        return "model"
    if isinstance(obj, VolumetricNetwork):
        return "network"
    raise LoomConfigError(f"expected a network or a language model, got {type(obj).__name__}")


def model_path(obj: Any) -> str:
    """The file or folder a loaded language model was read from (what a merge reads)."""
    if isinstance(obj, str | os.PathLike):
        return str(obj)
    net = getattr(obj, "net", obj)
    source = getattr(net, "source", None)
    if source is None:
        raise LoomConfigError("this model was not read from a file, so it cannot be merged; "
                              "pick a model file, folder or name")
    if any(layer.cfg.dtype != "float32" or getattr(layer.weights, "encoded", None) is not None
           for layer in net.weighted_layers()):
        raise LoomConfigError("the loaded model is morphed, and a merge reads the model's file: the "
                              "merge would not have the morph; revert it, or pick its file to merge that")
    return str(source.path)


# ----- two networks -----------------------------------------------------------------------------
def network_report(a: VolumetricNetwork, b: VolumetricNetwork, *, across_dtypes: bool = False) -> DNAReport:
    """:func:`~.genetics.dna.compare_dna` of ``a`` and ``b``, with a row per compared layer and the heatmap
    grid cells x layer slots."""
    comparison = compare_dna(a, b, across_dtypes=across_dtypes)
    rows = [OverlapRow(key, "", _layer_text(a, key), v) for key, v in comparison.layer_overlaps.items()]
    cells = [(z, y, x) for z in range(a.depth) for y in range(a.rows) for x in range(a.cols)]
    values = np.full((len(cells), a.layers_per_cell), np.nan)
    at = {c: r for r, c in enumerate(cells)}
    for key, v in comparison.layer_overlaps.items():
        z, y, x, l = map(int, key.split(","))  # noqa: E741
        values[at[(z, y, x)], l] = v
    heatmap = Heatmap(values, [f"{z},{y},{x}" for z, y, x in cells],
                      [f"l={i}" for i in range(a.layers_per_cell)])
    return DNAReport("network", comparison, rows, heatmap)


def _layer_text(net: VolumetricNetwork, key: str) -> str:
    layer = net.layer_at(tuple(map(int, key.split(","))))
    return layer.cfg.type if layer is not None else ""


# ----- two language models ----------------------------------------------------------------------
@dataclass
class _Signed:
    dna: DNA
    leaves: dict[tuple[str, str], LayerSignature]  # (position key, path) -> the sub-layer's signature
    names: dict[tuple[str, str], Any]  # the same keys -> LayerName


def model_report(a: Any, b: Any, *, width: int = DEFAULT_WIDTH, progress: Progress | None = None,
                 cancel: Cancel = None) -> DNAReport:
    """Compare two language models (TextModels, networks, or model files, folders and aliases,
    which are loaded and closed again) by their sketches across dtypes: the cells' overlaps equal
    :func:`~.sketch.compare_models`'; rows and heatmap are per sub-layer (blocks x sub-layers).

    ``progress("sketch A" | "sketch B", layers done, weighted layers)``; ``cancel`` stops between
    layers with :class:`~loomlab.core.errors.LoomCancelled`.
    """
    check_width(width)
    signed = [_sign_model(m, label, width, progress, cancel) for label, m in (("A", a), ("B", b))]
    comparison = compare_dna(signed[0].dna, signed[1].dna, across_dtypes=True)
    rows: list[OverlapRow] = []
    for key, overlap in comparison.layer_overlaps.items():  # grid order; a block before its sub-layers
        if (key, "") not in signed[0].leaves:
            rows.append(OverlapRow(key, "", f"{signed[0].names[(key, '')].label} (all of it)", overlap,
                                   whole=True))
        for (leaf_key, path), sig in signed[0].leaves.items():
            other = signed[1].leaves.get((leaf_key, path))
            if leaf_key == key and other is not None:
                name = signed[0].names[(key, path)].label
                rows.append(OverlapRow(key, path, name, _leaf_cosine(sig, other)))
    return DNAReport("model", comparison, rows, _block_heatmap(rows, signed[0].names))


def _sign_model(model: Any, label: str, width: int, progress: Progress | None, cancel: Cancel) -> _Signed:
    if isinstance(model, str | os.PathLike):
        from ...llm.files.discovery import resolve
        from ...llm.model.loader import load_causal_lm

        net = load_causal_lm(resolve(model, cancel=as_cancel_check(cancel)))
        try:
            return _sign_network(net, label, width, progress, cancel)
        finally:
            net.close()
    net = getattr(model, "net", model)
    if not isinstance(net, VolumetricNetwork):
        raise LoomConfigError(f"expected a language model, got {type(model).__name__}")
    return _sign_network(net, label, width, progress, cancel)


def _sign_network(net: VolumetricNetwork, label: str, width: int, progress: Progress | None,
                  cancel: Cancel) -> _Signed:
    """sketch_dna's signatures, keeping each signed sub-layer's vector on the way."""
    report = None if progress is None else (lambda _, done, total: progress(f"sketch {label}", done, total))
    cells = [(c, top, [la for la in signed_tree(top) if is_signed(la)]) for c, top in net.layers()]
    sketcher = Sketcher(width, as_cancel_check(cancel), report, sum(len(leaves) for *_, leaves in cells))
    seen: dict[int, np.ndarray] = {}

    def leaf(layer) -> np.ndarray:
        if id(layer) not in seen:
            seen[id(layer)] = sketcher.vector(layer)
        return seen[id(layer)]

    sigs, leaves, names = [], {}, {}
    for (z, y, x, l), top, signed in cells:  # noqa: E741
        sigs.append(_signature((z, y, x, l), top, signature_vector(top, leaf)))
        key = f"{z},{y},{x},{l}"
        names[(key, "")] = layer_name(net, (z, y, x, l, ""))
        for la in signed:
            path = getattr(la, "path", "") if la is not top else ""
            leaves[(key, path)] = _signature((z, y, x, l), la, seen[id(la)])
            names[(key, path)] = layer_name(net, (z, y, x, l, path))
    return _Signed(DNA(tuple(sigs)), leaves, names)


def _signature(coord: tuple[int, int, int, int], layer, vector: np.ndarray) -> LayerSignature:
    return LayerSignature(*coord, lookup(LAYER_TYPES, layer.cfg.type).id, lookup(DTYPES, layer.cfg.dtype).id,
                          vector)


def _leaf_cosine(a: LayerSignature, b: LayerSignature) -> float:
    return cosine_similarity(a, b, across_dtypes=True)


def _block_heatmap(rows: list[OverlapRow], names: dict[tuple[str, str], Any]) -> Heatmap:
    """Blocks down, sub-layers (their names less the ``blk.N.`` prefix) across; a model without
    blocks gets one row of its cells."""
    blocks: list[int] = []
    columns: list[str] = []
    cells: dict[tuple[int, str], float] = {}
    rows = [row for row in rows if not row.whole]
    for row in rows:
        name = names.get((row.key, row.path))
        if name is None or name.block is None:
            continue
        column = name.label.split(".", 2)[-1] if name.label.startswith("blk.") else name.label
        if name.block not in blocks:
            blocks.append(name.block)
        if column not in columns:
            columns.append(column)
        cells[(name.block, column)] = row.overlap
    if not blocks:
        values = np.array([[row.overlap for row in rows]], dtype=float).reshape(1, len(rows))
        return Heatmap(values, ["cells"], [row.name for row in rows])
    values = np.full((len(blocks), len(columns)), math.nan)
    for (block, column), v in cells.items():
        values[blocks.index(block), columns.index(column)] = v
    return Heatmap(values, [f"block {b}" for b in blocks], columns)
