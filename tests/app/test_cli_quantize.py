"""``loomlab quantize MODEL OUT.gguf --recipe R``: a recipe applied, then the model saved as GGUF.

Oracles: the engine's own plan for the same recipe (core/llm/recipe.py: each tensor's type, which
gguf-py's reader must find in the file) and the in-memory morphed model's logits, which the
written file must reproduce when loaded back."""

from __future__ import annotations

import json

import numpy as np
from gguf import GGUFReader

from loomlab.app.cli import main
from loomlab.core.llm import registry
from loomlab.core.llm.recipe import apply_recipe, plan_recipe
from loomlab.core.llm.textmodel import load_model

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


def test_bad_recipes_and_unstorable_dtypes_stop_before_a_file_is_written(tmp_path, capsys):
    out = tmp_path / "out.gguf"
    assert main(["quantize", "smollm2-135m", str(out), "--recipe", "Q3_K"]) == 2
    assert "unknown format 'Q3_K'" in capsys.readouterr().err
    assert main(["quantize", "smollm2-135m", str(out), "--recipe", "int8"]) == 2
    err = capsys.readouterr().err
    assert "cannot export as GGUF: 123 layers are int8 (token_embd, blk.0.attn_norm" in err
    assert "and 119 more" in err
    assert list(tmp_path.iterdir()) == []
