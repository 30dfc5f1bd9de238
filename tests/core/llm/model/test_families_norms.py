"""gemma2 and olmo2: the two families whose blocks differ from llama's by where their norms sit
(gemma2 before and after each half, olmo2 after only) and by soft-capping (gemma2).

Oracles: transformers' float32 logits and greedy tokens of the tiny checkpoints
(``tests/data/tiny-hf/tiny-gemma2``, ``tiny-olmo2``, written by ``make_tiny.py``), read as HF
folders and converted to GGUF the way llama.cpp's converter does (``write_gguf``); the numpy
path for the array-API device path; llama.cpp's defaults for what a GGUF leaves out.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from loomlab.core.backend import to_host
from loomlab.core.errors import ModelFormatError
from loomlab.core.llm.kernels.attention_kernel import attend
from loomlab.core.llm.kernels.quant_int8 import int8_activations
from loomlab.core.llm.model.llm_layers import LLMAttention, LLMHead
from loomlab.core.llm.model.loader import architecture, load_causal_lm

from .test_architectures import write_gguf

TINY = Path(__file__).resolve().parents[3] / "data" / "tiny-hf"
FAMILIES = {"gemma2": "tiny-gemma2", "olmo2": "tiny-olmo2"}


def reference(family: str) -> dict:
    return json.loads((TINY / FAMILIES[family] / "reference.json").read_text())


def greedy(net, prompt: list[int], n: int) -> list[int]:
    """``n`` tokens by argmax through the KV-cache decode path."""
    cache = [net.make_cache(len(prompt) + n)]
    logits = net.step(np.array([prompt]), cache)[0]
    tokens = []
    for _ in range(n):
        tokens.append(int(np.argmax(logits)))
        logits = net.step(np.array([[tokens[-1]]]), cache)[0]
    return tokens


@pytest.fixture(scope="module", params=[(f, route) for f in FAMILIES for route in ("hf", "gguf")],
                ids=lambda p: "-".join(p))
def model(request, tmp_path_factory):
    family, route = request.param
    path = TINY / FAMILIES[family]
    if route == "gguf":
        path = write_gguf(tmp_path_factory.mktemp(family) / "m.gguf", FAMILIES[family], family)
    return family, route, load_causal_lm(path)


def test_logits_and_greedy_tokens_are_transformers(model):
    """Every position's logits within 1e-4; 32 greedy tokens equal in the float path and in the
    default (int8 activations) mode."""
    family, route, net = model
    ref = reference(family)
    logits = net.forward(np.array([ref["input_ids"]]))[0]
    np.testing.assert_allclose(logits, np.array(ref["logits"]), atol=1e-4)
    assert greedy(net, ref["input_ids"], 32) == ref["greedy_32"]
    with int8_activations():
        assert greedy(net, ref["input_ids"], 32) == ref["greedy_32"]
    # what each family is made of, as the file says it
    attention = [la for la in net.all_layers() if isinstance(la, LLMAttention)]
    if family == "gemma2":
        assert [la.spec.window for la in attention] == [4, None, 4]  # sliding on layers 0, 2
        assert {(la.spec.softcap, la.score_scale) for la in attention} == {(1.0, 0.25)}
        assert net.cells[-1].softcap == 2.0
        assert net.cells[-1].weights.blocks["weight"] is net.cells[0].weights.blocks["table"]  # tied
    else:
        assert {la.weights.blocks["q_norm"].shape for la in attention} == {(64,)}  # all 4 heads' width
        assert net.cells[-1].softcap is None


def test_gguf_agrees_with_the_hf_folder_over_a_long_sequence(tmp_path):
    """100 positions (past gemma2's window of 4 and far along RoPE) from both sources of the
    same float32 weights."""
    ids = np.random.default_rng(3).integers(0, 256, (1, 100))
    for family, name in FAMILIES.items():
        from_gguf = load_causal_lm(write_gguf(tmp_path / f"{family}.gguf", name, family))
        from_hf = load_causal_lm(TINY / name)
        np.testing.assert_allclose(from_gguf.forward(ids), from_hf.forward(ids), atol=1e-5, err_msg=family)


@pytest.mark.parametrize("family, fused", [("gemma2", True), ("olmo2", False)])
def test_a_q8_0_gguf_in_the_default_mode_stays_near_transformers(tmp_path, spy, family, fused):
    """Q8_0 matrices in the int8 mode, the prompt and a token: gemma2's by the fused decode step
    (its bits are the grid's: test_fused_decode), olmo2's by the grid (norms after each half
    only, over all heads: no layout of the step); the logits near transformers' float32 ones."""
    net = load_causal_lm(write_gguf(tmp_path / "q.gguf", FAMILIES[family], family,
                                    qtype=GGMLQuantizationType.Q8_0))
    ref = reference(family)
    with int8_activations():
        cache = [net.make_cache(len(ref["input_ids"]) + 1)]
        last = net.step(np.array([ref["input_ids"]]), cache)[0]
        net.step(np.array([[1]]), cache)
    assert spy == [fused, fused]
    np.testing.assert_allclose(last, ref["logits"][-1], atol=0.1)  # 8-bit weights and activations
    assert int(np.argmax(last)) == ref["greedy_32"][0]


def test_a_gguf_merged_with_its_checkpoint_loads_back_as_transformers_model(tmp_path):
    """A merge whose first parent is a GGUF writes config.json from the GGUF's settings (soft
    caps, query scale, layer types): the merged folder gives transformers' logits."""
    from loomlab.core.llm.quality.merge import merge_models

    for family, name in FAMILIES.items():
        gguf_file = write_gguf(tmp_path / f"{family}.gguf", name, family)
        out = merge_models(gguf_file, TINY / name, tmp_path / family, method="linear", t=0.5)
        ref = reference(family)
        logits = load_causal_lm(out).forward(np.array([ref["input_ids"]]))[0]
        np.testing.assert_allclose(logits, np.array(ref["logits"]), atol=1e-4, err_msg=family)


# ----- settings -------------------------------------------------------------------------------------
GEMMA2 = {"general.architecture": "gemma2", "gemma2.block_count": 5, "gemma2.embedding_length": 64,
          "gemma2.attention.head_count": 4, "gemma2.feed_forward_length": 128, "gemma2.rope.freq_base": 5e4}

OLMO2 = {**{k.replace("gemma2", "olmo2"): v for k, v in GEMMA2.items()}, "general.architecture": "olmo2"}


def test_gemma2_gguf_takes_llama_cpps_defaults():
    """Caps 50 and 30, sliding window 4096 on every second layer from layer 0, the SWA layers'
    RoPE the global one, head_dim ** -0.5 as the scale but for the 46-block (27B) model's
    (hidden_size / heads) ** -0.5, and the embedding as the output."""
    gemma2 = architecture("gemma2")
    args = gemma2.Args.from_gguf(GEMMA2, {})
    assert (args.attn_softcap, args.final_softcap, args.sliding_window) == (50.0, 30.0, 4096)
    assert "".join(t[0].upper() for t in args.layer_types) == "SFSFS"
    assert args.local_rope == args.rope and args.rope.base == 5e4
    assert (args.query_scale, args.qk_norm, args.tie_embeddings, args.norm_shift) == (None, False, True, 0.0)
    big = gemma2.Args.from_gguf({**GEMMA2, "gemma2.block_count": 46, "gemma2.embedding_length": 4608,
                                 "gemma2.attention.head_count": 32, "gemma2.attention.key_length": 128,
                                 "gemma2.attention.value_length": 128, "gemma2.attn_logit_softcapping": 20.0,
                                 "gemma2.attention.sliding_window_pattern": 3}, {})
    assert (big.query_scale, big.head_dim, big.attn_softcap) == (144 ** -0.5, 128, 20.0)
    assert "".join(t[0].upper() for t in big.layer_types[:6]) == "SSFSSF"


def test_gemma2_config_caps_default_when_absent_and_are_off_when_null():
    config = json.loads((TINY / "tiny-gemma2" / "config.json").read_text())
    gemma2 = architecture("gemma2")
    absent = gemma2.Args.from_hf({k: v for k, v in config.items() if not k.endswith("softcapping")})
    assert (absent.attn_softcap, absent.final_softcap) == (50.0, 30.0)
    off = gemma2.Args.from_hf({**config, "attn_logit_softcapping": None, "final_logit_softcapping": None})
    assert (off.attn_softcap, off.final_softcap) == (None, None)
    v4 = {k: v for k, v in config.items() if k not in ("layer_types", "rope_parameters")}  # transformers 4
    assert gemma2.Args.from_hf({**v4, "rope_theta": 1e4}).layer_types == tuple(config["layer_types"])


@pytest.mark.parametrize("read, field, message", [
    (lambda: architecture("gemma2").Args.from_gguf({**GEMMA2, "gemma2.attn_logit_softcapping": -1.0}, {}),
     "gemma2.attn_logit_softcapping", "not a positive float32 number"),
    (lambda: architecture("gemma2").Args.from_gguf({**GEMMA2, "gemma2.final_logit_softcapping": "30"}, {}),
     "gemma2.final_logit_softcapping", "expected float"),
    (lambda: architecture("gemma2").Args.from_hf(
        {**json.loads((TINY / "tiny-gemma2" / "config.json").read_text()), "final_logit_softcapping": 0}),
     "config.json:final_logit_softcapping", "not a positive float32 number"),
    (lambda: architecture("olmo2").Args.from_gguf({**OLMO2, "olmo2.attention.sliding_window": 4096}, {}),
     "olmo2.attention.sliding_window", "OLMo 3"),
])
def test_bad_settings_are_refused_naming_the_field(read, field, message):
    with pytest.raises(ModelFormatError, match=message) as info:
        read()
    assert info.value.field == field


def test_olmo2_q_norm_of_one_head_is_refused_naming_the_tensor(tmp_path):
    """A qwen3-style (per-head) Q norm is not OLMo 2's: the tensor is named, with its shape."""
    from safetensors.numpy import load_file, save_file

    folder = tmp_path / "olmo2"
    folder.mkdir()
    (folder / "config.json").write_text((TINY / "tiny-olmo2" / "config.json").read_text())
    tensors = load_file(str(TINY / "tiny-olmo2" / "model.safetensors"))
    tensors["model.layers.1.self_attn.q_norm.weight"] = np.ones(16, np.float32)
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(ModelFormatError, match=r"shape \(16,\), expected \(64,\)") as info:
        load_causal_lm(folder)
    assert info.value.field == "model.layers.1.self_attn.q_norm.weight"


# ----- the array-API device path --------------------------------------------------------------------
def test_both_families_on_the_strict_backend_are_the_numpy_path():
    """Soft-capped scores and logits, whole-width Q/K norms and post-norms as array-API code on
    array_api_strict's checking device: the numpy path's logits within float32 rounding."""
    pytest.importorskip("array_api_strict", reason="the strict backend needs array-api-strict (dev extra)")
    ids = np.random.default_rng(4).integers(0, 256, (1, 20))
    for family, name in FAMILIES.items():
        host, device = load_causal_lm(TINY / name), load_causal_lm(TINY / name)
        device.place("strict")
        ref = host.forward(ids)
        got = to_host(device.forward(ids))
        np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * np.abs(ref).max(), err_msg=family)
        assert isinstance(device.cells[-1], LLMHead)


def test_the_array_api_fallback_caps_scores_as_the_cpu_kernel():
    pytest.importorskip("array_api_strict", reason="the strict backend needs array-api-strict (dev extra)")
    from loomlab.core.backend import get_backend
    from loomlab.core.llm.kernels.device_kernels import LLMKernels

    rng = np.random.default_rng(7)
    q = rng.standard_normal((3, 4, 8)).astype(np.float32)
    keys, values = (rng.standard_normal((2, 12, 8)).astype(np.float32) for _ in range(2))
    b = get_backend("strict")
    got = LLMKernels(b).attend(b.xp.asarray(q), b.xp.asarray(keys), b.xp.asarray(values), 9, 5, 0.7, 1.5)
    ref = attend(q, keys, values, 9, 5, 0.7, softcap=1.5)
    np.testing.assert_allclose(to_host(got), ref, rtol=0, atol=4 * 12 * 2.0**-24 * np.abs(values).max() * 4)
    assert np.abs(ref - attend(q, keys, values, 9, 5, 0.7)).max() > 0.01  # the cap changed the result
