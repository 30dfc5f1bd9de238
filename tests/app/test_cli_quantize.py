"""``loomlab quantize MODEL OUT.gguf --recipe R``: a recipe applied, then the model saved as GGUF.

Oracles: the engine's own plan for the same recipe (core/llm/quality/recipe.py: each tensor's type, which
gguf-py's reader must find in the file) and the in-memory morphed model's logits, which the
written file must reproduce when loaded back."""

from __future__ import annotations

import contextlib
import json
import os

import numpy as np
import pytest
from gguf import GGUFReader

from loomlab.app.cli import main
from loomlab.core.errors import LoomCancelled
from loomlab.core.llm.files import registry
from loomlab.core.llm.generate import textmodel
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.quality import recipe
from loomlab.core.llm.quality.recipe import apply_recipe, plan_recipe

RECIPE = {"blk.*.ffn_down": "Q8_0", "blk.0.attn_q/k/v/output": "Q4_0", "blk.1.attn_q/k/v/output": "float16"}
PROMPT_IDS = np.array([[1, 504, 3458, 282, 4649, 314]])


def test_the_file_holds_the_planned_types_and_runs_as_the_morphed_model(tmp_path, capsys):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps(RECIPE))
    out = tmp_path / "out.gguf"
    assert main(["quantize", "smollm2-135m", str(out), "--recipe", str(recipe), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["path"] == str(out) and summary["bytes"] == out.stat().st_size

    with load_model("smollm2-135m") as expected:
        plan = plan_recipe(expected.net, str(recipe))
        apply_recipe(expected.net, plan)
        want = expected.net.step(PROMPT_IDS, None)
    types = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
    for lp in plan.changed:
        for tensor, fmt in lp.tensor_formats.items():
            assert types[tensor] == {"float16": "F16"}.get(fmt, fmt), tensor
    source = {t.name: t.tensor_type.name for t in GGUFReader(registry.fetch("smollm2-135m")).tensors}
    assert summary["changed_tensors"] == sum(types[name] != source[name] for name in source) > 0
    with load_model(str(out)) as written:
        np.testing.assert_array_equal(written.net.step(PROMPT_IDS, None), want)


@pytest.fixture
def loaded(smollm2, monkeypatch):
    """quantize given the module's loaded smollm2 (not closed by the command), and stopped with a
    LoomCancelled where it would start morphing: what it does before any work."""
    monkeypatch.setattr(textmodel, "load_model", lambda *a, **k: contextlib.nullcontext(smollm2))

    def stop(*args, **kwargs):
        raise LoomCancelled("morphing")

    monkeypatch.setattr(recipe, "apply_recipe", stop)
    return smollm2


def test_a_device_fifo_or_folder_output_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(textmodel, "load_model", lambda *a, **k: pytest.fail("loaded the model"))
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for out, kind in (("/dev/null", "a character device"), (str(fifo), "a FIFO"),
                      (str(tmp_path), "a folder")):
        assert main(["quantize", "smollm2-135m", out, "--recipe", "Q8_0"]) == 2
        assert capsys.readouterr().err == (f"loomlab: error: cannot save to {out}: it is {kind}, not a "
                                           f"regular file; give a file's path\n")
    assert [p.name for p in tmp_path.iterdir()] == ["fifo"]


def test_bad_recipes_and_unstorable_dtypes_stop_before_morphing(loaded, tmp_path, capsys):
    out = tmp_path / "out.gguf"
    assert main(["quantize", "smollm2-135m", str(out), "--recipe", "IQ4_XS"]) == 2
    assert "unknown format 'IQ4_XS'" in capsys.readouterr().err
    for dtype in ("int8", "fp4"):
        assert main(["quantize", "smollm2-135m", str(out), "--recipe", dtype]) == 2
        assert capsys.readouterr().err.startswith(f"loomlab: error: cannot export as GGUF: 123 layers are "
                                                  f"{dtype} (token_embd, blk.0.attn_norm")
    assert list(tmp_path.iterdir()) == []


def test_fallbacks_are_one_summary_line(loaded, tmp_path, capsys):
    """Q4_K_M on SmolLM2 printed 180 "fallback:" lines."""
    assert main(["quantize", "smollm2-135m", str(tmp_path / "out.gguf"), "--recipe", "Q4_K_M"]) == 2
    plan = recipe.plan_recipe(loaded.net, "Q4_K_M")
    assert capsys.readouterr().err == (f"{recipe.fallback_summary(plan.fallbacks)}\n"
                                       f"loomlab: error: morphing\n")
    assert len(plan.fallbacks) == 180
