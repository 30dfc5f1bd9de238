"""Output drift of a morphed language model, as llama.cpp's ``llama-perplexity --kl-divergence``
reports it (``loomlab quant-report``).

The probe text is tokenized once (the model's BOS added when it wants one) and cut into chunks of
``ctx`` tokens (``len(tokens) // ctx`` of them, at least two). Each chunk is a fresh sequence whose
first token becomes BOS when the model adds one; only the second half of each chunk is scored, the
logits at positions ``ctx // 2 .. ctx - 2`` predicting tokens ``ctx // 2 + 1 .. ctx - 1``, so every
prediction has at least half a context behind it. At every scored position, with ``P`` the base
model's next-token distribution and ``Q`` the morphed one's:

* ``KL(P || Q) = sum_v P(v) (log P(v) - log Q(v))``, from the log-softmax of both (float64);
* the negative log-likelihood of the token that follows in the text, for both models;
  ``PPL = exp(mean NLL)``;
* ``dp = Q(token) - P(token)``, the change in the probability of that token (llama.cpp's ``Δp``);
  ``RMS Δp = sqrt(mean dp^2)``;
* whether both models' most likely token is the same (``Same top p``).

Reported as llama.cpp reports them: PPL of both models and their ratio (with ln ratio), the KL
mean, median, 90/95/99/99.9th percentiles and maximum (percentiles interpolated linearly between
order statistics, ``fraction * (n - 1)``, which is numpy's default), RMS Δp and "same top" with
their ± uncertainties (standard error of the mean; the ratio's through the covariance of the two
NLLs). One difference: llama.cpp reads the base model's log-probabilities back from a file that
stores them in 16 bits over the 16 nats below each row's maximum and leaves out of the KL the tokens
below that; here nothing is written anywhere and the KL sums every token in float64.

Streaming: the base model's logits live in memory only for the chunk being scored, the morphed
model's swapped in and out per chunk (a morphed layer is a morphed copy of its weight store,
quantized once, so switching back is exact and costs nothing); only the per-position KL and Δp
(a few thousand floats) are kept, for the percentiles. Per layer (``per_layer=True``), the base
logits of every chunk's scored half are computed once and kept in memory (chunks x ctx/2 x vocab
float32: ~125 MB for SmolLM2-135M at the default probe and context), then each layer of the recipe
is morphed alone, the probe run, its KL taken, and the layer put back; layers come out sorted by
KL mean, most sensitive first.

What a recipe is and how a layer is morphed live in :mod:`.recipe`: :func:`~.recipe.plan_recipe`
(formats, presets as llama.cpp's file types, rules, JSON files: a format per matrix, llama.cpp's
fallbacks listed) and the ``morph`` callable (default :func:`~.recipe.morph_planned`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import numpy as np

from ...backend import to_host
from ...cancel import Cancel, as_cancel_check
from ...errors import LoomCancelled, LoomConfigError
from ...layers.base import Layer
from ...morph_probe import log_softmax
from .recipe import LayerPlan, WeightedLayer, morph_planned, plan_recipe, weighted_layers
from .recipe import format_name as format_name  # re-exported: recipes lived here before .recipe
from .recipe import resolve_recipe as resolve_recipe

DEFAULT_CTX = 256  # tokens per chunk; llama.cpp's own default is 512 (give ctx=512 for that)
MIN_PROBE_TOKENS = 512  # and at least two chunks (llama.cpp's rule: 2 * ctx tokens)
MIN_CTX = 4
PROBE_RESOURCE = "probe_en.txt"  # in loomlab.resources: ~1,300 tokens of plain English prose
PERCENTILES = (90.0, 95.0, 99.0, 99.9)
ROWS_PER_BLOCK = 64  # positions whose float64 log-softmax is held at once (bounds memory, big vocabularies)

Morph = Callable[[Layer, int, LayerPlan], Any]  # morph_planned(layer, cell index, plan): morphs in place
Progress = Callable[[int, int, str], None]  # (forward passes done, total, what is running)


# ----- the probe ---------------------------------------------------------------------------------
def default_probe() -> str:
    """The English text shipped with Loom Lab for drift measurements (~1,300 tokens)."""
    return resources.files("loomlab.resources").joinpath(PROBE_RESOURCE).read_text("utf-8")


@dataclass(frozen=True)
class ProbeChunks:
    """A probe text cut into chunks as llama.cpp's perplexity tool cuts it."""

    tokens: int  # the probe's tokens (only ``len(chunks) * ctx`` of them are used)
    ctx: int
    chunks: tuple[np.ndarray, ...]  # each [ctx] int64, its first token BOS when the model adds one
    targets: tuple[np.ndarray, ...]  # each [ctx - 1 - ctx // 2]: the tokens the scored rows predict

    @property
    def first(self) -> int:
        return self.ctx // 2

    @property
    def positions(self) -> int:
        return sum(t.size for t in self.targets)


def probe_chunks(model, text: str, ctx: int = DEFAULT_CTX) -> ProbeChunks:
    """Tokenize ``text`` and cut it into ``len(tokens) // ctx`` chunks (see the module docstring).

    Raises:
        LoomConfigError: ``ctx`` out of range, or the text has fewer than ``max(512, 2 * ctx)`` tokens.
    """
    limit = model.context_length
    if isinstance(ctx, bool) or not isinstance(ctx, int | np.integer) or not MIN_CTX <= ctx <= limit:
        raise LoomConfigError(f"the context must be an integer from {MIN_CTX} to the model's {limit} tokens, "
                              f"got {ctx!r}")
    ctx = int(ctx)
    if not isinstance(text, str):
        raise LoomConfigError(f"the probe is a text, got {type(text).__name__}")
    ids = np.asarray(model.tokenizer.encode(text, add_special_tokens=True), dtype=np.int64)
    need = max(MIN_PROBE_TOKENS, 2 * ctx)
    if ids.size < need:
        raise LoomConfigError(f"the probe text has {ids.size} tokens; a drift measurement needs at least "
                              f"{need} ({MIN_PROBE_TOKENS} and two chunks of {ctx})")
    bos = bos_id(model.tokenizer)
    first = ctx // 2
    chunks, targets = [], []
    for start in range(0, (ids.size // ctx) * ctx, ctx):
        chunk = ids[start:start + ctx].copy()
        targets.append(chunk[first + 1:].copy())  # the text's own tokens, before BOS replaces the first
        if bos is not None:
            chunk[0] = bos
        chunks.append(chunk)
    return ProbeChunks(int(ids.size), ctx, tuple(chunks), tuple(targets))


def bos_id(tokenizer) -> int | None:
    """The BOS id when the tokenizer adds one to a sequence (llama.cpp's ``add_bos``), else None."""
    bos = getattr(tokenizer, "bos_id", None)
    if bos is None:
        return None
    return bos if tokenizer.encode("a", add_special_tokens=True)[:1] == [bos] else None


# ----- the statistics ----------------------------------------------------------------------------
@dataclass(frozen=True)
class DriftStats:
    """llama.cpp's ``--kl-divergence`` summary; probabilities as fractions (not percent)."""

    positions: int
    ppl_base: float
    ppl_base_unc: float
    ppl_morphed: float
    ppl_morphed_unc: float
    ppl_correlation: float  # Cor(ln PPL(Q), ln PPL(base)) over positions' NLLs, as llama.cpp prints it
    ln_ppl_ratio: float  # mean NLL(Q) - mean NLL(base)
    ln_ppl_ratio_unc: float
    ppl_ratio: float  # PPL(Q) / PPL(base)
    ppl_ratio_unc: float
    ppl_diff: float
    ppl_diff_unc: float
    kl_mean: float  # nats
    kl_mean_unc: float
    kl_median: float
    kl_p90: float
    kl_p95: float
    kl_p99: float
    kl_p999: float
    kl_max: float
    kl_min: float
    dp_mean: float  # mean of Q(token) - P(token)
    dp_mean_unc: float
    rms_dp: float
    rms_dp_unc: float
    same_top: float  # fraction of positions whose most likely token is the same
    same_top_unc: float

    def as_dict(self) -> dict[str, float]:
        """JSON-able, with the probabilities also in percent (``same_top_percent``, ``rms_dp_percent``)."""
        out: dict[str, float] = {k: getattr(self, k) for k in self.__dataclass_fields__}
        out["same_top_percent"] = 100.0 * self.same_top
        out["same_top_percent_unc"] = 100.0 * self.same_top_unc
        out["rms_dp_percent"] = 100.0 * self.rms_dp
        out["rms_dp_percent_unc"] = 100.0 * self.rms_dp_unc
        return out


class DriftAccumulator:
    """Running sums of a drift measurement, fed one chunk's scored logits at a time.

    Holds llama.cpp's sums (NLLs of both models and their squares and product, KL and its square,
    Δp and its 2nd and 4th powers, same-top count) and each position's KL and Δp for the
    percentiles; never the logits.
    """

    def __init__(self):
        self.count = 0
        self.same_top = 0
        self._sums = np.zeros(10)  # nll, nll2, nll_base, nll_base2, nll_nll_base, kl, kl2, dp, dp2, dp4
        self._kl: list[np.ndarray] = []
        self._dp: list[np.ndarray] = []

    def add(self, base_logits: np.ndarray, logits: np.ndarray, targets: np.ndarray) -> None:
        """Score rows ``[n, vocab]`` of the base and morphed model's logits, row ``i`` predicting
        ``targets[i]``."""
        base_logits, logits = np.asarray(base_logits), np.asarray(logits)
        targets = np.asarray(targets, dtype=np.int64)
        if (base_logits.shape != logits.shape or base_logits.ndim != 2
                or targets.shape != base_logits.shape[:1]):
            raise LoomConfigError(f"drift needs logits [n, vocab] of the same shape and n targets; got "
                                  f"{base_logits.shape}, {logits.shape} and {targets.shape}")
        for at in range(0, targets.size, ROWS_PER_BLOCK):
            rows = slice(at, at + ROWS_PER_BLOCK)
            self._add_rows(base_logits[rows], logits[rows], targets[rows])

    def _add_rows(self, base: np.ndarray, cur: np.ndarray, targets: np.ndarray) -> None:
        log_p, log_q = log_softmax(base), log_softmax(cur)
        kl = np.sum(np.exp(log_p) * (log_p - log_q), axis=-1)
        rows = np.arange(targets.size)
        nll_base, nll = -log_p[rows, targets], -log_q[rows, targets]
        dp = np.exp(-nll) - np.exp(-nll_base)
        self.same_top += int(np.count_nonzero(np.argmax(cur, axis=-1) == np.argmax(base, axis=-1)))
        self.count += targets.size
        dp2 = dp * dp
        self._sums += [nll.sum(), (nll * nll).sum(), nll_base.sum(), (nll_base * nll_base).sum(),
                       (nll * nll_base).sum(), kl.sum(), (kl * kl).sum(),
                       dp.sum(), dp2.sum(), (dp2 * dp2).sum()]
        self._kl.append(kl)
        self._dp.append(dp)

    @property
    def kl_values(self) -> np.ndarray:
        return np.concatenate(self._kl) if self._kl else np.empty(0)

    @property
    def dp_values(self) -> np.ndarray:
        return np.concatenate(self._dp) if self._dp else np.empty(0)

    def result(self) -> DriftStats:
        n = self.count
        if n < 2:
            raise LoomConfigError(f"drift statistics need at least 2 scored positions, got {n}")
        nll, nll2, nllb, nllb2, nll_nllb, kl, kl2, dp, dp2, dp4 = (float(s) for s in self._sums)
        log_ppl, log_ppl_unc = _mean_and_uncertainty(nll, nll2, n)
        log_base, log_base_unc = _mean_and_uncertainty(nllb, nllb2, n)
        cov = _covariance(nll, nllb, nll_nllb, n)
        ppl, ppl_base = math.exp(log_ppl), math.exp(log_base)
        ppl_unc, ppl_base_unc = ppl * log_ppl_unc, ppl_base * log_base_unc
        ln_ratio = log_ppl - log_base
        ln_ratio_unc = math.sqrt(max(0.0, log_ppl_unc ** 2 + log_base_unc ** 2 - 2 * cov))
        ratio = math.exp(ln_ratio)
        ppl_diff_unc = math.sqrt(max(0.0, ppl_unc ** 2 + ppl_base_unc ** 2 - 2 * ppl * ppl_base * cov))
        denom = log_ppl_unc * log_base_unc
        kl_mean, kl_unc = _mean_and_uncertainty(kl, kl2, n)
        dp_mean, dp_unc = _mean_and_uncertainty(dp, dp2, n)
        mse, mse_unc = _mean_and_uncertainty(dp2, dp4, n)
        rms = math.sqrt(max(0.0, mse))
        same = self.same_top / n
        values = self.kl_values
        p90, p95, p99, p999 = (float(v) for v in np.percentile(values, PERCENTILES))
        return DriftStats(
            positions=n, ppl_base=ppl_base, ppl_base_unc=ppl_base_unc,
            ppl_morphed=ppl, ppl_morphed_unc=ppl_unc, ppl_correlation=cov / denom if denom > 0 else 1.0,
            ln_ppl_ratio=ln_ratio, ln_ppl_ratio_unc=ln_ratio_unc,
            ppl_ratio=ratio, ppl_ratio_unc=ratio * ln_ratio_unc,
            ppl_diff=ppl - ppl_base, ppl_diff_unc=ppl_diff_unc,
            kl_mean=kl_mean, kl_mean_unc=kl_unc, kl_median=float(np.median(values)),
            kl_p90=p90, kl_p95=p95, kl_p99=p99, kl_p999=p999,
            kl_max=float(values.max()), kl_min=float(values.min()),
            dp_mean=dp_mean, dp_mean_unc=dp_unc,
            rms_dp=rms, rms_dp_unc=0.5 / rms * mse_unc if rms > 0 else 0.0,
            same_top=same, same_top_unc=math.sqrt(same * (1 - same) / (n - 1)))


def drift_stats(base_logits: np.ndarray, logits: np.ndarray, targets: np.ndarray) -> DriftStats:
    """The statistics of one set of scored rows (``[n, vocab]`` each, row ``i`` predicting
    ``targets[i]``): :class:`DriftAccumulator` fed once."""
    acc = DriftAccumulator()
    acc.add(base_logits, logits, targets)
    return acc.result()


def _mean_and_uncertainty(total: float, total2: float, n: int) -> tuple[float, float]:
    """llama.cpp's mean and its standard error (0 for 10 values or fewer)."""
    mean = total / n
    var = total2 / n - mean * mean
    return mean, math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0


def _covariance(a: float, b: float, ab: float, n: int) -> float:
    """llama.cpp's covariance of the two means (0 under 10 values)."""
    if n < 10:
        return 0.0
    return (ab / n - (a / n) * (b / n)) / (n - 1)


# ----- morphed states ----------------------------------------------------------------------------
class _Morphed:
    """Morphed copies of some layers' weight stores, switched in and out of the model.

    Each layer chosen gets a copy of its store (the file's matrices shared, not copied), morphed by
    ``morph``; the model's own stores are never touched (no master built, no scale fixed), and they
    are back in every layer when the ``with`` block ends, however it ends.
    """

    def __init__(self, layers: list[WeightedLayer], plan: Sequence[LayerPlan], morph: Morph,
                 stop: Callable[[], bool]):
        self._own = [(layers[lp.position].layer, layers[lp.position].layer.weights,
                      layers[lp.position].layer.cfg.dtype) for lp in plan]
        self._morphed: list[tuple[Layer, Any, str]] = []
        try:
            for lp in plan:
                if stop():
                    raise LoomCancelled("drift measurement cancelled while morphing layers")
                la = layers[lp.position]
                layer, store, dtype = la.layer, la.layer.weights, la.layer.cfg.dtype
                layer.weights = store.copy()
                try:
                    morph(layer, la.cell, lp)
                    self._morphed.append((layer, layer.weights, layer.cfg.dtype))
                finally:
                    layer.weights, layer.cfg.dtype = store, dtype
        except BaseException:
            self.restore()
            raise

    def switch_in(self) -> None:
        for layer, store, dtype in self._morphed:
            layer.weights, layer.cfg.dtype = store, dtype

    def restore(self) -> None:
        for layer, store, dtype in self._own:
            layer.weights, layer.cfg.dtype = store, dtype


@contextmanager
def _morphed(layers, plan, morph, stop) -> Iterator[_Morphed]:
    state = _Morphed(layers, plan, morph, stop)
    try:
        yield state
    finally:
        state.restore()


# ----- the measurement ---------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerDrift:
    """One layer morphed alone."""

    position: int
    name: str
    format: str
    bytes: int  # the model's weight bytes with only this layer morphed
    stats: DriftStats


@dataclass(frozen=True)
class DriftReport:
    model: str
    recipe: dict[str, str]  # layer name -> format (Q4_K+Q6_K for a mix), the layers morphed
    weighted_layers: int
    tokens: int  # the probe's
    ctx: int
    chunks: int
    bytes_base: int  # weight bytes (Loom's CalculateTotalMemory) of the model as it was
    bytes: int  # ... and morphed by the recipe
    stats: DriftStats
    layers: tuple[LayerDrift, ...] = field(default=())  # per layer, by KL mean, largest first
    seconds: float = 0.0
    fallbacks: tuple[str, ...] = ()  # llama.cpp's fallbacks the recipe took (rows not whole blocks)

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: the summary's numbers at the top level (``kl_mean``, ``same_top_percent`` ...)."""
        formats: dict[str, int] = {}
        for fmt in self.recipe.values():
            formats[fmt] = formats.get(fmt, 0) + 1
        out: dict[str, Any] = {
            "model": self.model, "weighted_layers": self.weighted_layers, "layers_morphed": len(self.recipe),
            "formats": formats, "tokens": self.tokens, "ctx": self.ctx, "chunks": self.chunks,
            "bytes_base": self.bytes_base, "bytes": self.bytes, **self.stats.as_dict(),
            "seconds": self.seconds, "recipe": dict(self.recipe), "fallbacks": list(self.fallbacks)}
        if self.layers:
            out["per_layer"] = [{"position": la.position, "layer": la.name, "format": la.format,
                                 "bytes": la.bytes, **la.stats.as_dict()} for la in self.layers]
        return out


def measure_drift(model, recipe, probe: str | None = None, *, ctx: int = DEFAULT_CTX, per_layer: bool = False,
                 morph: Morph = morph_planned, progress: Progress | None = None,
                 cancel: Cancel = None) -> DriftReport:
    """How far ``recipe`` moves ``model``'s next-token distributions over ``probe`` (see the module
    docstring), against the model as it is now.

    Args:
        model: a :class:`~loomlab.core.llm.generate.textmodel.TextModel` (``load_model``).
        recipe: what to morph, as :func:`~.recipe.plan_recipe` reads it.
        probe: the text (default :func:`default_probe`); at least ``max(512, 2 * ctx)`` tokens.
        ctx: tokens per chunk (llama.cpp's ``-c``).
        per_layer: also morph each of the recipe's layers alone and rank them by KL mean.
        morph: ``morph(layer, cell, layer_plan)`` morphs one layer in place (on a copy of its store).
        progress: ``progress(done, total, what)`` after each forward pass over a chunk; ``what`` is
            ``"base"``, ``"morphed"`` or the layer's name.
        cancel: checked before each forward pass and each layer morphed; raises
            :class:`LoomCancelled`. The model is unmorphed when this returns or raises.

    Holds the model (``model.busy()``), so it refuses a model that is generating; both runs take
    the exact path (float32 activations) whatever mode the model generates in.
    """
    began = time.perf_counter()
    stop = as_cancel_check(cancel)
    net = model.net
    layers = weighted_layers(net)
    recipe_plan = plan_recipe(net, recipe)
    plan = recipe_plan.changed
    chunks = probe_chunks(model, default_probe() if probe is None else probe, ctx)
    n = len(chunks.chunks)
    total = 2 * n + (n * len(plan) if per_layer else 0)
    done = 0

    def forward(chunk_index: int, what: str) -> np.ndarray:
        nonlocal done
        if stop():
            raise LoomCancelled("drift measurement cancelled")
        logits = net.step(chunks.chunks[chunk_index][None], None, last_only=False)
        # a host copy of the scored rows (the rest is freed; a device model sends only these)
        rows = np.array(to_host(logits[0, chunks.first:chunks.ctx - 1, :]), dtype=np.float32)
        done += 1
        if progress is not None:
            progress(done, total, what)
        return rows

    with model.busy(activations="float32"):  # the exact path: the weights' drift alone
        bytes_base = net.memory_bytes()
        acc = DriftAccumulator()
        kept: list[np.ndarray] = []  # the base rows of every chunk, for the per-layer runs only
        with _morphed(layers, plan, morph, stop) as state:
            state.switch_in()
            size = net.memory_bytes()
            for i in range(n):
                state.restore()
                base = forward(i, "base")
                state.switch_in()
                acc.add(base, forward(i, "morphed"), chunks.targets[i])
                if per_layer:
                    kept.append(base)
                del base
        stats = acc.result()
        ranked = []
        for lp in plan if per_layer else ():
            with _morphed(layers, [lp], morph, stop) as state:
                state.switch_in()
                layer_bytes = net.memory_bytes()
                one = DriftAccumulator()
                for i in range(n):
                    one.add(kept[i], forward(i, lp.name), chunks.targets[i])
            ranked.append(LayerDrift(lp.position, lp.name, lp.format, layer_bytes, one.result()))
    ranked.sort(key=lambda r: (-r.stats.kl_mean, r.position))
    return DriftReport(getattr(model, "name", ""), {lp.name: lp.format for lp in plan},
                       len(layers), chunks.tokens, chunks.ctx, n, bytes_base, size, stats, tuple(ranked),
                       time.perf_counter() - began, tuple(map(str, recipe_plan.fallbacks)))
