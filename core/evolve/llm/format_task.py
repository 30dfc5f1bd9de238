"""The built-in task ``gguf-recipe``: evolve a GGUF format for every matrix of a language model,
against llama.cpp's presets.

A member is a recipe of :mod:`.format_space` (one format per GGUF tensor). The run starts where
llama.cpp is: the first population holds the presets that plan for the model (Q4_K_M, Q4_0 ...;
with a byte budget, those within it) and mutants of them. A child takes each matrix's format from
one of two parents (the fitter's with probability 3/4) and then moves some matrices one format up
or down (``mutation_rate`` per matrix). Fitness, from the KL on the training text:

* a budget (a preset's name, its bytes being the cap, or a number of bytes): ``-KL`` within the
  cap; a recipe over it scores below every one within (``-KL - 10 - excess / cap``);
* ``"pareto"``: bytes and KL both count; a member's fitness is minus its non-dominated rank, plus
  up to 0.5 for its crowding distance on that front (NSGA-II's order), so the elitist selection
  keeps the front and spreads along it.

Every generation re-scores on the held-out text the members that matter (the fittest within the
budget, or the generation's front), and the presets once: those are the numbers a report shows
(:meth:`GGUFRecipeTask.comparison`). Members are evaluated in the process holding the model.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...cancel import Cancel
from ...errors import LoomConfigError
from ...io.bounded_read import read_small_text
from ...llm.quality.drift import DEFAULT_CTX, default_probe
from ...llm.quality.recipe import PRESET_PREFIX, PRESETS
from ...units import format_bytes
from ..genetics.gorand import GoRand
from ..genetics.neat import NEATConfig
from ..genetics.values import check_number
from ..search.evaluators import Progress
from ..search.tasks import Task
from .format_space import (
    DEFAULT_FORMATS,
    HELDOUT,
    TRAIN,
    FormatScore,
    FormatSpace,
    Genes,
    check_formats,
    pareto_ranks,
)
from .recipe_genome import check_count, check_probability
from .recipe_task import RECIPE_MEMBER_BYTES, RecipeGenome

PARETO = "pareto"
OVER_BUDGET = 10.0  # nats below any recipe within the budget
TRAIN_RESOURCE = "recipe_train_en.txt"  # in loomlab.resources: ~680 tokens of English prose
TEXT_LIMIT = 64 << 20  # bytes of a training or held-out text file


@dataclass(frozen=True)
class MemberScore:
    """What the population table and the scatter show of a recipe."""

    kl_mean: float  # on the training text
    bytes: int
    heldout_kl: float | None  # on the held-out text, once re-scored


@dataclass(frozen=True)
class Comparison:
    """One preset beside the best evolved recipe within its bytes, both on the held-out text."""

    preset: str
    preset_genes: Genes
    preset_score: FormatScore
    evolved: Genes | None  # the lowest training KL among the recipes evaluated within the bytes
    evolved_score: FormatScore | None


class FormatGenome(RecipeGenome):
    """Recipes of a :class:`FormatSpace`, first bred from ``seeds`` (see the module docstring);
    children and checkpoints as :class:`RecipeGenome` makes them."""

    def __init__(self, space: FormatSpace, seeds: Sequence[Genes], mutation_rate: float):
        super().__init__(space, mutation_rate)
        self.seeds = list(seeds)

    def initial(self, size: int, rng: GoRand) -> list[Genes]:
        out = self.seeds[:size]
        while len(out) < size:
            out.append(self.space.mutate(self.seeds[len(out) % len(self.seeds)], rng, self.mutation_rate))
        return out


class GGUFRecipeTask(Task):
    """Evolve per-matrix GGUF formats (see the module docstring).

    Params: ``model`` (a 16- or 32-bit GGUF or HF folder), ``train`` / ``heldout`` (text files;
    "": the shipped texts), ``ctx`` (tokens per chunk), ``budget`` (a preset, bytes, or
    ``"pareto"``), ``imatrix`` (an importance matrix file, or ""), ``formats``, ``mutation_rate``
    (per matrix) and ``threshold`` (a fitness that counts as solved; None: never).
    """

    name = "gguf-recipe"
    member_by_member = True
    defaults: dict[str, Any] = {
        "model": "", "train": "", "heldout": "", "ctx": DEFAULT_CTX, "budget": "Q4_K_M", "imatrix": "",
        "formats": list(DEFAULT_FORMATS), "mutation_rate": 0.02, "threshold": None,
    }

    def __init__(self, **params: Any):
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise LoomConfigError(f"task {self.name!r} has no parameter {unknown[0]!r}; "
                                  f"its parameters: {', '.join(sorted(self.defaults))}")
        p = {**self.defaults, **params}
        for key in ("model", "train", "heldout", "imatrix"):
            if not isinstance(p[key], str):
                raise LoomConfigError(f"{_where(key)} must be a string (a path), got {p[key]!r}")
        if not p["model"]:
            raise LoomConfigError(f"{_where('model')} names the 16-bit source (loomlab quantize MODEL "
                                  f"model-f16.gguf --recipe float16 makes one)")
        self.params = {"model": p["model"], "train": p["train"], "heldout": p["heldout"],
                       "ctx": check_count(_where("ctx"), p["ctx"], 4), "budget": check_budget(p["budget"]),
                       "imatrix": p["imatrix"], "formats": list(check_formats(p["formats"])),
                       "mutation_rate": check_probability(_where("mutation_rate"), p["mutation_rate"]),
                       "threshold": None if p["threshold"] is None else check_number(_where("threshold"),
                                                                                      p["threshold"])}
        self.fitness_threshold = self.params["threshold"]
        self._space: FormatSpace | None = None
        self.last_scores: list[MemberScore] = []

    # ----- the space ---------------------------------------------------------------------------
    @property
    def space(self) -> FormatSpace:
        """The model's format space, built on first use (loads the model, runs the reference)."""
        if self._space is None:
            from ...llm.generate.textmodel import load_model

            self.use_model(load_model(self.params["model"], first_run="wait"))
        return self._space

    def use_model(self, model) -> None:
        """Evolve ``model`` as loaded (the workbench already holds it) instead of loading ``model``."""
        p = self.params
        importance = None
        if p["imatrix"]:
            from ...llm.quality.imatrix import read_imatrix

            importance = read_imatrix(p["imatrix"])
        self._space = FormatSpace(model, _text(p["train"], "train"), _text(p["heldout"], "heldout"),
                                  formats=p["formats"], ctx=p["ctx"], importance=importance)

    @property
    def cap(self) -> int | None:
        """The byte cap (None: a Pareto run)."""
        budget = self.params["budget"]
        if budget == PARETO:
            return None
        if isinstance(budget, int):
            return budget
        return self.space.recipe_bytes(self.space.genes_of(PRESET_PREFIX + budget))

    def seeds(self) -> list[Genes]:
        """The presets a run starts from: those within the cap (all of them on a Pareto run), most
        bytes first, each distinct plan once; the smallest preset when none fits."""
        presets = sorted(set(self.space.presets.values()), key=lambda g: (-self.space.recipe_bytes(g), g))
        cap = self.cap
        within = [g for g in presets if cap is None or self.space.recipe_bytes(g) <= cap]
        return within or presets[-1:]

    def genome(self, config: NEATConfig) -> FormatGenome:
        return FormatGenome(self.space, self.seeds(), self.params["mutation_rate"])

    def member_bytes(self, config: NEATConfig | None = None) -> int:
        return RECIPE_MEMBER_BYTES

    # ----- evaluation --------------------------------------------------------------------------
    def evaluate(self, members: Sequence[Sequence[str]], progress: Progress | None = None,
                 cancel: Cancel = None) -> list[float]:
        space = self.space
        self.references(progress, cancel)  # the presets' held-out scores: measured in the first generation
        scores = space.score_many(members, TRAIN, progress=progress, cancel=cancel)
        points = [(s.bytes, s.kl_mean) for s in scores]
        cap = self.cap
        if cap is None:
            fitness = pareto_fitness(points)
            chosen = [i for i, f in enumerate(fitness) if f >= 0]
        else:
            fitness = [budget_fitness(kl, size, cap) for size, kl in points]
            top = max(range(len(fitness)), key=lambda i: (fitness[i], -i))
            chosen = [top] if scores[top].bytes <= cap else []
        for i in chosen:
            space.score(members[i], HELDOUT, cancel)
        self.last_scores = [MemberScore(s.kl_mean, s.bytes, _kl(space.scored(m, HELDOUT)))
                            for m, s in zip(members, scores, strict=True)]
        return fitness

    def references(self, progress: Progress | None = None, cancel: Cancel = None) -> dict[str, FormatScore]:
        """Each preset's held-out score, by name; ``progress(done, presets)`` while any is measured
        (the first time: a few seconds a preset on SmolLM2-135M)."""
        presets = self.space.presets
        if progress is not None and any(self.space.scored(g, HELDOUT) is None for g in presets.values()):
            progress(0, len(presets))
            for done, genes in enumerate(presets.values(), 1):
                self.space.score(genes, HELDOUT, cancel)
                progress(done, len(presets))
        return {name: self.space.score(genes, HELDOUT, cancel) for name, genes in presets.items()}

    def comparison(self, cancel: Cancel = None) -> list[Comparison]:
        """Every preset beside the evolved recipe with the lowest training KL within its bytes
        (presets themselves excluded), both re-scored on the held-out text."""
        space = self.space
        tried = [(genes, score) for (text, genes), score in space.evaluated().items() if text == TRAIN]
        presets = set(space.presets.values())
        out = []
        for name, genes in space.presets.items():
            size = space.recipe_bytes(genes)
            fits = [(s.kl_mean, g) for g, s in tried if s.bytes <= size and g not in presets]
            best = min(fits, default=None)
            out.append(Comparison(name, genes, space.score(genes, HELDOUT, cancel),
                                  None if best is None else best[1],
                                  None if best is None else space.score(best[1], HELDOUT, cancel)))
        return out

    # ----- what the CLI and the panel print ------------------------------------------------------
    def morphs(self, genes: Sequence[str]) -> dict[str, str]:
        """``{GGUF tensor: format}``, the JSON recipe ``quantize --recipe`` reads."""
        return self.space.mapping(genes)

    def summary(self, genes: Sequence[str]) -> str:
        """``Q4_0×120 Q6_K×40 ..., 96.2 MiB, KL 0.041 (held-out 0.038)``."""
        counts = " ".join(f"{fmt}×{n}" for fmt, n in Counter(genes).most_common())
        train, heldout = self.space.scored(genes, TRAIN), self.space.scored(genes, HELDOUT)
        kl = "" if train is None else f", KL {train.kl_mean:.4g}"
        held = "" if heldout is None else f" (held-out {heldout.kl_mean:.4g})"
        return f"{counts}, {format_bytes(self.space.recipe_bytes(genes))}{kl}{held}"


# ----- fitness -----------------------------------------------------------------------------------------
def budget_fitness(kl: float, size: int, cap: int) -> float:
    """``-kl`` within ``cap`` bytes; below every recipe within it when over."""
    return -kl if size <= cap else -kl - OVER_BUDGET - (size - cap) / cap


def pareto_fitness(points: Sequence[tuple[float, float]]) -> list[float]:
    """Minus each point's non-dominated rank, plus ``0.5 * d / (1 + d)`` for its crowding distance
    ``d`` within its rank (NSGA-II's: the sum over both axes of the neighbours' gap over the
    rank's range; a rank's two ends 0.5)."""
    ranks = pareto_ranks(points)
    out = [0.0] * len(points)
    for rank in set(ranks):
        members = [i for i, r in enumerate(ranks) if r == rank]
        crowd = dict.fromkeys(members, 0.0)
        for axis in (0, 1):
            members.sort(key=lambda i: (points[i][axis], i))
            span = points[members[-1]][axis] - points[members[0]][axis]
            crowd[members[0]] = crowd[members[-1]] = math.inf
            for before, i, after in zip(members, members[1:], members[2:], strict=False):
                if span > 0:
                    crowd[i] += (points[after][axis] - points[before][axis]) / span
        for i in members:
            d = crowd[i]
            out[i] = -rank + (0.5 if math.isinf(d) else 0.5 * d / (1 + d))
    return out


def check_budget(budget) -> str | int:
    if budget == PARETO or budget in PRESETS:
        return budget
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        return budget
    raise LoomConfigError(f"{_where('budget')} is a preset ({', '.join(PRESETS)}), a number of bytes "
                          f"or {PARETO!r}; got {budget!r}")


def _kl(score: FormatScore | None) -> float | None:
    return None if score is None else score.kl_mean


def _text(path: str, key: str) -> str:
    """The text at ``path``; "" the shipped one (the training text, or the drift probe)."""
    if path:
        return read_small_text(Path(path), f"the {key} text", TEXT_LIMIT)
    if key == "heldout":
        return default_probe()
    from importlib import resources

    return resources.files("loomlab.resources").joinpath(TRAIN_RESOURCE).read_text("utf-8")


def _where(key: str) -> str:
    return f"task {GGUFRecipeTask.name!r} parameter {key!r}"
