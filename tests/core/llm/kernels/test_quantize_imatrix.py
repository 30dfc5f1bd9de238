"""quantize(..., importance=w) against llama.cpp's own importance-weighted quantizers, byte for byte:
``quantize_<type>(src, dst, nrow, n_per_row, quant_weights)`` from ``ggml-quants.c``, compiled by
``tests/oracles/llamacpp.py`` (built on first use, ~30 s, and cached). Then what the weights are
for: the encoding's error weighted by them is smaller than the reference quantizer's.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as GT

from loomlab.core.errors import LoomConfigError, LoomShapeError
from loomlab.core.llm.kernels import block_morph
from loomlab.core.llm.kernels.quantize import QUANTIZE_FORMATS, quantize, quantize_matrix

from . import test_quantize
from .test_quantize import random_matrix

F32 = np.float32
c_oracle = test_quantize.c_oracle  # its fixture: llama.cpp's C, built or loaded, or a failure saying why


def widths(fmt: str) -> list[int]:
    """Rows of one K super-block, and of 576 (SmolLM2's width) where the blocks are 32 wide."""
    return [256, 576] if GGML_QUANT_SIZES[GT[fmt]][0] == 32 else [256]


def activation_importance(cols: int, rng: np.random.Generator) -> np.ndarray:
    """What llama.cpp's imatrix collects: each column's mean square input over many tokens, here of
    activations whose channels differ in scale by orders of magnitude (as real ones do)."""
    channel_scale = np.exp(rng.normal(0, 1.5, cols))
    A = rng.standard_normal((128, cols)) * channel_scale
    return (A * A).mean(axis=0).astype(F32)


def importance(kind: str, cols: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "uniform":
        return rng.uniform(0.05, 20, cols).astype(F32)
    if kind == "with zeros":  # scattered zeros, and a whole 32-block (a K format's whole groups)
        w = rng.uniform(0.05, 20, cols).astype(F32) * (rng.uniform(size=cols) > 0.3)
        w[32:64] = 0
        return w.astype(F32)
    if kind == "all zeros":
        return np.zeros(cols, F32)
    return activation_importance(cols, rng)


KINDS = ("uniform", "with zeros", "all zeros", "activations")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("fmt", QUANTIZE_FORMATS)
def test_matches_llama_cpp_quantize_with_imatrix(fmt, kind, c_oracle):
    """Rows of every kind test_quantize uses (zeros, subnormals, huge values, ties ...) plus
    random ones: quantize_<fmt> with the same quant_weights writes the same bytes."""
    for cols in widths(fmt):
        W = random_matrix(cols, seed=cols)
        qw = importance(kind, cols, seed=cols + 1)
        got = quantize(W, fmt, importance=qw)
        want = np.frombuffer(c_oracle.quantize_weighted(fmt, W, qw), np.uint8).reshape(got.shape)
        np.testing.assert_array_equal(got, want, err_msg=f"{fmt} {kind} rows of {cols}")


@pytest.mark.parametrize("fmt", QUANTIZE_FORMATS)
def test_no_importance_is_the_reference_quantizer(fmt, c_oracle):
    """importance=None: the C's quantize_<fmt> with NULL weights, i.e. quantize_row_<fmt>_ref,
    which is what quantize() always wrote (test_quantize.py)."""
    for cols in widths(fmt):
        W = random_matrix(cols, seed=7)
        got = quantize(W, fmt, importance=None)
        assert got.tobytes() == c_oracle.quantize_weighted(fmt, W, None)
        np.testing.assert_array_equal(got, quantize(W, fmt))


@pytest.mark.parametrize("fmt", QUANTIZE_FORMATS)
def test_weighted_error_is_smaller(fmt):
    """What the weights are for: sum(w * (x - q)**2) per row is no larger than the reference
    quantizer's for most rows (a heuristic fit, so not for every row), and smaller in total.
    Q8_0 ignores the weights, so its rows tie."""
    rng = np.random.default_rng(11)
    cols = 512
    W = (rng.standard_normal((64, cols)) * rng.uniform(0.01, 3, (64, 1))).astype(F32)
    qw = activation_importance(cols, rng)

    def weighted_error(blocks):
        D = quants.dequantize(blocks, GT[fmt])
        return ((W - D).astype(np.float64) ** 2 * qw).sum(axis=1)

    with_w, without = weighted_error(quantize(W, fmt, qw)), weighted_error(quantize(W, fmt))
    if fmt == "Q8_0":
        np.testing.assert_array_equal(with_w, without)
        return
    assert np.mean(with_w <= without) >= 0.9, (np.mean(with_w <= without), fmt)
    assert with_w.sum() < 0.97 * without.sum(), (with_w.sum() / without.sum(), fmt)


def test_quantize_matrix_and_encode_take_importance():
    """quantize_matrix passes it on; block_morph.encode too, and caches by its values: the same
    weights (even a new array) find the encoding, other weights or none get their own."""
    rng = np.random.default_rng(12)
    W = rng.standard_normal((8, 256)).astype(F32)
    qw = activation_importance(256, rng)
    blocks = quantize(W, "Q4_K", qw)
    D = quants.dequantize(blocks, GT.Q4_K)
    m = quantize_matrix(W, "Q4_K", name="w", importance=qw)
    assert (m.type_name, m.shape) == ("Q4_K", W.shape)
    np.testing.assert_array_equal(m.dequantize(), D)
    assert not np.array_equal(blocks, quantize(W, "Q4_K"))

    weighted = block_morph.encode(W, "Q4_K", importance=qw)
    np.testing.assert_array_equal(weighted.dequantize(), D)
    assert block_morph.encode(W, "Q4_K", importance=qw.copy()) is weighted
    plain = block_morph.encode(W, "Q4_K")
    assert plain is not weighted and block_morph.encode(W, "Q4_K") is plain
    other = block_morph.encode(W, "Q4_K", importance=qw * F32(2) + F32(1))
    assert other is not weighted and other is not plain


def test_importance_may_be_float64():
    rng = np.random.default_rng(13)
    W = rng.standard_normal((4, 64)).astype(F32)
    qw = rng.uniform(0, 5, 64)
    np.testing.assert_array_equal(quantize(W, "Q5_1", qw), quantize(W, "Q5_1", qw.astype(F32)))


@pytest.mark.parametrize(("weights", "error", "match"), [
    (np.ones(63, F32), LoomShapeError, r"one weight per column of the matrix, shape \(64,\); got shape \(63"),
    (np.ones((1, 64), F32), LoomShapeError, r"shape \(64,\); got shape \(1, 64\)"),
    (np.r_[np.ones(10), np.nan, np.ones(53)].astype(F32), LoomConfigError,
     r"1 weights that are not finite .* first at column 10 \(nan\)"),
    (np.r_[np.ones(63), np.inf].astype(F32), LoomConfigError, "not finite .* column 63"),
    (np.r_[np.ones(5), 1e300, np.ones(58)], LoomConfigError, r"not finite \(as float32\), first at column 5"),
    (np.r_[np.ones(3), -0.5, -1, np.ones(59)].astype(F32), LoomConfigError,
     r"2 weights that are negative, first at column 3 \(-0.5\); they must be finite and >= 0"),
    (np.ones(64, np.int32), LoomConfigError, "numpy array of floats; got int32"),
    ([1.0] * 64, LoomConfigError, "numpy array of floats; got list"),
])
def test_bad_importance_raises(weights, error, match):
    W = np.ones((2, 64), F32)
    for fmt in ("Q4_0", "Q8_0"):  # Q8_0 ignores the weights but still checks them
        with pytest.raises(error, match=match):
            quantize(W, fmt, importance=weights)
