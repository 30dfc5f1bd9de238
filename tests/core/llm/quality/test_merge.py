"""Model merges (core.llm.quality.merge) against their formulas and the parents' own logits.

Oracles: the merge formulas applied here to the parents' float32 tensors (linear, SLERP in
float64, task arithmetic), a network built from those tensors, transformers' logits of the tiny
checkpoints (``reference.json``), and the parents themselves at t = 0 and t = 1.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from loomlab.core.errors import LoomCancelled, LoomConfigError
from loomlab.core.io.output_folder import MARKER
from loomlab.core.llm import load_model
from loomlab.core.llm.files import registry
from loomlab.core.llm.files.hf_files import open_hf
from loomlab.core.llm.model.loader import architecture, load_causal_lm
from loomlab.core.llm.quality.merge import merge_models, schedule_value

from ..model.test_architectures import TINY, llama_cpp_permute, reference, write_gguf


def tensors(folder: Path) -> dict[str, np.ndarray]:
    with open_hf(folder) as hf:
        return {name: t.data().astype(np.float32) for name, t in hf.tensors.items()}


def variant(tmp_path: Path, name: str, seed: int, scale: float = 0.05, **reshape) -> Path:
    """A copy of tiny checkpoint ``name`` with every tensor nudged by seeded noise (and tensors in
    ``reshape`` given another shape): a second parent of the same architecture."""
    folder = tmp_path / f"{name}-{seed}"
    shutil.copytree(TINY / name, folder)
    rng = np.random.default_rng(seed)
    weights = {k: (v + scale * v.std() * rng.standard_normal(v.shape)).astype(np.float32)
               for k, v in tensors(TINY / name).items()}
    for key, shape in reshape.items():
        weights[key.replace("__", ".")] = np.zeros(shape, np.float32)
    save_file(weights, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def parents(tmp_path):
    return variant(tmp_path, "tiny-llama", 1), variant(tmp_path, "tiny-llama", 2)


def slerp_oracle(t: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    omega = math.acos(a64 @ b64 / np.linalg.norm(a64) / np.linalg.norm(b64))
    out = (math.sin((1 - t) * omega) * a64 + math.sin(t * omega) * b64) / math.sin(omega)
    return out.reshape(a.shape)


def logits(folder: Path, ids: np.ndarray) -> np.ndarray:
    net = load_causal_lm(folder)
    try:
        return net.forward(ids)
    finally:
        net.close()


IDS = np.random.default_rng(7).integers(0, 256, (1, 24))


def test_linear_merge_is_the_formula_and_loads_back_with_the_logits_of_those_weights(tmp_path, parents):
    a, b = parents
    out = merge_models(a, b, tmp_path / "out", method="linear", t=0.3)
    ta, tb, merged = tensors(a), tensors(b), tensors(out)
    assert list(merged) == list(ta)
    for name, w in merged.items():
        np.testing.assert_array_equal(w, np.float32(0.7) * ta[name] + np.float32(0.3) * tb[name])
    # a network built here from the formula's tensors gives the saved folder's logits
    config = json.loads((out / "config.json").read_text())
    module = architecture(config["model_type"])
    oracle = module.build(module.Args.from_hf(config), {k: np.float32(0.7) * ta[k] + np.float32(0.3) * tb[k]
                                                        for k in ta})
    np.testing.assert_array_equal(logits(out, IDS), oracle.forward(IDS))
    files = sorted(p.name for p in out.iterdir())
    assert files == [MARKER, "config.json", "generation_config.json", "model.safetensors"]
    assert config["torch_dtype" if "torch_dtype" in config else "dtype"] == "float32"


def test_slerp_follows_the_arc(tmp_path, parents):
    a, b = parents
    out = merge_models(a, b, tmp_path / "out", method="slerp", t=0.25)
    ta, tb, merged = tensors(a), tensors(b), tensors(out)
    for name, w in merged.items():
        np.testing.assert_allclose(w, slerp_oracle(0.25, ta[name], tb[name]), rtol=1e-5, atol=1e-7)
    # norms along the arc: between the parents', not shrunk toward the chord's midpoint
    q = merged["model.layers.0.mlp.up_proj.weight"]
    chord = 0.75 * ta["model.layers.0.mlp.up_proj.weight"] + 0.25 * tb["model.layers.0.mlp.up_proj.weight"]
    assert np.linalg.norm(q) > np.linalg.norm(chord)


@pytest.mark.parametrize("method", ["linear", "slerp"])
def test_t_0_and_1_give_the_parents_bit_for_bit(tmp_path, parents, method):
    a, b = parents
    for t, parent in ((0.0, a), (1.0, b)):
        out = merge_models(a, b, tmp_path / f"{method}-{t}", method=method, t=t)
        for name, w in tensors(out).items():
            np.testing.assert_array_equal(w, tensors(parent)[name])
        np.testing.assert_array_equal(logits(out, IDS), logits(parent, IDS))


def test_a_schedule_gives_each_block_its_t(tmp_path, parents):
    a, b = parents
    ta, tb = tensors(a), tensors(b)
    out = merge_models(a, b, tmp_path / "out", method="linear", t=[0.0, 0.5, 1.0])  # one per block (3)
    merged = tensors(out)
    for name, w in merged.items():
        block = name.split(".")[2] if name.startswith("model.layers.") else None
        t = {"0": 0.0, "1": 0.5, "2": 1.0}.get(block, 0.0 if "embed_tokens" in name else 1.0)
        half = np.float32(0.5) * ta[name] + np.float32(0.5) * tb[name]
        expected = ta[name] if t == 0 else tb[name] if t == 1 else half
        np.testing.assert_array_equal(w, expected, err_msg=name)
    # two anchors over three blocks: the middle block halfway, ends at the anchors
    assert [schedule_value((0.2, 0.6), f"model.layers.{i}.x.weight", 3) for i in range(3)] == \
        pytest.approx([0.2, 0.4, 0.6])
    assert schedule_value((0.2, 0.6), "model.embed_tokens.weight", 3) == 0.2
    assert schedule_value((0.2, 0.6), "lm_head.weight", 3) == 0.6


def test_task_arithmetic(tmp_path, parents):
    a, b = parents
    base = variant(tmp_path, "tiny-llama", 3)
    out = merge_models(a, b, tmp_path / "out", method="task", base=base, weights=(0.5, 1.5))
    ta, tb, tbase = tensors(a), tensors(b), tensors(base)
    for name, w in tensors(out).items():
        base_w = tbase[name]
        expected = base_w + np.float32(0.5) * (ta[name] - base_w) + np.float32(1.5) * (tb[name] - base_w)
        np.testing.assert_allclose(w, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("name, arch", [("tiny-llama", "llama"), ("tiny-gemma3", "gemma3")])
def test_a_gguf_parent_is_read_in_transformers_layout(tmp_path, name, arch):
    """GGUF llama's permuted Q/K rows and gemma3's 1 + w norms, merged with the HF checkpoint
    they came from: every tensor is the checkpoint's and the logits are transformers'."""
    gguf_file = write_gguf(tmp_path / "m.gguf", name, arch)
    out = merge_models(gguf_file, TINY / name, tmp_path / "out", method="linear", t=0.5)
    expected = tensors(TINY / name)
    merged = tensors(out)
    assert set(merged) == set(expected) - ({"lm_head.weight"} if arch == "gemma3" else set())
    for key, w in merged.items():
        np.testing.assert_allclose(w, expected[key], rtol=0, atol=1e-6, err_msg=key)
    ref = reference(name)
    np.testing.assert_allclose(logits(out, np.array(ref["input_ids"])[None])[0], np.array(ref["logits"]),
                               atol=1e-4)


def test_models_that_differ_name_the_first_difference(tmp_path):
    a = variant(tmp_path, "tiny-llama", 1)
    wide = variant(tmp_path, "tiny-llama", 2, model__layers__1__mlp__up_proj__weight=(130, 64))
    with pytest.raises(LoomConfigError, match=r"tensor model.layers.1.mlp.up_proj.weight is \(128, 64\) in A "
                                              r"but \(130, 64\) in B"):
        merge_models(a, wide, tmp_path / "out")
    with pytest.raises(LoomConfigError, match=r"architectures differ \(llama vs qwen2\)"):
        merge_models(a, TINY / "tiny-qwen2", tmp_path / "out")
    granite = write_gguf(tmp_path / "granite.gguf", "tiny-granite", "granite")  # multipliers: no HF config
    with pytest.raises(LoomConfigError, match="a granite GGUF file, whose transformers config is not"):
        merge_models(granite, TINY / "tiny-granite", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_bad_arguments(tmp_path, parents):
    a, b = parents
    cases = [(dict(method="ties"), "unknown merge method 'ties'; known: linear, slerp, task"),
             (dict(t=1.5), "t must be a number in [0, 1]"), (dict(t=[]), "t must be a number in [0, 1]"),
             (dict(t=[0.1, float("nan")]), "t must be a number in [0, 1]"),
             (dict(method="task"), "task arithmetic needs a base model"),
             (dict(method="task", base=a, weights=(1.0,)), "needs two finite weights"),
             (dict(base=a), "a base model is for task arithmetic only, not linear")]
    for kwargs, message in cases:
        with pytest.raises(LoomConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
            merge_models(a, b, tmp_path / "out", **kwargs)
    (tmp_path / "file").write_text("x")
    with pytest.raises(LoomConfigError, match="exists and is not a folder"):
        merge_models(a, b, tmp_path / "file")


def test_progress_and_cancel_leave_an_existing_folder_as_it_was(tmp_path, parents):
    a, b = parents
    out = merge_models(a, b, tmp_path / "out", t=0.0)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    calls = []
    n = len(tensors(a))

    def progress(stage, done, total):
        calls.append((stage, done, total))

    with pytest.raises(LoomCancelled, match=f"after 5 of {n} tensors"):
        merge_models(a, b, out, t=1.0, progress=progress, cancel=lambda: len(calls) >= 5)
    assert calls == [("merge", i, n) for i in range(1, 6)]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["out", a.name, b.name])  # no staging left
    merge_models(a, b, out, t=1.0)  # an existing folder is replaced whole
    for name, w in tensors(out).items():
        np.testing.assert_array_equal(w, tensors(b)[name])


def test_smollm2_merged_at_t0_is_the_parent_and_chats(tmp_path):
    """The real model: a GGUF (Q4_1 + Q8_0) parent written as an HF folder, tokenizer and chat
    template included. Weights are the parent's dequantized blocks bit for bit (Q/K rows in
    transformers' order); the folder loads as a TextModel that replies as the parent does."""
    out = merge_models("smollm2-135m", "smollm2-135m", tmp_path / "smol", method="slerp", t=0.0)
    parent = load_causal_lm(registry.fetch("smollm2-135m"))
    try:
        file_matrices = parent.source.load({})  # block tensors under their GGUF names
        with open_hf(out) as hf:
            saved = hf.tensors
            for i in (0, 17, 29):
                np.testing.assert_array_equal(saved[f"model.layers.{i}.mlp.down_proj.weight"].data(),
                                              file_matrices[f"blk.{i}.ffn_down.weight"].dequantize())
                for stem, heads in (("q", 9), ("k", 3)):
                    hf_rows = saved[f"model.layers.{i}.self_attn.{stem}_proj.weight"].data()
                    np.testing.assert_array_equal(llama_cpp_permute(hf_rows, heads),
                                                  file_matrices[f"blk.{i}.attn_{stem}.weight"].dequantize())
            np.testing.assert_array_equal(saved["model.embed_tokens.weight"].data(),
                                          file_matrices["model.embed_tokens.weight"].dequantize())
            assert "lm_head.weight" not in saved
    finally:
        parent.close()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    # the merge holds the file's weights as floats: the file's exact path is its oracle
    with load_model("smollm2-135m", activations="float32") as original, load_model(out) as merged:
        assert merged.template.source == "file" and merged.supports_chat
        assert merged.tokenizer.eos_ids == original.tokenizer.eos_ids
        prompt = "The capital of France is"
        assert merged.tokenizer.encode(prompt, True) == original.tokenizer.encode(prompt, True)
        reply = "".join(r.text for r in merged.chat(messages, max_tokens=12))
        assert reply == "".join(r.text for r in original.chat(messages, max_tokens=12))
        np.testing.assert_allclose(merged.classify([prompt])[0].logits, original.classify([prompt])[0].logits,
                                   atol=1e-3)


# ----- which existing folder a merge may replace ------------------------------------------------
def test_a_folder_holding_other_files_is_refused_unless_forced(tmp_path, parents):
    """The issue's reproducer: `mkdir x && echo keep > x/notes.txt && loomlab merge A B -o x`."""
    a, b = parents
    out = tmp_path / "x"
    out.mkdir()
    (out / "notes.txt").write_text("keep")
    with pytest.raises(LoomConfigError, match=r"x holds files Loom Lab did not write there \(notes.txt\)"):
        merge_models(a, b, out)
    assert [p.name for p in out.iterdir()] == ["notes.txt"] and (out / "notes.txt").read_text() == "keep"
    merge_models(a, b, out, t=1.0, force=True)
    assert not (out / "notes.txt").exists()
    for name, w in tensors(out).items():
        np.testing.assert_array_equal(w, tensors(b)[name])


def test_our_own_output_is_replaced_but_not_once_something_else_is_added(tmp_path, parents):
    a, b = parents
    out = merge_models(a, b, tmp_path / "out", t=0.0)
    marker = json.loads((out / MARKER).read_text())
    assert marker["written_by"] == "Loom Lab"
    assert sorted(marker["files"] + [MARKER]) == sorted(p.name for p in out.iterdir())
    merge_models(a, b, out, t=1.0)
    np.testing.assert_array_equal(tensors(out)["model.norm.weight"], tensors(b)["model.norm.weight"])
    (out / "notes.txt").write_text("mine")
    with pytest.raises(LoomConfigError, match=r"holds files Loom Lab did not write there \(notes.txt\)"):
        merge_models(a, b, out, t=0.0)
    assert (out / "notes.txt").read_text() == "mine"


def test_an_input_or_a_folder_holding_one_is_refused_even_when_forced(tmp_path, parents):
    a, b = parents
    before = {p.name: p.read_bytes() for p in a.iterdir()}
    for out, why in ((a, f"is the input {a}"), (tmp_path, f"holds the input {a}"),
                     (b / "..", f"holds the input {a}")):
        for force in (False, True):
            with pytest.raises(LoomConfigError, match=re.escape(f"{out} {why}; writing the model there "
                                                                f"would remove it")):
                merge_models(a, b, out, force=force)
    assert {p.name: p.read_bytes() for p in a.iterdir()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a.name, b.name])


MERGER = """
import sys, time
from loomlab.core.llm.quality.merge import merge_models

def progress(stage, done, total):
    if done == 1:
        print("writing", flush=True)
        time.sleep(30)

merge_models(sys.argv[1], sys.argv[2], sys.argv[3], progress=progress)
"""


def test_sigterm_during_a_merge_leaves_no_staging_folder(tmp_path, parents):
    a, b = parents
    child = subprocess.Popen([sys.executable, "-c", MERGER, str(a), str(b), str(tmp_path / "out")],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "writing\n"
        assert any(p.name.endswith(".tmp") for p in tmp_path.iterdir())  # the staging folder, half written
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) != 0
    finally:
        child.kill()
        child.stdout.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([a.name, b.name])
