"""Quantization recipes of SmolLM2-135M: fitness against a slow reference (a fresh copy of the model
morphed layer by layer, KL by a separate formula), exact revert, byte counts, seeded breeding."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader

from loomlab.core.errors import LoomCancelled, LoomConfigError
from loomlab.core.evolve.genetics.gorand import GoRand
from loomlab.core.evolve.llm.recipe_genome import (
    RecipeSpace,
    recipe_from_bytes,
    recipe_from_json,
    recipe_to_bytes,
    recipe_to_json,
)
from loomlab.core.llm.files import registry
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.morph import morph_sublayer, weighted_cells
from loomlab.core.morph_probe import llm_probe

PROBES = ("The capital of France is Paris, and the capital of Italy is",
          "for i in range(10):\n    print(i *")
TOKENS = 12
DTYPES = ("float32", "float16", "bfloat16", "fp8e4m3", "int8", "int4")
BITS = {"float32": 32, "float16": 16, "bfloat16": 16, "fp8e4m3": 8, "int8": 8, "int4": 4}
LAM = 0.7


@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def space(model):
    return RecipeSpace(model, DTYPES, PROBES, TOKENS, LAM)


def partial_recipe(space, plan: dict[str, str]) -> tuple[str, ...]:
    """float32 everywhere but the layers ``plan`` names."""
    return tuple(plan.get(name, "float32") for name in space.names)


def slow_reference(recipe) -> tuple[float, int]:
    """Mean KL and memory bytes of ``recipe`` on a fresh copy morphed layer by layer by the Morph
    panel's own call, KL from softmax probabilities (not log-softmax) in float64."""
    with load_model("smollm2-135m") as fresh, fresh.busy(activations="float32"):  # as measured
        reference = [llm_probe(fresh, text, TOKENS).logits for text in PROBES]
        for (index, layer), dtype in zip(weighted_cells(fresh.net), recipe, strict=True):
            if dtype != "float32":
                morph_sublayer(layer, index, dtype)
        morphed = [llm_probe(fresh, text, TOKENS).logits for text in PROBES]
        size = fresh.net.memory_bytes()
    kls = []
    for a, b in zip(reference, morphed, strict=True):
        p, q = softmax(a), softmax(b)
        kls.extend(np.sum(p * (np.log(p) - np.log(q)), axis=1))
    return float(np.mean(kls)), size


def softmax(logits) -> np.ndarray:
    e = np.exp(np.asarray(logits, np.float64) - np.max(logits, axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def packed_bytes(model, recipe) -> int:
    """Bytes by bits per weight, each layer's weights counted from its matrices' shapes; a tied
    head and its embedding in one dtype are one copy. "float32": the file's own blocks (gguf-py's
    block sizes; the file has no zero filler biases), each matrix once."""
    total, seen = 0, set()
    for (_, layer), dtype in zip(weighted_cells(model.net), recipe, strict=True):
        blocks = layer.weights.blocks
        if dtype == "float32":
            for name, m in blocks.items():
                if id(m) not in seen:
                    seen.add(id(m))
                    total += file_bytes(name, m)
            continue
        tensors = {id(m) for m in blocks.values() if len(m.shape) == 2}
        if tensors and (dtype, frozenset(tensors)) in seen:
            continue
        seen.add((dtype, frozenset(tensors)))
        n = sum(math.prod(m.shape) for m in blocks.values())
        total += math.ceil(n * BITS[dtype] / 8)
    return total


def file_bytes(name: str, m) -> int:
    if isinstance(m, np.ndarray):
        return 0 if name.startswith("b") and not m.any() else 4 * m.size
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[m.type_name]]
    return m.shape[0] * (m.shape[1] // block) * size


def state_of(model) -> tuple[np.ndarray, list]:
    with model.busy():  # the thread settings the model runs under (the kernels crawl outside them)
        logits = model.net.step(np.array([[1, 504, 2365, 6354, 16438]]), None, last_only=False)
    stores = [(layer.weights, layer.cfg.dtype, layer.weights.scale, dict(layer.weights.native))
              for layer in model.net.weighted_layers()]
    return logits, stores


def assert_unchanged(model, before) -> None:
    logits, stores = state_of(model)
    assert np.array_equal(logits, before[0])  # bit for bit
    assert all(a[0] is b[0] and a[1:3] == b[1:3] and a[3].keys() == b[3].keys()
               for a, b in zip(stores, before[1], strict=True))


# ----- fitness ----------------------------------------------------------------------------------
def test_the_unmorphed_recipe_has_no_divergence_and_every_byte(model, space):
    in_file = sum(int(t.n_bytes) for t in GGUFReader(registry.fetch("smollm2-135m")).tensors)  # gguf-py's
    score = space.evaluate(space.uniform("float32"))
    assert score.kl_mean == pytest.approx(0, abs=1e-12)
    assert score.bytes == space.bytes_unmorphed == model.net.memory_bytes() == in_file  # the tied table once
    assert score.fitness == pytest.approx(-LAM, abs=1e-12)
    assert len(space) == len(space.names) == len(weighted_cells(model.net)) == 123
    assert space.positions == sum(min(TOKENS, len(model.tokenizer.encode(p, add_special_tokens=True)))
                                  for p in PROBES)


@pytest.mark.parametrize("plan", [
    # head and embedding apart (both counted), a block's layers in four dtypes
    {"token_embd": "int8", "output (tied to token_embd)": "bfloat16", "blk.0.attn_q/k/v/output": "int4",
     "blk.0.ffn_gate/up/down": "fp8e4m3", "blk.3.attn_norm": "int4", "blk.7.ffn_gate/up/down": "int8"},
    # head and embedding together (one copy), float16 in the middle
    {"token_embd": "int8", "output (tied to token_embd)": "int8", "blk.12.attn_q/k/v/output": "float16",
     "blk.29.ffn_gate/up/down": "bfloat16", "output_norm": "fp8e4m3"},
], ids=["tied-apart", "tied-together"])
def test_a_recipe_scores_as_the_slow_reference(model, space, plan):
    recipe = partial_recipe(space, plan)
    assert sum(d != "float32" for d in recipe) == len(plan)
    score = space.evaluate(recipe)
    kl, size = slow_reference(recipe)
    assert score.kl_mean == pytest.approx(kl, abs=1e-9, rel=1e-9)
    assert kl > 1e-4  # the recipe does change the model
    assert score.bytes == size == packed_bytes(model, recipe) == space.recipe_bytes(recipe)
    assert score.fitness == pytest.approx(-kl - LAM * size / model.net.memory_bytes(), abs=1e-9)


def test_evaluate_reverts_exactly_and_reuses_quantized_layers(model, space):
    before = state_of(model)
    recipe = partial_recipe(space, {"token_embd": "int8", "blk.1.attn_q/k/v/output": "bfloat16",
                                    "blk.2.ffn_gate/up/down": "int4"})
    first = space.evaluate(recipe)
    assert_unchanged(model, before)
    builds = space.cache_info().builds
    assert space.evaluate(recipe) == first  # same numbers, from cached layers
    assert space.cache_info().builds == builds
    # the head in the embedding's dtype is the same quantized table: nothing new to build
    tied = partial_recipe(space, {"token_embd": "int8", "output (tied to token_embd)": "int8"})
    space.evaluate(tied)
    assert space.cache_info().builds == builds
    assert_unchanged(model, before)


def test_a_cancelled_or_failing_evaluation_leaves_the_model_unmorphed(model, space, monkeypatch):
    before = state_of(model)
    recipe = partial_recipe(space, {"blk.4.attn_q/k/v/output": "int8", "blk.5.ffn_gate/up/down": "int4"})
    checks = itertools.count()  # checked at the start, per morphed layer, per probe: 5th = 2nd probe
    with pytest.raises(LoomCancelled, match="between probes"):
        space.evaluate(recipe, cancel=lambda: next(checks) >= 4)
    assert_unchanged(model, before)
    with pytest.raises(LoomCancelled):
        space.evaluate_many([recipe, recipe], cancel=lambda: True)
    real_step = model.net.step

    def failing_step(*args, **kwargs):
        assert list(model.net.weighted_layers())[1].weights is not before[1][1][0]  # morphed here
        real_step(*args, **kwargs)
        raise RuntimeError("forward failed")

    monkeypatch.setattr(model.net, "step", failing_step)
    with pytest.raises(RuntimeError, match="forward failed"):
        space.evaluate(partial_recipe(space, {"blk.0.attn_norm": "int8"}))
    monkeypatch.undo()
    assert_unchanged(model, before)


def test_evaluate_many_is_evaluate_in_order(space):
    rng = GoRand(11)
    base = partial_recipe(space, {"blk.6.attn_q/k/v/output": "int8"})
    recipes = [base, space.mutate(base, rng, 0.02), space.uniform("float32")]
    seen = []
    scores = space.evaluate_many(recipes, progress=lambda done, total: seen.append((done, total)))
    assert scores == [space.evaluate(r) for r in recipes]
    assert seen == [(0, 3), (1, 3), (2, 3), (3, 3)]


def test_a_small_cache_stays_in_its_bound(model):
    layer_bytes = 4 * 2657856  # one MLP layer's weights in float32
    small = RecipeSpace(model, DTYPES, PROBES[:1], 6, LAM, cache_bytes=layer_bytes + 10)
    a = partial_recipe(small, {"blk.8.ffn_gate/up/down": "int8", "blk.9.ffn_gate/up/down": "int8"})
    first = small.evaluate(a)
    info = small.cache_info()
    assert (info.entries, info.bytes, info.builds) == (1, layer_bytes, 2)
    assert small.evaluate(a) == first  # evicted and quantized again: the same weights
    assert small.cache_info().bytes <= layer_bytes + 10


# ----- breeding ---------------------------------------------------------------------------------
def test_random_mutate_and_crossover_draw_from_the_go_generator(space):
    dtypes = space.dtypes
    a = space.random_recipe(GoRand(3))
    oracle = GoRand(3)
    assert a == tuple(dtypes[oracle.intn(len(dtypes))] for _ in range(len(space)))
    assert a == space.random_recipe(GoRand(3)) != space.random_recipe(GoRand(4))
    b = space.random_recipe(GoRand(5))

    mutant = space.mutate(a, GoRand(9), 0.3)
    oracle, expected = GoRand(9), []
    for d in a:
        if oracle.float64() < 0.3:
            others = [x for x in dtypes if x != d]
            d = others[oracle.intn(len(others))]
        expected.append(d)
    assert mutant == tuple(expected) == space.mutate(a, GoRand(9), 0.3)
    assert 0 < sum(x != y for x, y in zip(a, mutant, strict=True)) < len(a)
    assert space.mutate(a, GoRand(9), 0.0) == a
    assert all(x != y for x, y in zip(a, space.mutate(a, GoRand(9), 1.0), strict=True))

    child = space.crossover(a, b, GoRand(2), share_a=0.6)
    oracle = GoRand(2)
    assert child == tuple(x if oracle.float64() < 0.6 else y for x, y in zip(a, b, strict=True))
    assert space.crossover(a, b, GoRand(2)) == space.crossover(a, b, GoRand(2))
    assert space.crossover(a, b, GoRand(2), share_a=1.0) == a
    assert space.crossover(a, b, GoRand(2), share_a=0.0) == b
    assert {*a, *b, *mutant, *child} <= set(dtypes)


def test_recipes_round_trip_through_checkpoint_bytes(space):
    recipe = space.random_recipe(GoRand(8))
    assert recipe_from_bytes(recipe_to_bytes(recipe)) == recipe
    assert recipe_from_json(recipe_to_json(recipe)) == recipe
    assert space.validate(recipe_from_bytes(recipe_to_bytes(recipe))) == recipe


# ----- bad input --------------------------------------------------------------------------------
@pytest.mark.parametrize("recipe, message", [
    (("float32",) * 122, "one dtype per weighted layer \\(123\\), got 122"),
    (("float32",) * 124, "got 124"),
    ("float32", "a recipe is a sequence of dtype names"),
    (("float32",) * 60 + ("float8",) + ("float32",) * 62, "recipe layer 60 .*'float8' is not one of"),
    (("int2",) + ("float32",) * 122, "recipe layer 0 \\(token_embd\\): 'int2' is not one of this space's"),
    ((None,) * 123, "recipe layer 0"),
])
def test_bad_recipes_are_refused(space, recipe, message):
    for call in (space.validate, space.evaluate, lambda r: space.evaluate_many([space.uniform("int8"), r]),
                 lambda r: space.mutate(r, GoRand(1), 0.1)):
        with pytest.raises(LoomConfigError, match=message):
            call(recipe)


def test_aliases_are_read_as_loom_names(space):
    assert space.validate(("FP16",) + ("float32",) * 122)[0] == "float16"


def test_bad_settings_are_refused(model, space):
    for kwargs, message in [
        ({"dtypes": ("float32", "float12")}, "unknown dtype 'float12'"),
        ({"dtypes": ("int8", "INT8")}, "listed twice"),
        ({"dtypes": ()}, "non-empty sequence"),
        ({"probes": ()}, "probes is a non-empty"),
        ({"probes": ("ok", "")}, "each probe is a non-empty string"),
        ({"probe_tokens": 0}, "probe_tokens must be an integer >= 1"),
        ({"lam": -1.0}, "lam must be a finite number >= 0"),
        ({"lam": float("nan")}, "lam"),
        ({"cache_bytes": -5}, "cache_bytes"),
    ]:
        with pytest.raises(LoomConfigError, match=message):
            RecipeSpace(model, **kwargs)
    with pytest.raises(LoomConfigError, match="needs a language model"):
        RecipeSpace(model.net)
    recipe = space.uniform("float32")
    with pytest.raises(LoomConfigError, match="rate must lie in"):
        space.mutate(recipe, GoRand(1), 1.5)
    with pytest.raises(LoomConfigError, match="GoRand"):
        space.random_recipe(np.random.default_rng(1))
    for text in ("{", '{"a": 1}', '["int8", 3]'):
        with pytest.raises(LoomConfigError, match="stored recipe"):
            recipe_from_json(text)


def test_a_morphed_model_is_refused():
    with load_model("smollm2-135m") as fresh:
        index, norm = weighted_cells(fresh.net)[1]
        morph_sublayer(norm, index, "int8")
        with pytest.raises(LoomConfigError, match="blk.0.attn_norm is int8.*morph it back"):
            RecipeSpace(fresh, probes=PROBES[:1], probe_tokens=4)
