"""A first run: the model answers on plain numpy while a child process compiles its kernels
(core/llm/model/kernel_compilation.py, core/llm/kernels/numpy_kernels.py).

Oracles: transformers' logits of the golden prompts (the numpy path computes the file's weights in
float32, as transformers did), and the exact path's kernels."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import loomlab.core
from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.files import registry
from loomlab.core.llm.kernels.numpy_kernels import NAME, float32_bytes, numpy_backend
from loomlab.core.llm.model.kernel_compilation import matrices
from loomlab.core.llm.model.loader import load_causal_lm

GOLDEN = Path(__file__).parents[3] / "data" / "llm" / "smollm2-135m-instruct-q4_1.json"
PROMPT = "The capital of France is"
DROPPED = "fused_decode._activations-"  # the kernel the "cold" cache lacks: a small one, quick to compile


def test_the_numpy_path_matches_transformers_on_the_golden_prompts():
    net = load_causal_lm(registry.fetch("smollm2-135m"))
    try:
        net.place(numpy_backend())
        for case in json.loads(GOLDEN.read_text())["generate"]:
            ids = case["prompt_ids"]
            logits = net.step(np.array([ids]), [net.make_cache(len(ids))])[0]
            top = case["last_logits_top20"]
            np.testing.assert_allclose(logits[top["ids"]], top["values"], atol=2e-3, err_msg=case["kind"])
            assert int(np.argmax(logits)) == case["greedy_32"][0]
    finally:
        net.close()


def test_float32_bytes_counts_a_tied_table_once():
    net = load_causal_lm(registry.fetch("smollm2-135m"))
    try:
        ms = matrices(net)
        unique = {id(m): m for m in ms}
        assert len(ms) == len(unique) + 1  # the embedding table is the head's too
        assert float32_bytes(ms) == sum(4 * m.shape[0] * m.shape[1] for m in unique.values())
        assert float32_bytes(ms) == 4 * 134_479_872  # the file's 2-D tensors' elements (gguf-py counts them)
    finally:
        net.close()


def test_first_run_mode_is_checked():
    from loomlab.core.llm.generate.textmodel import load_model

    with pytest.raises(LoomConfigError, match="first_run"):
        load_model("smollm2-135m", first_run="later")


COLD_RUN = """
import json, sys
from numba.core import event
from loomlab.core.llm.generate.textmodel import load_model

class Count(event.Listener):
    n = 0
    def on_start(self, ev): Count.n += 1
    def on_end(self, ev): pass

event.register("numba:compile", Count())
out = {}
with load_model("smollm2-135m", first_run="answer") as model:
    out["ready_at_load"] = model.kernels_ready
    out["backend_at_load"] = model.backend.name
    Count.n = 0  # (loading began one, to learn the cache lacked it, and stopped it)
    ids = json.loads(sys.argv[1])
    logits = model.net.step([ids], [model.net.make_cache(len(ids))])[0]
    out["numpy_top20"] = [float(logits[i]) for i in json.loads(sys.argv[2])]
    out["compiled_here_while_answering"] = Count.n
    model.wait_for_kernels()
    out["ready"] = model.kernels_ready
    out["backend"] = model.backend.name
    with model.busy(activations="float32"):
        logits = model.net.step([ids], [model.net.make_cache(len(ids))])[0]
    out["kernel_top20"] = [float(logits[i]) for i in json.loads(sys.argv[2])]
    out["reply"] = "".join(r.text for r in model.generate(sys.argv[3], max_tokens=4))
print(json.dumps(out))
"""


def _cache_copy(dest: Path) -> None:
    """Numba's cache of this source tree (``__pycache__`` beside each module), laid out as under
    ``NUMBA_CACHE_DIR=dest`` (numba: the folder's name and the SHA-1 of its path), less one
    kernel."""
    for cache in Path(loomlab.core.__file__).parent.rglob("__pycache__"):
        folder = str(cache.parent.resolve())
        target = dest / f"{cache.parent.name}_{hashlib.sha1(folder.encode()).hexdigest()}"
        for f in cache.iterdir():
            if f.suffix in (".nbi", ".nbc") and not f.name.startswith(DROPPED):
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target / f.name)


def test_a_cold_cache_answers_on_numpy_then_takes_the_compiled_kernels(tmp_path):
    from loomlab.core.llm.generate.textmodel import load_model

    with load_model("smollm2-135m", first_run="wait") as model:  # its kernels now in the tree's cache
        reply = "".join(r.text for r in model.generate(PROMPT, max_tokens=4))
    _cache_copy(tmp_path)
    case = json.loads(GOLDEN.read_text())["generate"][0]
    top = case["last_logits_top20"]
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    env.pop("LOOMLAB_FIRST_RUN", None)  # the default, as a user has it
    argv = [json.dumps(case["prompt_ids"]), json.dumps(top["ids"]), PROMPT]
    run = subprocess.run([sys.executable, "-c", COLD_RUN, *argv], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["ready_at_load"] is False and out["backend_at_load"] == NAME
    assert out["compiled_here_while_answering"] == 0  # nothing numba compiles in the answering process
    np.testing.assert_allclose(out["numpy_top20"], top["values"], atol=2e-3)
    assert out["ready"] is True and out["backend"] == "numpy"
    np.testing.assert_allclose(out["kernel_top20"], top["values"], atol=2e-3)
    assert out["reply"] == reply  # the default mode's, as in this process


def test_the_cli_says_it_answers_on_numpy_and_finishes_the_kernels_before_it_exits(tmp_path):
    from loomlab.core.llm.generate.textmodel import load_model

    with load_model("smollm2-135m", first_run="wait") as model:  # its kernels now in the tree's cache
        default = "".join(r.text for r in model.generate(PROMPT, max_tokens=4))
        model.activations = "float32"
        exact = "".join(r.text for r in model.generate(PROMPT, max_tokens=4))
    _cache_copy(tmp_path)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    env.pop("LOOMLAB_FIRST_RUN", None)
    argv = [sys.executable, "-m", "loomlab.app.cli", "generate", "smollm2-135m", "--prompt", PROMPT,
            "--max-tokens", "4"]
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr
    assert "preparing kernels for this CPU (first run only), in the background" in first.stderr
    assert "backend: numpy (kernels compiling)]" in first.stderr
    assert "finishing the kernels" in first.stderr and "100.0% (1/1)" in first.stderr
    assert first.stdout.strip() == exact.strip()  # numpy computes what the exact path does
    again = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "in the background" not in again.stderr
    assert "backend: numpy]" in again.stderr and again.stdout.strip() == default.strip()
