"""quantize() against its two oracles, byte for byte: gguf-py's ``quants.quantize`` (Q8_0, Q4_0,
Q4_1, Q5_0, Q5_1) and llama.cpp's own C reference quantizers, compiled from PyPI's
llama-cpp-python sdist (all ten formats; ``tests/oracles/llamacpp.py``). Then the round trip:
a QuantMatrix built from the blocks reads back what gguf-py reads from the same bytes.

The llama.cpp oracle is built on first use (pip download + gcc, ~30 s) and cached under
``~/.cache/loomlab/oracles/``; if it cannot be built, these tests fail and say why.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, quants
from gguf import GGMLQuantizationType as GT

from loomlab.core.errors import LoomConfigError, LoomShapeError
from loomlab.core.llm.files import registry
from loomlab.core.llm.kernels.quant import QuantMatrix
from loomlab.core.llm.kernels.quantize import QUANTIZE_FORMATS, quantize, quantize_matrix
from tests.oracles import llamacpp

from .test_quant import assert_product_close

GGUF_PY = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")  # the formats gguf-py can quantize
F32 = np.float32


@pytest.fixture(scope="module")
def c_oracle():
    try:
        llamacpp.load()
    except llamacpp.OracleBuildError as e:
        pytest.fail(f"the llama.cpp oracle could not be built, so quantize() is unchecked: {e}")
    return llamacpp


def block_size(fmt: str) -> int:
    return GGML_QUANT_SIZES[GT[fmt]][0]


def tricky_rows(cols: int, rng: np.random.Generator) -> np.ndarray:
    """Rows that stress each encoder: zeros, huge and tiny magnitudes, one-signed rows, constant
    rows, lone spikes, ties of +max and -max, and values on the rounding boundaries."""
    normal = lambda: rng.standard_normal(cols).astype(F32)  # noqa: E731
    ramp = np.arange(cols, dtype=F32) % 32
    rows = [
        np.zeros(cols, F32),
        normal(),
        normal() * F32(1e4), normal() * F32(6e4), normal() * F32(1e6),  # near and past float16's max
        normal() * F32(1e-3), normal() * F32(1e-6), normal() * F32(1e-20),
        normal() * F32(1e-38), normal() * F32(1e-42),  # float32 subnormals
        -np.abs(normal()), np.abs(normal()) + 1, -np.abs(normal()) - 1,
        np.full(cols, 0.7, F32), np.full(cols, -3.25, F32),
        np.where(np.arange(cols) % 37 == 5, F32(2.5), F32(0)),
        np.where(np.arange(cols) % 2 == 0, F32(1), F32(-1)),  # +max and -max tie: the first wins
        ramp - 16,  # integers: Q5_0/Q4_0 steps of exactly 2 or 1, quants exactly on x.5
        (ramp - 15.5) / F32(8),  # halves of a power-of-two step
        (ramp + 0.5) * F32(0.25) - F32(4), ramp * F32(1 / 31), ramp * F32(1 / 15) - F32(0.5),
        np.round(normal() * 8) / F32(8),  # a coarse grid: many equal values and ties
        normal() * (rng.uniform(0, 1, cols) < 0.1).astype(F32),  # mostly zeros
    ]
    return np.stack(rows).astype(F32)


def random_matrix(cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scaled = rng.standard_normal((40, cols)).astype(F32) * rng.uniform(1e-3, 5, (40, 1)).astype(F32)
    heavy = rng.standard_t(2, (8, cols)).astype(F32)  # outliers
    return np.concatenate([tricky_rows(cols, rng), scaled, heavy])


@pytest.mark.parametrize("fmt", GGUF_PY)
def test_matches_gguf_py(fmt):
    W = random_matrix(4 * 32, seed=1) + F32(0)  # no -0.0: see test_signed_zero_minimum_as_llama_cpp
    with np.errstate(all="ignore"):  # gguf-py divides by zero and overflows on the extreme rows
        want = quants.quantize(W, GT[fmt])
    got = quantize(W, fmt)
    assert got.dtype == np.uint8 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt", QUANTIZE_FORMATS)
def test_matches_llama_cpp(fmt, c_oracle):
    W = random_matrix(2 * 256, seed=2)
    np.testing.assert_array_equal(quantize(W, fmt), c_oracle.quantize(W, fmt))


@pytest.mark.parametrize("fmt", QUANTIZE_FORMATS)
def test_many_random_rows_match_llama_cpp(fmt, c_oracle):
    """Enough blocks that rare paths (a rejected refinement step, a clamped quant) occur."""
    rng = np.random.default_rng(3)
    W = (rng.standard_normal((300, 1024)) * rng.uniform(1e-4, 10, (300, 1))).astype(F32)
    W[::7] = rng.standard_t(1.5, (W[::7].shape)).astype(F32)
    np.testing.assert_array_equal(quantize(W, fmt), c_oracle.quantize(W, fmt))


@pytest.mark.parametrize("fmt", ["Q4_1", "Q5_1"])
def test_signed_zero_minimum_as_llama_cpp(fmt, c_oracle):
    """A block whose minimum is zero, held as both -0.0 and +0.0: llama.cpp keeps the first (its
    strict ``v < min``), numpy's ``min`` returns either, so gguf-py's f16 m may lose the sign bit.
    quantize() follows the C."""
    x = np.array([[-0.0, 0.0] * 8 + [0.5] * 16, [0.0, -0.0] * 8 + [0.5] * 16], F32)
    got = quantize(x, fmt)
    np.testing.assert_array_equal(got, c_oracle.quantize(x, fmt))
    assert got[0, 2:4].tolist() == [0x00, 0x80] and got[1, 2:4].tolist() == [0, 0]  # m = -0.0, +0.0


# ---------------------------------------------------------------------------------------------
# Real weights: SmolLM2-135M's, as the file stores them (Q4_1 blocks, Q8_0 token table), in float32.


@pytest.fixture(scope="module")
def smollm2_weights():
    tensors = {t.name: t for t in GGUFReader(registry.fetch("smollm2-135m")).tensors}
    pick = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.7.ffn_gate.weight", "blk.29.ffn_down.weight"]
    weights = {name: quants.dequantize(tensors[name].data, tensors[name].tensor_type) for name in pick}
    weights["token_embd.weight"] = quants.dequantize(tensors["token_embd.weight"].data[:2048], GT.Q8_0)
    return weights


def real_matrix(weights: dict, name: str, fmt: str) -> np.ndarray:
    """The tensor's rows, or for K-quants (256-weight blocks) its weights as rows of 1536 when
    its rows are not whole super-blocks (576 = 2.25 x 256)."""
    W = weights[name]
    return W if W.shape[1] % block_size(fmt) == 0 else W.reshape(-1, 1536)


@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.7.ffn_gate.weight",
                                  "blk.29.ffn_down.weight", "token_embd.weight"])
def test_real_weights_match_both_oracles(smollm2_weights, c_oracle, name):
    for fmt in QUANTIZE_FORMATS:
        W = real_matrix(smollm2_weights, name, fmt)
        got = quantize(W, fmt)
        np.testing.assert_array_equal(got, c_oracle.quantize(W, fmt), err_msg=f"{name} {fmt} vs llama.cpp")
        if fmt in GGUF_PY:
            want = quants.quantize(W, GT[fmt])
            np.testing.assert_array_equal(got, want, err_msg=f"{name} {fmt} vs gguf-py")


# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", QUANTIZE_FORMATS)
def test_round_trip_through_quant_matrix(fmt):
    rng = np.random.default_rng(4)
    W = (rng.standard_normal((37, 512)) * rng.uniform(0.01, 2, (37, 1))).astype(F32)
    m = quantize_matrix(W, fmt, name="w")
    assert isinstance(m, QuantMatrix) and (m.type_name, m.shape) == (fmt, W.shape)
    D = quants.dequantize(quantize(W, fmt), GT[fmt])
    np.testing.assert_array_equal(m.dequantize(), D)
    x = rng.standard_normal(512).astype(F32)
    assert_product_close(m.matvec(x)[None], D, x[None])
    X = rng.standard_normal((19, 512)).astype(F32)
    assert_product_close(m.matmul(X), D, X)
    # the encoding is close to W: within half a step of each block's scale, roughly
    err = np.abs(D - W).max() / np.abs(W).max()
    assert err < {"Q8_0": 0.01, "Q6_K": 0.03, "Q5_0": 0.05, "Q5_1": 0.05, "Q5_K": 0.06, "Q3_K": 0.25,
                  "Q2_K": 0.4}.get(fmt, 0.12), err


def test_input_layouts_and_dtypes():
    """Non-contiguous and float64 / float16 inputs give the blocks of their float32 values."""
    rng = np.random.default_rng(5)
    W = rng.standard_normal((64, 96)).astype(F32)
    want = quantize(np.ascontiguousarray(W[::2, :64]), "Q4_1")
    np.testing.assert_array_equal(quantize(W[::2, :64], "Q4_1"), want)
    np.testing.assert_array_equal(quantize(W[::2, :64].astype(np.float64), "Q4_1"), want)
    H = W.astype(np.float16)
    np.testing.assert_array_equal(quantize(H, "Q8_0"), quantize(H.astype(F32), "Q8_0"))
    assert quantize(W[:1, :32], "Q8_0").shape == (1, 34)


@pytest.mark.parametrize(("matrix", "fmt", "error", "match"), [
    (np.zeros((2, 64), F32), "IQ4_XS", LoomConfigError, r"cannot quantize to .IQ4_XS.; formats: Q8_0, Q4_0"),
    (np.zeros((2, 64), F32), "q4_0", LoomConfigError, "cannot quantize to 'q4_0'"),
    (np.zeros((2, 64), F32), GT.Q4_0, LoomConfigError, "cannot quantize to"),
    (np.zeros(64, F32), "Q4_0", LoomShapeError, r"2-D \[rows, cols\].*shape \(64,\)"),
    (np.zeros((2, 2, 64), F32), "Q4_0", LoomShapeError, "2-D"),
    (np.zeros((0, 64), F32), "Q4_0", LoomShapeError, "not empty"),
    (np.zeros((2, 48), F32), "Q4_0", LoomShapeError, "whole 32-weight blocks.*48 columns"),
    (np.zeros((2, 512 + 32), F32), "Q4_K", LoomShapeError, "whole 256-weight blocks.*544 columns"),
    (np.zeros((2, 576), F32), "Q6_K", LoomShapeError, "whole 256-weight blocks"),
    (np.zeros((2, 64), np.int32), "Q8_0", LoomConfigError, "must hold floats; got int32"),
    ([[0.0] * 32], "Q8_0", LoomConfigError, "numpy array, not list"),
    (np.array([[0.0] * 31 + [np.nan]] * 3, F32), "Q8_0", LoomConfigError, "not finite .* 3 rows, first"),
    (np.array([[1.0] * 32, [0.0] * 31 + [-np.inf]], F32), "Q5_1", LoomConfigError, "1 rows, first row 1"),
    (np.full((1, 32), 1e300), "Q8_0", LoomConfigError, r"not finite \(as float32\)"),
])
def test_bad_input_raises_one_typed_error(matrix, fmt, error, match):
    with pytest.raises(error, match=match):
        quantize(matrix, fmt)
