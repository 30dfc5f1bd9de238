"""The quantized matrix kernels (gpu/quant_cuda.py) in numba's CUDA simulator, against the CPU
kernels (``QuantMatrix.matvec`` / ``matmul``), for every format QuantMatrix holds.

Tolerance: both sides compute the same float32 weights (the GPU may fuse a weight's
multiply-add, one more rounding) and float32 products, summed in different orders. Each is within
gamma_n * sum|w||x| of the exact sum (gamma_n ~ n * 2^-24, as tests/core/llm/kernels/test_quant.py's module
docstring says), so they differ by at most twice that: ``2 (n + 4) 2^-24 (|W| @ |x|)``, a few
1e-5 of the row's magnitude here. One wrong weight (a nibble, a scale, an offset) moves a result
by about |w x|, roughly 1/n of that magnitude: far outside the bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GT

from loomlab.core.errors import LoomConfigError, LoomShapeError
from loomlab.core.llm.kernels.quant import FORMATS, QuantMatrix
from loomlab.gpu.quant_cuda import DEVICE_KINDS

from ..core.llm.kernels.test_quant import QUANTIZED, random_blocks

pytestmark = pytest.mark.cuda_simulator
THREADS = 32  # the simulator runs every GPU thread as a Python thread: one warp per block


def matrix(ggml_type: GT, rows: int, n_blocks: int, seed: int) -> QuantMatrix:
    rng = np.random.default_rng(seed)
    if ggml_type in QUANTIZED:
        cols = n_blocks * GGML_QUANT_SIZES[ggml_type][0]
        return QuantMatrix(random_blocks(ggml_type, rows, cols, rng), ggml_type, (rows, cols))
    cols = 32 * n_blocks + 3  # a plain type: any width
    return QuantMatrix(rng.standard_normal((rows, cols)).astype(np.float16), ggml_type, (rows, cols))


def assert_matches_cpu(got, want, m: QuantMatrix, X: np.ndarray) -> None:
    """``got`` (GPU) ~ ``want`` (CPU kernel) within the bound of the module docstring."""
    W = m.dequantize().astype(np.float64)
    bound = 2 * (m.shape[1] + 4) * 2.0**-24 * (np.abs(X.astype(np.float64)) @ np.abs(W).T)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == want.shape
    excess = np.abs(got.astype(np.float64) - want) - bound.reshape(want.shape)
    assert excess.max() <= 0, f"worst difference exceeds the bound by {excess.max():.3g}"


# 1 row, one block, one row of X; 3 rows (odd), two blocks, T = 5 (one full and one partial group
# of the kernel's 4 rows of X per block)
SHAPES = [(1, 1, 1), (3, 2, 5)]
# the layouts the kernel decodes, and Q5_K for the block types it takes as float32 values
DEVICE_TYPES = [t for t in QUANTIZED if FORMATS[t].kind in DEVICE_KINDS] + [GT.Q5_K]
CASES = [(t, *shape) for t in (*DEVICE_TYPES, GT.F16) for shape in SHAPES]


@pytest.mark.parametrize(("ggml_type", "rows", "n_blocks", "T"), CASES,
                         ids=[f"{t.name}-{r}rows-{b}blocks-T{T}" for t, r, b, T in CASES])
def test_products_match_cpu_kernels(ggml_type, rows, n_blocks, T):
    from loomlab.gpu.quant_cuda import CudaQuantMatrix

    m = matrix(ggml_type, rows, n_blocks, seed=int(ggml_type) * 10 + rows)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal(m.shape[1]).astype(np.float32)
    X = rng.standard_normal((T, m.shape[1])).astype(np.float32)
    g = CudaQuantMatrix(m, threads=THREADS)
    assert_matches_cpu(g.matvec(x), m.matvec(x), m, x[None])
    assert_matches_cpu(g.matmul(X), m.matmul(X), m, X)


def test_device_arrays_in_device_arrays_out():
    from numba import cuda

    from loomlab.gpu.quant_cuda import CudaQuantMatrix

    m = matrix(GT.Q4_1, 2, 1, seed=1)
    x = np.linspace(-1, 1, m.shape[1], dtype=np.float32)
    g = CudaQuantMatrix(m, threads=THREADS)
    assert repr(g) == "CudaQuantMatrix(Q4_1, shape=(2, 32))"
    out = g.matvec(cuda.to_device(x))
    assert not isinstance(out, np.ndarray) and out.shape == (2,)
    assert_matches_cpu(out.copy_to_host(), m.matvec(x), m, x[None])


def test_quant_product_uploads_a_cpu_matrix():
    from loomlab.gpu.quant_cuda import quant_product

    m = matrix(GT.Q8_0, 2, 1, seed=2)
    X = np.random.default_rng(2).standard_normal((2, m.shape[1])).astype(np.float32)
    assert_matches_cpu(quant_product(m, X), m.matmul(X), m, X)
    assert_matches_cpu(quant_product(m, X[0]), m.matvec(X[0]), m, X[:1])
    assert quant_product(m, X[:0]).shape == (0, 2)  # an empty batch launches nothing


def test_bad_input_is_named():
    from numba import cuda

    from loomlab.gpu.quant_cuda import CudaQuantMatrix

    m = matrix(GT.Q4_0, 2, 1, seed=3)
    g = CudaQuantMatrix(m, threads=THREADS)
    with pytest.raises(LoomShapeError, match="in_features=32; got \\(31,\\)"):
        g.matvec(np.zeros(31, np.float32))
    with pytest.raises(LoomShapeError, match=r"\(T, in_features\)"):
        g.matmul(np.zeros(32, np.float32))
    with pytest.raises(LoomShapeError, match="must be C-contiguous float32; got float64"):
        g.matvec(cuda.to_device(np.zeros(32)))
    with pytest.raises(LoomShapeError, match="needs a QuantMatrix; got ndarray"):
        CudaQuantMatrix(np.zeros((2, 32), np.float32))
    with pytest.raises(LoomConfigError, match="power of two in 32..1024; got 48"):
        CudaQuantMatrix(m, threads=48)
