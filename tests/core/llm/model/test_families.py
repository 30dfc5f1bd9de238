"""Phi-3, Granite and SmolLM3 from HF folders and from GGUF files.

Oracles: transformers' float32 logits and greedy continuation of each tiny random checkpoint
(``tests/data/tiny-hf/tiny-<family>/reference.json``), the same checkpoint converted to GGUF as
llama.cpp's converter does (``write_gguf``: phi3's fused matrices kept fused, granite's
multipliers as its keys), a float32 twin of a quantized file's blocks, and the identity for a
RoPE of zero frequencies.
"""

from __future__ import annotations

import json

import gguf
import numpy as np
import pytest

from loomlab.core.errors import ModelFormatError
from loomlab.core.llm.files.gguf_file import open_gguf
from loomlab.core.llm.kernels.quant import QuantMatrix
from loomlab.core.llm.kernels.quant_int8 import int8_activations
from loomlab.core.llm.model.loader import architecture, load_causal_lm
from loomlab.core.llm.model.rope import Rope

from .test_architectures import TINY, hf_folder, reference, write_gguf
from .test_llm_logits import greedy

FAMILIES = ("phi3", "granite", "smollm3")


def blocks(net) -> list[tuple]:
    """``(attention, MLP)`` of each block."""
    return [(b.children[0].children[1], b.children[2].children[1]) for b in net.cells[1:-2]]


@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_transformers_from_hf_and_gguf(family, tmp_path):
    """Logits at every position within 1e-4 and the 32 greedy tokens (prefill, then the cached
    decode path), from the HF folder and the converted GGUF, on the float path and in the
    default (int8) mode."""
    ref = reference(f"tiny-{family}")
    gguf_path = write_gguf(tmp_path / "m.gguf", f"tiny-{family}", family)
    sources = {"hf": TINY / f"tiny-{family}", "gguf": gguf_path}
    for source, path in sources.items():
        net = load_causal_lm(path)
        for mode in (False, True):
            with int8_activations(mode):
                logits = net.forward(np.array([ref["input_ids"]]))[0]
                np.testing.assert_allclose(logits, np.array(ref["logits"]), atol=1e-4, err_msg=source)
                _, tokens = greedy(net, ref["input_ids"], len(ref["greedy_32"]))
            assert tokens == ref["greedy_32"], (source, mode)


def test_each_source_reads_its_family_settings(tmp_path):
    """The settings the logits depend on, as each file states them (llama.cpp's fixed NoPE step of
    4 for a GGUF smollm3; transformers' no_rope_layers)."""
    read = {}
    for family in FAMILIES:
        path = write_gguf(tmp_path / f"{family}.gguf", f"tiny-{family}", family)
        with open_gguf(path) as f:
            gguf_args = architecture(family).Args.from_gguf(f.metadata, f.kv_offsets)
        config = json.loads((TINY / f"tiny-{family}" / "config.json").read_text())
        read[family] = gguf_args, architecture(family).Args.from_hf(config)
    for gguf_args, hf_args in read.values():
        assert not hf_args.rope_interleaved  # phi3's converter keeps transformers' Q/K rows
        assert gguf_args.rope_interleaved == (gguf_args.architecture != "phi3")
    for args in read["granite"]:
        scales = (args.embedding_scale, args.residual_scale, args.attention_scale, args.logit_scale)
        assert scales == pytest.approx((12.0, 0.22, 0.1, 8.0), rel=1e-7)  # GGUF keeps float32
    for args in read["smollm3"]:
        assert args.rope_layers == (True, True, True, False)
    smollm3 = architecture("smollm3").Args.from_hf(
        {**json.loads((TINY / "tiny-smollm3" / "config.json").read_text()), "no_rope_layers": None,
         "no_rope_layer_interval": 2})
    assert smollm3.rope_layers == (True, False, True, False)
    phi3 = architecture("phi3").Args.from_hf({**json.loads((TINY / "tiny-phi3" / "config.json").read_text()),
                                              "sliding_window": 8})
    assert phi3.layer_types == ("sliding_attention",) * 3 and phi3.layer_window(2) == 8


def test_quantized_phi3_splits_the_files_blocks(tmp_path):
    """Q8_0 attn_qkv / ffn_up split into row ranges of the file's own blocks: no copy, nothing
    dequantized (their products against a float32 twin: test_architectures'
    test_quantized_gguf_matches_a_float_twin_of_its_dequantized_blocks)."""
    q8 = gguf.GGMLQuantizationType.Q8_0
    net = load_causal_lm(write_gguf(tmp_path / "q.gguf", "tiny-phi3", "phi3", qtype=q8))
    attention, mlp = blocks(net)[1]
    fused_qkv = net.source.file.tensors["blk.1.attn_qkv.weight"].data()
    parts = [attention.weights.blocks[n] for n in ("wq", "wk", "wv")] + [mlp.weights.blocks["gate"],
                                                                          mlp.weights.blocks["up"]]
    assert all(isinstance(m, QuantMatrix) and m.type_name == "Q8_0" for m in parts)
    assert [m.shape[0] for m in parts] == [64, 32, 32, 128, 128]
    assert all(np.shares_memory(m.raw_blocks, fused_qkv) for m in parts[:3])
    gate_up = net.source.file.tensors["blk.1.ffn_up.weight"].data()
    assert all(np.shares_memory(m.raw_blocks, gate_up) for m in parts[3:])
    net.step(np.array([[1, 2, 3]]), [net.make_cache()])
    assert all(la.weights._master is None for la in net.weighted_layers())


@pytest.mark.parametrize("interleaved", [False, True])
def test_a_rope_of_zero_frequencies_is_the_identity_bit_for_bit(interleaved):
    """SmolLM3's NoPE layers rotate by cos 1, sin 0 (the grid's numpy and compiled paths)."""
    v = np.random.default_rng(7).standard_normal((2, 5, 3, 16)).astype(np.float32)
    rope = Rope(np.zeros(8, np.float32), interleaved)
    (compiled,) = rope((0, 9), 5, v)
    (arrays,) = rope((0, 9), 5, v.astype(np.float64))  # not float32: the numpy form
    assert np.array_equal(compiled, v) and np.array_equal(arrays, v)
    assert np.array_equal(rope.on_device((3, 4), 5, np, v)[0], v)


PHI3_HF = [
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4, "short_factor": [1.0] * 8,
                          "long_factor": [2.0] * 8}}, "config.json:rope_parameters.rope_type",
     "unsupported RoPE type 'longrope'"),
    ({"rope_parameters": {"rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "config.json:rope_parameters.partial_rotary_factor", "RoPE over part of each head"),
    ({"rope_parameters": None, "rope_theta": 1e4, "partial_rotary_factor": 0.75},
     "config.json:partial_rotary_factor", "RoPE over part of each head"),
]
GRANITE_HF = [({"logits_scaling": 0}, "config.json:logits_scaling", "not a positive"),
              ({"residual_multiplier": "0.2"}, "config.json:residual_multiplier", "expected float")]
SMOLLM3_HF = [({"no_rope_layers": [1, 1, 0]}, "config.json:no_rope_layers", "expected 4 entries"),
              ({"no_rope_layers": [1, 2, 1, 0]}, "config.json:no_rope_layers", "expected 4 entries"),
              ({"no_rope_layers": None, "no_rope_layer_interval": 0}, "config.json:no_rope_layer_interval",
               "not in 1")]


@pytest.mark.parametrize("family, change, field, message", [
    *(("phi3", *case) for case in PHI3_HF), *(("granite", *case) for case in GRANITE_HF),
    *(("smollm3", *case) for case in SMOLLM3_HF)])
def test_a_bad_family_setting_is_refused_naming_its_field(family, change, field, message, tmp_path):
    with pytest.raises(ModelFormatError, match=message) as info:
        load_causal_lm(hf_folder(tmp_path, f"tiny-{family}", **change))
    assert info.value.field == field


def test_bad_family_gguf_files_are_refused_naming_the_key_or_tensor(tmp_path):
    args = architecture("phi3").Args.from_hf(json.loads((TINY / "tiny-phi3" / "config.json").read_text()))
    with pytest.raises(ModelFormatError, match="longrope") as info:  # GGUF's Phi-3 128k factors
        architecture("phi3").sanitize({"rope_factors_short.weight": np.ones(8, np.float32)}, args)
    assert info.value.field == "rope_factors_short.weight"
    phi3_gguf = {"general.architecture": "phi3", "phi3.block_count": 2, "phi3.embedding_length": 64,
                 "phi3.attention.head_count": 4, "phi3.feed_forward_length": 128}
    with pytest.raises(ModelFormatError, match="differs from the head size 16") as info:  # partial rotary
        architecture("phi3").Args.from_gguf({**phi3_gguf, "phi3.rope.dimension_count": 12}, {})
    assert info.value.field == "phi3.rope.dimension_count"
    path = write_gguf(tmp_path / "short.gguf", "tiny-phi3", "phi3", reshape="blk.1.attn_qkv.weight")
    with pytest.raises(ModelFormatError, match=r"shape \(127, 64\), expected \(128, 64\)") as info:
        load_causal_lm(path)
    assert info.value.field == "blk.1.attn_qkv.weight"
    granite = {"general.architecture": "granite", "granite.block_count": 2, "granite.embedding_length": 64,
               "granite.attention.head_count": 4, "granite.feed_forward_length": 128}
    with pytest.raises(ModelFormatError, match="required setting is missing") as info:
        architecture("granite").Args.from_gguf(granite, {})
    assert info.value.field == "granite.logit_scale"
    with pytest.raises(ModelFormatError, match="not a positive") as info:
        architecture("granite").Args.from_gguf({**granite, "granite.logit_scale": 8.0,
                                                "granite.residual_scale": -0.5}, {})
    assert info.value.field == "granite.residual_scale"
    zero = architecture("granite").Args.from_gguf({**granite, "granite.logit_scale": 8.0,
                                                   "granite.attention.scale": 0.0}, {})
    assert (zero.attention_scale, zero.residual_scale) == (None, 1.0)  # llama.cpp's "not set"
