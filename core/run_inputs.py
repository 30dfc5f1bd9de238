"""Inputs for running a network by hand: the shape its first layer reads, seeded and golden-style
inputs of that shape, and input files (.npy / .json) checked against it.

The Loom goldens (tests/data/loom-goldens-seed1.json) were made with one recipe: a single
``numpy.random.default_rng(1)`` stream, from which each case in turn draws
``standard_normal(input_shape)`` (float64, stored as float32); an Embedding case is fed the fixed
token ids 3 1 4 1 5 and draws nothing. :func:`golden_probe` is that recipe for any network.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import LoomConfigError, LoomShapeError
from .layers.base import Layer
from .network import VolumetricNetwork

GOLDEN_SEED = 1
GOLDEN_TOKEN_IDS = (3, 1, 4, 1, 5)
DEFAULT_SEQ_LENGTH = 4  # attention that leaves seq_length at 0 reads any length
MAX_INPUT_FILE_BYTES = 64 << 20  # far beyond any input a hand run needs; refuses a stray huge file


@dataclass(frozen=True)
class InputSpec:
    """What a network's first layer reads.

    ``kind`` is "vector" (``[B, *shape]``), "sequence" (``[B, S, d]``: attention in the net),
    "tokens" (``[B, S]`` integer ids below ``vocab``) or "whole" (KMeans: the whole tensor is one
    vector of ``shape``, so the batch is always 1).
    """

    kind: str
    shape: tuple[int, ...]
    vocab: int = 0

    @property
    def size(self) -> int:
        """Values per sample (per position for a sequence, ids per row for tokens)."""
        return int(np.prod(self.shape[-1:] if self.kind == "sequence" else self.shape))

    def describe(self) -> str:
        dims = "×".join(str(n) for n in self.shape)
        return {"vector": f"[batch, {dims}]", "sequence": f"[batch, {dims}] (positions × width)",
                "tokens": f"[batch, {dims}] token ids < {self.vocab}",
                "whole": f"one vector of {dims} (batch 1)"}[self.kind]


def first_input_layer(net: VolumetricNetwork) -> tuple[Layer, tuple[int, ...]] | None:
    """The first enabled layer that states its input size (nested children included), and that
    per-sample size; None when no layer does."""
    for _, top in net.layers():
        if top.cfg.is_disabled:
            continue
        for layer in top.walk():
            shape, _ = layer.describe_shapes()
            if shape:
                return layer, tuple(shape)
    return None


def input_spec(net: VolumetricNetwork) -> InputSpec:
    """The input the first enabled layer that knows its size reads (nested children included)."""
    found = first_input_layer(net)
    if found is None:
        raise LoomConfigError("cannot tell what input this network reads: no layer states its input size")
    layer, shape = found
    attention = [la for la in net.all_layers() if la.type_name == "MultiHeadAttention"]
    seq = next((a.cfg.seq_length for a in attention if a.cfg.seq_length > 0), DEFAULT_SEQ_LENGTH)
    if layer.type_name == "Embedding":
        length = seq if attention else len(GOLDEN_TOKEN_IDS)
        return InputSpec("tokens", (length,), layer.cfg.vocab_size)
    if layer.type_name == "KMeans":
        return InputSpec("whole", shape)
    if attention:
        return InputSpec("sequence", (seq, shape[-1]))
    return InputSpec("vector", shape)


def sample_input(net: VolumetricNetwork, rng: np.random.Generator, batch: int = 1, *,
                 token_ids: tuple[int, ...] | None = None) -> np.ndarray:
    """A float32 input of ``batch`` samples for ``net``: standard normal values drawn from
    ``rng``, or token ids (``token_ids`` repeated over every row, else uniform ids from ``rng``)."""
    if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
        raise LoomConfigError(f"batch must be a positive integer, got {batch!r}")
    spec = input_spec(net)
    if spec.kind == "tokens":
        (seq,) = spec.shape
        if token_ids is None:
            return rng.integers(0, max(spec.vocab, 1), (batch, seq)).astype(np.float32)
        row = np.resize(np.asarray(token_ids) % max(spec.vocab, 1), seq)
        return np.tile(row, (batch, 1)).astype(np.float32)
    rows = 1 if spec.kind == "whole" else batch
    return rng.standard_normal((rows, *spec.shape)).astype(np.float32)


def golden_probe(net: VolumetricNetwork, batch: int = 1,
                 rng: np.random.Generator | None = None) -> np.ndarray:
    """The input the Loom goldens would give ``net`` (see the module's docstring).

    With no ``rng`` it is the first draw of the seed-1 stream, as for the goldens' first case;
    pass one generator to a run of calls to continue the stream as the goldens do case by case.
    """
    rng = np.random.default_rng(GOLDEN_SEED) if rng is None else rng
    return sample_input(net, rng, batch, token_ids=GOLDEN_TOKEN_IDS)


def random_input(net: VolumetricNetwork, seed: int, batch: int = 1) -> np.ndarray:
    """A seeded input for ``net``: standard normal values, or uniform token ids."""
    return sample_input(net, np.random.default_rng(seed), batch)


def read_input_file(path: str | os.PathLike) -> np.ndarray:
    """Numbers from a ``.npy`` file (never unpickled) or a ``.json`` file (an array of numbers,
    or ``{"input": [...], "shape": [...]}`` as the loom-reference tool reads), as float32.

    Raises :class:`LoomConfigError` naming the file for anything that is not a finite numeric
    array of at most :data:`MAX_INPUT_FILE_BYTES`.
    """
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as e:
        raise LoomConfigError(f"{path}: cannot read the input file ({e.strerror or e})") from None
    if size > MAX_INPUT_FILE_BYTES:
        raise LoomConfigError(f"{path}: {size:,} bytes is more than an input file may hold "
                              f"({MAX_INPUT_FILE_BYTES:,})")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        x = _read_npy(path)
    elif suffix == ".json":
        x = _read_json(path)
    else:
        raise LoomConfigError(f"{path}: an input file must be .npy or .json, "
                              f"not {suffix or 'without a suffix'!r}")
    if x.size == 0:
        raise LoomConfigError(f"{path}: the input holds no values")
    with np.errstate(over="ignore"):  # a value beyond float32 becomes inf, refused just below
        x = x.astype(np.float32)
    if not np.isfinite(x).all():
        raise LoomConfigError(f"{path}: the input holds NaN or infinite values (or numbers beyond float32)")
    return x


def _read_npy(path: Path) -> np.ndarray:
    # memory-mapped first, so a header that claims more data than the file holds is refused
    # before anything is allocated for it
    try:
        mapped = np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as e:  # pickled data, an object array, a broken or truncated header
        if "pickle" in str(e) or "Python objects" in str(e):
            raise LoomConfigError(f"{path}: holds pickled Python objects, which are never loaded; "
                                  f"save a plain numeric array") from None
        raise LoomConfigError(f"{path}: not a plain numeric .npy array ({e})") from None
    except (OSError, EOFError) as e:
        raise LoomConfigError(f"{path}: cannot read the .npy file ({e})") from None
    if not isinstance(mapped, np.ndarray):  # an .npz archive under an .npy name
        mapped.close()
        raise LoomConfigError(f"{path}: an .npz archive, not one .npy array")
    if mapped.dtype.kind not in "iuf":
        raise LoomConfigError(f"{path}: the array must hold numbers, got dtype {mapped.dtype}")
    return np.array(mapped)


def _read_json(path: Path) -> np.ndarray:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise LoomConfigError(f"{path}: not a readable JSON file ({e})") from None
    except RecursionError:
        raise LoomConfigError(f"{path}: the JSON is nested too deeply to be an input") from None
    values, shape = (doc.get("input"), doc.get("shape")) if isinstance(doc, dict) else (doc, None)
    try:
        x = np.asarray(values)
    except ValueError:  # ragged nesting
        raise LoomConfigError(f"{path}: the input is not a rectangular array of numbers") from None
    if x.dtype.kind not in "iuf":
        raise LoomConfigError(f"{path}: expected an array of numbers "
                              f"(or {{\"input\": [...], \"shape\": [...]}})")
    if shape is not None:
        if not (isinstance(shape, list) and shape and all(isinstance(n, int) and not isinstance(n, bool)
                                                          and n > 0 for n in shape)):
            raise LoomConfigError(f"{path}: \"shape\" must be a list of positive integers, got {shape!r}")
        if int(np.prod(shape)) != x.size:
            raise LoomConfigError(f"{path}: \"shape\" {shape} does not fit {x.size} values")
        x = x.reshape(shape)
    return x


def fit_input(net: VolumetricNetwork, x: np.ndarray) -> np.ndarray:
    """``x`` in the layout ``net`` reads, or :class:`LoomShapeError` saying what it needs.

    A vector input becomes ``[-1, *shape]``: a flat list of values is as many samples as it
    holds (Loom's ``[1, len]`` would read the first and silently drop the rest). A sequence input
    keeps ``[B, S, d]`` and reads anything else as one sequence of ``d``-wide positions; token
    ids keep their rows (a flat list is one row).
    """
    x = np.asarray(x, dtype=np.float32)
    spec = input_spec(net)
    unit = spec.size
    if x.size == 0 or x.size % unit:
        raise LoomShapeError(f"an input of shape {list(x.shape)} ({x.size} values) does not fit this "
                             f"network, which reads {spec.describe()}: the number of values must be "
                             f"{'exactly' if spec.kind == 'whole' else 'a multiple of'} {unit}")
    if spec.kind == "whole":
        if x.size != unit:
            raise LoomShapeError(f"a KMeans network reads one vector of {unit} values, got {x.size}")
        return x.reshape(1, *spec.shape)
    if spec.kind == "sequence":
        return x if x.ndim == 3 and x.shape[-1] == unit else x.reshape(1, -1, unit)
    if spec.kind == "tokens":
        return x.reshape(1, -1) if x.ndim <= 1 else x
    return x.reshape(-1, *spec.shape)
