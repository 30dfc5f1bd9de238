"""Row invariance of the matrix products: row t of ``matmul(X)`` has the same bits as
``matvec(X[t])`` whatever T is and whatever the other rows are (the server's promise that a
request's greedy output is the same alone or in any slot of a batch).

The oracles: ``matvec`` for the bits (the fused decode kernels, themselves checked against gguf-py
in test_quant.py), and ``X @ dequantize().T`` in float64 within the float32 dot-product bound
(test_quant.assert_product_close) for the values.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as GT

from loomlab.core.errors import LoomShapeError
from loomlab.core.llm import load_model
from loomlab.core.llm.kernels import quant
from loomlab.core.llm.kernels.quant import QuantMatrix, float_matmul
from loomlab.core.llm.model.llm_layers import linear

from .test_quant import QUANTIZED, assert_product_close, random_blocks

ROW_COUNTS = (1, 2, 3, 7, 8, 9, 16, 33, 64)


def per_row(m: QuantMatrix, X: np.ndarray) -> np.ndarray:
    return np.stack([m.matvec(x) for x in X])


@pytest.fixture(scope="module", params=QUANTIZED, ids=lambda t: t.name)
def block_matrix(request):
    """A 37-row matrix (odd: the last row pairs with itself; chunks of 16, 16, 5) of 3 blocks."""
    ggml_type = request.param
    rng = np.random.default_rng(int(ggml_type))
    cols = 3 * GGML_QUANT_SIZES[ggml_type][0]
    data = random_blocks(ggml_type, 37, cols, rng)
    return QuantMatrix(data, ggml_type, (37, cols)), quants.dequantize(data, ggml_type)


def test_invariant_up_to_64_rows():
    assert quant.MATMUL_MIN_T > 64


@pytest.mark.parametrize("T", ROW_COUNTS)
def test_matmul_rows_are_matvec_bits(block_matrix, T):
    m, W = block_matrix
    X = np.random.default_rng(T).standard_normal((T, m.shape[1])).astype(np.float32)
    got = m.matmul(X)
    np.testing.assert_array_equal(got.view(np.uint32), per_row(m, X).view(np.uint32))
    assert_product_close(got, W, X)


def test_permuted_and_mixed_rows_keep_their_bits(block_matrix):
    """A row's result depends on that row only: permuting X permutes the result bit for bit, and
    a row computed beside other rows (or copies of itself) equals it computed alone."""
    m, _ = block_matrix
    rng = np.random.default_rng(11)
    X = rng.standard_normal((33, m.shape[1])).astype(np.float32)
    base = m.matmul(X)
    perm = rng.permutation(33)
    np.testing.assert_array_equal(m.matmul(X[perm]).view(np.uint32), base[perm].view(np.uint32))
    mixed = np.concatenate([X[5:6], rng.standard_normal((8, m.shape[1])).astype(np.float32), X[5:6]])
    got = m.matmul(mixed)
    for row in (got[0], got[-1]):
        np.testing.assert_array_equal(row.view(np.uint32), base[5].view(np.uint32))


def test_tiled_path_still_multiplies(block_matrix, monkeypatch):
    """Beyond MATMUL_MIN_T rows the tiled BLAS path (not row-invariant) must still be right."""
    monkeypatch.setattr(quant, "MATMUL_MIN_T", 4)
    monkeypatch.setattr(quant, "TILE_BYTES", 5 * 4 * 96)  # tiles of a few rows, the last one partial
    m, W = block_matrix
    X = np.random.default_rng(15).standard_normal((5, m.shape[1])).astype(np.float32)
    assert_product_close(m.matmul(X), W, X)


@pytest.mark.parametrize("ggml_type", [GT.F32, GT.F16, GT.BF16], ids=lambda t: t.name)
def test_dense_types_are_row_invariant(ggml_type):
    rng = np.random.default_rng(12)
    W = rng.standard_normal((37, 100)).astype(np.float32)  # 100: three 32-lane chunks and a tail of 4
    if ggml_type == GT.BF16:
        W = (W.view(np.uint32) & 0xFFFF0000).view(np.float32)
        data = (W.view(np.uint32) >> 16).astype(np.uint16)
    else:
        data = W.astype({GT.F32: np.float32, GT.F16: np.float16}[ggml_type])
        W = data.astype(np.float32)
    m = QuantMatrix(data, ggml_type, (37, 100))
    for T in ROW_COUNTS:
        X = rng.standard_normal((T, 100)).astype(np.float32)
        got = m.matmul(X)
        np.testing.assert_array_equal(got.view(np.uint32), per_row(m, X).view(np.uint32))
        assert_product_close(got, W, X)


@pytest.mark.parametrize("cols", [1, 31, 32, 100, 576])
def test_float_matmul_is_row_invariant(cols):
    rng = np.random.default_rng(cols)
    W = rng.standard_normal((19, cols)).astype(np.float32)
    X = rng.standard_normal((9, cols)).astype(np.float32)
    got = float_matmul(W, X)
    assert_product_close(got, W, X)
    for t in range(9):
        np.testing.assert_array_equal(float_matmul(W, X[t:t + 1])[0].view(np.uint32), got[t].view(np.uint32))
    np.testing.assert_array_equal(float_matmul(W, X[::-1]).view(np.uint32), got[::-1].view(np.uint32))


def test_float_matmul_rejects_bad_shapes():
    with pytest.raises(LoomShapeError, match="float32 weight"):
        float_matmul(np.zeros((2, 3)), np.zeros((1, 3), np.float32))
    with pytest.raises(LoomShapeError, match=r"needs input \(T, 3\)"):
        float_matmul(np.zeros((2, 3), np.float32), np.zeros((1, 4), np.float32))


def test_linear_is_row_invariant_for_quantized_and_dense_matrices(block_matrix):
    """``linear`` (the layers' one entry point) gives a row of a batch the bits of that row alone."""
    m, _ = block_matrix
    rng = np.random.default_rng(13)
    X = rng.standard_normal((2, 4, m.shape[1])).astype(np.float32)
    dense = QuantMatrix(m.dequantize(), GT.F32, m.shape)
    for w in (m, dense):
        got = linear(X, w)
        assert got.shape == (2, 4, m.shape[0])
        for b in range(2):
            for t in range(4):
                np.testing.assert_array_equal(linear(X[b, t], w).view(np.uint32), got[b, t].view(np.uint32))


def test_linear_is_row_invariant_for_numpy_weights():
    rng = np.random.default_rng(14)
    W = rng.standard_normal((64, 576)).astype(np.float32)
    X = rng.standard_normal((33, 576)).astype(np.float32)
    got = linear(X, W)
    for t in range(33):
        np.testing.assert_array_equal(linear(X[t:t + 1], W)[0].view(np.uint32), got[t].view(np.uint32))


# ---------------------------------------------------------------------------------------------
# End to end: SmolLM2 (Q4_1 blocks, Q8_0 head) steps four sequences at once.


@pytest.fixture(scope="module")
def smollm2():
    return load_model("smollm2-135m")


def test_batched_decode_step_matches_each_sequence_alone(smollm2):
    net = smollm2.net
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10], [11], [12, 13, 14, 15, 16]]

    def caches_after_prompts():
        caches = []
        for p in prompts:
            cache = net.make_cache()
            net.step(np.array([p]), [cache])
            caches.append(cache)
        return caches

    ids = np.array([[40], [41], [42], [43]])
    together = net.step(ids, caches_after_prompts())
    alone_caches = caches_after_prompts()
    alone = np.concatenate([net.step(ids[b:b + 1], [alone_caches[b]]) for b in range(4)])
    assert together.shape == (4, 49152) and np.isfinite(together).all()
    np.testing.assert_array_equal(together.view(np.uint32), alone.view(np.uint32))
