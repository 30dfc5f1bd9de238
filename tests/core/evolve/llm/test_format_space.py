"""Recipes of GGUF formats per matrix and their scores (core/evolve/llm/format_space.py, format_task.py).

Oracles: ``quant-report``'s measurement (:func:`measure_drift`) of the same recipe on the same text,
with and without an importance matrix; the plan's byte count and the morphed model's
``memory_bytes``; the same recipe scored afresh (no cached residual streams); llama.cpp's
block-size rule for which formats a row takes; brute-force dominance for the Pareto front; the
formulas of the budget and crowding fitness.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest

from loomlab.core.errors import LoomCancelled, LoomConfigError
from loomlab.core.evolve.genetics.gorand import GoRand
from loomlab.core.evolve.llm.format_space import (
    DEFAULT_FORMATS,
    HELDOUT,
    TRAIN,
    FormatSpace,
    bits_per_weight,
    block_elems,
    pareto_front,
    pareto_ranks,
)
from loomlab.core.evolve.llm.format_task import OVER_BUDGET, budget_fitness, pareto_fitness
from loomlab.core.evolve.search.run import Evolution
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.llm.generate.textmodel import TextModel
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.quality.drift import measure_drift
from loomlab.core.llm.quality.imatrix import compute_imatrix
from loomlab.core.llm.quality.recipe import apply_recipe, plan_recipe

TINY_LLAMA = Path(__file__).parents[3] / "data" / "tiny-hf" / "tiny-llama"
CTX = 64
TRAIN_TEXT = "The mill on the river ground wheat for three hundred years. " * 10  # 600 tokens
HELDOUT_TEXT = "A lighthouse keeper climbed the stairs each evening to light the lamp. " * 8


class ByteTokenizer:
    """Enough of a tokenizer for the texts (the tiny test model ships none)."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 50 + 1 for c in text]

    def close(self):
        pass


def tiny_model() -> TextModel:
    return TextModel(load_causal_lm(TINY_LLAMA), ByteTokenizer(), None, name="tiny-llama")


@pytest.fixture(scope="module")
def model():
    return tiny_model()


@pytest.fixture(scope="module")
def space(model):
    return FormatSpace(model, TRAIN_TEXT, HELDOUT_TEXT, ctx=CTX)


def quant_report(model, space, genes, text, importance=None):
    """What ``loomlab quant-report --recipe`` measures for the recipe's JSON."""
    morph = None
    if importance is not None:
        from loomlab.core.llm.quality.recipe import morph_planned

        def morph(layer, cell, plan):
            return morph_planned(layer, cell, plan, lambda name: importance.importance(name)
                                 if name in importance.in_sum2 else None)
    kwargs = {} if morph is None else {"morph": morph}
    return measure_drift(model, space.mapping(genes), text, ctx=CTX, **kwargs)


# ----- the space -----------------------------------------------------------------------------------
def test_each_matrix_takes_the_formats_whose_blocks_divide_its_rows_fewest_bits_first(space, model):
    names = {t.name for t in space.tensors}
    assert "token_embd.weight" in names and "output.weight" in names and len(names) == len(space.tensors)
    assert space.tensors[0].block == -1 and space.tensors[-1].name == "output.weight"
    for t in space.tensors:
        want = [f for f in DEFAULT_FORMATS if t.shape[1] % block_elems(f) == 0]
        assert set(t.formats) == set(want), t.name
        bits = [bits_per_weight(f) for f in t.formats]
        assert bits == sorted(bits)
    assert [bits_per_weight(f) for f in ("Q4_K", "Q6_K", "F16")] == [4.5, 6.5625, 16]


def test_bytes_are_the_plans_and_the_morphed_models(space):
    net = tiny_model().net
    mutant = space.mutate(space.presets["Q4_0"], GoRand(3), 0.5)
    for genes in (space.presets["Q4_0"], space.presets["Q8_0"], mutant):
        mapping = space.mapping(genes)
        assert space.recipe_bytes(genes) == plan_recipe(net, mapping).bytes
        fresh = tiny_model().net
        apply_recipe(fresh, mapping)
        assert space.recipe_bytes(genes) == fresh.memory_bytes()


def test_presets_are_llama_cpps_plans(space, model):
    assert {"Q4_K_M", "Q4_0", "Q8_0"} <= set(space.presets)
    plan = plan_recipe(model.net, "Q4_K_M")
    want = {}
    for lp in plan.layers:
        want.update(lp.tensor_formats)
    assert space.mapping(space.presets["Q4_K_M"]) == want


@pytest.mark.parametrize("preset", ["Q4_0", "Q4_K_M", "Q8_0"])
def test_a_recipes_score_is_quant_reports(space, model, preset):
    genes = space.presets[preset]
    for text, words in ((HELDOUT, HELDOUT_TEXT), (TRAIN, TRAIN_TEXT)):
        got = space.score(genes, text).stats
        want = quant_report(model, space, genes, words).stats
        assert got.positions == want.positions
        for key in ("kl_mean", "kl_p99", "kl_max", "same_top", "ppl_morphed", "rms_dp"):
            assert math.isclose(getattr(got, key), getattr(want, key), rel_tol=2e-4, abs_tol=1e-9), key
    assert space.score(genes) is space.score(genes)  # measured once


def test_cached_residual_streams_give_the_fresh_scores(model, space):
    base = space.presets["Q4_0"]
    rng = GoRand(7)
    children = [space.mutate(base, rng, 0.1) for _ in range(3)]
    cached = [space.score(c).kl_mean for c in children]
    assert space.cache_info().hits > 0  # the children shared their parent's first blocks
    fresh = FormatSpace(model, TRAIN_TEXT, HELDOUT_TEXT, ctx=CTX, state_bytes=0)
    assert [fresh.score(c).kl_mean for c in children] == cached
    assert fresh.cache_info().hits == 0


def test_an_importance_matrix_weighs_the_formats_as_quant_report_does(model):
    importance = compute_imatrix(model, TRAIN_TEXT, ctx=CTX)
    space = FormatSpace(model, TRAIN_TEXT, HELDOUT_TEXT, ctx=CTX, importance=importance)
    genes = space.presets["Q4_0"]
    weighted = space.score(genes, HELDOUT).kl_mean
    want = quant_report(model, space, genes, HELDOUT_TEXT, importance).stats.kl_mean
    assert math.isclose(weighted, want, rel_tol=2e-4)
    plain = quant_report(model, space, genes, HELDOUT_TEXT).stats.kl_mean
    assert weighted != plain


def test_mutation_moves_a_matrix_one_format_and_crossover_takes_each_from_a_parent(space):
    base = space.presets["Q4_0"]
    child = space.mutate(base, GoRand(11), 0.5)
    moved = [(t, a, b) for t, a, b in zip(space.tensors, base, child, strict=True) if a != b]
    assert moved
    for t, a, b in moved:
        assert abs(t.formats.index(a) - t.formats.index(b)) == 1
    again = space.mutate(base, GoRand(11), 0.5)
    assert again == child  # seeded: the same draws
    other = space.presets["Q8_0"]
    mixed = space.crossover(base, other, GoRand(2), 0.5)
    assert all(g in (a, b) for g, a, b in zip(mixed, base, other, strict=True))
    assert mixed != base and mixed != other


def test_bad_recipes_and_sources_are_refused(space, model, tmp_path):
    with pytest.raises(LoomConfigError, match="one format per matrix"):
        space.validate(["Q4_0"])
    bad = list(space.presets["Q4_0"])
    bad[0] = "Q4_K"  # rows of 64: not whole blocks of 256
    with pytest.raises(LoomConfigError, match="token_embd.weight .*cannot be 'Q4_K'"):
        space.validate(bad)
    with pytest.raises(LoomConfigError, match="unknown format"):
        FormatSpace(model, TRAIN_TEXT, HELDOUT_TEXT, ctx=CTX, formats=["Q4_0", "Q9_9"])
    morphed = tiny_model()
    apply_recipe(morphed.net, "Q8_0")
    with pytest.raises(LoomConfigError, match="morphed"):
        FormatSpace(morphed, TRAIN_TEXT, HELDOUT_TEXT, ctx=CTX)
    from ...llm.files.test_model_files_fuzz import write_tiny_gguf  # its matrices are Q8_0

    quantized = TextModel(load_causal_lm(write_tiny_gguf(tmp_path / "q8.gguf")), ByteTokenizer(), None)
    with pytest.raises(LoomConfigError, match=r"stored as Q8_0.*--recipe float16"):
        FormatSpace(quantized, "a" * 600, "b" * 600, ctx=CTX)


def test_a_cancelled_score_puts_the_models_weights_back(model, space):
    stores = [la.weights for _, la in model.net.layers() if la.weights is not None]
    genes = space.mutate(space.presets["Q8_0"], GoRand(5), 0.3)
    with pytest.raises(LoomCancelled):
        space.score(genes, TRAIN, cancel=lambda: True)
    assert [la.weights for _, la in model.net.layers() if la.weights is not None] == stores
    assert space.scored(genes, TRAIN) is None


# ----- fronts and fitness ----------------------------------------------------------------------------
def test_pareto_front_and_ranks_against_brute_force():
    rng = np.random.default_rng(0)
    points = [tuple(p) for p in rng.integers(0, 6, size=(40, 2)).astype(float)]

    def dominated(p, among):
        return any(q[0] <= p[0] and q[1] <= p[1] and q != p for q in among)

    front = pareto_front(points)
    undominated = [i for i, p in enumerate(points) if not dominated(p, points)]
    firsts = [i for i in undominated if points.index(points[i]) == i]  # equal points: the first
    assert sorted(front) == firsts
    ranks = pareto_ranks(points)
    for r in set(ranks):  # rank r: the front of the points not in a lower rank
        pool = [i for i in range(len(points)) if ranks[i] >= r]
        assert sorted(i for i in pool if ranks[i] == r) == sorted(pool[k] for k in
                                                                 pareto_front([points[i] for i in pool]))
        for i in pool:
            if ranks[i] > r:  # dominated by, or equal to, a point of rank r
                assert any(ranks[j] == r and points[j][0] <= points[i][0] and points[j][1] <= points[i][1]
                           for j in pool)


def test_pareto_fitness_is_rank_then_crowding():
    points = [(1.0, 5.0), (2.0, 3.0), (3.0, 2.5), (6.0, 1.0), (3.0, 4.0), (7.0, 7.0)]
    fit = pareto_fitness(points)
    assert fit[0] == fit[3] == 0.5  # the front's ends
    # (2, 3): neighbours (1, 5) and (3, 2.5) on a front spanning 5 in bytes and 4 in KL
    d = (3.0 - 1.0) / 5 + (5.0 - 2.5) / 4
    assert fit[1] == pytest.approx(0.5 * d / (1 + d))
    assert fit[4] == 0.5 - 1 and fit[5] == 0.5 - 2  # ranks 1 and 2, alone there
    assert min(fit[:4]) > max(fit[4:])


def test_budget_fitness_puts_every_recipe_over_the_cap_below_those_within():
    assert budget_fitness(0.3, 100, 100) == -0.3
    assert budget_fitness(0.0, 101, 100) == pytest.approx(-OVER_BUDGET - 0.01)
    assert budget_fitness(0.0, 101, 100) < budget_fitness(OVER_BUDGET - 0.1, 100, 100)


# ----- the task -----------------------------------------------------------------------------------
def test_params_are_checked_before_any_model_loads():
    for bad, word in [(dict(colour=1), "colour"), (dict(model=""), "model"), (dict(budget="Q9"), "budget"),
                      (dict(budget=-5), "budget"), (dict(formats=["Q4_0", "Q4_0"]), "twice"),
                      (dict(mutation_rate=2), "mutation_rate"), (dict(ctx=1), "ctx")]:
        with pytest.raises(LoomConfigError, match=word):
            get_task("gguf-recipe", **{"model": "x.gguf", **bad})


def run_task(model, budget, generations=2, population=6):
    task = get_task("gguf-recipe", model="tiny", ctx=CTX, budget=budget)
    task._space = FormatSpace(model, TRAIN_TEXT, HELDOUT_TEXT, ctx=CTX)
    run = Evolution(task, population=population)
    run.run(generations)
    return task, run


def test_a_budget_run_starts_from_the_presets_within_it_and_stays_within(model):
    task, run = run_task(model, "Q4_K_M")
    cap = task.cap
    assert cap == task.space.recipe_bytes(task.space.presets["Q4_K_M"])
    seeds = task.seeds()
    assert seeds and all(task.space.recipe_bytes(g) <= cap for g in seeds)
    assert task.space.recipe_bytes(run.best) <= cap
    held = task.space.scored(run.best, HELDOUT)
    want = quant_report(model, task.space, run.best, HELDOUT_TEXT).stats.kl_mean
    assert held is not None and math.isclose(held.kl_mean, want, rel_tol=2e-4)
    rows = task.last_scores
    assert len(rows) == 6 and sum(r.heldout_kl is not None for r in rows) >= 1
    assert task.morphs(run.best) == task.space.mapping(run.best)
    assert "held-out" in task.summary(run.best)


def test_a_pareto_run_rescores_its_front_and_compares_with_every_preset(model):
    task, run = run_task(model, "pareto", generations=2, population=8)
    assert task.cap is None
    front = [r for r in task.last_scores if r.heldout_kl is not None]
    assert front
    table = task.comparison()
    assert [c.preset for c in table] == list(task.space.presets)
    presets = set(task.space.presets.values())
    for c in table:
        assert c.preset_score.bytes == task.space.recipe_bytes(c.preset_genes)
        if c.evolved is not None:
            assert c.evolved not in presets and c.evolved_score.bytes <= c.preset_score.bytes
            trained = task.space.scored(c.evolved, TRAIN).kl_mean
            within = [s.kl_mean for (text, g), s in task.space.evaluated().items()
                      if text == TRAIN and s.bytes <= c.preset_score.bytes and g not in presets]
            assert trained == min(within)


def test_references_are_the_presets_heldout_scores(model, space):
    task = get_task("gguf-recipe", model="tiny", ctx=CTX)
    task._space = space
    refs = task.references()
    assert set(refs) == set(space.presets)
    for name, score in refs.items():
        assert score is space.scored(space.presets[name], HELDOUT)


def test_formats_draws_are_one_float_per_matrix():
    """The mutation's draws: one Float64 per matrix, one Intn(2) per move (a run repeats exactly)."""
    model = tiny_model()
    space = FormatSpace(model, TRAIN_TEXT, HELDOUT_TEXT, ctx=CTX, formats=["Q4_0", "Q8_0"])
    rng, mirror = GoRand(9), GoRand(9)
    child = space.mutate(space.presets["Q4_0"], rng, 0.25)
    moves = sum(mirror.float64() < 0.25 for _ in space.tensors)
    for _ in range(moves):
        mirror.intn(2)
    assert rng.float64() == mirror.float64()
    assert sum(a != b for a, b in zip(child, space.presets["Q4_0"], strict=True)) == moves
    assert list(itertools.chain(*[t.formats for t in space.tensors])) == ["Q4_0", "Q8_0"] * len(space)


def test_the_example_config_is_a_gguf_recipe_run():
    import tomllib

    from loomlab.core.evolve.search.run_config import plan_from_dict

    example = Path(__file__).parents[4] / "examples" / "gguf-recipe.toml"
    plan = plan_from_dict(tomllib.loads(example.read_text()))
    assert plan.task.name == "gguf-recipe" and plan.task.params["budget"] == "pareto"
    assert plan.task.params["model"] == "smollm2-f16.gguf" and plan.generations == 20
