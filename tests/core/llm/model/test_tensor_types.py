"""Language models in the newer kernel types (Q5_K, Q3_K, Q2_K, IQ4_XS, IQ4_NL, MXFP4: kernels in
both modes) and in the tensor types without a matrix kernel (TQ1_0, IQ2_XS ...: decoded to
float32 at load).

Oracle for the decoded types: a twin GGUF of the same model whose matrices in those types hold
llama.cpp's own decoding of the blocks (``dequantize_row_*``, compiled from its C) as float32, and
whose other matrices are the same blocks: the same logits bit for bit at prefill and decode, on
the exact path and with 8-bit activations (the kernel types then run their integer kernels, the
decoded ones float32).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT
from safetensors.numpy import save_file

from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.model.model_info import describe
from tests.oracles import llamacpp

from .test_architectures import TINY, write_gguf
from .test_fused_decode import TWO_THREADS, assert_same_bits, greedy, grid_only, threads

KERNEL_TYPE = "Q6_K"  # the FFN's down matrices (rows of 512) keep a type with kernels, as in Q5_K_M


@pytest.fixture(scope="module")
def wide_llama(tmp_path_factory) -> Path:
    """tiny-llama's layout with rows of 256 and 512 (whole super-blocks), random weights."""
    folder = tmp_path_factory.mktemp("wide-llama")
    cfg = json.loads((TINY / "tiny-llama" / "config.json").read_text())
    cfg.update(hidden_size=256, intermediate_size=512, head_dim=64, num_hidden_layers=2)
    (folder / "config.json").write_text(json.dumps(cfg))
    rng = np.random.default_rng(0)
    d, f, v, kv = 256, 512, cfg["vocab_size"], cfg["num_key_value_heads"] * 64
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,), "lm_head.weight": (v, d)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (d,), p + "post_attention_layernorm.weight": (d,),
                   p + "self_attn.q_proj.weight": (d, d), p + "self_attn.k_proj.weight": (kv, d),
                   p + "self_attn.v_proj.weight": (kv, d), p + "self_attn.o_proj.weight": (d, d),
                   p + "mlp.gate_proj.weight": (f, d), p + "mlp.up_proj.weight": (f, d),
                   p + "mlp.down_proj.weight": (d, f)}
    tensors = {name: (1 + 0.1 * rng.standard_normal(shape) if len(shape) == 1
                      else 0.08 * rng.standard_normal(shape)).astype(np.float32)
               for name, shape in shapes.items()}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder


def encoder(fmt: str, decoded: bool):
    """write_gguf's ``encode``: ``fmt`` blocks (or llama.cpp's float32 decoding of them) for every
    matrix but the FFN's down ones, which get :data:`KERNEL_TYPE` blocks."""
    def encode(w):
        if w.shape[1] == 512:
            return llamacpp.quantize(w, KERNEL_TYPE), GT[KERNEL_TYPE]
        blocks = llamacpp.quantize(w, fmt)
        return (llamacpp.dequantize(blocks, fmt), None) if decoded else (blocks, GT[fmt])
    return encode


@pytest.mark.parametrize("fmt", ["TQ1_0", "TQ2_0"])
def test_a_model_in_a_decoded_type_equals_its_float_twin(tmp_path, wide_llama, fmt):
    path = write_gguf(tmp_path / "q.gguf", "", "llama", folder=wide_llama, encode=encoder(fmt, False))
    twin = write_gguf(tmp_path / "f.gguf", "", "llama", folder=wide_llama, encode=encoder(fmt, True))
    info = describe(path)
    assert info.decoded_types == (fmt,)
    decoded_elements = 2 * 256 * 256 + 2 * (2 * 256 * 256 + 2 * 128 * 256 + 2 * 512 * 256)  # tables + blocks
    assert info.decoded_bytes == 4 * decoded_elements
    assert info.estimated_memory == info.file_bytes + info.kv_cache_bytes + info.decoded_bytes
    assert f"{fmt} decoded to float32 at load" in info.types_text

    ids = np.random.default_rng(1).integers(0, 256, 12)
    for a, b in zip(exact_logits(path, ids), exact_logits(twin, ids), strict=True):
        np.testing.assert_array_equal(a, b)
    nets = [load_causal_lm(p) for p in (path, twin)]
    (logits, tokens), (twin_logits, twin_tokens) = (greedy(net, list(ids), 6) for net in nets)
    assert tokens == twin_tokens
    for a, b in zip(logits, twin_logits, strict=True):
        np.testing.assert_array_equal(a, b)
    for net in nets:
        net.close()


def exact_logits(path: Path, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    net = load_causal_lm(path)
    try:
        cache = net.make_cache()
        return net.step(ids[None], [cache], last_only=False)[0], net.step(ids[None, :1], [cache])[0]
    finally:
        net.close()


@pytest.mark.parametrize("fmt", ["Q5_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ4_NL", "MXFP4"])
def test_a_model_in_a_kernel_type_matches_its_float_twin(tmp_path, wide_llama, fmt):
    """Blocks multiplied in place, against the float32 twin: the same weights, summed in another
    order (the kernels' lanes), so equal within float32 rounding."""
    path = write_gguf(tmp_path / "q.gguf", "", "llama", folder=wide_llama, encode=encoder(fmt, False))
    twin = write_gguf(tmp_path / "f.gguf", "", "llama", folder=wide_llama, encode=encoder(fmt, True))
    info = describe(path)
    assert info.decoded_types == () and info.estimated_memory == info.file_bytes + info.kv_cache_bytes
    ids = np.random.default_rng(2).integers(0, 256, 12)
    for a, b in zip(exact_logits(path, ids), exact_logits(twin, ids), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4)


@pytest.mark.parametrize("n_threads", [1, pytest.param(2, marks=TWO_THREADS)])
@pytest.mark.parametrize("fmt", ["Q5_K", "Q3_K", "Q2_K", "IQ4_XS", "IQ4_NL", "MXFP4"])
def test_new_types_decode_fused_as_on_the_grid(tmp_path, wide_llama, spy, monkeypatch, fmt, n_threads):
    """With 8-bit activations the fused step multiplies the new types by their integer kernels,
    bit for bit as the grid does, in every step."""
    path = write_gguf(tmp_path / "q.gguf", "", "llama", folder=wide_llama, encode=encoder(fmt, False))
    net = load_causal_lm(path)
    prompt = [5, 17, 42, 3, 88, 11]
    try:
        with threads(n_threads):
            fused, fused_tokens = greedy(net, prompt, 6)
            assert spy == [True] * 7
            with grid_only(monkeypatch):
                grid, grid_tokens = greedy(net, prompt, 6)
    finally:
        net.close()
    assert fused_tokens == grid_tokens
    assert_same_bits(fused, grid)
