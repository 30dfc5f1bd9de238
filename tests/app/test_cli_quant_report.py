"""``loomlab quant-report`` on SmolLM2-135M with a short probe and context (a few layers morphed, so
each run takes seconds). Oracle: the engine's own measurement (core/llm/quality/drift.py) of the same
recipe, probe and context."""

from __future__ import annotations

import json
import re

import pytest

from loomlab.app.cli import main
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.quality.drift import default_probe, measure_drift

CTX = "128"
RECIPE = {"blk.0.attn_q/k/v/output": "int8", "blk.0.ffn_gate/up/down": "int4", "output_norm": "int8"}
JSON_KEYS = ("bytes", "ppl_base", "ppl_morphed", "kl_mean", "kl_p99", "kl_max", "same_top_percent")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("quant")
    paragraphs = default_probe().split("\n\n")
    (folder / "probe.txt").write_text("\n\n".join(paragraphs[:5]))  # ~590 tokens
    (folder / "short.txt").write_text("\n\n".join(paragraphs[:4]))  # ~470 tokens
    (folder / "recipe.json").write_text(json.dumps(RECIPE))
    return folder


def run(argv, capsys) -> tuple[int, str, list[str]]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err.strip().splitlines()


def test_json_holds_the_engines_numbers(files, capsys):
    code, out, _ = run(["quant-report", "smollm2-135m", "--recipe", str(files / "recipe.json"),
                        "--probe", str(files / "probe.txt"), "--ctx", CTX, "--json"], capsys)
    assert code == 0
    got = json.loads(out)
    assert all(key in got for key in JSON_KEYS)
    with load_model("smollm2-135m") as model:
        probe = (files / "probe.txt").read_text()
        want = measure_drift(model, str(files / "recipe.json"), probe, ctx=int(CTX))
    expected = want.as_dict()
    assert got["bytes"] == want.bytes and got["bytes_base"] == want.bytes_base
    assert got["recipe"] == RECIPE and got["ctx"] == 128 and got["chunks"] == 4
    for key in JSON_KEYS[1:] + ("kl_median", "kl_p90", "kl_p95", "kl_p999", "ppl_ratio", "rms_dp_percent"):
        assert got[key] == pytest.approx(expected[key], rel=1e-6, abs=1e-12), key
    assert got["same_top_percent"] == pytest.approx(100 * want.stats.same_top)
    assert got["kl_mean"] > 0 and "per_layer" not in got


def test_text_report_with_per_layer_ranking(files, capsys):
    code, out, err = run(["quant-report", "smollm2-135m", "--recipe", str(files / "recipe.json"),
                          "--probe", str(files / "probe.txt"), "--ctx", CTX, "--per-layer", "--top", "2"],
                         capsys)
    assert code == 0
    for label in ("Mean PPL(Q)", "Mean PPL(base)", "Mean PPL(Q)/PPL(base)", "Mean    KLD:", "Maximum KLD:",
                  "99.9%   KLD:", "99.0%   KLD:", "95.0%   KLD:", "90.0%   KLD:", "Median  KLD:", "RMS Δp",
                  "Same top p:", "3 of 123 weighted layers morphed"):
        assert label in out, label
    # sizes in the unit every panel uses, the change said as what it is
    sizes = r"^weights: [\d.]+ MiB -> [\d.]+ MiB \((saved|grew by) [\d.]+ [KM]iB \([+-][\d.]+%\)\)$"
    assert re.search(sizes, out, re.MULTILINE), out
    table = out.split("====== Per layer")[1].splitlines()
    assert "(2 of 3)" in table[0] and table[1].split()[:2] == ["rank", "layer"]
    ranked = [line.split()[1] for line in table[2:] if line.strip()]
    assert len(ranked) == 2 and ranked[0] == "blk.0.ffn_gate/up/down"  # int4 hurts more than int8
    assert any(line.startswith("[") for line in err)  # progress, one line per pass (not a terminal)


def test_json_per_layer_sorted_by_kl(files, capsys):
    code, out, _ = run(["quant-report", "smollm2-135m", "--recipe", str(files / "recipe.json"),
                        "--probe", str(files / "probe.txt"), "--ctx", CTX, "--per-layer", "--json"], capsys)
    assert code == 0
    layers = json.loads(out)["per_layer"]
    assert sorted(la["layer"] for la in layers) == sorted(RECIPE)
    kls = [la["kl_mean"] for la in layers]
    assert kls == sorted(kls, reverse=True) and kls[0] > kls[-1]


def test_a_llama_cpp_preset_with_its_fallbacks(files, capsys):
    """Q4_K_M on SmolLM2 (rows of 576 weights): the plan's fallbacks are printed and in the JSON."""
    from loomlab.core.llm.quality.recipe import plan_recipe

    argv = ["quant-report", "smollm2-135m", "--recipe", "Q4_K_M", "--probe", str(files / "probe.txt"),
            "--ctx", CTX]
    code, out, _ = run(argv + ["--json"], capsys)
    assert code == 0
    got = json.loads(out)
    with load_model("smollm2-135m") as model:
        plan = plan_recipe(model.net, "Q4_K_M")
    assert got["fallbacks"] == [str(f) for f in plan.fallbacks] and got["bytes"] == plan.bytes
    assert got["recipe"] == {lp.name: lp.format for lp in plan.changed}
    # gate/up (rows of 576) fall back to Q5_0; blk.0's down is one of llama.cpp's "more bits" blocks
    assert got["recipe"]["blk.0.ffn_gate/up/down"] == "Q5_0+Q6_K"
    code, out, _ = run(argv, capsys)
    assert code == 0 and f"llama.cpp's fallbacks, {len(plan.fallbacks)} tensors" in out
    assert "  blk.0.attn_q.weight: rows of 576 weights are not whole Q4_K blocks of 256, Q5_0 instead" in out


@pytest.mark.parametrize("args, message", [
    (["--recipe", "int9"], "recipe 'int9' is neither a format nor a recipe file"),
    (["--recipe", "preset:IQ4_XS"], "unknown preset 'IQ4_XS'"),
    (["--recipe", "{dir}/unknown-layer.json"], "recipe layer 'blk.99.ffn_norm': no such weighted layer"),
    (["--recipe", "{dir}/bad-format.json"], "unknown format 'int9'"),
    (["--probe", "{dir}/missing.txt"], "cannot read the probe file"),
    (["--probe", "{dir}/short.txt"], "needs at least 512"),
    (["--ctx", "1"], "the context must be an integer from 4"),
    (["--top", "-1"], "--top must be >= 0"),
])
def test_errors_exit_2_with_one_line(files, capsys, args, message):
    (files / "unknown-layer.json").write_text(json.dumps({"blk.99.ffn_norm": "int8"}))
    (files / "bad-format.json").write_text(json.dumps({"blk.0.ffn_norm": "int9"}))
    argv = ["quant-report", "smollm2-135m", "--probe", str(files / "probe.txt"), "--ctx", CTX]
    argv += [a.format(dir=files) for a in args]
    code, out, err = run(argv, capsys)
    assert code == 2 and out == ""
    errors = [line for line in err if "error" in line]
    assert errors == [err[-1]] and err[-1].startswith("loomlab: error: ") and message in err[-1]
