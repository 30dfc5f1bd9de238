"""Mixture-of-experts families (qwen3moe, mixtral) as grid networks.

Oracles: transformers' reference logits and greedy continuation of the tiny checkpoints
(tests/data/tiny-hf/make_tiny.py), read as HF folders and as GGUF files converted the way
llama.cpp's converter does (experts stacked, ``test_architectures.write_gguf``); a float32 twin of
a Q8_0 file's dequantized blocks; the routing formula written out per token.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from safetensors.numpy import load_file, save_file

from loomlab.core.backend import to_host
from loomlab.core.errors import ModelFormatError
from loomlab.core.layer_names import layer_name
from loomlab.core.llm.kernels.quant_int8 import int8_activations
from loomlab.core.llm.model import causal_lm
from loomlab.core.llm.model.llm_layers import LLMGatedMLP
from loomlab.core.llm.model.loader import architecture, load_causal_lm
from loomlab.core.llm.model.moe_layer import LLMMixtureOfExperts, route
from loomlab.core.llm.quality.gguf_export import export_gguf, export_refusal
from loomlab.core.morph import morph_sublayer
from loomlab.core.observe import CallbackObserver

from .test_architectures import TINY, assert_matches_float_twin, reference, write_gguf

FAMILIES = [("tiny-qwen3moe", "qwen3moe"), ("tiny-mixtral", "llama")]  # (checkpoint, GGUF architecture)
N_EXPERTS, K, D = 4, 2, 64


def greedy(net, ids: np.ndarray, n: int = 32) -> list[int]:
    """``n`` greedy tokens through the decode path (a prefill, then one token a step)."""
    cache = net.make_cache()
    logits = net.step(ids[None], [cache])[0]
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits)))
        logits = net.step(np.array([[out[-1]]]), [cache])[0]
    return out


def moe_layers(net) -> list[LLMMixtureOfExperts]:
    return [la for la in net.all_layers() if isinstance(la, LLMMixtureOfExperts)]


def assert_matches_transformers(net, name: str) -> None:
    ref = reference(name)
    ids = np.array(ref["input_ids"])
    np.testing.assert_allclose(net.forward(ids[None])[0], np.array(ref["logits"]), atol=1e-4)
    assert greedy(net, ids) == ref["greedy_32"]


@pytest.mark.parametrize("name, arch", FAMILIES)
def test_hf_folder_and_its_gguf_give_transformers_logits_and_greedy_tokens(tmp_path, name, arch):
    hf = load_causal_lm(TINY / name)
    gguf_net = load_causal_lm(write_gguf(tmp_path / "m.gguf", name, arch))
    for net in (hf, gguf_net):
        layers = moe_layers(net)
        assert len(layers) == 3 and all(la.n_experts == N_EXPERTS and la.k == K for la in layers)
        assert all(type(e) is LLMGatedMLP for la in layers for e in la.children)
        assert_matches_transformers(net, name)


def test_stacked_experts_are_views_of_the_file_blocks(tmp_path):
    """Each expert of a Q8_0 file multiplies its own rows of the stacked tensor's mapping: no copy."""
    net = load_causal_lm(write_gguf(tmp_path / "q.gguf", "tiny-qwen3moe", "qwen3moe",
                                    qtype=GGMLQuantizationType.Q8_0))
    ups = [e.weights.blocks["up"] for e in moe_layers(net)[0].children]
    assert {m.type_name for m in ups} == {"Q8_0"}
    starts = [m.raw_blocks.__array_interface__["data"][0] for m in ups]
    assert np.diff(starts).tolist() == [ups[0].raw_blocks.nbytes] * (N_EXPERTS - 1)
    assert all(not m.raw_blocks.flags.owndata for m in ups)


def test_quantized_moe_gguf_matches_a_float_twin_of_its_dequantized_blocks(tmp_path):
    """Q8_0 experts multiplied in place (prefill, decode) against a float32 GGUF holding gguf-py's
    dequantization of the same blocks."""
    quantized = assert_matches_float_twin(tmp_path, "tiny-mixtral", "llama")
    assert {m.type_name for la in moe_layers(quantized) for e in la.children
            for m in e.weights.blocks.values() if len(m.shape) == 2} == {"Q8_0"}


def test_the_int8_mode_runs_moe_models_on_the_grid(tmp_path, monkeypatch):
    """The fused decode step knows no experts: in the int8 mode (the default) every step of a MoE
    model is left to the grid, which gives transformers' greedy tokens and logits within 8-bit
    activations' error of the float mode (this model routes every token alike in both)."""
    net = load_causal_lm(write_gguf(tmp_path / "q.gguf", "tiny-qwen3moe", "qwen3moe",
                                    qtype=GGMLQuantizationType.Q8_0))
    ref = reference("tiny-qwen3moe")
    ids = np.array(ref["input_ids"])
    exact = net.forward(ids[None])[0]
    answers: list[bool] = []
    real = causal_lm.fused_step
    monkeypatch.setattr(causal_lm, "fused_step", lambda *a: answers.append(real(*a) is not None))
    with int8_activations():
        logits = net.step(ids[None], [net.make_cache()], last_only=False)[0]
        tokens = greedy(net, ids)
    assert len(answers) == 34 and not any(answers)
    np.testing.assert_allclose(logits, exact, atol=0.1)
    assert tokens == ref["greedy_32"]


def test_transformers_5_fused_experts_read_as_the_per_expert_checkpoint(tmp_path):
    """transformers 5's in-memory layout (``mlp.experts.gate_up_proj [E, 2F, D]``,
    ``mlp.experts.down_proj [E, D, F]``, router ``mlp.gate``) for mixtral's experts."""
    folder = tmp_path / "fused"
    shutil.copytree(TINY / "tiny-mixtral", folder)
    tensors = load_file(folder / "model.safetensors")
    fused = {}
    for i in range(3):
        p = f"model.layers.{i}.block_sparse_moe."
        w = {n: np.stack([tensors.pop(f"{p}experts.{e}.{n}.weight") for e in range(N_EXPERTS)])
             for n in ("w1", "w2", "w3")}
        fused[f"model.layers.{i}.mlp.experts.gate_up_proj"] = np.concatenate([w["w1"], w["w3"]], axis=1)
        fused[f"model.layers.{i}.mlp.experts.down_proj"] = w["w2"]
        fused[f"model.layers.{i}.mlp.gate.weight"] = tensors.pop(f"{p}gate.weight")
    save_file({**tensors, **fused}, folder / "model.safetensors")
    assert_matches_transformers(load_causal_lm(folder), "tiny-mixtral")


def test_routing_is_the_softmax_of_the_chosen_experts():
    """Per token: the k largest router logits; weights their softmax over all experts, renormalised
    over the chosen k (mixtral's formula: the softmax of the chosen logits alone) or not."""
    logits = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    chosen, weights = route(logits, 3, normalise=True)
    _, plain = route(logits, 3, normalise=False)
    for row, experts, w, p in zip(logits, chosen, weights, plain, strict=True):
        top = np.argsort(row)[::-1][:3]
        np.testing.assert_array_equal(experts, top)
        e = np.exp(row[top].astype(np.float64) - row.max())
        np.testing.assert_allclose(w, e / e.sum(), rtol=1e-6)
        np.testing.assert_allclose(p, e / np.exp(row.astype(np.float64) - row.max()).sum(), rtol=1e-6)


def test_per_expert_load_counts_tokens_and_observers_see_each_expert_that_ran():
    net = load_causal_lm(TINY / "tiny-qwen3moe")
    events = []
    net.attach(CallbackObserver(events.append))
    ids = np.array(reference("tiny-qwen3moe")["input_ids"])
    net.forward(ids[None])
    for layer in moe_layers(net):
        assert layer.load.sum() == len(ids) * K and np.array_equal(layer.load, layer.last_load)
        rows = {e.path: e.stats.total // D for e in events
                if (e.z, e.y, e.x, e.l) == layer.coords and e.path.startswith(layer.path + ".")}
        assert rows == {child.path: n for child, n in zip(layer.children, layer.last_load, strict=True) if n}
    layer = moe_layers(net)[0]
    assert layer_name(net, (*layer.coords, layer.path)).tensors == {"router": "blk.0.ffn_gate_inp.weight"}
    expert = layer.children[2]
    assert layer_name(net, (*expert.coords, expert.path)).label == "blk.0.ffn_gate_exps/up_exps/down_exps[2]"


def test_morphing_one_expert_changes_only_the_tokens_routed_to_it():
    net = load_causal_lm(TINY / "tiny-mixtral")
    ids = np.array(reference("tiny-mixtral")["input_ids"])[None]
    before = net.forward(ids)
    layer = moe_layers(net)[-1]
    cell, routed = net.index(layer.coords), layer.last_load[0]
    report = morph_sublayer(layer.children[0], cell, "int4")
    assert report.path == layer.children[0].path and report.dtype == "int4"
    after = net.forward(ids)
    changed = np.abs(after - before).max(axis=-1)[0] > 1e-6
    assert routed > 0 and changed.sum() == routed  # the last block: nothing mixes the rows after it
    morph_sublayer(layer.children[0], cell, "float32")
    np.testing.assert_array_equal(net.forward(ids), before)


QWEN3MOE_GGUF = {"general.architecture": "qwen3moe", "qwen3moe.block_count": 2,
                 "qwen3moe.embedding_length": 64, "qwen3moe.attention.head_count": 4,
                 "qwen3moe.feed_forward_length": 128, "qwen3moe.expert_count": 4,
                 "qwen3moe.expert_used_count": 2}


@pytest.mark.parametrize("change, field", [
    ({"qwen3moe.expert_used_count": 5}, "qwen3moe.expert_used_count"),
    ({"qwen3moe.expert_count": 0}, "qwen3moe.expert_count"),
    ({"qwen3moe.expert_count": None}, "qwen3moe.expert_count"),
    ({"qwen3moe.expert_used_count": None}, "qwen3moe.expert_used_count"),
    ({"qwen3moe.expert_feed_forward_length": -1}, "qwen3moe.expert_feed_forward_length"),
    ({"general.architecture": "qwen2"}, "qwen2.expert_count"),
])
def test_bad_gguf_expert_settings_name_their_field(change, field):
    metadata = {k: v for k, v in {**QWEN3MOE_GGUF, **change}.items() if v is not None}
    arch = metadata["general.architecture"]
    metadata = {k.replace("qwen3moe.", f"{arch}."): v for k, v in metadata.items()}
    with pytest.raises(ModelFormatError) as info:
        architecture(arch).Args.from_gguf(metadata, {})
    assert info.value.field == field


@pytest.mark.parametrize("change, field", [
    ({"num_experts_per_tok": 5}, "config.json:num_experts_per_tok"),
    ({"num_local_experts": 0}, "config.json:num_local_experts"),
    ({"mlp_only_layers": ["1"]}, "config.json:mlp_only_layers"),
])
def test_bad_config_expert_settings_name_their_field(change, field):
    config = {**json.loads((TINY / "tiny-qwen3moe" / "config.json").read_text()), **change}
    with pytest.raises(ModelFormatError) as info:
        architecture("qwen3_moe").Args.from_hf(config)
    assert info.value.field == field


def test_qwen3moe_dense_blocks_follow_mlp_only_layers_and_the_sparse_step(tmp_path):
    config = {**json.loads((TINY / "tiny-qwen3moe" / "config.json").read_text()), "num_hidden_layers": 6,
              "mlp_only_layers": [3], "decoder_sparse_step": 2}
    moe = architecture("qwen3_moe").Args.from_hf(config).moe
    assert [moe.sparse(i) for i in range(6)] == [False, True, False, False, False, True]
    folder = tmp_path / "dense-first"  # block 0 dense: it needs the plain MLP the checkpoint lacks
    shutil.copytree(TINY / "tiny-qwen3moe", folder)
    (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 3, "mlp_only_layers": [0],
                                                    "decoder_sparse_step": 1}))
    with pytest.raises(ModelFormatError) as info:
        load_causal_lm(folder)
    assert info.value.field == "model.layers.0.mlp.gate_proj.weight"


def test_a_missing_or_misshapen_expert_is_named_as_the_file_names_it(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "tiny-qwen3moe", "qwen3moe", reshape="blk.1.ffn_up_exps.weight")
    with pytest.raises(ModelFormatError, match="missing") as info:
        load_causal_lm(path)  # the stack lost its last expert
    assert info.value.field == "blk.1.ffn_up_exps.weight[3]"
    folder = tmp_path / "narrow"
    shutil.copytree(TINY / "tiny-qwen3moe", folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "moe_intermediate_size": 16}))
    with pytest.raises(ModelFormatError, match=r"shape \(32, 64\), expected \(16, 64\)") as info:
        load_causal_lm(folder)
    assert info.value.field == "model.layers.0.mlp.experts.0.gate_proj.weight"


def test_a_moe_model_on_a_device_backend_gives_the_host_logits():
    """Routing on the host, experts on the device (array-api-strict's simulated device1, where any
    implicit host copy raises): the logits of the numpy path, prefill and decode."""
    pytest.importorskip("array_api_strict", reason="the strict backend needs array-api-strict (dev extra)")
    host, device = load_causal_lm(TINY / "tiny-qwen3moe"), load_causal_lm(TINY / "tiny-qwen3moe")
    device.place("strict")
    ids = np.random.default_rng(3).integers(0, 256, (1, 20))
    want = host.forward(ids)
    scale = np.abs(want).max()
    np.testing.assert_allclose(to_host(device.forward(ids)), want, atol=1e-5 * scale)
    assert [a.load.tolist() for a in moe_layers(host)] == [b.load.tolist() for b in moe_layers(device)]
    cache = device.make_cache()
    device.step(ids[:, :-1], [cache])
    np.testing.assert_allclose(to_host(device.step(ids[:, -1:], [cache])), want[:, -1], atol=1e-5 * scale)


def test_a_moe_gguf_exports_as_its_file_and_a_morphed_expert_is_refused(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "tiny-qwen3moe", "qwen3moe", qtype=GGMLQuantizationType.Q8_0)
    model = SimpleNamespace(net=load_causal_lm(path), name="tiny-qwen3moe")
    export_gguf(model, tmp_path / "copy.gguf")
    assert (tmp_path / "copy.gguf").read_bytes() == path.read_bytes()
    expert = moe_layers(model.net)[1].children[3]
    morph_sublayer(expert, model.net.index(expert.coords), "float16")
    assert "blk.1.ffn_gate_exps/up_exps/down_exps[3]" in export_refusal(model)
