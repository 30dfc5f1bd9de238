"""Output drift as llama.cpp's ``llama-perplexity --kl-divergence`` reports it (core/llm/quality/drift.py).

Oracles: the statistics against a brute-force numpy computation written out from llama.cpp's
definitions (explicit log-softmax, KL sum, its percentile and median conventions, its ± formulas);
a model against itself (KL 0, same top 100 %, ratio 1); the streamed, swapped-store measurement
against the same chunks run on a fresh copy morphed by the engine's own morph calls; each layer of
a per-layer run against that layer measured alone.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from loomlab.core.errors import LoomCancelled, LoomConfigError
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.quality.drift import (
    DriftAccumulator,
    default_probe,
    drift_stats,
    measure_drift,
    probe_chunks,
    resolve_recipe,
    weighted_layers,
)
from loomlab.core.morph import morph_sublayer

CTX = 128  # 4 chunks of the short probe: 252 scored positions, ~4 s a measurement
FEW = {"token_embd": "int8", "blk.0.attn_q/k/v/output": "int8", "blk.0.ffn_gate/up/down": "int8",
       "blk.29.ffn_norm": "int8", "output_norm": "int8"}


# ----- the oracle: llama.cpp's definitions written out ---------------------------------------------
def brute_force(base: np.ndarray, cur: np.ndarray, targets: np.ndarray) -> dict[str, float]:
    base, cur = base.astype(np.float64), cur.astype(np.float64)
    n = targets.size

    def log_softmax(x):
        m = x.max(axis=1, keepdims=True)
        return x - m - np.log(np.exp(x - m).sum(axis=1, keepdims=True))

    lp, lq = log_softmax(base), log_softmax(cur)
    kl = np.array([np.sum(np.exp(lp[i]) * (lp[i] - lq[i])) for i in range(n)])
    nll_b = np.array([-lp[i, targets[i]] for i in range(n)])
    nll = np.array([-lq[i, targets[i]] for i in range(n)])
    dp = np.exp(-nll) - np.exp(-nll_b)
    same = np.mean([np.argmax(base[i]) == np.argmax(cur[i]) for i in range(n)])

    def unc(v):  # llama.cpp's mean_and_uncertainty
        var = np.mean(v * v) - np.mean(v) ** 2
        return math.sqrt(var / (n - 1)) if var > 0 and n > 10 else 0.0

    def percentile(values, fraction):  # llama.cpp's lambda
        v = sorted(values)
        p = fraction * (len(v) - 1)
        ip = int(p)
        p -= ip
        return (1 - p) * v[ip] + p * v[min(ip + 1, len(v) - 1)]

    s = sorted(kl)
    median = 0.5 * (s[n // 2] + s[n // 2 - 1]) if n % 2 == 0 else s[n // 2]
    cov = (np.mean(nll * nll_b) - np.mean(nll) * np.mean(nll_b)) / (n - 1)
    ln_ratio_unc = math.sqrt(unc(nll) ** 2 + unc(nll_b) ** 2 - 2 * cov)
    rms = math.sqrt(np.mean(dp ** 2))
    return {
        "ppl_base": math.exp(nll_b.mean()), "ppl_morphed": math.exp(nll.mean()),
        "ppl_base_unc": math.exp(nll_b.mean()) * unc(nll_b),
        "ppl_morphed_unc": math.exp(nll.mean()) * unc(nll),
        "ln_ppl_ratio": nll.mean() - nll_b.mean(), "ln_ppl_ratio_unc": ln_ratio_unc,
        "ppl_ratio": math.exp(nll.mean() - nll_b.mean()),
        "ppl_ratio_unc": math.exp(nll.mean() - nll_b.mean()) * ln_ratio_unc,
        "kl_mean": kl.mean(), "kl_mean_unc": unc(kl), "kl_median": median,
        "kl_p90": percentile(kl, 0.90), "kl_p95": percentile(kl, 0.95), "kl_p99": percentile(kl, 0.99),
        "kl_p999": percentile(kl, 0.999), "kl_max": s[-1], "kl_min": s[0],
        "dp_mean": dp.mean(), "rms_dp": rms, "rms_dp_unc": 0.5 / rms * unc(dp ** 2),
        "same_top": same, "same_top_unc": math.sqrt(same * (1 - same) / (n - 1)),
    }


def random_logits(n=301, vocab=97, seed=0, noise=0.7):
    rng = np.random.default_rng(seed)
    base = (rng.standard_normal((n, vocab)) * 3).astype(np.float32)
    cur = (base + rng.standard_normal((n, vocab)) * noise).astype(np.float32)
    return base, cur, rng.integers(0, vocab, n)


@pytest.mark.parametrize("n", [301, 300])  # odd and even counts (the median's two cases)
def test_stats_match_llama_cpp_definitions_by_brute_force(n):
    base, cur, targets = random_logits(n)
    got = drift_stats(base, cur, targets)
    for key, want in brute_force(base, cur, targets).items():
        assert getattr(got, key) == pytest.approx(want, rel=1e-9, abs=1e-12), key
    assert got.positions == n
    assert got.as_dict()["same_top_percent"] == pytest.approx(100 * got.same_top)


def test_streaming_in_uneven_chunks_equals_one_pass():
    base, cur, targets = random_logits(301)
    acc = DriftAccumulator()
    for a, b in [(0, 7), (7, 150), (150, 151), (151, 301)]:  # blocks beyond ROWS_PER_BLOCK included
        acc.add(base[a:b], cur[a:b], targets[a:b])
    streamed, whole = acc.result(), drift_stats(base, cur, targets)
    for key, value in whole.as_dict().items():
        assert streamed.as_dict()[key] == pytest.approx(value, rel=1e-12, abs=1e-15), key


def test_identical_logits_give_no_drift():
    base, _, targets = random_logits(200)
    s = drift_stats(base, base.copy(), targets)
    assert s.kl_mean == s.kl_max == s.kl_p99 == 0.0
    assert s.same_top == 1.0 and s.ppl_ratio == 1.0 and s.ppl_base == s.ppl_morphed and s.rms_dp == 0.0


def test_accumulator_rejects_mismatched_shapes():
    base, cur, targets = random_logits(20)
    with pytest.raises(LoomConfigError):
        drift_stats(base, cur[:, :-1], targets)
    with pytest.raises(LoomConfigError):
        drift_stats(base, cur, targets[:-1])


# ----- SmolLM2-135M --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def model(smollm2):
    return smollm2


@pytest.fixture(scope="module")
def probe(model):
    text = "\n\n".join(default_probe().split("\n\n")[:5])
    assert len(model.tokenizer.encode(text, add_special_tokens=True)) >= 512
    return text


def own_state(model):
    return [(la.layer.weights, la.layer.cfg.dtype, la.layer.weights.version, len(la.layer.weights.native))
            for la in weighted_layers(model.net)]


def test_default_probe_is_long_enough_for_llama_cpps_default_context(model):
    chunks = probe_chunks(model, default_probe(), 512)
    assert chunks.tokens >= 1024 and len(chunks.chunks) == 2 and chunks.positions == 2 * 255


def test_chunks_are_consecutive_slices_scored_on_their_second_half(model, probe):
    ids = model.tokenizer.encode(probe, add_special_tokens=True)
    chunks = probe_chunks(model, probe, CTX)
    assert len(chunks.chunks) == len(ids) // CTX
    for i, (chunk, targets) in enumerate(zip(chunks.chunks, chunks.targets, strict=True)):
        assert chunk.tolist() == ids[i * CTX:(i + 1) * CTX]  # SmolLM2 adds no BOS
        assert targets.tolist() == ids[i * CTX + CTX // 2 + 1:(i + 1) * CTX]


def test_a_short_probe_or_a_bad_context_is_refused(model, probe):
    short = "\n\n".join(default_probe().split("\n\n")[:4])
    with pytest.raises(LoomConfigError, match="needs at least 512"):
        probe_chunks(model, short, CTX)
    with pytest.raises(LoomConfigError, match="two chunks of 512"):
        probe_chunks(model, probe, 512)
    for ctx in (2, 10 ** 6, 1.5):
        with pytest.raises(LoomConfigError, match="context"):
            probe_chunks(model, probe, ctx)


def test_the_model_against_itself_drifts_nowhere(model, probe):
    before = own_state(model)
    report = measure_drift(model, "float32", probe, ctx=CTX)
    s = report.stats
    assert report.recipe == {} and report.bytes == report.bytes_base
    assert s.kl_mean == 0.0 and s.kl_max == 0.0 and s.same_top == 1.0
    assert s.ppl_ratio == pytest.approx(1.0, abs=1e-12) and s.ppl_morphed == s.ppl_base
    assert s.positions == 4 * (CTX - 1 - CTX // 2) and report.chunks == 4
    assert own_state(model) == before


def test_int8_everywhere_drifts_and_leaves_the_model_as_it_was(model, probe):
    before = own_state(model)
    report = measure_drift(model, "int8", probe, ctx=CTX)
    s = report.stats
    assert len(report.recipe) == 123 and set(report.recipe.values()) == {"int8"}
    assert s.kl_mean > 0 and s.kl_max >= s.kl_p999 >= s.kl_p99 >= s.kl_p95 >= s.kl_p90 >= s.kl_median > 0
    assert s.same_top < 1 and s.ppl_morphed != s.ppl_base and s.rms_dp > 0
    assert own_state(model) == before


def test_streamed_measurement_equals_a_fresh_copy_morphed_by_the_engine(model, probe):
    """Same chunks on a fresh model whose layers morph_sublayer morphs for real; stats by brute force."""
    report = measure_drift(model, FEW, probe, ctx=CTX)
    chunks = probe_chunks(model, probe, CTX)
    rows = slice(CTX // 2, CTX - 1)
    with load_model("smollm2-135m") as fresh, fresh.busy(activations="float32"):  # as measured
        base = [fresh.net.step(c[None], None, last_only=False)[0][rows] for c in chunks.chunks]
        layers = weighted_layers(fresh.net)
        for position, fmt in resolve_recipe(fresh.net, FEW).items():
            morph_sublayer(layers[position].layer, layers[position].cell, fmt)
        cur = [fresh.net.step(c[None], None, last_only=False)[0][rows] for c in chunks.chunks]
        size = fresh.net.memory_bytes()
    want = brute_force(np.concatenate(base), np.concatenate(cur), np.concatenate(chunks.targets))
    for key, value in want.items():
        assert getattr(report.stats, key) == pytest.approx(value, rel=1e-5, abs=1e-9), key
    assert report.bytes == size


def test_per_layer_ranks_the_recipes_layers_by_kl(model, probe):
    before = own_state(model)
    seen = []
    report = measure_drift(model, FEW, probe, ctx=CTX, per_layer=True,
                           progress=lambda done, total, what: seen.append((done, total, what)))
    ranked = report.layers
    assert sorted(la.name for la in ranked) == sorted(FEW)
    kls = [la.stats.kl_mean for la in ranked]
    assert kls == sorted(kls, reverse=True) and kls[0] > kls[-1] > 0
    assert all(la.format == "int8" for la in ranked)
    # progress: every forward pass, in order: base and morphed per chunk, then each layer's chunks
    assert [d for d, _, _ in seen] == list(range(1, 4 * 2 + 4 * len(FEW) + 1))
    assert seen[0][2] == "base" and seen[1][2] == "morphed" and seen[-1][2] in FEW
    # a layer of the ranking is that layer measured alone (each was put back before the next)
    top = ranked[0]
    alone = measure_drift(model, {top.name: top.format}, probe, ctx=CTX).stats
    assert top.stats.kl_mean == pytest.approx(alone.kl_mean, rel=1e-6)
    assert top.stats.same_top == alone.same_top
    assert own_state(model) == before


def test_cancel_stops_between_passes_and_unmorphs(model, probe):
    before = own_state(model)
    calls = []

    def cancel():
        calls.append(1)
        return len(calls) > 3

    with pytest.raises(LoomCancelled):
        measure_drift(model, FEW, probe, ctx=CTX, per_layer=True, cancel=cancel)
    assert own_state(model) == before


# ----- recipes -------------------------------------------------------------------------------------
def test_a_format_name_morphs_every_weighted_layer(model):
    assert resolve_recipe(model.net, "int8") == dict.fromkeys(range(123), "int8")
    assert resolve_recipe(model.net, "F16") == dict.fromkeys(range(123), "float16")  # an alias
    assert resolve_recipe(model.net, "float32") == {}  # already so: nothing to morph


def test_layers_by_name_tensor_or_position(model, tmp_path):
    names = [la.name for la in weighted_layers(model.net)]
    plan = resolve_recipe(model.net, {"blk.3.ffn_up.weight": "int4", "blk.3.attn_k": "fp8", "7": "int8",
                                      "output": "float16", "token_embd": "bfloat16"})
    assert {names[i]: f for i, f in plan.items()} == {
        "blk.3.ffn_gate/up/down": "int4", "blk.3.attn_q/k/v/output": "fp8e4m3", names[7]: "int8",
        "output (tied to token_embd)": "float16", "token_embd": "bfloat16"}
    rest = resolve_recipe(model.net, {"*": "int8", "token_embd": "float32"})
    assert len(rest) == 122 and 0 not in rest
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({"blk.0.attn_norm": "int8", "*": "float16"}))
    from_file = resolve_recipe(model.net, str(path))
    assert from_file[1] == "int8" and len(from_file) == 123 and set(from_file.values()) == {"int8", "float16"}
    listed = tmp_path / "evolved.json"  # the evolution's stored recipe: one format per layer
    listed.write_text(json.dumps(["int4"] + ["float32"] * 122))
    assert resolve_recipe(model.net, listed) == {0: "int4"}


@pytest.mark.parametrize("recipe, message", [
    ("int9", "neither a format nor a recipe file"),
    ("IQ4_XS", "neither a format nor a recipe file"),  # a GGUF type that is no morph target here
    ({"blk.0.attn_norm": "int9"}, "unknown format 'int9'"),
    ({"blk.99.attn_norm": "int8"}, "recipe layer 'blk.99.attn_norm': no such weighted layer"),
    ({"123": "int8"}, "weighted layers are 0 to 122"),
    ({"blk.3.ffn_up": "int8", "blk.3.ffn_down": "int4"}, "given two formats"),
    (["int8"] * 3, "one format per weighted layer (123), got 3"),
    ("/nonexistent/recipe.json", "cannot read the recipe file"),
    (3, "a recipe is a format name"),
])
def test_bad_recipes_are_refused_with_the_reason(model, recipe, message):
    with pytest.raises(LoomConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve_recipe(model.net, recipe)


def test_a_recipe_file_that_is_not_json_is_refused(model, tmp_path):
    path = tmp_path / "r.json"
    path.write_text("int8 everywhere")
    with pytest.raises(LoomConfigError, match="not JSON"):
        resolve_recipe(model.net, path)


def test_a_model_on_the_strict_backend_drifts_as_on_numpy(model, probe):
    """The drift probe on a device model (array_api_strict): only the scored logits rows cross to
    the host, and the statistics equal the numpy model's to float32 summation-order rounding."""
    want = measure_drift(model, FEW, probe, ctx=CTX).stats
    with load_model("smollm2-135m", backend="strict") as on_device:
        got = measure_drift(on_device, FEW, probe, ctx=CTX).stats
    assert got.positions == want.positions and got.same_top == want.same_top
    assert got.kl_mean == pytest.approx(want.kl_mean, rel=1e-3, abs=1e-7)
    assert got.ppl_ratio == pytest.approx(want.ppl_ratio, rel=1e-5)
