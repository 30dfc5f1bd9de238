"""The compiled RMSNorm (core/llm/kernels/norm_kernel.py) against numpy's operations, bit for bit."""

import numpy as np
import pytest

from loomlab.core.llm.model.llm_layers import rms_norm, rms_norm_xp

F32 = np.float32
WIDTHS = [1, 2, 7, 8, 9, 15, 16, 17, 64, 100, 127, 128, 129, 136, 255, 256, 257, 576, 640, 1000, 1536, 2048]


@pytest.mark.parametrize("n", WIDTHS)
def test_rows_equal_numpy_bit_for_bit(n):
    rng = np.random.default_rng(n)
    x = (rng.standard_normal((5, n)) * rng.uniform(1e-3, 1e3, (5, 1))).astype(F32)
    gamma = rng.standard_normal(n).astype(F32)
    got, want = rms_norm(x, gamma, 1e-6), rms_norm_xp(x, gamma, 1e-6)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    x64 = x.astype(np.float64)
    formula = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + 1e-6) * gamma
    np.testing.assert_allclose(got, formula, rtol=2e-6, atol=1e-30)


def test_heads_and_edge_values_equal_numpy():
    """Q/K norms run over each head of [B, T, H, hd]; zeros, -0.0 and huge values included."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 256)).astype(F32)
    x[0, 0, 0] = 0.0
    x[0, 0, 1] = -0.0
    x[1, 2, 3, :7] = 3e18  # squares overflow to inf: the row becomes 0 or NaN as in numpy
    gamma = rng.standard_normal(256).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        got, want = rms_norm(x, gamma, 1e-5), rms_norm_xp(x, gamma, 1e-5)
    assert got.shape == want.shape == x.shape
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_other_dtypes_and_layouts_take_the_numpy_form():
    rng = np.random.default_rng(2)
    x64 = rng.standard_normal((3, 40))
    gamma = rng.standard_normal(40).astype(F32)
    np.testing.assert_array_equal(rms_norm(x64, gamma, 1e-6), rms_norm_xp(x64, gamma, 1e-6))
    strided = rng.standard_normal((40, 3)).astype(F32).T  # not C-contiguous
    np.testing.assert_array_equal(rms_norm(strided, gamma, 1e-6), rms_norm_xp(strided, gamma, 1e-6))
    formula = strided / np.sqrt((strided.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-6) * gamma
    np.testing.assert_allclose(rms_norm(strided, gamma, 1e-6), formula, rtol=1e-5)
