"""LLM DNA: the signature of a language model's layers from a count sketch of their weights.

Loom signs a layer by the unit vector of all its weights (:mod:`.genetics.dna`); for a language model that
is the whole model again, dequantized. Here each weighted layer is signed by a *count sketch* of
the weights its forward pass uses instead, a vector of at most ``width`` numbers:

* the layer's weights are read as one flat vector ``w`` in its store's layout (the file's
  matrices one after another, or the dequantized morph), streamed in row blocks so no more than
  a few MB are dequantized at a time;
* weight ``i`` gets a sign ``s_i = +-1`` and lands in bucket ``i mod width``:
  ``sketch[j] = sum over i = j (mod width) of s_i w_i``. The signs are fixed pseudo-random bits,
  drawn page by page (a whole number of widths, about ``PAGE_WEIGHTS``) from
  ``numpy.random.default_rng([SEED, width, page])``, so they depend only on a weight's position
  and the same layer in two models is hashed alike. The default width is a prime: with a power
  of two, a matrix column (rows 576 = 2^6 * 9 apart) would fall into 1/64 of the buckets, and the
  few large-valued columns of attention weights would collide;
* the signature is the sketch normalised to a unit vector.

The dot product of two sketches estimates the dot product of the weights without bias (the signs
of different weights are independent), with a standard deviation of about ``sqrt((1 + c^2) /
width)`` for unit vectors of cosine ``c``, less once normalised; a layer of at most ``width``
weights has no two weights in one bucket and its sketch cosine is exact. With the default width
(65521) the sketch cosine of SmolLM2's layers lies within 0.007 of the exact one, for cosines
near 0 (two different blocks), 0.7 (a layer and itself plus as much noise) and 1 (its int8
morph); tests/core/evolve/llm/test_sketch.py holds it to 0.02.

Containers are signed as Loom signs them: their children's unit vectors joined and normalised
again, so a transformer block's overlap is the mean of its norms', attention's and MLP's. The
signatures are :class:`~.genetics.dna.LayerSignature` objects at the grid positions of the cells, so two
sketches compare with :func:`~.genetics.dna.compare_dna` (``across_dtypes=True`` to compare a model with
its morph) and the layers of two models of one architecture line up by position.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from functools import lru_cache

import numpy as np

from ...cancel import Cancel, as_cancel_check
from ...enums import DTYPES, LAYER_TYPES, lookup
from ...errors import LoomCancelled, LoomConfigError
from ...layers.base import Layer
from ...llm.model.llm_layers import Matrix, MatrixStore
from ...network import VolumetricNetwork
from ..genetics.dna import (
    DNA,
    DNAComparison,
    LayerSignature,
    compare_dna,
    is_signed,
    normalize,
    signature_vector,
    signed_children,
)

DEFAULT_WIDTH = 65521  # the largest prime below 2^16: see the module doc
PAGE_WEIGHTS = 1 << 20  # about this many weights per page of signs (a whole number of widths)
SEED = 0x4C4F4F4D  # "LOOM": the sign pages are part of the format, so the seed never changes

Progress = Callable[[str, int, int], None]


def sketch_dna(model, *, width: int = DEFAULT_WIDTH, progress: Progress | None = None,
               cancel: Cancel = None) -> DNA:
    """One signature per grid cell of ``model`` (a network, or anything with a ``net``, such as a
    :class:`~loomlab.core.llm.TextModel`), its weighted layers signed by their sketch.

    ``progress("sketch", layers done, weighted layers)`` is called after each weighted layer;
    ``cancel`` stops between layers with :class:`~loomlab.core.errors.LoomCancelled`.
    """
    net = _network(model)
    check_width(width)
    stop = as_cancel_check(cancel)
    leaves = [la for _, top in net.layers() for la in signed_tree(top) if is_signed(la)]
    sketcher = Sketcher(width, stop, progress, len(leaves))
    sigs = [LayerSignature(z, y, x, l, lookup(LAYER_TYPES, layer.cfg.type).id,
                           lookup(DTYPES, layer.cfg.dtype).id, sketcher.vector(layer))
            for (z, y, x, l), layer in net.layers()]  # noqa: E741
    return DNA(tuple(sigs))


def compare_models(a, b, *, width: int = DEFAULT_WIDTH, progress: Progress | None = None,
                   cancel: Cancel = None) -> DNAComparison:
    """Per-layer overlaps of two language models (networks, TextModels, or model files, folders
    and aliases, which are loaded and closed again): their sketches compared across dtypes.

    ``progress("sketch A" | "sketch B", done, total)`` follows each model's layers.
    """
    dnas = []
    for label, model in (("A", a), ("B", b)):
        report = None if progress is None else (
            lambda _, done, total, stage=f"sketch {label}": progress(stage, done, total))
        if isinstance(model, str | os.PathLike):
            # here, not at the top: the loader brings numba's kernels, which signing a network never needs
            from ...llm.files.discovery import resolve
            from ...llm.model.loader import load_causal_lm

            net = load_causal_lm(resolve(model, cancel=as_cancel_check(cancel)))
            try:
                dnas.append(sketch_dna(net, width=width, progress=report, cancel=cancel))
            finally:
                net.close()
        else:
            dnas.append(sketch_dna(model, width=width, progress=report, cancel=cancel))
    return compare_dna(dnas[0], dnas[1], across_dtypes=True)


def sketch_vector(parts: list[Matrix], width: int = DEFAULT_WIDTH) -> np.ndarray:
    """The unit sketch of the flat vector made of ``parts`` (float32 arrays or quantized
    matrices, read in row blocks) one after another: ``min(total size, width)`` numbers."""
    check_width(width)
    sketch = _CountSketch(width)
    for part in parts:
        for block in _row_blocks(part):
            sketch.add(block)
    return normalize(sketch.result())


# ----- layers -----------------------------------------------------------------------------------

class Sketcher:
    """Signs layers, counting weighted ones for ``progress``; a matrix two layers share (a tied LM
    head) is sketched once."""

    def __init__(self, width: int, stop: Callable[[], bool], progress: Progress | None, total: int):
        self.width, self.stop, self.progress, self.total = width, stop, progress, total
        self.done = 0
        self.cache: dict[tuple[int, ...], np.ndarray] = {}

    def vector(self, layer: Layer) -> np.ndarray:
        return signature_vector(layer, self._leaf)

    def _leaf(self, layer: Layer) -> np.ndarray:
        if self.stop():
            raise LoomCancelled(f"DNA sketch cancelled after {self.done} of {self.total} layers")
        store, dtype = layer.weights, layer.cfg.dtype
        if isinstance(store, MatrixStore) and store.version == 0 and dtype == "float32":
            # forward reads the file's own matrices (MatrixStore.current's rule); they live as
            # long as the model, so their identity keys the cache
            key = tuple(id(m) for m in store.blocks.values())
            if key not in self.cache:
                self.cache[key] = sketch_vector(list(store.blocks.values()), self.width)
            vector = self.cache[key]
        else:
            vector = sketch_vector([store.dequantized(dtype)], self.width)
        self.done += 1
        if self.progress is not None:
            self.progress("sketch", self.done, self.total)
        return vector


def signed_tree(layer: Layer) -> Iterator[Layer]:
    """``layer`` and, depth first, every child a signature descends into."""
    yield layer
    for child in signed_children(layer):
        yield from signed_tree(child)


def _network(model) -> VolumetricNetwork:
    net = getattr(model, "net", model)
    if not isinstance(net, VolumetricNetwork):
        raise LoomConfigError(f"sketch_dna takes a network or a model holding one, "
                              f"got {type(model).__name__}")
    return net


def check_width(width: int) -> None:
    """Refuse a sketch width that is not an integer from 1 to PAGE_WEIGHTS (a typed error)."""
    if not isinstance(width, int) or isinstance(width, bool) or not 1 <= width <= PAGE_WEIGHTS:
        raise LoomConfigError(f"sketch width must be an integer from 1 to {PAGE_WEIGHTS}, got {width!r}")


# ----- the count sketch -------------------------------------------------------------------------

def _row_blocks(part: Matrix) -> Iterator[np.ndarray]:
    """``part`` flattened, as float32 blocks of whole rows of about PAGE weights."""
    if isinstance(part, np.ndarray) and part.ndim == 1:  # a vector, or a morphed layer's flat weights
        yield np.asarray(part, np.float32)
        return
    rows, cols = part.shape[0], math.prod(part.shape[1:])
    step = max(1, PAGE_WEIGHTS // max(cols, 1))
    for r0 in range(0, rows, step):
        r1 = min(rows, r0 + step)
        block = part[r0:r1] if isinstance(part, np.ndarray) else part.rows(np.arange(r0, r1))
        yield np.asarray(block, np.float32).reshape(-1)


class _CountSketch:
    """``sum_i s_i w_i`` into bucket ``i mod width``, fed a flat vector block by block; weights are
    gathered into pages so each page's signs are drawn once."""

    def __init__(self, width: int):
        self.width = width
        self.page_size = width * max(1, PAGE_WEIGHTS // width)
        self.acc = np.zeros(width, np.float64)
        self.buf = np.empty(self.page_size, np.float32)
        self.fill = 0  # weights waiting in buf
        self.page = 0  # index of the page being filled
        self.size = 0  # weights seen

    def add(self, values: np.ndarray) -> None:
        self.size += values.size
        pos, n = 0, self.page_size
        while pos < values.size:
            if self.fill == 0 and values.size - pos >= n:  # a whole page: fold it in place
                self._fold(values[pos:pos + n])
                pos += n
                continue
            take = min(n - self.fill, values.size - pos)
            self.buf[self.fill:self.fill + take] = values[pos:pos + take]
            self.fill += take
            pos += take
            if self.fill == n:
                self._fold(self.buf)
                self.fill = 0

    def result(self) -> np.ndarray:
        if self.fill:
            self.buf[self.fill:] = 0
            self._fold(self.buf)
            self.fill = 0
        return self.acc[:min(self.size, self.width)].astype(np.float32)

    def _fold(self, page: np.ndarray) -> None:
        signed = page * _signs(self.width, self.page)
        self.acc += signed.reshape(-1, self.width).sum(axis=0, dtype=np.float64)
        self.page += 1


@lru_cache(maxsize=8)
def _signs(width: int, page: int) -> np.ndarray:
    """The signs of page ``page`` of a sketch ``width`` wide, float32 +-1 (the first pages serve
    every layer: kept)."""
    n = width * max(1, PAGE_WEIGHTS // width)
    rng = np.random.default_rng([SEED, width, page])
    bits = np.unpackbits(np.frombuffer(rng.bytes(-(-n // 8)), np.uint8))[:n]
    signs = 1.0 - 2.0 * bits.astype(np.float32)
    signs.flags.writeable = False
    return signs
