"""A quantization recipe as llama-quantize makes one: a GGUF format for every matrix, and its score.

A :class:`FormatSpace` holds one language model loaded from a 16- or 32-bit source (what
llama-quantize starts from: an F16 GGUF, an HF folder), the formats each matrix may take (those
whose blocks divide its rows, fewest bits first), llama.cpp's presets planned for the model, a
training text and a held-out text. A recipe is one format name per matrix (GGUF tensor) in
:attr:`FormatSpace.tensors` order: the embedding's first, then each block's, the head's last.

A recipe's score is what ``quant-report`` measures on a text (:mod:`~loomlab.core.llm.quality.drift`:
chunks of ``ctx`` tokens, the second half of each scored, KL of the source's next-token
distribution to the recipe's), against reference logits computed once from the source. Scoring
is cheap after the first time for three reasons:

* each (matrix, format) is encoded once, by the same ``encode`` that ``quantize`` and
  ``quant-report`` call (so the numbers are theirs), and held for the space's life;
* the residual stream after each block is cached by the formats of everything before it: a
  recipe that shares its first blocks' formats with one scored before (a child with its parent,
  two children of one parent) runs from the first block where it differs (``state_bytes`` bounds
  the cache, least recently used first);
* the head runs on the scored rows only, and a recipe scored once is never scored again.

The chunks of a text run on as many threads as there are CPUs, each with one BLAS and one numba
thread: the exact path's prefill multiplies with single-threaded BLAS (as generation does, see
``TextModel.busy``), so one chunk at a time kept one core busy.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import numba
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GT

from ...cancel import Cancel, as_cancel_check
from ...errors import LoomCancelled, LoomConfigError
from ...inspect.trace import Tracer
from ...llm.kernels.block_morph import encode, encoding_name, stored_nbytes
from ...llm.model.llm_layers import MatrixStore
from ...llm.quality.drift import DEFAULT_CTX, DriftAccumulator, DriftStats, ProbeChunks, probe_chunks
from ...llm.quality.imatrix import ImportanceMatrix
from ...llm.quality.recipe import PRESET_PREFIX, PRESETS, plan_recipe, weighted_layers
from ..genetics.gorand import GoRand
from .recipe_genome import ArrayCache, check_count, check_probability

Genes = tuple[str, ...]  # one GGUF format per matrix, in FormatSpace.tensors order

#: what a matrix may become: llama.cpp's block formats Loom Lab encodes, and F16
DEFAULT_FORMATS = ("Q2_K", "Q3_K", "Q4_0", "Q4_K", "Q4_1", "Q5_0", "Q5_K", "Q5_1", "Q6_K", "Q8_0", "F16")
SOURCE_TYPES = ("F32", "F16", "BF16")  # what llama-quantize quantizes from
DEFAULT_STATE_BYTES = 1 << 30  # residual streams kept between recipes (SmolLM2: 0.6 MB a chunk a block)
TRAIN, HELDOUT = "train", "held-out"
CHUNK_THREADS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def bits_per_weight(fmt: str) -> float:
    elems, size = GGML_QUANT_SIZES[GT[fmt]]
    return 8.0 * size / elems


@dataclass(frozen=True)
class RecipeTensor:
    """One matrix a recipe gives a format."""

    name: str  # the GGUF tensor, blk.3.attn_v.weight
    shape: tuple[int, int]  # rows, weights per row
    formats: tuple[str, ...]  # the formats whose blocks divide its rows, fewest bits first
    block: int  # the first block that reads it: -1 the embedding, n_blocks the head
    holders: tuple[tuple[int, str], ...]  # (weighted layer position, weight-store part) holding it

    def nbytes(self, fmt: str) -> int:
        elems, size = GGML_QUANT_SIZES[GT[fmt]]
        return self.shape[0] * (self.shape[1] // elems) * size


@dataclass(frozen=True)
class FormatScore:
    """A recipe measured on one text."""

    kl_mean: float  # nats, over the scored positions
    bytes: int  # the model's weight bytes with the recipe applied (vectors included)
    stats: DriftStats  # everything quant-report prints


class FormatSpace:
    """The recipes of ``model`` and their scores (see the module docstring).

    Args:
        model: a :class:`~loomlab.core.llm.generate.textmodel.TextModel` whose matrices are F32,
            F16 or BF16 (a quantized file is refused: export it first,
            ``loomlab quantize MODEL out.gguf --recipe float16``).
        train: the text recipes are bred on.
        heldout: the text they are re-scored on (never seen by the search).
        formats: the formats a matrix may take (F16 is kept for rows no block divides).
        ctx: tokens per chunk of both texts (each needs ``max(512, 2 * ctx)`` tokens).
        importance: an importance matrix; block formats are then weighted as llama-quantize's
            ``--imatrix`` weighs them.
        state_bytes: bound on the cached residual streams.
    """

    def __init__(self, model, train: str, heldout: str, *, formats: Sequence[str] = DEFAULT_FORMATS,
                 ctx: int = DEFAULT_CTX, importance: ImportanceMatrix | None = None,
                 state_bytes: int = DEFAULT_STATE_BYTES):
        net = getattr(model, "net", None)
        if net is None or not hasattr(model, "tokenizer"):
            raise LoomConfigError(f"a format space needs a language model (load_model), "
                                  f"got {type(model).__name__}")
        self.model, self.net = model, net
        self.formats = check_formats(formats)
        self.importance = importance
        self.tracer = Tracer(net)
        self._layers = weighted_layers(net)
        self._own = [(la.layer, la.layer.weights) for la in self._layers]
        self.tensors = self._find_tensors()
        if not self.tensors:
            raise LoomConfigError("the model has no matrices to quantize")
        n = self.tracer.n_layers
        # genes[:ends[b + 1]] are the formats the residual after block b depends on (b = -1: embedding)
        self._ends = [sum(t.block <= b for t in self.tensors) for b in range(-1, n)]
        self._fixed = net.memory_bytes() - sum(stored_nbytes(self._source(t)) for t in self.tensors)
        # (tensor, format) -> its encoding, held so that morph_parts finds it in encode's cache
        self._encoded: dict[tuple[str, str], object] = {}
        self._stores: dict[tuple[int, tuple[str, ...]], MatrixStore] = {}
        self._states = ArrayCache(check_count("state_bytes", state_bytes, 0))
        self._states_lock = threading.Lock()  # the chunks' threads share the cache
        self._scores: dict[tuple[str, Genes], FormatScore] = {}
        with model.busy(activations="float32"):
            self.texts = {TRAIN: probe_chunks(model, train, ctx), HELDOUT: probe_chunks(model, heldout, ctx)}
            self._reference = {name: self._all_rows(chunks, None) for name, chunks in self.texts.items()}
        self.presets = self._plan_presets()

    # ----- the matrices ------------------------------------------------------------------------
    def _find_tensors(self) -> tuple[RecipeTensor, ...]:
        n = self.tracer.n_layers
        found: dict[str, list] = {}
        for la in self._layers:
            store = la.layer.weights
            if not isinstance(store, MatrixStore):
                raise LoomConfigError(f"layer {la.name} is not a language model layer")
            if la.layer.cfg.dtype != "float32" or store.encoded is not None or store.version != 0:
                raise LoomConfigError(f"the model is morphed (layer {la.name}); load it again")
            block = min(max(la.cell - 1, -1), n)  # cell 0 the embedding, 1..n the blocks, then the head
            for part in store.matrix_parts():
                m, name = store.blocks[part], la.parts[part]
                if encoding_name(m) not in SOURCE_TYPES:
                    raise LoomConfigError(
                        f"{name} is stored as {encoding_name(m)}: a recipe is evolved from a 16- or "
                        f"32-bit source, as llama-quantize starts from one (export it first: loomlab "
                        f"quantize MODEL model-f16.gguf --recipe float16)")
                entry = found.setdefault(name, [tuple(m.shape), block, []])
                entry[2].append((la.position, part))
        tensors = []
        for name, (shape, block, holders) in found.items():
            fits = tuple(f for f in self.formats if len(shape) == 2 and shape[1] % block_elems(f) == 0)
            tensors.append(RecipeTensor(name, shape, fits or ("F16",), block, tuple(holders)))
        return tuple(sorted(tensors, key=lambda t: t.block))  # stable: the layers' order within a block

    def _source(self, t: RecipeTensor):
        position, part = t.holders[0]
        return self._own[position][1].blocks[part]

    def __len__(self) -> int:
        return len(self.tensors)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tensors)

    # ----- recipes --------------------------------------------------------------------------------
    def validate(self, genes: Sequence[str]) -> Genes:
        """``genes`` as a tuple; raises :class:`LoomConfigError` naming the first tensor whose format
        is not one it may take."""
        if isinstance(genes, str | bytes) or not isinstance(genes, Sequence) or len(genes) != len(self):
            raise LoomConfigError(f"a recipe has one format per matrix ({len(self)}), got {genes!r:.80}")
        for t, fmt in zip(self.tensors, genes, strict=True):
            if fmt not in t.formats:
                raise LoomConfigError(f"{t.name} (rows of {t.shape[1]}) cannot be {fmt!r}; "
                                      f"it may be {', '.join(t.formats)}")
        return tuple(genes)

    def genes_of(self, recipe) -> Genes:
        """The genes of anything ``--recipe`` takes (a preset, a JSON file, a mapping), as planned
        for this model."""
        plan = plan_recipe(self.net, recipe)
        formats = {}
        for lp in plan.layers:
            formats.update(lp.tensor_formats)
        return self.validate(tuple(formats.get(t.name, encoding_name(self._source(t))) for t in self.tensors))

    def mapping(self, genes: Sequence[str]) -> dict[str, str]:
        """``{GGUF tensor: format}``, the JSON recipe ``quantize`` and ``quant-report`` read."""
        return dict(zip(self.names, self.validate(genes), strict=True))

    def recipe_bytes(self, genes: Sequence[str]) -> int:
        """Weight bytes of the model with ``genes`` applied (vectors at their loaded size), as
        ``plan_recipe(...).bytes`` counts them."""
        return self._fixed + sum(t.nbytes(fmt) for t, fmt in zip(self.tensors, genes, strict=True))

    def _plan_presets(self) -> dict[str, Genes]:
        """llama.cpp's presets that plan for this model within the allowed formats, by name (on
        narrow rows several fall back to the same formats)."""
        out: dict[str, Genes] = {}
        for name in PRESETS:
            try:
                genes = self.genes_of(PRESET_PREFIX + name)
            except LoomConfigError:
                continue
            out[name] = genes
        return out

    def mutate(self, genes: Sequence[str], rng: GoRand, rate: float) -> Genes:
        """Each matrix, with probability ``rate``, moves one step to the next format with fewer or
        more bits (one ``Float64`` per matrix, then one ``Intn(2)`` for each that moves)."""
        genes, rate = list(self.validate(genes)), check_probability("rate", rate)
        for i, t in enumerate(self.tensors):
            if rng.float64() < rate and len(t.formats) > 1:
                at = t.formats.index(genes[i])
                step = -1 if rng.intn(2) == 0 else 1
                if not 0 <= at + step < len(t.formats):
                    step = -step
                genes[i] = t.formats[at + step]
        return tuple(genes)

    def crossover(self, a: Sequence[str], b: Sequence[str], rng: GoRand, share_a: float = 0.5) -> Genes:
        """Each matrix's format from ``a`` with probability ``share_a``, else from ``b`` (one
        ``Float64`` per matrix)."""
        a, b = self.validate(a), self.validate(b)
        share_a = check_probability("share_a", share_a)
        return tuple(x if rng.float64() < share_a else y for x, y in zip(a, b, strict=True))

    # ----- scores ---------------------------------------------------------------------------------
    def score(self, genes: Sequence[str], text: str = TRAIN, cancel: Cancel = None) -> FormatScore:
        """``genes`` measured on the training or the held-out text (each recipe once per text).
        The model's own weights are back when this returns, raises or is cancelled
        (:class:`LoomCancelled`, checked between blocks)."""
        genes = self.validate(genes)
        if text not in self.texts:
            raise LoomConfigError(f"a recipe is scored on {TRAIN!r} or {HELDOUT!r}, not {text!r}")
        hit = self._scores.get((text, genes))
        if hit is not None:
            return hit
        stop = as_cancel_check(cancel)
        chunks = self.texts[text]
        acc = DriftAccumulator()
        with self.model.busy(activations="float32"), self._applied(genes):
            rows = self._all_rows(chunks, (text, genes), stop)
        for i, reference in enumerate(self._reference[text]):
            acc.add(reference, rows[i], chunks.targets[i])
        stats = acc.result()
        out = FormatScore(stats.kl_mean, self.recipe_bytes(genes), stats)
        self._scores[text, genes] = out
        return out

    def score_many(self, recipes: Sequence[Sequence[str]], text: str = TRAIN,
                   progress: Callable[[int, int], None] | None = None,
                   cancel: Cancel = None) -> list[FormatScore]:
        """:meth:`score` each recipe in order (all validated first); a cancel raises with no list."""
        recipes = [self.validate(r) for r in recipes]
        out = []
        for recipe in recipes:
            out.append(self.score(recipe, text, cancel))
            if progress is not None:
                progress(len(out), len(recipes))
        return out

    def scored(self, genes: Sequence[str], text: str = HELDOUT) -> FormatScore | None:
        """The score of ``genes`` on ``text`` if it was measured, else None (measures nothing)."""
        return self._scores.get((text, tuple(genes)))

    def evaluated(self) -> dict[tuple[str, Genes], FormatScore]:
        """Every score measured so far, by (text, genes)."""
        return dict(self._scores)

    def _all_rows(self, chunks: ProbeChunks, key: tuple[str, Genes] | None,
                  stop: Callable[[], bool] = lambda: False) -> list[np.ndarray]:
        """:meth:`_rows` of every chunk, on up to :data:`CHUNK_THREADS` threads."""
        n = len(chunks.chunks)
        if CHUNK_THREADS < 2 or n < 2:
            return [self._rows(chunks, i, key, stop) for i in range(n)]

        def one(i: int) -> np.ndarray:
            numba.set_num_threads(1)  # this thread's kernels; the others' chunks use the other cores
            return self._rows(chunks, i, key, stop)

        with ThreadPoolExecutor(max_workers=min(CHUNK_THREADS, n), thread_name_prefix="recipe-chunk") as pool:
            return list(pool.map(one, range(n)))

    def _rows(self, chunks: ProbeChunks, i: int, key: tuple[str, Genes] | None,
              stop: Callable[[], bool] = lambda: False) -> np.ndarray:
        """The scored rows' logits of chunk ``i`` for the weights now in the model; ``key`` (text,
        genes) reads and fills the residual cache, None runs everything afresh."""
        ids = chunks.chunks[i][None]
        x, start = None, 0
        if key is not None:
            text, genes = key
            for b in range(self.tracer.n_layers, -1, -1):  # the longest prefix already run
                with self._states_lock:
                    x = self._states.get((text, i, genes[:self._ends[b]]))
                if x is not None:
                    start = b
                    break
        if x is None:
            x = self.tracer.run(ids, stop=0).final
            self._keep(key, i, 0, x)
        for b in range(start, self.tracer.n_layers):
            if stop():
                raise LoomCancelled("recipe scoring cancelled")
            x = self.tracer.run(resid=x, start=b, stop=b + 1).final
            self._keep(key, i, b + 1, x)
        logits = self.tracer.logits(x[:, chunks.first:chunks.ctx - 1])[0]
        return np.asarray(logits, dtype=np.float32)

    def _keep(self, key, i: int, b: int, x) -> None:
        if key is not None:
            text, genes = key
            with self._states_lock:
                self._states.put((text, i, genes[:self._ends[b]]), x)

    @contextmanager
    def _applied(self, genes: Genes) -> Iterator[None]:
        """The model with ``genes``' matrices swapped in; its own stores back however this ends."""
        by_layer: dict[int, dict[str, str]] = {}
        for t, fmt in zip(self.tensors, genes, strict=True):
            for position, part in t.holders:
                by_layer.setdefault(position, {})[part] = fmt
        try:
            for position, formats in by_layer.items():
                self._own[position][0].weights = self._store(position, formats)
            yield
        finally:
            for layer, store in self._own:
                layer.weights = store

    def _store(self, position: int, formats: Mapping[str, str]) -> MatrixStore:
        """Layer ``position``'s store with its matrices in ``formats`` (a copy of its own, made once)."""
        key = (position, tuple(sorted(formats.items())))
        store = self._stores.get(key)
        if store is None:
            own = self._own[position][1]
            parts = {part: fmt for part, fmt in formats.items() if fmt != encoding_name(own.blocks[part])}
            weights = {}
            for part, fmt in parts.items():
                name = self._layers[position].parts[part]
                weights[part] = self._weights(name)
                if (name, fmt) not in self._encoded:
                    self._encoded[name, fmt] = encode(own.blocks[part], fmt, weights[part])
            store = own.copy()
            if parts:
                store.morph_parts(parts, weights)
            self._stores[key] = store
        return store

    def _weights(self, name: str) -> np.ndarray | None:
        if self.importance is None or name not in self.importance.in_sum2:
            return None
        return self.importance.importance(name)

    def cache_info(self):
        """The residual cache's entries, bytes, limit, hits and builds."""
        return self._states.info()


# ----- the Pareto front ---------------------------------------------------------------------------
def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point dominates (smaller or equal in both, smaller in one),
    by the first coordinate ascending; of equal points the first."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front, best = [], float("inf")
    for i in order:
        if points[i][1] < best:
            front.append(i)
            best = points[i][1]
    return front


def pareto_ranks(points: Sequence[tuple[float, float]]) -> list[int]:
    """Each point's non-dominated rank (0: on the front; 1: on the front once rank 0 is removed ...)."""
    ranks = [-1] * len(points)
    left = list(range(len(points)))
    rank = 0
    while left:
        front = {left[i] for i in pareto_front([points[j] for j in left])}
        for i in front:
            ranks[i] = rank
        left = [i for i in left if i not in front]
        rank += 1
    return ranks


# ----- argument checks -------------------------------------------------------------------------------
def block_elems(fmt: str) -> int:
    return GGML_QUANT_SIZES[GT[fmt]][0]


def check_formats(formats: Sequence[str]) -> tuple[str, ...]:
    """The formats, fewest bits first; raises naming an unknown one."""
    if isinstance(formats, str) or not isinstance(formats, Sequence) or not formats:
        raise LoomConfigError(f"formats is a non-empty list of GGUF formats, got {formats!r}")
    for fmt in formats:
        if fmt not in DEFAULT_FORMATS:
            raise LoomConfigError(f"unknown format {fmt!r}; a recipe's formats are "
                                  f"{', '.join(DEFAULT_FORMATS)}")
    if len(set(formats)) != len(formats):
        raise LoomConfigError(f"a format is listed twice in {list(formats)}")
    return tuple(sorted(formats, key=lambda f: (bits_per_weight(f), DEFAULT_FORMATS.index(f))))
