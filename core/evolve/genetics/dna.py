"""A network's DNA and the comparison of two (Loom's ``ExtractDNA`` / ``CompareNetworks``, spec §6).

A signature is one unit vector per grid cell: the direction of the layer's weights. Two layers
overlap as much as their directions agree, and a layer whose best match sits at another position
is a "logic shift" (the same function moved elsewhere in the grid). The arithmetic is Loom's,
float32 where Loom uses float32 and summed in Loom's order, so the numbers equal Loom's.

Beyond Loom, ``across_dtypes=True`` compares what each layer computes with (its dequantized
weights) instead of scoring layers of different dtypes 0, so a model and its int8 or Q8_0 morph
compare as nearly the same. Those cosines are summed in float64: a float32 sum of a language
model's 65,521-wide sketches errs by ~1e-5, as much as an int8 morph moves a layer.

Identical signatures score exactly 1 and every score lies in [-1, 1]: a unit vector rounded to
float32 dotted with itself gives 1 +- a few ulp (Loom reports 1.0000001), which would let an
untouched layer look changed and a norm exceed 1.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...backend import array_module, to_host, widest_float
from ...enums import DTYPES, LAYER_TYPES, by_id, lookup
from ...errors import LoomConfigError
from ...layers.base import Layer
from ...network import VolumetricNetwork
from ...weights import WeightStore

UNIT = np.ones(1, dtype=np.float32)  # the signature of a layer without weights
LOGIC_SHIFT_MIN = 0.8  # a best match elsewhere above this is reported as a logic shift
_CONTAINERS = ("Parallel", "Sequential")
_WEIGHTLESS = ("Softmax", "Residual")


def position_key(z: int, y: int, x: int, l: int) -> str:  # noqa: E741
    """Loom's spelling of a grid position: ``"z,y,x,l"``."""
    return f"{z},{y},{x},{l}"


@dataclass(frozen=True)
class LayerSignature:
    """One grid cell's signature: position, Loom's type and dtype ids, and a unit vector."""

    z: int
    y: int
    x: int
    l: int  # noqa: E741
    layer_type: int
    dtype: int
    weights: np.ndarray = field(repr=False)

    @property
    def key(self) -> str:
        return position_key(self.z, self.y, self.x, self.l)

    def to_loom(self) -> dict:
        return {"Z": self.z, "Y": self.y, "X": self.x, "L": self.l, "Type": self.layer_type,
                "DType": self.dtype, "Weights": [float(v) for v in self.weights]}


@dataclass(frozen=True)
class DNA:
    """Signatures in the grid's flat order (Loom's ``NetworkDNA``)."""

    signatures: tuple[LayerSignature, ...]

    def __len__(self) -> int:
        return len(self.signatures)

    def __iter__(self):
        return iter(self.signatures)

    def to_loom(self) -> list[dict]:
        return [s.to_loom() for s in self.signatures]

    @classmethod
    def from_loom(cls, items: Any) -> DNA:
        """Read Loom's list of ``{Z, Y, X, L, Type, DType, Weights}``; a malformed entry raises
        :class:`LoomConfigError` naming it."""
        if not isinstance(items, list):
            raise LoomConfigError(f"DNA must be a list of signatures, got {type(items).__name__}")
        return cls(tuple(_signature_from_loom(item, i) for i, item in enumerate(items)))


@dataclass(frozen=True)
class LogicShift:
    source_pos: str
    target_pos: str
    overlap: float

    def to_loom(self) -> dict:
        return {"SourcePos": self.source_pos, "TargetPos": self.target_pos, "Overlap": self.overlap}


@dataclass(frozen=True)
class DNAComparison:
    """Loom's ``CompareNetworks`` result: mean overlap of same-position layers, each of them,
    and the layers whose best match lies elsewhere."""

    overall_overlap: float
    layer_overlaps: dict[str, float]
    logic_shifts: list[LogicShift]

    def to_loom(self) -> dict:
        return {"OverallOverlap": self.overall_overlap, "LayerOverlaps": dict(self.layer_overlaps),
                "LogicShifts": [s.to_loom() for s in self.logic_shifts]}


# ----- extraction --------------------------------------------------------------------------
def extract_dna(net: VolumetricNetwork, *, dequantized: bool = False) -> DNA:
    """One signature per grid layer, in flat order (spec §6.1).

    Loom signs a layer by its float32 master weights (times its scale), whatever its dtype;
    ``dequantized=True`` signs it by the weights its forward pass uses instead. Each signature is
    computed in the network's array namespace, where its weights are (a device master stays
    there), and only the unit vector crosses to the host: one transfer per signed grid layer.
    """
    xp = net.backend.xp
    sigs = []
    for (z, y, x, l), layer in net.layers():  # noqa: E741
        sigs.append(LayerSignature(z, y, x, l, _type_id(layer), lookup(DTYPES, layer.cfg.dtype).id,
                                   layer_vector(layer, dequantized, xp)))
    return DNA(tuple(sigs))


def layer_vector(layer, dequantized: bool = False, xp=np) -> np.ndarray:
    """The unit vector that signs ``layer`` (its children's, for a container), computed in ``xp``
    and brought to the host."""
    return to_host(signature_vector(layer, lambda leaf: _weights_vector(leaf, dequantized, xp)))


def signature_vector(layer: Layer, leaf: Callable[[Layer], Any]) -> Any:
    """Loom's rule for a layer's signature (spec §6.1), with ``leaf`` signing each layer that
    holds weights: ``[1]`` for a weightless one, a container's children's vectors concatenated
    and normalised again (in the namespace of the first child signed by ``leaf``, if any)."""
    if layer.cfg.type in _CONTAINERS:
        parts = [signature_vector(c, leaf) for c in signed_children(layer)]
        if not parts:
            return UNIT
        xp = next((array_module(p) for p in parts if p is not UNIT), np)
        return normalize(xp.concat([xp.asarray(p) for p in parts]))
    return leaf(layer) if is_signed(layer) else UNIT


def signed_children(layer: Layer) -> list[Layer]:
    """A container's children as Loom signs them: remote links left out, a Parallel's gate last
    (none for another layer: Loom signs it by its own weights)."""
    if layer.cfg.type not in _CONTAINERS:
        return []
    out = [c for c in layer.children if not c.cfg.is_remote_link]
    gate = getattr(layer, "gate", None)
    return out + [gate] if gate is not None else out


def is_signed(layer: Layer) -> bool:
    """Whether ``layer`` is signed by its own weights (not a container, not weightless)."""
    kind = layer.cfg.type
    return (kind not in _WEIGHTLESS and kind not in _CONTAINERS and layer.weights is not None
            and len(layer.weights) > 0)


def _weights_vector(layer: Layer, dequantized: bool, xp) -> Any:
    store = layer.weights
    if not isinstance(store, WeightStore):
        raise LoomConfigError(f"{layer.cfg.type} layer holds {type(store).__name__} weights (a language "
                              "model's): sign it with loomlab.core.evolve.llm.sketch.sketch_dna")
    if dequantized:
        return normalize(layer.params(xp, np.float32))
    w = store.values(xp, np.float32)  # the float32 master: the device's after training there
    scale = float(np.float32(store.scale))  # a Python float: the standard's scalar, same float32 product
    return normalize(w if scale in (0, 1) else w * scale)


def normalize(v):
    """``v / |v|`` as Loom computes it: float32 squares summed in float64 in order, the norm
    rounded to float32, zeros for a zero vector. In ``v``'s namespace (float32 sums on a device
    without float64); a list is read as numpy."""
    xp = array_module(v)
    v = xp.reshape(xp.astype(xp.asarray(v), xp.float32, copy=False), (-1,))
    squares = xp.astype(v * v, widest_float(xp, getattr(v, "device", None)))
    m = xp.astype(xp.sqrt(xp.cumulative_sum(squares)[-1:]), xp.float32)  # [] for an empty v
    zero = m == 0  # every square is 0: zeros (the division by inf only keeps numpy from warning)
    return xp.where(zero, 0.0, v / xp.where(zero, xp.inf, m))


# ----- comparison --------------------------------------------------------------------------
def cosine_similarity(a: LayerSignature, b: LayerSignature, *, across_dtypes: bool = False) -> float:
    """Loom's ``CosineSimilarity``: 0 for another type, dtype or length; else the dot product of
    the two unit vectors, not re-normalised: float32 summed in order as Loom does, or in float64
    ``across_dtypes``; exactly 1 for identical vectors and clipped to [-1, 1] (module doc)."""
    if a.layer_type != b.layer_type or a.weights.size != b.weights.size:
        return 0.0
    if a.dtype != b.dtype and not across_dtypes:
        return 0.0
    return _dot(a.weights, b.weights, np.float64 if across_dtypes else np.float32)


def _dot(u: np.ndarray, v: np.ndarray, dtype) -> float:
    u_zero, v_zero = not u.any(), not v.any()
    if u_zero or v_zero:
        return 1.0 if u_zero and v_zero else 0.0
    if np.array_equal(u, v):
        return 1.0
    if dtype == np.float64:
        return float(np.clip(np.dot(u.astype(np.float64), v.astype(np.float64)), -1.0, 1.0))
    return float(np.clip(np.cumsum(u * v, dtype=np.float32)[-1], -1.0, 1.0))


def compare_dna(a: VolumetricNetwork | DNA, b: VolumetricNetwork | DNA, *,
                across_dtypes: bool = False) -> DNAComparison:
    """Loom's ``CompareNetworks`` (spec §6.3) of two networks or their DNA.

    ``across_dtypes``: networks are signed by their dequantized weights and layers of different
    dtypes are compared rather than scored 0 (Loom's behaviour, the default).
    """
    dna_a, dna_b = (_as_dna(n, across_dtypes) for n in (a, b))
    by_position: dict[str, LayerSignature] = {}
    for sig in dna_b:
        by_position.setdefault(sig.key, sig)  # the first one at a position, as Loom's scan finds
    overlaps: dict[str, float] = {}
    total, matched = np.float32(0), 0
    for sig in dna_a:
        other = by_position.get(sig.key)
        if other is not None:
            overlap = cosine_similarity(sig, other, across_dtypes=across_dtypes)
            overlaps[sig.key] = overlap
            total = np.float32(total + np.float32(overlap))
            matched += 1
    overall = float(np.float32(total / np.float32(matched))) if matched else 0.0
    return DNAComparison(overall, overlaps, _logic_shifts(dna_a, dna_b, across_dtypes))


def dtype_mismatches(a: VolumetricNetwork, b: VolumetricNetwork) -> list[tuple[str, str, str]]:
    """``(position, dtype in a, dtype in b)`` for each grid position where ``a`` and ``b`` hold
    layers of one type in different dtypes: Loom scores those 0, ``across_dtypes`` compares them."""
    out = []
    for (z, y, x, l), layer in a.layers():  # noqa: E741
        other = b.layer_at((z, y, x, l))
        if other is not None and other.cfg.type == layer.cfg.type and other.cfg.dtype != layer.cfg.dtype:
            out.append((position_key(z, y, x, l), layer.cfg.dtype, other.cfg.dtype))
    return out


def _logic_shifts(dna_a: DNA, dna_b: DNA, across_dtypes: bool) -> list[LogicShift]:
    by_length: dict[int, list[LayerSignature]] = {}
    for sig in dna_b:
        by_length.setdefault(sig.weights.size, []).append(sig)
    shifts = []
    for sig in dna_a:
        best, best_sig = -1.0, None
        for other in by_length.get(sig.weights.size, ()):
            overlap = cosine_similarity(sig, other, across_dtypes=across_dtypes)
            if overlap > best:  # strictly greater: a tie keeps the first in b's order
                best, best_sig = overlap, other
        if best_sig is not None and best > LOGIC_SHIFT_MIN and best_sig.key != sig.key:
            shifts.append(LogicShift(sig.key, best_sig.key, best))
    return shifts


def _as_dna(n: VolumetricNetwork | DNA, dequantized: bool) -> DNA:
    if isinstance(n, DNA):
        return n
    if isinstance(n, VolumetricNetwork):
        return extract_dna(n, dequantized=dequantized)
    raise LoomConfigError(f"compare_dna takes networks or DNA, got {type(n).__name__}")


def _type_id(layer) -> int:
    return lookup(LAYER_TYPES, layer.cfg.type).id


def _signature_from_loom(item: Any, i: int) -> LayerSignature:
    where = f"DNA[{i}]"
    if not isinstance(item, dict):
        raise LoomConfigError(f"{where} must be an object, got {type(item).__name__}")
    missing = [k for k in ("Z", "Y", "X", "L", "Type", "DType", "Weights") if k not in item]
    if missing:
        raise LoomConfigError(f"{where} lacks {', '.join(missing)}")
    ints = {}
    for k in ("Z", "Y", "X", "L", "Type", "DType"):
        v = item[k]
        if not isinstance(v, int) or isinstance(v, bool) or (v < 0 and k != "Type"):
            raise LoomConfigError(f"{where}.{k} must be a non-negative integer, got {v!r}")
        ints[k] = v
    for table, k in ((LAYER_TYPES, "Type"), (DTYPES, "DType")):
        try:
            by_id(table, ints[k])
        except KeyError:
            raise LoomConfigError(f"{where}.{k} {ints[k]} is not a Loom id") from None
    weights = item["Weights"]
    if not isinstance(weights, list) or not all(_is_number(w) for w in weights):
        raise LoomConfigError(f"{where}.Weights must be a list of numbers")
    vec = np.asarray(weights, dtype=np.float32)
    if not np.isfinite(vec).all():
        raise LoomConfigError(f"{where}.Weights holds a non-finite value")
    return LayerSignature(ints["Z"], ints["Y"], ints["X"], ints["L"], ints["Type"], ints["DType"], vec)


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)

