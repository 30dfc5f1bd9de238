"""The ReLU family's compiled loop (numpy float32/float64, contiguous) against Loom's expressions
(spec §1.2) written with ``where``, bit for bit: NaN and -0.0 pass through, negatives give +0.0
(ReLU, ReLU2) or ``v·0.01`` in the array's dtype (LeakyReLU); other arrays take the fallback."""

import numpy as np
import pytest

from loomlab.core.activations import LEAKY_RELU, RELU, RELU2, activate


def loom(act, v):
    with np.errstate(all="ignore"):
        if act == RELU:
            return np.where(v < 0, 0, v).astype(v.dtype)
        if act == LEAKY_RELU:
            return np.where(v < 0, v * 0.01, v).astype(v.dtype)
        return np.where(v < 0, 0, v * v).astype(v.dtype)


SPECIAL = [np.nan, -np.nan, -0.0, 0.0, -1.0, 2.5, -np.inf, np.inf, 1e-45, -1e-45, 3e38, -3e38, 1e-39, -7.0]


def bits_equal(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))


@pytest.mark.parametrize("act", [RELU, LEAKY_RELU, RELU2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(14,), (2, 7), (1, 14, 1), (0,), (3, 0)])
def test_compiled_loop_equals_loom_bit_for_bit(act, dtype, shape):
    rng = np.random.default_rng(0)
    size = int(np.prod(shape))
    v = np.resize(np.array(SPECIAL, dtype), size).reshape(shape)
    bits_equal(activate(act, v), loom(act, v))
    r = (rng.standard_normal(1000) * 10).astype(dtype)  # long enough for the vector loop and its tail
    r[::7] = -0.0
    bits_equal(activate(act, r), loom(act, r))


@pytest.mark.parametrize("act", [RELU, LEAKY_RELU, RELU2])
def test_other_arrays_take_the_array_module_path(act):
    v = np.array(SPECIAL * 2, np.float32).reshape(4, 7)
    with np.errstate(over="ignore"):  # ReLU2 of 3e38 overflows to inf, as Loom's float32 product does
        bits_equal(activate(act, v[:, ::2]), loom(act, v[:, ::2]))  # strided view
        bits_equal(activate(act, v.T), loom(act, v.T))  # Fortran order
    half = np.array([-1.5, 0.0, -0.0, 2.0, np.nan, 300], np.float16)
    ints = np.array([-300, -100, -1, 0, 7, 40], np.int32)
    with np.errstate(all="ignore"):  # float16 300² overflows, as in Loom's float16 arithmetic
        bits_equal(activate(act, half), loom(act, half))
        bits_equal(activate(act, ints), loom(act, ints))
    scalar = np.array(-0.0, np.float32)  # 0-d
    bits_equal(activate(act, scalar), loom(act, scalar))


@pytest.mark.parametrize("act", [RELU, LEAKY_RELU, RELU2])
def test_input_is_not_changed_and_result_is_new(act):
    v = np.array([-1.0, 0.5, -0.0, np.nan], np.float32)
    keep = v.copy()
    y = activate(act, v)
    assert y is not v and not np.shares_memory(y, v)
    bits_equal(v, keep)
