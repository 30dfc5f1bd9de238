"""The built-in task ``quant-recipe``: evolve a language model's quantization recipe.

A member is a recipe, one Loom dtype per weighted layer (:mod:`.recipe_genome`); its fitness is
``-mean KL(P_model || P_recipe) - lam * bytes / bytes of the unmorphed model`` over the
next-token distributions of a few probe prompts. A run evolves recipes with the same loop as
networks (:class:`~.search.run.Evolution`, Loom's elitist selection and draws from the run's Go
generator); only what a member is differs, which :class:`RecipeGenome` says:

* the first population: the unmorphed recipe (every layer float32) and mutants of it, so a run
  starts from the model as loaded and trades accuracy for bytes from there;
* offspring: each layer's dtype from one of two parents (the fitter one's with probability 3/4,
  as Loom's blend leans to the fitter parent), then each layer moves to another dtype with
  probability ``mutation_rate``;
* checkpoints store a recipe as its JSON text.

The model is loaded (``load_model(params["model"])``) and the reference distributions computed
the first time the task needs them, in the process that evaluates: recipes are evaluated in
process only (a cluster's work items are networks).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ...cancel import Cancel
from ...errors import LoomConfigError
from ...units import format_bytes
from ..genetics.genome import Genome
from ..genetics.gorand import GoRand
from ..genetics.neat import NEATConfig
from ..genetics.values import check_number
from ..search.evaluators import Progress
from ..search.live import KEEP_GENE, KEPT
from ..search.tasks import Task
from .recipe_genome import (
    DEFAULT_DTYPES,
    DEFAULT_LAMBDA,
    DEFAULT_PROBE_TOKENS,
    DEFAULT_PROBES,
    Recipe,
    RecipeScore,
    RecipeSpace,
    check_count,
    check_dtypes,
    check_non_negative,
    check_probability,
    check_probes,
    recipe_from_bytes,
    recipe_to_bytes,
)

FITTER_SHARE = 0.75  # a child's layer comes from the fitter parent with this probability
# a member in memory: one dtype per weighted layer (hundreds), its score and its checkpoint text
RECIPE_MEMBER_BYTES = 64 << 10


class RecipeGenome(Genome):
    """Recipes of ``space`` (see the module docstring)."""

    member_kind = "recipe"

    def __init__(self, space: RecipeSpace, mutation_rate: float):
        self.space, self.mutation_rate = space, mutation_rate

    def initial(self, size: int, rng: GoRand) -> list[Recipe]:
        unmorphed = self.space.uniform(KEEP_GENE)
        return [unmorphed] + [self.space.mutate(unmorphed, rng, self.mutation_rate) for _ in range(size - 1)]

    def offspring(self, a, b, fitness_a, fitness_b, rng) -> Recipe:
        share = 0.5 if fitness_a == fitness_b else FITTER_SHARE if fitness_a > fitness_b else 1 - FITTER_SHARE
        return self.space.mutate(self.space.crossover(a, b, rng, share), rng, self.mutation_rate)

    def encode(self, member: Sequence[str]) -> bytes:
        return recipe_to_bytes(member)

    def decode(self, data: bytes) -> Recipe:
        return self.space.validate(recipe_from_bytes(data))


class RecipeTask(Task):
    """Evolve the per-layer dtypes of a language model (see the module docstring).

    Params: ``model`` (a built-in alias or a path, as ``load_model`` takes), ``dtypes`` (those a
    layer may take), ``probes`` (prompt texts), ``probe_tokens`` (each probe's length),
    ``lam`` (the cost of a whole model's bytes, in nats), ``mutation_rate`` (per layer) and
    ``threshold`` (a fitness that counts as solved; None: never).
    """

    name = "quant-recipe"
    member_by_member = True  # a recipe's probes take about a second: report and stop between them
    defaults: dict[str, Any] = {
        "model": "smollm2-135m", "dtypes": list(DEFAULT_DTYPES), "probes": list(DEFAULT_PROBES),
        "probe_tokens": DEFAULT_PROBE_TOKENS, "lam": DEFAULT_LAMBDA, "mutation_rate": 0.1, "threshold": None,
    }

    def __init__(self, **params: Any):
        unknown = sorted(set(params) - set(self.defaults))
        if unknown:
            raise LoomConfigError(f"task {self.name!r} has no parameter {unknown[0]!r}; "
                                  f"its parameters: {', '.join(sorted(self.defaults))}")
        p = {**self.defaults, **params}
        if not isinstance(p["model"], str) or not p["model"]:
            raise LoomConfigError(f"{_where('model')} must be a non-empty string, got {p['model']!r}")
        self.params = {"model": p["model"],
                       "dtypes": list(check_dtypes(p["dtypes"], _where("dtypes"))),
                       "probes": list(check_probes(p["probes"], _where("probes"))),
                       "probe_tokens": check_count(_where("probe_tokens"), p["probe_tokens"], 1),
                       "lam": check_non_negative(_where("lam"), p["lam"]),
                       "mutation_rate": check_probability(_where("mutation_rate"), p["mutation_rate"]),
                       "threshold": None if p["threshold"] is None else check_number(_where("threshold"),
                                                                                      p["threshold"])}
        self.fitness_threshold = self.params["threshold"]
        self._space: RecipeSpace | None = None
        self.last_scores: list[RecipeScore] = []  # KL and bytes of the last evaluation, in order

    @property
    def space(self) -> RecipeSpace:
        """The model's recipe space, built on first use (loads the model, runs the probes)."""
        if self._space is None:
            from ...llm.generate.textmodel import load_model

            self.use_model(load_model(self.params["model"], first_run="wait"))  # measured: the kernels
        return self._space

    def use_model(self, model) -> None:
        """Evolve ``model`` as it is loaded (the workbench already holds its weights) instead of
        loading the ``model`` parameter again."""
        p = self.params
        self._space = RecipeSpace(model, p["dtypes"], p["probes"], p["probe_tokens"], p["lam"])

    def member_bytes(self, config: NEATConfig | None = None) -> int:
        """A recipe's memory (the model is loaded once for the whole run)."""
        return RECIPE_MEMBER_BYTES

    def morphs(self, recipe: Sequence[str]) -> dict[str, str]:
        """The layers ``recipe`` morphs as ``{layer name: dtype}``, the recipe ``quant-report`` and
        ``quantize`` read (a layer it keeps as loaded is not named)."""
        return {name: gene for name, gene in zip(self.space.names, recipe, strict=True) if gene != KEEP_GENE}

    def summary(self, recipe: Sequence[str]) -> str:
        """``recipe`` in one line: its layers per dtype and its packed size,
        ``int8×30 as loaded×93, 45.2 MiB``."""
        counts = Counter(KEPT if gene == KEEP_GENE else gene for gene in recipe)
        layers = " ".join(f"{name}×{n}" for name, n in counts.most_common())
        return f"{layers}, {format_bytes(self.space.recipe_bytes(recipe))}"

    def genome(self, config: NEATConfig) -> RecipeGenome:
        """What a run's members are (the run's NEAT config only seeds its generator)."""
        return RecipeGenome(self.space, self.params["mutation_rate"])

    def evaluate(self, members: Sequence[Sequence[str]], progress: Progress | None = None,
                 cancel: Cancel = None) -> list[float]:
        self.last_scores = self.space.evaluate_many(members, progress=progress, cancel=cancel)
        return [s.fitness for s in self.last_scores]


def _where(key: str) -> str:
    return f"task {RecipeTask.name!r} parameter {key!r}"
