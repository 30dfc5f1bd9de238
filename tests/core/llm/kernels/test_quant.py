"""QuantMatrix against gguf-py: its ``dequantize`` is the oracle for the blocks, numpy matmul for
the products.

Dequantization is bit-exact by construction (the kernels compute each weight with the same
float32 operations as gguf-py), so ``dequantize`` and ``rows`` are compared with equality. A
product differs from the oracle only by float32 accumulation order: for any order, the rounding
error of an n-term dot product is at most gamma_n * sum|w||x| with gamma_n ~ n * 2^-24, so each
output is checked against ``(n + 2) * 2^-24 * (|W| @ |x|)`` (3.5e-5 relative for n = 576) with a
float64 oracle. Real errors (a wrong nibble, scale or offset) are orders of magnitude larger.
"""

from __future__ import annotations

import functools

import numba
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFReader, quants
from gguf import GGMLQuantizationType as GT

from loomlab.core.errors import LoomShapeError, ModelFormatError
from loomlab.core.llm.files import registry
from loomlab.core.llm.kernels import quant
from loomlab.core.llm.kernels.quant import QuantMatrix
from tests.oracles import llamacpp

QUANTIZED = [GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0, GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K, GT.Q6_K,
             GT.IQ4_XS, GT.IQ4_NL, GT.MXFP4]
# gguf-py can quantize these; K-quants it only dequantizes, so their blocks are random bytes.
QUANTIZABLE = {GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0}


def random_blocks(ggml_type: GT, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid blocks [rows, bytes_per_row] of ``ggml_type`` for a rows x cols matrix."""
    if ggml_type in QUANTIZABLE:
        weights = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 2.0, (rows, 1))
        return quants.quantize(weights.astype(np.float32), ggml_type)
    block_elems, block_bytes = GGML_QUANT_SIZES[ggml_type]
    blocks = rng.integers(0, 256, (rows, cols // block_elems, block_bytes), dtype=np.uint8)
    if ggml_type == GT.MXFP4:  # E8M0 exponents of scales 2^-10 .. 2^7 (products stay finite)
        blocks[:, :, 0] = rng.integers(118, 136, blocks.shape[:2])
        return blocks.reshape(rows, -1)
    # Every byte pattern is a valid block except for the float16 scales: make those finite.
    scale_bytes = {GT.Q2_K: (80, 82), GT.Q3_K: (108,), GT.Q4_K: (0, 2), GT.Q5_K: (0, 2), GT.Q6_K: (208,),
                   GT.IQ4_XS: (0,), GT.IQ4_NL: (0,)}
    for at in scale_bytes[ggml_type]:
        scale = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype("<f2")
        blocks[:, :, at:at + 2] = scale.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


def assert_product_close(got: np.ndarray, W: np.ndarray, X: np.ndarray) -> None:
    """``got`` ~ ``X @ W.T`` within the float32 dot-product error bound (module docstring)."""
    W64, X64 = W.astype(np.float64), X.astype(np.float64)
    want = X64 @ W64.T
    bound = (W.shape[1] + 2) * 2.0**-24 * (np.abs(X64) @ np.abs(W64).T)
    assert got.dtype == np.float32 and got.shape == want.shape
    excess = np.abs(got - want) - bound
    assert excess.max() <= 0, f"worst error exceeds the bound by {excess.max():.3g}"


# rows: 1 (a row pair with itself), 37 (odd: chunks of 16, 16 and 5); columns: 1 and 5 blocks.
CASES = [(t, rows, blocks) for t in QUANTIZED for rows, blocks in ((1, 1), (37, 5))]


@pytest.mark.parametrize(("ggml_type", "rows", "n_blocks"), CASES,
                         ids=[f"{t.name}-{r}x{b}blocks" for t, r, b in CASES])
def test_random_blocks_match_gguf(ggml_type, rows, n_blocks):
    rng = np.random.default_rng(int(ggml_type) * 100 + rows)
    cols = n_blocks * GGML_QUANT_SIZES[ggml_type][0]
    data = random_blocks(ggml_type, rows, cols, rng)
    W = quants.dequantize(data, ggml_type)
    m = QuantMatrix(data, ggml_type, (rows, cols))
    assert (m.shape, m.ggml_type, m.type_name) == ((rows, cols), int(ggml_type), ggml_type.name)

    np.testing.assert_array_equal(m.dequantize(), W)
    ids = rng.integers(0, rows, 7)
    np.testing.assert_array_equal(m.rows(ids), W[ids])
    x = rng.standard_normal(cols).astype(np.float32)
    assert_product_close(m.matvec(x)[None], W, x[None])
    for T in (1, 3, 37):  # 1 and 3 take the per-row kernel, 37 the tiled BLAS path
        X = rng.standard_normal((T, cols)).astype(np.float32)
        assert_product_close(m.matmul(X), W, X)


@pytest.mark.parametrize("ggml_type", [GT.Q4_1, GT.Q5_1, GT.Q3_K, GT.Q5_K, GT.Q6_K], ids=lambda t: t.name)
def test_matmul_over_many_tiles(ggml_type, monkeypatch):
    """Tiles of a few rows, the last one partial, must still cover every output column."""
    monkeypatch.setattr(quant, "TILE_BYTES", 3 * 512 * 4)
    rng = np.random.default_rng(1)
    data = random_blocks(ggml_type, 41, 512, rng)
    W = quants.dequantize(data, ggml_type)
    X = rng.standard_normal((9, 512)).astype(np.float32)
    assert_product_close(QuantMatrix(data, ggml_type, (41, 512)).matmul(X), W, X)


# ---------------------------------------------------------------------------------------------
# Types without a kernel: decoded to float32 at load. Oracle: llama.cpp's dequantize_row_* (its C,
# compiled), bit for bit, on blocks of its reference quantizers and, for the grid types, whose
# quantizers need tables built first, on random bytes with finite scales. IQ4_NL and MXFP4 (which
# have kernels) are checked the same way on its quantizers' blocks.

DECODED = [GT[name] for name in quant.DECODED_TYPES]
GRID_TYPES = {GT.IQ1_S, GT.IQ1_M, GT.IQ2_XXS, GT.IQ2_XS, GT.IQ2_S, GT.IQ3_XXS, GT.IQ3_S}


def decoded_type_blocks(ggml_type: GT, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    if ggml_type not in GRID_TYPES:
        weights = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.01, 2.0, (rows, 1))
        return llamacpp.quantize(weights, ggml_type.name)
    block_elems, block_bytes = GGML_QUANT_SIZES[ggml_type]
    blocks = rng.integers(0, 256, (rows, cols // block_elems, block_bytes), dtype=np.uint8)
    if ggml_type == GT.IQ1_M:  # its f16 scale is the top nibbles of its four uint16 sub-scales
        blocks[:, :, 55] = (blocks[:, :, 55] & 0x0F) | 0x30  # sign 0, exponent 12-15
    else:
        scale = (rng.standard_normal(blocks.shape[:2]) * 0.01).astype("<f2")
        blocks[:, :, 0:2] = scale.view(np.uint8).reshape(*blocks.shape[:2], 2)
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("ggml_type", [*DECODED, GT.IQ4_NL, GT.MXFP4], ids=lambda t: t.name)
def test_decoded_types_match_llama_cpp(ggml_type):
    rng = np.random.default_rng(int(ggml_type))
    rows, cols = 37, max(2 * GGML_QUANT_SIZES[ggml_type][0], 256)
    data = decoded_type_blocks(ggml_type, rows, cols, rng)
    W = llamacpp.dequantize(data, ggml_type.name)
    assert np.isfinite(W).all()
    m = QuantMatrix(data, ggml_type, (rows, cols))
    np.testing.assert_array_equal(m.dequantize().view(np.uint32), W.view(np.uint32))
    assert (m.type_name, m.decoded) == (ggml_type.name, ggml_type in DECODED)
    np.testing.assert_array_equal(m.raw_blocks, data)  # multiplied in place, or kept for export
    ids = rng.integers(0, rows, 7)
    np.testing.assert_array_equal(m.rows(ids), W[ids])
    x = rng.standard_normal(cols).astype(np.float32)
    assert_product_close(m.matvec(x)[None], W, x[None])
    X = rng.standard_normal((5, cols)).astype(np.float32)
    assert_product_close(m.matmul(X), W, X)


def test_mxfp4_scales_of_every_exponent_are_exact():
    """E8M0 exponents 0 and 1 (2^-128, 2^-127: float32 subnormals, ggml's special case), 255
    (2^127), and 2^-25 and 2^16, which float16 has not."""
    rng = np.random.default_rng(10)
    data = decoded_type_blocks(GT.MXFP4, 5, 64, rng)
    data.reshape(5, 2, 17)[:, 0, 0] = (0, 1, 255, 128 - 25, 128 + 16)
    np.testing.assert_array_equal(QuantMatrix(data, GT.MXFP4, (5, 64)).dequantize(),
                                  llamacpp.dequantize(data, "MXFP4"))


def test_decoded_types_convert_in_parts(monkeypatch):
    """A matrix larger than a part converts part by part into one array (temporaries bounded)."""
    monkeypatch.setattr(quant, "DECODE_ELEMS", 3 * 256)
    rng = np.random.default_rng(9)
    data = decoded_type_blocks(GT.TQ2_0, 11, 256, rng)
    np.testing.assert_array_equal(QuantMatrix(data, GT.TQ2_0, (11, 256)).dequantize(),
                                  llamacpp.dequantize(data, "TQ2_0"))


def test_every_format_is_registered_with_gguf_block_sizes():
    """One table, filled by declaring ``ggml_type``: each entry's block geometry is gguf-py's."""
    assert set(quant.FORMATS) == {*QUANTIZED, *DECODED, GT.F32, GT.F16, GT.BF16}
    for ggml_type, fmt in quant.FORMATS.items():
        assert fmt.ggml_type == ggml_type
        assert (fmt.block_elems, fmt.block_bytes) == GGML_QUANT_SIZES[GT(ggml_type)]
    assert set(quant.SUPPORTED_TYPES) == {GT(t).name for t in quant.FORMATS}


def test_matmul_leaves_numba_thread_count_unchanged():
    rng = np.random.default_rng(2)
    m = QuantMatrix(random_blocks(GT.Q8_0, 8, 64, rng), GT.Q8_0, (8, 64))
    before = numba.get_num_threads()
    m.matmul(np.ones((quant.MATMUL_MIN_T + 1, 64), np.float32))
    assert numba.get_num_threads() == before


def test_blocks_are_read_in_place():
    """The nibbles are not copied: changing the source bytes changes the matrix."""
    rng = np.random.default_rng(3)
    data = random_blocks(GT.Q4_1, 4, 64, rng)
    m = QuantMatrix(data, GT.Q4_1, (4, 64))
    data[2, 4:20] ^= 0xFF  # the first block's nibbles of row 2 (after f16 d and m)
    np.testing.assert_array_equal(m.dequantize(), quants.dequantize(data, GT.Q4_1))


@pytest.mark.parametrize("ggml_type", [GT.Q8_0, GT.Q4_1, GT.Q6_K, GT.IQ4_NL, GT.F16], ids=lambda t: t.name)
def test_a_row_range_is_those_rows_in_the_same_encoding_without_a_copy(ggml_type):
    """Oracle: the whole matrix's rows and products (block formats and a plain one, F16); the part
    views the file's bytes, and the int8 kernels give it the products of a matrix made from a
    copy of those rows' bytes, bit for bit."""
    from loomlab.core.llm.kernels.quant_int8 import int8_product, supports

    rng = np.random.default_rng(8)
    rows, cols = 48, 256
    if ggml_type == GT.F16:
        data = rng.standard_normal((rows, cols)).astype(np.float16)
    else:
        data = random_blocks(ggml_type, rows, cols, rng)
    m = QuantMatrix(data, ggml_type, (rows, cols))
    X = rng.standard_normal((3, cols)).astype(np.float32)
    for start, stop in ((0, 16), (16, 40), (40, 48)):
        part = m.row_range(start, stop)
        assert (part.shape, part.type_name) == ((stop - start, cols), m.type_name)
        np.testing.assert_array_equal(part.dequantize(), m.dequantize()[start:stop])
        np.testing.assert_array_equal(part.matmul(X), m.matmul(X)[:, start:stop])
        np.testing.assert_array_equal(part.matvec(X[0]), m.matvec(X[0])[start:stop])
        if ggml_type != GT.F16:
            assert np.shares_memory(part.raw_blocks, m.raw_blocks) and supports(part)
            copied = QuantMatrix(np.array(data[start:stop]), ggml_type, part.shape)  # its own bytes
            np.testing.assert_array_equal(int8_product(part, X), int8_product(copied, X))
    for start, stop in ((0, 0), (-1, 4), (40, 49), (5, 3)):
        with pytest.raises(LoomShapeError, match="not a range"):
            m.row_range(start, stop)


@pytest.mark.parametrize("ggml_type", [GT.Q5_0, GT.Q5_1], ids=lambda t: t.name)
def test_matvec_writes_into_out(ggml_type):
    rng = np.random.default_rng(4)
    data = random_blocks(ggml_type, 6, 96, rng)
    m = QuantMatrix(data, ggml_type, (6, 96))
    x = rng.standard_normal(96).astype(np.float32)
    out = np.full(6, np.nan, np.float32)
    assert m.matvec(x, out=out) is out
    assert_product_close(out[None], quants.dequantize(data, ggml_type), x[None])


@pytest.mark.parametrize("ggml_type", [GT.F32, GT.F16, GT.BF16], ids=lambda t: t.name)
@pytest.mark.parametrize("as_bytes", [False, True], ids=["array", "bytes"])
def test_plain_types_pass_through(ggml_type, as_bytes):
    rng = np.random.default_rng(5)
    W = rng.standard_normal((9, 24)).astype(np.float32)
    if ggml_type == GT.BF16:
        W = (W.view(np.uint32) & 0xFFFF0000).view(np.float32)  # exactly representable in bfloat16
        data = (W.view(np.uint32) >> 16).astype(np.uint16)
    else:
        W = W.astype({GT.F32: np.float32, GT.F16: np.float16}[ggml_type]).astype(np.float32)
        data = W.astype({GT.F32: np.float32, GT.F16: np.float16}[ggml_type])
    m = QuantMatrix(data.view(np.uint8) if as_bytes else data, ggml_type, (9, 24))
    np.testing.assert_array_equal(m.dequantize(), W)
    np.testing.assert_array_equal(m.rows([8, 0]), W[[8, 0]])
    x = rng.standard_normal(24).astype(np.float32)
    assert_product_close(m.matvec(x)[None], W, x[None])
    X = rng.standard_normal((5, 24)).astype(np.float32)
    assert_product_close(m.matmul(X), W, X)


@pytest.mark.parametrize(("data", "ggml_type", "shape", "match"), [
    (np.zeros((2, 18), np.uint8), GT.Q8_1, (2, 32), "no matrix kernel"),
    (np.zeros((2, 18), np.uint8), 999, (2, 32), "999 .unknown."),
    (np.zeros((2, 18), np.uint8), "Q4_0", (2, 32), "integer id"),
    (np.zeros((2, 18), np.uint8), GT.Q4_0, (2, 48), "not whole blocks of 32"),
    (np.zeros((2, 18), np.uint8), GT.Q4_0, (3, 32), r"needs uint8 data of shape \(3, 18\)"),
    (np.zeros((2, 20), np.uint8), GT.Q4_0, (2, 32), r"needs uint8 data of shape \(2, 18\)"),
    (np.zeros((2, 18), np.int8), GT.Q4_0, (2, 32), "got int8"),
    (np.zeros((2, 8), np.float64), GT.F32, (2, 8), "got float64"),
    (np.zeros((2, 18), np.uint8), GT.Q4_0, (0, 32), "positive"),
    (np.zeros((2, 18), np.uint8), GT.Q4_0, (2,), "out_features, in_features"),
    ([[0] * 18] * 2, GT.Q4_0, (2, 32), "numpy array"),
])
def test_bad_tensors_raise_model_format_error(data, ggml_type, shape, match):
    with pytest.raises(ModelFormatError, match=match) as err:
        QuantMatrix(data, ggml_type, shape, name="blk.0.attn_q.weight")
    assert err.value.field == "blk.0.attn_q.weight"


def test_bad_inputs_raise_shape_error():
    m = QuantMatrix(random_blocks(GT.Q8_0, 4, 64, np.random.default_rng(6)), GT.Q8_0, (4, 64))
    with pytest.raises(LoomShapeError, match="in_features=64"):
        m.matvec(np.zeros(63, np.float32))
    with pytest.raises(LoomShapeError, match="in_features=64"):
        m.matmul(np.zeros(64, np.float32))
    with pytest.raises(LoomShapeError, match="shape \\(4,\\)"):
        m.matvec(np.zeros(64, np.float32), out=np.zeros(4, np.float64))
    with pytest.raises(LoomShapeError, match=r"\[0, 4\)"):
        m.rows([0, 4])
    with pytest.raises(LoomShapeError, match=r"\[0, 4\)"):
        m.rows([-1])
    with pytest.raises(LoomShapeError, match="1-D integer"):
        m.rows([0.5])


# ---------------------------------------------------------------------------------------------
# The built-in models' own tensors (read with gguf-py here; the project's reader is tested apart).


@functools.cache  # gguf-py reads gemma3's header in ~20 s; the int8 tests use the same tensors
def model_tensors(alias: str) -> dict:
    return {t.name: t for t in GGUFReader(registry.fetch(alias)).tensors}


@pytest.fixture(scope="module")
def smollm2():
    return model_tensors("smollm2-135m")


@pytest.fixture(scope="module")
def gemma3():
    return model_tensors("gemma3-270m")


def check_real_tensor(tensor, ggml_type: GT, rng: np.random.Generator) -> None:
    assert tensor.tensor_type == ggml_type
    out_features, in_features = int(tensor.shape[1]), int(tensor.shape[0])  # GGUF lists dims inner first
    m = QuantMatrix(tensor.data, int(tensor.tensor_type), (out_features, in_features), name=tensor.name)
    W = quants.dequantize(tensor.data, ggml_type)
    np.testing.assert_array_equal(m.dequantize(), W)
    ids = np.concatenate([[0, out_features - 1], rng.integers(0, out_features, 30)])
    np.testing.assert_array_equal(m.rows(ids), W[ids])
    x = rng.standard_normal(in_features).astype(np.float32)
    assert_product_close(m.matvec(x)[None], W, x[None])
    for T in (3, 37):
        X = rng.standard_normal((T, in_features)).astype(np.float32)
        assert_product_close(m.matmul(X), W, X)


@pytest.mark.parametrize(("name", "ggml_type"), [
    ("blk.0.attn_q.weight", GT.Q4_1), ("token_embd.weight", GT.Q8_0)])
def test_smollm2_tensors(smollm2, name, ggml_type):
    check_real_tensor(smollm2[name], ggml_type, np.random.default_rng(7))


@pytest.mark.parametrize(("name", "ggml_type"), [
    ("blk.0.attn_output.weight", GT.Q4_K), ("blk.0.ffn_down.weight", GT.Q6_K),
    ("blk.0.attn_q.weight", GT.Q5_0)])
def test_gemma3_tensors(gemma3, name, ggml_type):
    check_real_tensor(gemma3[name], ggml_type, np.random.default_rng(8))
