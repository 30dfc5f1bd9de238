"""A language model's quantization recipe as a genome: one Loom dtype per weighted layer.

The issue's built-in task "LLM quantization recipe" evolves these: fitness is ``-mean KL(P_ref ||
P_recipe) - lam * bytes / bytes_unmorphed``, the KL taken over the next-token distributions at every
position of a few probe prompts, against the model as loaded. :class:`RecipeSpace` holds what every
evaluation shares (the layers, the allowed dtypes, the tokenized probes and the reference
distributions) and breeds recipes from the run's Go generator, so a seeded run repeats exactly.

Why evaluating is cheap after the first time: a layer morphed to a dtype is swapped in as a new
weight store holding the float32 weights that dtype dequantizes to (what the forward pass of a
morphed layer multiplies with), and those stores' weights are cached per (tensors, dtype). A
recipe then costs its forward passes, not a re-quantization (quantizing all of SmolLM2-135M to one
dtype takes 5-16 s on 2 cores; its probe forward passes under a second). The model's own weight
stores are never touched, so putting them back is an exact revert, and the first morph of a layer
cannot fix its scale for later morphs (Loom's rule): each (layer, dtype) is quantized as
``morph_layer`` quantizes it on a fresh copy of the model.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ...cancel import Cancel, as_cancel_check
from ...dtypes import get_format, packed_nbytes
from ...errors import LoomCancelled, LoomConfigError
from ...io.bounded_read import parse_json_text
from ...layer_names import layer_label
from ...llm.model.llm_layers import MatrixStore, dense
from ...llm.quality.recipe import recipe_from_value
from ...morph import weighted_cells
from ...morph_probe import log_softmax
from ...weights import WeightStore
from ..genetics.gorand import GoRand
from ..genetics.values import check_number

Recipe = tuple[str, ...]  # one canonical dtype name per weighted layer, in RecipeSpace.names order

# 32, 16, 8 and 4 bits: float16 is nearly free for SmolLM2 (KL ~3e-6 nats all layers), bfloat16
# costs ~4e-4, fp8/int8 with Loom's one scale per layer ~0.2-0.3, int4 wrecks it (~9) unless kept to
# a few layers: the search has something to find at every step down.
DEFAULT_DTYPES = ("float32", "float16", "bfloat16", "fp8e4m3", "int8", "int4")
DEFAULT_PROBES = (
    "The old lighthouse keeper climbed the spiral stairs every evening to light the lamp, and",
    "def mean(values):\n    total = 0\n    for v in values:\n        total += v\n    return",
    "Water boils at 100 degrees Celsius at sea level. The chemical symbol for gold is",
    "User: Can you recommend a good book for a long train journey?\nAssistant: Sure! I would",
)
DEFAULT_PROBE_TOKENS = 32
DEFAULT_LAMBDA = 1.0
# Every default dtype of every SmolLM2-135M layer is ~2.7 GB of float32 (its tied embedding table
# counted once per dtype): the default holds it all, so a long run never re-quantizes.
DEFAULT_CACHE_BYTES = 3 << 30


@dataclass(frozen=True)
class RecipeScore:
    kl_mean: float  # nats, mean over every probe position
    bytes: int  # the recipe's packed weight bytes (Loom's CalculateTotalMemory)
    fitness: float  # -kl_mean - lam * bytes / bytes of the unmorphed model


@dataclass(frozen=True)
class CacheInfo:
    entries: int
    bytes: int
    limit: int
    hits: int
    builds: int  # (tensors, dtype) pairs quantized, re-builds after an eviction included


class RecipeSpace:
    """The recipes of ``model`` (a :class:`~loomlab.core.llm.generate.textmodel.TextModel`) and their fitness.

    Args:
        model: the language model, unmorphed (every weighted layer float32, i.e. as the file holds it).
        dtypes: the dtypes a layer may take (Loom's names or aliases).
        probes: the prompts whose next-token distributions are compared.
        probe_tokens: each probe is cut to this many tokens (BOS included), as the Morph panel's probe.
        lam: what a whole model's worth of bytes costs, in nats of KL.
        cache_bytes: bound on the morphed weights kept between evaluations (float32, 4 bytes a
            weight; least recently used go first). One evaluation holds its own recipe's weights
            whatever the bound; with a bound below what recent recipes use, layers are quantized again.

    The reference distributions are computed here, once, and kept in memory only.
    """

    def __init__(self, model, dtypes: Sequence[str] = DEFAULT_DTYPES, probes: Sequence[str] = DEFAULT_PROBES,
                 probe_tokens: int = DEFAULT_PROBE_TOKENS, lam: float = DEFAULT_LAMBDA,
                 cache_bytes: int = DEFAULT_CACHE_BYTES):
        net = getattr(model, "net", None)
        if net is None or not hasattr(model, "tokenizer"):
            raise LoomConfigError(f"a recipe space needs a language model (load_model), "
                                  f"got {type(model).__name__}")
        self.model = model
        self.dtypes: tuple[str, ...] = check_dtypes(dtypes)
        self.lam = check_non_negative("lam", lam)
        self.probe_tokens = check_count("probe_tokens", probe_tokens, 1)
        self._cache = ArrayCache(check_count("cache_bytes", cache_bytes, 0))
        cells = weighted_cells(net)
        self.names: tuple[str, ...] = tuple(layer_label(net, (*net.coord(i), la.path)) for i, la in cells)
        for name, (_, layer) in zip(self.names, cells, strict=True):
            if not isinstance(layer.weights, MatrixStore):
                raise LoomConfigError(f"layer {name} is not a language model layer; a recipe space needs "
                                      "a model from load_model")
            if layer.cfg.dtype != "float32":
                raise LoomConfigError(f"the model is morphed (layer {name} is {layer.cfg.dtype}); "
                                      "morph it back to float32 first")
        self._layers = [layer for _, layer in cells]
        self._stores = [layer.weights for layer in self._layers]
        self.parameters: tuple[int, ...] = tuple(len(s) for s in self._stores)
        # what memory_by_dtype counts once: a tied head and its embedding in the same encoding
        self._held = [tuple(sorted(s.tensor_sizes())) for s in self._stores]
        self._file = [s.stored("float32") for s in self._stores]  # "float32" genes: the file's blocks
        # layers with the same tensors and scale quantize to the same weights: one cache entry
        self._sources = [("blocks", s.scale, tuple(id(m) for m in s.blocks.values())) if s.version == 0
                         else ("store", id(s)) for s in self._stores]
        self.probes = check_probes(probes)
        self._ids = [self._tokenize(text) for text in self.probes]
        self.positions = sum(ids.size for ids in self._ids)
        self.bytes_unmorphed = self.recipe_bytes(("float32",) * len(self._layers))
        # the lock and thread settings every use of the model runs under, on the exact path: a
        # recipe's KL is its weights' drift, not 8-bit activations' rounding
        with model.busy(activations="float32"):
            logits = [self._logits(ids) for ids in self._ids]
        self._ref_log_p = [log_softmax(x) for x in logits]
        self._ref_p = [np.exp(lp) for lp in self._ref_log_p]

    def _tokenize(self, text: str) -> np.ndarray:
        ids = self.model.tokenizer.encode(text, add_special_tokens=True)[:self.probe_tokens]
        ids = np.asarray(ids, np.int64)
        if ids.size == 0:
            raise LoomConfigError(f"the probe {text!r} has no tokens")
        return ids

    def _logits(self, ids: np.ndarray) -> np.ndarray:
        return self.model.net.step(ids[None], None, last_only=False)[0]

    def describe(self) -> dict:
        """What rebuilds this space on the same model (JSON-able), for a run's stored config."""
        return {"model": getattr(self.model, "name", ""), "dtypes": list(self.dtypes),
                "probes": list(self.probes), "probe_tokens": self.probe_tokens, "lam": self.lam}

    # ----- recipes -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._layers)

    def validate(self, recipe: Sequence[str]) -> Recipe:
        """``recipe`` with canonical dtype names; raises :class:`LoomConfigError` naming the layer."""
        if isinstance(recipe, str | bytes) or not isinstance(recipe, Sequence):
            raise LoomConfigError(f"a recipe is a sequence of dtype names, one per weighted layer "
                                  f"({len(self)}); got {type(recipe).__name__}")
        if len(recipe) != len(self):
            raise LoomConfigError(f"a recipe has one dtype per weighted layer ({len(self)}), "
                                  f"got {len(recipe)}")
        out = []
        for i, name in enumerate(recipe):
            if name not in self.dtypes:
                try:
                    name = get_format(name).name if isinstance(name, str) else None
                except LoomConfigError:
                    name = None
                if name not in self.dtypes:
                    raise LoomConfigError(f"recipe layer {i} ({self.names[i]}): {recipe[i]!r} is not one of "
                                          f"this space's dtypes ({', '.join(self.dtypes)})")
            out.append(name)
        return tuple(out)

    def uniform(self, dtype: str) -> Recipe:
        """Every layer in ``dtype`` (``uniform("float32")`` is the unmorphed model)."""
        return self.validate((dtype,) * len(self))

    def random_recipe(self, rng: GoRand) -> Recipe:
        """Each layer's dtype drawn uniformly from the allowed ones (one ``Intn`` per layer)."""
        rng = _go_rand(rng)
        return tuple(self.dtypes[rng.intn(len(self.dtypes))] for _ in range(len(self)))

    def mutate(self, recipe: Sequence[str], rng: GoRand, rate: float) -> Recipe:
        """Each layer, with probability ``rate``, moves to another allowed dtype (uniformly drawn).

        Draws: one ``Float64`` per layer, then one ``Intn`` for each layer that moves, in layer order.
        """
        recipe, rng = self.validate(recipe), _go_rand(rng)
        rate = check_probability("rate", rate)
        out = list(recipe)
        for i, current in enumerate(recipe):
            if rng.float64() < rate and len(self.dtypes) > 1:
                others = [d for d in self.dtypes if d != current]
                out[i] = others[rng.intn(len(others))]
        return tuple(out)

    def crossover(self, a: Sequence[str], b: Sequence[str], rng: GoRand, share_a: float = 0.5) -> Recipe:
        """Each layer's dtype from ``a`` with probability ``share_a``, else from ``b`` (one
        ``Float64`` per layer); a fitter parent can be given the larger share."""
        a, b, rng = self.validate(a), self.validate(b), _go_rand(rng)
        share_a = check_probability("share_a", share_a)
        return tuple(x if rng.float64() < share_a else y for x, y in zip(a, b, strict=True))

    def recipe_bytes(self, recipe: Sequence[str]) -> int:
        """Weight bytes with each layer in its recipe dtype, as ``net.memory_bytes()`` of the
        morphed model counts them ("float32": the file's own blocks; tensors held by two layers
        in the same encoding count once)."""
        seen, total = set(), 0
        for n, held, file, dtype in zip(self.parameters, self._held, self._file, recipe, strict=True):
            stored = file if dtype == "float32" else {(dtype, *held): (dtype, packed_nbytes(n, dtype))}
            for key, (_, size) in stored.items():
                if key not in seen:
                    seen.add(key)
                    total += size
        return total

    # ----- evaluation ----------------------------------------------------------------------------
    def evaluate(self, recipe: Sequence[str], cancel: Cancel = None) -> RecipeScore:
        """KL against the unmorphed model, bytes and fitness of ``recipe``.

        The model runs morphed only inside this call: its weight stores are back when it returns,
        raises or is cancelled (:class:`LoomCancelled`, checked between layers being quantized and
        between probes). Holds the model's generation lock, so it refuses a model that is busy.
        """
        recipe = self.validate(recipe)
        stop = as_cancel_check(cancel)
        if stop():
            raise LoomCancelled("recipe evaluation cancelled")
        kl_sum = 0.0
        with self.model.busy(activations="float32"), self._applied(recipe, stop):
            for ids, log_p, p in zip(self._ids, self._ref_log_p, self._ref_p, strict=True):
                if stop():
                    raise LoomCancelled("recipe evaluation cancelled between probes")
                log_q = log_softmax(self._logits(ids))
                kl_sum += float(np.sum(p * (log_p - log_q)))  # morph_probe.compare's KL, summed over rows
        kl_mean = kl_sum / self.positions
        size = self.recipe_bytes(recipe)
        return RecipeScore(kl_mean, size, -kl_mean - self.lam * size / self.bytes_unmorphed)

    def evaluate_many(self, recipes: Sequence[Sequence[str]],
                      progress: Callable[[int, int], None] | None = None,
                      cancel: Cancel = None) -> list[RecipeScore]:
        """:meth:`evaluate` each recipe, in order; all are validated before any runs. A cancel
        raises :class:`LoomCancelled` with no partial list (as the run's evaluators do)."""
        recipes = [self.validate(r) for r in recipes]
        stop = as_cancel_check(cancel)
        if progress is not None:
            progress(0, len(recipes))
        scores = []
        for recipe in recipes:
            scores.append(self.evaluate(recipe, stop))
            if progress is not None:
                progress(len(scores), len(recipes))
        return scores

    @contextmanager
    def _applied(self, recipe: Recipe, stop: Callable[[], bool]) -> Iterator[None]:
        """The model with ``recipe``'s stores swapped in, and its own put back however this ends."""
        try:
            for i, (layer, dtype) in enumerate(zip(self._layers, recipe, strict=True)):
                if dtype != "float32":
                    if stop():
                        raise LoomCancelled("recipe evaluation cancelled while quantizing layers")
                    layer.weights = self._morphed_store(i, dtype)
            yield
        finally:
            for layer, store in zip(self._layers, self._stores, strict=True):
                layer.weights = store

    def _morphed_store(self, i: int, dtype: str) -> MatrixStore:
        """Layer ``i``'s weights as a ``dtype`` layer's forward pass sees them, in a store the LLM
        layers read directly (float32 matrices, cut from one flat vector as MatrixStore.current cuts
        a morphed layer's)."""
        key = (dtype, self._sources[i])
        flat = self._cache.get(key)
        if flat is None:
            flat = self._cache.put(key, self._quantized(self._stores[i], dtype))
        out, at = {}, 0
        for name, m in self._stores[i].blocks.items():
            n = math.prod(m.shape)
            out[name] = flat[at:at + n].reshape(m.shape)
            at += n
        return MatrixStore(out)

    @staticmethod
    def _quantized(store: MatrixStore, dtype: str) -> np.ndarray:
        """What ``morph_layer`` gives this layer's forward pass for ``dtype`` on a fresh model: the
        master quantized with the scale morph would choose, then dequantized; built on a throwaway
        store so the model's own keeps no master (a 113 MB copy for SmolLM2's table) and no scale."""
        if store.version == 0:  # MatrixStore.master's definition, without caching it in the store
            master = np.concatenate([dense(m).reshape(-1) for m in store.blocks.values()])
        else:
            master = store.master
        return WeightStore(master, store.scale).dequantized(dtype)

    def cache_info(self) -> CacheInfo:
        return self._cache.info()

    def clear_cache(self) -> None:
        """Drop every cached morphed weight (the next evaluations quantize again)."""
        self._cache.clear()


class ArrayCache:
    """Arrays by key (flat float32 weights, residual streams), least recently used dropped first
    beyond ``limit`` bytes."""

    def __init__(self, limit: int):
        self.limit = limit
        self._items: OrderedDict[tuple, np.ndarray] = OrderedDict()
        self._bytes = self.hits = self.builds = 0

    def get(self, key: tuple) -> np.ndarray | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
            self.hits += 1
        return value

    def put(self, key: tuple, value: np.ndarray) -> np.ndarray:
        self.builds += 1
        if value.nbytes > self.limit:
            return value  # used once, never kept
        while self._bytes + value.nbytes > self.limit:
            _, old = self._items.popitem(last=False)
            self._bytes -= old.nbytes
        self._items[key] = value
        self._bytes += value.nbytes
        return value

    def clear(self) -> None:
        self._items.clear()
        self._bytes = 0

    def info(self) -> CacheInfo:
        return CacheInfo(len(self._items), self._bytes, self.limit, self.hits, self.builds)


# ----- checkpoints -------------------------------------------------------------------------------
def recipe_to_json(recipe: Sequence[str]) -> str:
    """A recipe as a compact JSON array of dtype names."""
    return json.dumps(list(recipe), separators=(",", ":"))


def recipe_from_json(text: str | bytes) -> Recipe:
    """The recipe :func:`recipe_to_json` wrote (check it with :meth:`RecipeSpace.validate`)."""
    return recipe_from_value(parse_json_text(text, "a stored recipe"))


def recipe_to_bytes(recipe: Sequence[str]) -> bytes:
    """A recipe as the bytes a checkpoint stores for a member (UTF-8 JSON)."""
    return recipe_to_json(recipe).encode("utf-8")


def recipe_from_bytes(data: bytes) -> Recipe:
    return recipe_from_json(bytes(data))


# ----- argument checks -----------------------------------------------------------------------------
def check_dtypes(names: Sequence[str], what: str = "dtypes") -> tuple[str, ...]:
    if isinstance(names, str) or not isinstance(names, Sequence) or not names:
        raise LoomConfigError(f"{what} is a non-empty sequence of dtype names, got {names!r}")
    out = []
    for name in names:
        if not isinstance(name, str):
            raise LoomConfigError(f"{what} holds dtype names, got {name!r}")
        canonical = get_format(name).name  # an unknown name raises, listing Loom's 21
        if canonical in out:
            raise LoomConfigError(f"dtype {name!r} is listed twice in {what}")
        out.append(canonical)
    return tuple(out)


def check_probes(probes: Sequence[str], what: str = "probes") -> tuple[str, ...]:
    if isinstance(probes, str) or not isinstance(probes, Sequence) or not probes:
        raise LoomConfigError(f"{what} is a non-empty sequence of prompts")
    if not all(isinstance(p, str) and p for p in probes):
        raise LoomConfigError(f"each probe is a non-empty string ({what})")
    return tuple(probes)


def check_count(what: str, value, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise LoomConfigError(f"{what} must be an integer >= {low}, got {value!r}")
    return int(value)


def check_non_negative(what: str, value) -> float:
    number = check_number(what, value)  # an int too large for a float is refused, not an OverflowError
    if number < 0:
        raise LoomConfigError(f"{what} must be a finite number >= 0, got {value!r}")
    return number


def check_probability(what: str, value) -> float:
    value = check_non_negative(what, value)
    if value > 1:
        raise LoomConfigError(f"{what} must lie in [0, 1], got {value!r}")
    return value


def _go_rand(rng) -> GoRand:
    if not isinstance(rng, GoRand):
        raise LoomConfigError(f"recipes are drawn from the run's GoRand, got {type(rng).__name__}")
    return rng
