"""``loomlab merge`` on the tiny checkpoints. Oracle: the merge formulas on the parents' tensors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from loomlab.app.cli import main
from loomlab.core.llm.files.hf_files import open_hf

TINY = Path(__file__).resolve().parents[1] / "data" / "tiny-hf"


def tensors(folder: Path) -> dict[str, np.ndarray]:
    with open_hf(folder) as hf:
        return {name: t.data().astype(np.float32) for name, t in hf.tensors.items()}


@pytest.fixture
def parents(tmp_path):
    """tiny-llama and two nudged copies of it (B and a base)."""
    out = [TINY / "tiny-llama"]
    for seed in (1, 2):
        folder = tmp_path / f"llama-{seed}"
        shutil.copytree(TINY / "tiny-llama", folder)
        rng = np.random.default_rng(seed)
        save_file({k: (v + 0.1 * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
                   for k, v in tensors(TINY / "tiny-llama").items()}, str(folder / "model.safetensors"))
        out.append(folder)
    return out


def test_linear_with_a_schedule_and_a_progress_bar(tmp_path, parents, capsys):
    a, b, _ = parents
    out = tmp_path / "merged"
    assert main(["merge", str(a), str(b), "-o", str(out), "--t-schedule", "0,0.5,1"]) == 0
    captured = capsys.readouterr()
    assert captured.out.strip() == f"merged {a} and {b} (linear) into {out}"
    assert captured.err.strip().splitlines()[-1].startswith("merge    [#####")
    assert captured.err.strip().endswith("100.0% (30/30)")
    ta, tb, merged = tensors(a), tensors(b), tensors(out)
    first, last = "model.layers.0.mlp.up_proj.weight", "model.layers.2.mlp.up_proj.weight"
    np.testing.assert_array_equal(merged[first], ta[first])
    np.testing.assert_array_equal(merged[last], tb[last])
    name = "model.layers.1.self_attn.q_proj.weight"
    np.testing.assert_array_equal(merged[name], np.float32(0.5) * ta[name] + np.float32(0.5) * tb[name])


def test_slerp_and_task(tmp_path, parents):
    a, b, base = parents
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "s"), "--method", "slerp", "--t", "1"]) == 0
    for name, w in tensors(tmp_path / "s").items():
        np.testing.assert_array_equal(w, tensors(b)[name])
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "t"), "--method", "task", "--base", str(base),
                 "--weights", "1,-1"]) == 0
    ta, tb, tbase = tensors(a), tensors(b), tensors(base)
    for name, w in tensors(tmp_path / "t").items():
        np.testing.assert_allclose(w, tbase[name] + (ta[name] - tbase[name]) - (tb[name] - tbase[name]),
                                   rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("extra, message", [
    (["--t", "1.5"], "t must be a number in [0, 1] or a non-empty list of them; got 1.5"),
    (["--t-schedule", "0,x"], "--t-schedule takes numbers separated by commas, got '0,x'"),
    (["--t", "0.1", "--t-schedule", "0,1"], "argument --t-schedule: not allowed with argument --t"),
    (["--method", "task"], "--method task needs --base (the model A and B were tuned from)"),
    (["--method", "ties"], "argument --method: invalid choice: 'ties' "
                           "(choose from 'linear', 'slerp', 'task')"),
    (["--base", "B"], "--base and --weights are for --method task, not linear"),
    (["--method", "task", "--base", "A", "--t", "0.5"], "--t and --t-schedule are for linear and slerp; "
                                                         "task takes --weights"),
    (["--method", "task", "--base", "A", "--weights", "1"], "task arithmetic needs two finite weights, one "
                                                            "per model; got [1.0]"),
])
def test_bad_arguments_give_one_line_and_exit_2(tmp_path, parents, capsys, extra, message):
    a, b, _ = parents
    extra = [str(a) if v == "A" else v for v in extra]
    assert main(["merge", str(a), str(b), "-o", str(tmp_path / "out"), *extra]) == 2
    err = capsys.readouterr().err
    assert err == f"loomlab: error: {message}\n"
    assert not (tmp_path / "out").exists()


def test_models_that_do_not_fit_and_a_missing_output(tmp_path, parents, capsys):
    a = parents[0]
    assert main(["merge", str(a), str(TINY / "tiny-qwen2"), "-o", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err == ("loomlab: error: cannot merge A (tiny-llama) with B (tiny-qwen2): "
                                       "architectures differ (llama vs qwen2)\n")
    assert main(["merge", str(a), str(a)]) == 2
    assert capsys.readouterr().err == "loomlab: error: the following arguments are required: -o/--output\n"


def test_an_existing_folder_with_other_files_is_kept_unless_forced_and_an_input_always(tmp_path, parents,
                                                                                       capsys):
    """The issue's reproducer: `mkdir x && echo keep > x/notes.txt && loomlab merge A B -o x`."""
    a, b, _ = parents
    x = tmp_path / "x"
    x.mkdir()
    (x / "notes.txt").write_text("keep\n")
    assert main(["merge", str(a), str(b), "-o", str(x)]) == 2
    assert capsys.readouterr().err == (f"loomlab: error: {x} holds files Loom Lab did not write there "
                                       f"(notes.txt); writing the model would remove them: give a new or "
                                       f"empty folder, or --force to replace the folder and everything "
                                       f"in it\n")
    assert (x / "notes.txt").read_text() == "keep\n"
    assert main(["merge", str(a), str(b), "-o", str(x), "--force", "--t", "1"]) == 0
    assert not (x / "notes.txt").exists()
    for name, w in tensors(x).items():
        np.testing.assert_array_equal(w, tensors(b)[name])
    assert main(["merge", str(a), str(b), "-o", str(b), "--force"]) == 2
    assert capsys.readouterr().err.endswith(f"loomlab: error: {b} is the input {b}; writing the model there "
                                            f"would remove it: give a new folder\n")
