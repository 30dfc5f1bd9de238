"""``loomlab imatrix`` on SmolLM2-135M. Oracle: each matrix's input as the tracer shows it
(core/inspect, ``keep=("attn_in", "mlp_in")``) over the same chunks, squared and summed here; the
files read back (GGUF and the legacy .dat)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loomlab.app.cli import main
from loomlab.core.inspect import Tracer
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.kernels.quant_int8 import int8_activations
from loomlab.core.llm.quality.drift import bos_id, default_probe
from loomlab.core.llm.quality.imatrix import imatrix_chunks, read_imatrix

MODEL = "smollm2-135m"
CTX, CHUNKS = 16, 2


@pytest.fixture(scope="module")
def expected():
    """blk.0's Q/K/V and blk.29's gate/up input statistics over the chunks the command cuts."""
    with load_model(MODEL) as model, model.busy(), int8_activations(False):
        ids = model.tokenizer.encode(default_probe(), add_special_tokens=True)
        chunks = imatrix_chunks(ids, CTX, bos_id(model.tokenizer), CHUNKS)
        tracer, last = Tracer(model.net), model.net.args.num_layers - 1
        sums = {"attn_in": 0.0, "mlp_in": 0.0}
        for chunk in chunks:
            trace = tracer.run([chunk], keep=("attn_in", "mlp_in"))
            for site, layer in (("attn_in", 0), ("mlp_in", last)):
                x = np.asarray(trace[site, layer], np.float64).reshape(CTX, -1)
                sums[site] = sums[site] + (x * x).sum(0)
        return sums, last, model.net.args.num_layers


def run(argv, capsys) -> tuple[int, str, str]:
    code = main(argv)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_imatrix_writes_what_llama_imatrix_would(tmp_path, capsys, expected):
    sums, last, layers = expected
    text = tmp_path / "calib.txt"
    text.write_text(default_probe(), "utf-8")
    out = tmp_path / "smol.imatrix.gguf"
    code, stdout, stderr = run(["imatrix", MODEL, "--text", str(text), "-o", str(out), "--ctx", str(CTX),
                                "--chunks", str(CHUNKS), "--json"], capsys)
    assert code == 0, stderr
    summary = json.loads(stdout)
    assert summary["tensors"] == 7 * layers and summary["chunk_count"] == CHUNKS
    assert summary["chunk_size"] == CTX and summary["tokens"] == CHUNKS * CTX
    assert f"[{CHUNKS}/{CHUNKS}] chunks" in stderr  # progress on stderr
    im = read_imatrix(out)
    assert im.datasets == [str(text)] and im.chunk_count == CHUNKS and im.chunk_size == CTX
    for name in ("attn_q", "attn_k", "attn_v"):
        np.testing.assert_allclose(im.in_sum2[f"blk.0.{name}.weight"][0], sums["attn_in"], rtol=1e-5)
    for name in ("ffn_gate", "ffn_up"):
        np.testing.assert_allclose(im.in_sum2[f"blk.{last}.{name}.weight"][0], sums["mlp_in"], rtol=1e-5)
    assert im.counts["blk.0.ffn_down.weight"].tolist() == [CHUNKS * CTX]
    assert im.in_sum2["blk.0.ffn_down.weight"].shape == (1, 1536)  # down's input: the FFN width

    dat = tmp_path / "smol.dat"
    code, stdout, _ = run(["imatrix", MODEL, "--text", str(text), "-o", str(dat), "--ctx", str(CTX),
                           "--chunks", "1", "--output-format", "dat"], capsys)
    assert code == 0 and f"{dat}: {7 * layers} tensors, 1 chunk of {CTX} tokens" in stdout
    legacy = read_imatrix(dat, chunk_size=CTX)
    assert legacy.chunk_count == 1 and legacy.datasets == [str(text)]
    assert legacy.counts["blk.0.attn_q.weight"].tolist() == [CTX]


def test_a_text_too_short_is_one_error_line(tmp_path, capsys):
    text = tmp_path / "short.txt"
    text.write_text("Too short.", "utf-8")
    code, _, stderr = run(["imatrix", MODEL, "--text", str(text), "-o", str(tmp_path / "x.gguf")], capsys)
    assert code == 2 and "needs at least 2 × ctx = 1024" in stderr
    assert not (tmp_path / "x.gguf").exists()
