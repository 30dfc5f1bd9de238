"""Architectures as grid networks: settings, weight names, RoPE, the decode path.

Oracles: transformers' reference logits of the tiny checkpoints (also when converted to GGUF the
way llama.cpp's converter does, with gguf-py's own tensor-name map), a complex-number RoPE, the
converter's llama3 ``rope_freqs`` formula, and full-sequence forward for the cached decode path.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType

from loomlab.core import VolumetricNetwork
from loomlab.core.errors import LoomConfigError, LoomShapeError, ModelFormatError
from loomlab.core.layers.attention import MultiHeadAttention
from loomlab.core.layers.base import make_layer
from loomlab.core.llm.files import architectures, registry
from loomlab.core.llm.files.gguf_file import open_gguf
from loomlab.core.llm.files.hf_files import open_hf
from loomlab.core.llm.model.layer_builders import attention_layer, mlp_layer
from loomlab.core.llm.model.llm_layers import LLMHead, LLMRMSNorm, MatrixStore
from loomlab.core.llm.model.loader import ARCHITECTURES, architecture, load_causal_lm
from loomlab.core.llm.model.model_args import ModelArgs
from loomlab.core.llm.model.rope import Rope, RopeConfig
from loomlab.core.morph import morph_layer
from loomlab.core.observe import CallbackObserver

TINY = Path(__file__).resolve().parents[3] / "data" / "tiny-hf"
GGUF_ARCH = {"llama": gguf.MODEL_ARCH.LLAMA, "gemma3": gguf.MODEL_ARCH.GEMMA3, "phi3": gguf.MODEL_ARCH.PHI3,
             "granite": gguf.MODEL_ARCH.GRANITE, "smollm3": gguf.MODEL_ARCH.SMOLLM3,
             "qwen3moe": gguf.MODEL_ARCH.QWEN3MOE, "gemma2": gguf.MODEL_ARCH.GEMMA2,
             "olmo2": gguf.MODEL_ARCH.OLMO2}
PERMUTED_QK = {"llama", "granite", "smollm3"}  # convert_hf_to_gguf.py's LlamaModel and its subclasses
GEMMAS = ("gemma3", "gemma2")  # norms stored as 1 + w, a sliding window
EXPERT = re.compile(r"(.+\.experts)\.(\d+)\.(\w+\.weight)")  # a checkpoint's per-expert matrix


def reference(name: str) -> dict:
    return json.loads((TINY / name / "reference.json").read_text())


# ----- RoPE ----------------------------------------------------------------------------------------
def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's permutation of llama's Q/K rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def complex_rope(v: np.ndarray, positions: np.ndarray, base: float) -> np.ndarray:
    """Half-split RoPE as complex multiplication: ``(v[j] + i v[j+h]) * exp(i p base^(-2j/hd))``."""
    hd = v.shape[-1]
    half = hd // 2
    z = v[..., :half] + 1j * v[..., half:]
    theta = positions[:, :, None, None] * base ** (-np.arange(half) * 2 / hd)
    z = z * np.exp(1j * theta)
    return np.concatenate([z.real, z.imag], axis=-1)


def test_rope_on_gguf_rows_matches_half_split_on_original_rows():
    rng = np.random.default_rng(1)
    heads, hd, d, base = 3, 8, 12, 10000.0
    w = rng.standard_normal((heads * hd, d)).astype(np.float32)
    x = rng.standard_normal((2, 5, d)).astype(np.float32)
    positions = np.array([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    expected = complex_rope((x @ w.T).reshape(2, 5, heads, hd).astype(np.float64), positions, base)
    inv_freq = RopeConfig(base).inv_freq(hd)
    (half,) = Rope(inv_freq)((0, 7), 5, (x @ w.T).reshape(2, 5, heads, hd))
    np.testing.assert_allclose(half, expected, atol=2e-5)
    (pairs,) = Rope(inv_freq, interleaved=True)((0, 7), 5,
                                                (x @ llama_cpp_permute(w, heads).T).reshape(2, 5, heads, hd))
    # the same vectors, in the permuted order: every dot product (attention score) agrees
    np.testing.assert_allclose(pairs, llama_cpp_permute(expected.reshape(-1, heads * hd).T, heads).T
                               .reshape(pairs.shape), atol=2e-5)


def test_llama3_frequencies_match_the_gguf_converter_factors():
    rope = RopeConfig(500000.0, "llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                      original_context=8192)
    base_freqs = RopeConfig(500000.0).inv_freq(64)
    factors = []  # convert_hf_to_gguf.py, LlamaModel.generate_extra_tensors
    for freq in base_freqs.astype(np.float64):
        wavelen = 2 * math.pi / freq
        if wavelen < 8192 / 4.0:
            factors.append(1.0)
        elif wavelen > 8192 / 1.0:
            factors.append(32.0)
        else:
            smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
            factors.append(1 / ((1 - smooth) / 32.0 + smooth))
    np.testing.assert_allclose(rope.inv_freq(64), base_freqs / np.array(factors), rtol=1e-6)
    np.testing.assert_allclose(RopeConfig(500000.0).inv_freq(64, np.array(factors)), rope.inv_freq(64),
                               rtol=1e-6)


# ----- layers --------------------------------------------------------------------------------------
def test_llm_layers_compute_what_core_layers_compute_from_their_master():
    """Built from named tensors with biases, each layer's master is in Loom's layout: the core
    layer made from that master gives the same output."""
    rng = np.random.default_rng(4)
    d, ffn, heads, kv_heads, hd = 16, 24, 4, 2, 4
    q, kv = heads * hd, kv_heads * hd
    args = ModelArgs("llama", d, 1, heads, kv_heads, hd, ffn, attention_biases=("q", "k", "v", "o"))
    shapes = {"self_attn.q_proj": (q, d), "self_attn.k_proj": (kv, d), "self_attn.v_proj": (kv, d),
              "self_attn.o_proj": (d, q), "mlp.gate_proj": (ffn, d), "mlp.up_proj": (ffn, d),
              "mlp.down_proj": (d, ffn)}
    weights = {}
    for name, shape in shapes.items():
        weights[f"model.layers.0.{name}.weight"] = rng.standard_normal(shape).astype(np.float32) * 0.5
        weights[f"model.layers.0.{name}.bias"] = rng.standard_normal(shape[0]).astype(np.float32) * 0.5
    gamma = rng.standard_normal(d).astype(np.float32)

    def loom_layout(*names):  # Loom's flat vector: the weight matrices, then the biases
        return np.concatenate([weights[f"model.layers.0.{n}.{kind}"].ravel() for kind in ("weight", "bias")
                               for n in names])

    cases = [(mlp_layer(args, weights, 0), "SwiGLU", dict(input_height=d, output_height=ffn),
              loom_layout("mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")),
             (attention_layer(args, weights, 0, Rope(RopeConfig().inv_freq(hd))), "MultiHeadAttention",
              dict(d_model=d, num_heads=heads, num_kv_heads=kv_heads, head_dim=hd),
              loom_layout("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")),
             (LLMRMSNorm(gamma, 1e-6), "RMSNorm", dict(input_height=d), gamma),
             (LLMHead(weights["model.layers.0.mlp.up_proj.weight"]), "Dense",
              dict(input_height=d, output_height=ffn), weights["model.layers.0.mlp.up_proj.weight"].ravel())]
    x = rng.standard_normal((6, d)).astype(np.float32)
    for layer, kind, cfg, master in cases:
        np.testing.assert_array_equal(layer.weights.master, master, err_msg=kind)
        core = make_layer(kind, weights=master, **cfg)
        outputs = []
        for one in (layer, core):
            net = VolumetricNetwork(1, 1, 1, 1, precision="fast")
            net[0, 0, 0, 0] = one
            outputs.append(net.forward(x))
        np.testing.assert_allclose(outputs[0], outputs[1], atol=2e-5, err_msg=kind)


# ----- settings ------------------------------------------------------------------------------------
def test_args_from_smollm2_metadata():
    with open_gguf(registry.fetch("smollm2-135m")) as f:
        module = architecture(f.architecture)
        args = module.Args.from_gguf(f.metadata, f.kv_offsets)
    assert (args.num_layers, args.hidden_size, args.num_heads, args.num_kv_heads, args.head_dim) == (
        30, 576, 9, 3, 64)
    assert (args.intermediate_size, args.context_length, args.rope.base) == (1536, 8192, 100000.0)
    assert args.rope_interleaved and args.tie_embeddings is None and not args.layer_types


def test_args_from_gemma3_metadata_mark_every_sixth_layer_global():
    with open_gguf(registry.fetch("gemma3-270m")) as f:
        args = architecture(f.architecture).Args.from_gguf(f.metadata, f.kv_offsets)
    assert [i for i, t in enumerate(args.layer_types) if t == "full_attention"] == [5, 11, 17]
    assert (args.sliding_window, args.local_rope.base, args.rope.base) == (512, 10000.0, 1e6)
    assert (args.head_dim, args.num_kv_heads, args.qk_norm, args.norm_shift) == (256, 1, True, 0.0)


@pytest.mark.parametrize("pattern, expected", [
    (None, "SSSSSFSS"), (3, "SSFSSFSS"), (np.array([1, 0, 1, 1, 0, 0, 1, 1], dtype=bool), "SFSSFFSS")])
def test_gemma3_sliding_layers_from_a_period_or_per_layer_flags(pattern, expected):
    metadata = {"general.architecture": "gemma3", "gemma3.block_count": 8, "gemma3.embedding_length": 64,
                "gemma3.attention.head_count": 2, "gemma3.feed_forward_length": 128,
                "gemma3.attention.sliding_window": 16}
    if pattern is not None:
        metadata["gemma3.attention.sliding_window_pattern"] = pattern
    args = architecture("gemma3").Args.from_gguf(metadata, {})
    assert "".join(t[0].upper() for t in args.layer_types) == expected
    assert [args.layer_window(i) for i in range(2)] == [16, 16 if expected[1] == "S" else None]


SMALL = {"general.architecture": "llama", "llama.block_count": 2, "llama.embedding_length": 64,
         "llama.attention.head_count": 4, "llama.feed_forward_length": 128, "some.unknown.key": [1, 2]}


@pytest.mark.parametrize("change, field", [
    ({"llama.block_count": None}, "llama.block_count"),
    ({"llama.embedding_length": "64"}, "llama.embedding_length"),
    ({"llama.attention.head_count_kv": 3}, "llama.attention.head_count_kv"),
    ({"llama.attention.key_length": 1 << 40}, "llama.attention.key_length"),
    ({"llama.feed_forward_length": True}, "llama.feed_forward_length"),
    ({"llama.rope.scaling.type": "yarn"}, "llama.rope.scaling.type"),
    ({"llama.embedding_length": 66}, "llama.attention.head_count"),
    ({"llama.rope.freq_base": -1.0}, "llama.rope.freq_base"),
    ({"llama.attention.layer_norm_rms_epsilon": float("nan")}, "llama.attention.layer_norm_rms_epsilon"),
])
def test_bad_settings_name_their_field(change, field):
    metadata = {k: v for k, v in {**SMALL, **change}.items() if v is not None}
    with pytest.raises(ModelFormatError) as info:
        architecture("llama").Args.from_gguf(metadata, {})
    assert info.value.field == field


@pytest.mark.parametrize("change, field", [
    ({"layer_types": 3}, "config.json:layer_types"),
    ({"layer_types": ["full_attention"]}, "config.json:layer_types"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "config.json:rope_parameters.rope_type"),
    ({"rope_parameters": None, "rope_scaling": "linear"}, "config.json:rope_scaling"),
    ({"num_key_value_heads": 3}, "config.json:num_key_value_heads"),
])
def test_bad_config_names_its_field(change, field):
    config = {**json.loads((TINY / "tiny-qwen2" / "config.json").read_text()), **change}
    with pytest.raises(ModelFormatError) as info:
        architecture("qwen2").Args.from_hf(config)
    assert info.value.field == field


def test_unknown_settings_are_ignored_and_unknown_architectures_refused():
    args = architecture("llama").Args.from_gguf(SMALL, {})
    assert (args.head_dim, args.num_kv_heads, args.norm_eps) == (16, 4, 1e-6)
    with pytest.raises(ModelFormatError, match="architecture 'gpt2' is not supported") as info:
        architecture("gpt2")
    assert info.value.field == "general.architecture"


def test_the_listing_knows_the_architectures_the_loader_builds():
    assert set(ARCHITECTURES) == architectures.SUPPORTED


def test_transformers_4_and_5_gemma3_configs_agree():
    v5 = json.loads((TINY / "tiny-gemma3" / "config.json").read_text())
    v4 = {k: v for k, v in v5.items() if k not in ("rope_parameters", "layer_types")}
    v4.update(rope_theta=1e6, rope_local_base_freq=10000.0, sliding_window_pattern=2)
    gemma = architecture("gemma3_text")
    a5, a4 = gemma.Args.from_hf(v5), gemma.Args.from_hf(v4)
    assert a5.layer_types == ("sliding_attention",) * 3
    assert a4.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert (a4.rope, a4.local_rope) == (a5.rope, a5.local_rope)
    assert a5.query_scale == 32 ** -0.5 and a5.tie_embeddings and a5.norm_shift == 1.0


def test_qwen_variants():
    qwen = architecture("qwen2")
    config = json.loads((TINY / "tiny-qwen2" / "config.json").read_text())
    assert qwen.Args.from_hf(config).attention_biases == ("q", "k", "v")
    qwen3 = qwen.Args.from_hf({**config, "model_type": "qwen3", "head_dim": 32})
    assert qwen3.qk_norm and qwen3.head_dim == 32 and not qwen3.attention_biases
    assert isinstance(ModelArgs.from_hf(config), ModelArgs)


# ----- the network ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma():
    return load_causal_lm(TINY / "tiny-gemma3")


def test_model_is_a_grid_of_core_layer_types(gemma):
    assert isinstance(gemma, VolumetricNetwork) and gemma.shape == (1, 1, 6, 1)
    tops = [layer.type_name for _, layer in gemma.layers()]
    assert tops == ["Embedding", "Sequential", "Sequential", "Sequential", "RMSNorm", "Dense"]
    block = [row.type for row in gemma.blueprint() if row.index == 1]
    assert block == ["Sequential", "Sequential", "RMSNorm", "MultiHeadAttention", "RMSNorm", "Residual",
                     "Sequential", "RMSNorm", "SwiGLU", "RMSNorm", "Residual"]
    attention = gemma.cells[1].children[0].children[1]
    # Loom's MHA layout, then the two Q/K norm gammas
    assert len(attention.weights) == MultiHeadAttention.param_count(attention.cfg) + 2 * 32
    embedding, head = gemma.cells[0], gemma.cells[-1]
    assert head.weights.blocks["weight"] is embedding.weights.blocks["table"]  # tied, one table
    assert all(la.weights._master is None for la in gemma.weighted_layers())  # nothing dequantized


def test_cached_decode_matches_full_forward(gemma):
    """Window 8 and 20 positions: the sliding window and the cache offsets both matter."""
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 256, (2, 20))
    full = gemma.forward(ids)
    cache = gemma.make_cache(4)
    steps = [gemma.step(ids[0, :5][None], [cache], last_only=False)[0]]
    steps += [gemma.step(ids[0, t:t + 1][None], [cache])[0][None] for t in range(5, 20)]
    np.testing.assert_allclose(np.concatenate(steps), full[0], atol=2e-5)
    # rows of one batch continue their own sequences, at different positions
    a, b = gemma.make_cache(), gemma.make_cache()
    gemma.step(ids[0, :12][None], [a])
    gemma.step(ids[1, :7][None], [b])
    both = gemma.step(np.array([[ids[0, 12]], [ids[1, 7]]]), [a, b])
    np.testing.assert_allclose(both, np.stack([full[0, 12], full[1, 7]]), atol=2e-5)
    with pytest.raises(LoomShapeError, match="2 caches for a batch of 1"):
        gemma.step(ids[:1, :1], [a, b])
    with pytest.raises(LoomShapeError, match="needs 3 KV caches"):
        gemma.step(ids[:1, :1], [a[:2]])


def test_hidden_states_are_what_the_head_turns_into_the_forward_logits(gemma):
    ids = np.random.default_rng(6).integers(0, 256, (2, 9))
    steps = gemma.step_count
    hidden = gemma.hidden_states(ids)
    assert hidden.shape == (2, 9, gemma.args.hidden_size) and gemma.step_count == steps
    head = gemma.cells[-1].weights.blocks["weight"]  # tied: the embedding table
    np.testing.assert_allclose(hidden @ np.asarray(head, np.float32).T, gemma.forward(ids), atol=1e-4)
    with pytest.raises(LoomShapeError, match="token ids must be"):
        gemma.hidden_states(np.zeros((1, 0), np.int64))


def test_observers_see_every_layer_of_a_decode_step(gemma):
    events = []
    observer = gemma.attach(CallbackObserver(events.append))
    try:
        gemma.step(np.array([[3, 4]]), [gemma.make_cache()])
    finally:
        gemma.detach(observer)
    kinds = [e.layer_type for e in events]
    assert len(events) == sum(1 for _ in gemma.all_layers())
    assert events[-1].stats.total == 256 and len(set(kinds)) == 7


def test_training_a_language_model_is_refused_with_a_typed_error(gemma):
    gemma.forward(np.array([[1, 2]]), train=True)
    with pytest.raises(LoomConfigError, match="inference-only"):
        gemma.backward(np.ones((1, 2, 256), np.float32))


def test_morphing_a_layer_changes_its_output_and_morphing_back_restores_it():
    net = load_causal_lm(TINY / "tiny-llama")
    ids = np.array(reference("tiny-llama")["input_ids"])
    before = net.forward(ids[None])
    report = morph_layer(net, 5, "int8")  # the LM head
    after = net.forward(ids[None])
    assert report.type == "Dense" and 0 < report.rel_error < 0.02
    assert 0 < np.abs(after - before).max() < 0.05
    morph_layer(net, 5, "float32")
    np.testing.assert_array_equal(net.forward(ids[None]), before)
    assert isinstance(net.cells[5].weights, MatrixStore)


# ----- GGUF files written as llama.cpp's converter writes them ---------------------------------------
def write_gguf(path: Path, name: str, arch: str, *, qtype=None, dequantized: bool = False, drop: str = "",
               reshape: str = "", folder: Path | None = None, encode=None,
               split_max_tensors: int = 0) -> Path:
    """``tests/data/tiny-hf/<name>`` (or the HF ``folder``) as a GGUF: gguf-py's tensor names
    (phi3's fused ``attn_qkv`` and gate+up ``ffn_up`` as they are), llama's (granite's, smollm3's)
    Q/K rows permuted, gemma's norms stored as ``1 + w``, the config's soft caps (gemma2) written
    when it has them, granite's multipliers as its scale keys, experts stacked into one
    ``[experts, rows, cols]`` tensor each with the router left float32; matrices quantized to
    ``qtype`` when given (and stored as gguf-py's float32 dequantization of those blocks when
    ``dequantized``), or stored as ``encode(w)`` gives them: ``(data, raw_dtype or None)``; split
    into files of ``split_max_tensors`` tensors (gguf-py's splitting, as ``convert_hf_to_gguf.py
    --split-max-tensors``) when given."""
    cfg, tensors = hf_checkpoint(folder or TINY / name)
    tensors = stack_experts(tensors)
    writer = gguf_writer(path, arch, cfg, split_max_tensors)
    writer.add_head_count_kv(cfg["num_key_value_heads"])
    writer.add_key_length(cfg["head_dim"])
    writer.add_value_length(cfg["head_dim"])
    writer.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    rope = cfg["rope_parameters"]
    writer.add_rope_freq_base(rope.get("full_attention", rope)["rope_theta"])
    if arch in GEMMAS:
        writer.add_sliding_window(cfg["sliding_window"])
    if "num_experts_per_tok" in cfg:
        writer.add_expert_count(cfg.get("num_experts", cfg.get("num_local_experts")))
        writer.add_expert_used_count(cfg["num_experts_per_tok"])
        if "moe_intermediate_size" in cfg:
            writer.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    if arch == "granite":
        writer.add_embedding_scale(cfg["embedding_multiplier"])
        writer.add_residual_scale(cfg["residual_multiplier"])
        writer.add_attention_scale(cfg["attention_multiplier"])
        writer.add_logit_scale(cfg["logits_scaling"])
    if cfg.get("attn_logit_softcapping"):
        writer.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
    if cfg.get("final_logit_softcapping"):
        writer.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    names = gguf.get_tensor_name_map(GGUF_ARCH[arch], cfg["num_hidden_layers"])
    for hf_name, w in tensors.items():
        gguf_name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if arch in PERMUTED_QK and hf_name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg["num_attention_heads"] if "q_proj" in hf_name else cfg["num_key_value_heads"]
            w = llama_cpp_permute(w, heads)
        if arch in GEMMAS and hf_name.endswith("norm.weight"):
            w = w + 1
        if gguf_name == drop:
            continue
        if gguf_name == reshape:
            w = w[:-1]
        if gguf_name.endswith("ffn_gate_inp.weight"):  # llama.cpp keeps the router float32
            writer.add_tensor(gguf_name, w)
        elif encode is not None and w.ndim == 2:
            data, raw_dtype = encode(w)
            writer.add_tensor(gguf_name, data, raw_dtype=raw_dtype)
        elif qtype is not None and w.ndim >= 2 and dequantized:
            writer.add_tensor(gguf_name, gguf.quants.dequantize(gguf.quants.quantize(w, qtype), qtype))
        elif qtype is not None and w.ndim >= 2:
            writer.add_tensor(gguf_name, gguf.quants.quantize(w, qtype), raw_dtype=qtype)
        else:
            writer.add_tensor(gguf_name, w)
    finish_gguf(writer)
    return path


def hf_checkpoint(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """An HF folder's config.json and its tensors as float32 arrays."""
    with open_hf(folder) as hf:
        return hf.config, {k: t.data().astype(np.float32) for k, t in hf.tensors.items()}


def gguf_writer(path: Path, arch: str, cfg: dict, split_max_tensors: int = 0) -> gguf.GGUFWriter:
    """A writer of ``arch`` holding the sizes every architecture's GGUF states (the converter's
    common ``set_gguf_parameters``), read from config.json ``cfg``."""
    writer = gguf.GGUFWriter(str(path), arch, split_max_tensors=split_max_tensors)
    writer.add_block_count(cfg["num_hidden_layers"])
    writer.add_context_length(cfg["max_position_embeddings"])
    writer.add_embedding_length(cfg["hidden_size"])
    writer.add_feed_forward_length(cfg["intermediate_size"])
    writer.add_head_count(cfg["num_attention_heads"])
    return writer


def finish_gguf(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def stack_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Per-expert matrices (``mlp.experts.3.up_proj.weight``) stacked in expert order into
    ``mlp.experts.up_proj.weight``, as llama.cpp's converter stacks them; the rest as they are."""
    out, stacks = {}, {}
    for name, w in tensors.items():
        m = EXPERT.fullmatch(name)
        if m is None:
            out[name] = w
        else:
            stacks.setdefault(f"{m[1]}.{m[3]}", {})[int(m[2])] = w
    for name, experts in stacks.items():
        out[name] = np.stack([experts[e] for e in sorted(experts)])
    return out


@pytest.mark.parametrize("name, arch", [("tiny-llama", "llama"), ("tiny-gemma3", "gemma3")])
def test_gguf_conversion_gives_transformers_logits(tmp_path, name, arch):
    net = load_causal_lm(write_gguf(tmp_path / "m.gguf", name, arch))
    ref = reference(name)
    logits = net.forward(np.array(ref["input_ids"])[None])[0]
    np.testing.assert_allclose(logits, np.array(ref["logits"]), atol=1e-4)
    # The tiny models attend almost uniformly, so RoPE barely moves their logits: a long sequence
    # against the checkpoint read directly (same float32 weights) tells a wrong rotation apart.
    ids = np.random.default_rng(3).integers(0, 256, (1, 100))
    np.testing.assert_allclose(net.forward(ids), load_causal_lm(TINY / name).forward(ids), atol=1e-5)
    tied = net.cells[-1].weights.blocks["weight"] is net.cells[0].weights.blocks["table"]
    assert tied == (arch == "gemma3")


def assert_matches_float_twin(tmp_path: Path, name: str, arch: str) -> VolumetricNetwork:
    """``name`` as a Q8_0 GGUF against a float32 GGUF holding gguf-py's dequantization of the same
    blocks: the prompt's logits at every position, then one decode step; returns the Q8_0 model."""
    q8 = GGMLQuantizationType.Q8_0
    quantized = load_causal_lm(write_gguf(tmp_path / "q.gguf", name, arch, qtype=q8))
    twin = load_causal_lm(write_gguf(tmp_path / "f.gguf", name, arch, qtype=q8, dequantized=True))
    ids = np.array(reference(name)["input_ids"])
    results = []
    for net in (quantized, twin):
        cache = net.make_cache()
        prefill = net.step(ids[None], [cache], last_only=False)[0]
        results.append((prefill, net.step(ids[None, :1], [cache])[0]))
    for got, want in zip(*results, strict=True):
        np.testing.assert_allclose(got, want, atol=1e-4)
    return quantized


@pytest.mark.parametrize("name, arch", [("tiny-llama", "llama"), ("tiny-phi3", "phi3")])
def test_quantized_gguf_matches_a_float_twin_of_its_dequantized_blocks(tmp_path, name, arch):
    """Q8_0 matrices multiplied in place (prefill, decode, embedding rows; phi3's split from its
    fused matrices)."""
    quantized = assert_matches_float_twin(tmp_path, name, arch)
    assert {type(m).__name__ for la in quantized.weighted_layers() for m in la.weights.blocks.values()
            if len(m.shape) == 2} == {"QuantMatrix"}


def test_missing_tensor_is_named_as_the_file_names_it(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "tiny-llama", "llama", drop="blk.1.ffn_up.weight")
    with pytest.raises(ModelFormatError, match="mlp.up_proj") as info:
        load_causal_lm(path)
    assert info.value.field == "blk.1.ffn_up.weight"


def test_wrong_shape_names_tensor_and_offset(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "tiny-llama", "llama", reshape="blk.2.attn_k.weight")
    with open_gguf(path) as f:
        offset = f.tensors["blk.2.attn_k.weight"].offset
    with pytest.raises(ModelFormatError, match=r"shape \(31, 64\), expected \(32, 64\)") as info:
        load_causal_lm(path)
    assert (info.value.field, info.value.offset) == ("blk.2.attn_k.weight", offset)


def test_untied_hf_checkpoint_without_lm_head_is_refused(tmp_path):
    from safetensors.numpy import save_file

    with open_hf(TINY / "tiny-llama") as hf:
        save_file({k: t.data().copy() for k, t in hf.tensors.items() if k != "lm_head.weight"},
                  str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text((TINY / "tiny-llama" / "config.json").read_text())
    with pytest.raises(ModelFormatError, match="tensor is missing") as info:
        load_causal_lm(tmp_path)
    assert info.value.field == "lm_head.weight"


# ----- settings the tensors or RoPE contradict -------------------------------------------------------
def hf_folder(tmp_path: Path, name: str = "tiny-llama", **changes) -> Path:
    """A copy of ``tests/data/tiny-hf/<name>`` whose config.json has ``changes`` (None deletes a key)."""
    config = {**json.loads((TINY / name / "config.json").read_text()), **changes}
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in config.items() if v is not None}))
    shutil.copyfile(TINY / name / "model.safetensors", tmp_path / "model.safetensors")
    return tmp_path


@pytest.mark.parametrize("layers", [1, 2])
def test_hf_layer_count_below_the_blocks_present_is_refused(tmp_path, layers):
    with pytest.raises(ModelFormatError, match=f"model has 3 blocks of tensors but num_hidden_layers says "
                                               f"{layers}$") as info:
        load_causal_lm(hf_folder(tmp_path, num_hidden_layers=layers))
    assert info.value.field == "config.json:num_hidden_layers"


def test_hf_layer_count_above_the_blocks_present_names_the_first_missing_tensor(tmp_path):
    with pytest.raises(ModelFormatError, match="tensor is missing") as info:
        load_causal_lm(hf_folder(tmp_path, num_hidden_layers=4))
    assert info.value.field == "model.layers.3.input_layernorm.weight"


def test_gguf_block_count_below_the_blocks_present_is_refused_at_its_offset(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "tiny-llama", "llama")
    data = path.read_bytes()
    with open_gguf(path) as f:
        at = f.kv_offsets["llama.block_count"]
    key = b"llama.block_count"
    value_at = at + 8 + len(key) + 4  # key length, key, value type, then the uint32 count
    assert data[at + 8:at + 8 + len(key)] == key and data[value_at:value_at + 4] == (3).to_bytes(4, "little")
    path.write_bytes(data[:value_at] + (2).to_bytes(4, "little") + data[value_at + 4:])
    with pytest.raises(ModelFormatError, match="model has 3 blocks of tensors but block_count says 2$") as e:
        load_causal_lm(path)
    assert (e.value.field, e.value.offset) == ("llama.block_count", at)


PARAMS, SCALING = "config.json:rope_parameters", "config.json:rope_scaling"
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}
RETURNS_TO_DEFAULTS = [  # each was read as the default RoPE before
    ({"rope_parameters": [10000.0]}, PARAMS, "expected an object"),
    ({"rope_parameters": "linear"}, PARAMS, "expected an object"),
    ({"rope_parameters": {"sliding_attention": {"rope_theta": 1e4}}}, f"{PARAMS}.full_attention",
     "none for full_attention"),
    ({"rope_parameters": {"full_attention": 1e4}}, f"{PARAMS}.full_attention", "expected an object"),
    ({"rope_parameters": {"rope_type": "linear"}}, f"{PARAMS}.factor", "missing"),
    ({"rope_parameters": {**LLAMA3, "high_freq_factor": None}}, f"{PARAMS}.high_freq_factor", "missing"),
    ({"rope_parameters": {**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0}},
     f"{PARAMS}.high_freq_factor", "not above low_freq_factor 4.0"),
    ({"rope_parameters": None, "rope_scaling": {"type": "linear"}}, f"{SCALING}.factor", "missing"),
]
REFUSED_BEFORE = [
    ({"rope_parameters": {"rope_type": "linear", "factor": "2"}}, f"{PARAMS}.factor", "expected float"),
    ({"rope_parameters": {"rope_theta": -1.0}}, f"{PARAMS}.rope_theta", "not a float32 number above 1"),
    ({"rope_parameters": {"rope_type": ["linear"]}}, f"{PARAMS}.rope_type", "unsupported"),
    ({"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2.0}}, f"{SCALING}.type",
     "unsupported RoPE type 'dynamic'"),
    ({"rope_parameters": None, "rope_theta": 0}, "config.json:rope_theta", "not a float32 number above 1"),
]


@pytest.mark.parametrize("change, field, message", RETURNS_TO_DEFAULTS + REFUSED_BEFORE)
def test_invalid_rope_settings_are_refused_naming_the_field(change, field, message):
    config = {**json.loads((TINY / "tiny-llama" / "config.json").read_text()), **change}
    with pytest.raises(ModelFormatError, match=message) as info:
        architecture("llama").Args.from_hf(config)
    assert info.value.field == field


def test_valid_rope_settings_of_both_transformers_versions_are_read():
    config = json.loads((TINY / "tiny-llama" / "config.json").read_text())
    v5 = architecture("llama").Args.from_hf({**config, "rope_parameters": {**LLAMA3, "rope_theta": 5e5}})
    v4 = architecture("llama").Args.from_hf({**config, "rope_parameters": None, "rope_scaling": LLAMA3,
                                            "rope_theta": 5e5})
    assert v5.rope == v4.rope == RopeConfig(5e5, "llama3", 8.0, 1.0, 4.0, 8192)
    linear = architecture("llama").Args.from_hf({**config, "rope_parameters": None,
                                                "rope_scaling": {"type": "linear", "factor": 2.0}})
    assert linear.rope == RopeConfig(10000.0, "linear", 2.0)


@pytest.mark.parametrize("extra, rope", [
    ({"llama.rope.scaling.factor": 4.0}, RopeConfig(10000.0, "linear", 4.0)),  # linear unless named
    ({"llama.rope.scale_linear": 2.0}, RopeConfig(10000.0, "linear", 2.0)),  # the older key
    ({"llama.rope.scaling.type": "none", "llama.rope.scaling.factor": 4.0}, RopeConfig(10000.0)),
    ({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0, "llama.rope.freq_base": 5e5},
     RopeConfig(5e5, "linear", 4.0)),
    ({}, RopeConfig(10000.0)),
])
def test_gguf_rope_scaling_is_read_as_llama_cpp_reads_it(extra, rope):
    assert architecture("llama").Args.from_gguf({**SMALL, **extra}, {}).rope == rope


@pytest.mark.parametrize("entry", [["sliding_attention"], {"type": "full_attention"}, None, 1])
def test_a_layer_type_of_the_wrong_kind_names_the_field(entry):
    config = json.loads((TINY / "tiny-llama" / "config.json").read_text())
    config["layer_types"] = ["full_attention", entry, "full_attention"]
    with pytest.raises(ModelFormatError, match="expected 3 entries of 'full_attention' / 'sliding") as e:
        architecture("llama").Args.from_hf(config)
    assert e.value.field == "config.json:layer_types"


def test_a_rope_base_or_factor_beyond_float32_is_refused_naming_the_field():
    """The frequencies are computed in float32: a base of 1e300 became inf (a RuntimeWarning and
    all-zero frequencies)."""
    config = json.loads((TINY / "tiny-llama" / "config.json").read_text())
    cases = [({"rope_theta": 1e300}, "rope_theta", "1e+300 is not a float32 number above 1"),
             ({"rope_type": "linear", "factor": 1e39}, "factor", "1e+39 is not a positive float32 number")]
    for params, field, message in cases:
        with pytest.raises(ModelFormatError, match=re.escape(message)) as e:
            architecture("llama").Args.from_hf({**config, "rope_parameters": params})
        assert e.value.field == f"config.json:rope_parameters.{field}"
    with pytest.raises(ModelFormatError, match=re.escape("1e+300 is not a float32 number above 1")) as e:
        architecture("llama").Args.from_gguf({**SMALL, "llama.rope.freq_base": 1e300}, {})
    assert e.value.field == "llama.rope.freq_base"


@pytest.mark.parametrize("base", [1.0, 1e-45, 0.5])
def test_a_rope_base_not_above_1_is_refused_naming_the_field(base):
    """base^(-2i/d) overflows float32 for a base near 0 (inf frequencies, a RuntimeWarning)."""
    v4 = {k: v for k, v in json.loads((TINY / "tiny-gemma3" / "config.json").read_text()).items()
          if k != "rope_parameters"}
    gemma_gguf = {**{k.replace("llama.", "gemma3."): v for k, v in SMALL.items()},
                  "general.architecture": "gemma3"}
    cases = {"llama.rope.freq_base": lambda: architecture("llama").Args.from_gguf(
                 {**SMALL, "llama.rope.freq_base": base}, {}),
             "gemma3.rope.freq_base_swa": lambda: architecture("gemma3").Args.from_gguf(
                 {**gemma_gguf, "gemma3.rope.freq_base_swa": base}, {}),
             "config.json:rope_theta": lambda: architecture("gemma3").Args.from_hf(
                 {**v4, "rope_theta": base}),
             "config.json:rope_local_base_freq": lambda: architecture("gemma3").Args.from_hf(
                 {**v4, "rope_local_base_freq": base})}
    for field, read in cases.items():
        with pytest.raises(ModelFormatError, match=f"{base} is not a float32 number above 1$") as e:
            read()
        assert e.value.field == field
