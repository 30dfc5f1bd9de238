"""Decode attention on the GPU (gpu/attention_cuda.py) in numba's CUDA simulator, against the CPU
kernel :func:`loomlab.core.llm.kernels.attention_kernel.attend`.

Tolerance: the scores are the same float32 operations on both sides; the exponentials are each
within 2 ulp of e**x on both (the CPU's polynomial, CUDA's ``expf``: 4 ulp apart at most), and
the exponentials' sum and the weighted sum of values are float32 sums of n terms in some order
(gamma_n ~ n * 2^-24 each, on both sides). So an output differs by at most about
``(4 n + 32) 2^-24`` times ``sum_i p_i |v_i|`` (the softmax weights p of a float64 oracle), a few
1e-6 of it here; one key too many or too few moves the output by about ``p_i |v_i|`` ~ 1/n of it.
"""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core.errors import LoomShapeError
from loomlab.core.llm.kernels.attention_kernel import attend

pytestmark = pytest.mark.cuda_simulator
THREADS = 32  # the simulator runs every GPU thread as a Python thread: one warp per block


def inputs(T, H, Hkv, hd, S, half, seed):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    keys, values = (rng.standard_normal((Hkv, S, hd)).astype(np.float16 if half else np.float32)
                    for _ in range(2))
    return q, *((a.view(np.uint16) if half else a) for a in (keys, values))


def magnitude(q, keys, values, start, window, scale, softcap=None):
    """``sum_i p_i |v_i|`` per output, p the float64 softmax over the keys each query sees (of
    the scores soft-capped at ``softcap`` when given)."""
    T, H, hd = q.shape
    Hkv = keys.shape[0]
    k64, v64 = (np.asarray(a.view(np.float16) if a.dtype == np.uint16 else a, np.float64)
                for a in (keys, values))
    out = np.empty((T, H * hd))
    for t in range(T):
        p = start + t
        lo = 0 if window is None else max(0, p - window + 1)
        for h in range(H):
            kv = h // (H // Hkv)
            s = scale * (k64[kv, lo:p + 1] @ q[t, h].astype(np.float64))
            if softcap is not None:
                s = np.tanh(s / softcap) * softcap
            e = np.exp(s - s.max())
            out[t, h * hd:(h + 1) * hd] = (e / e.sum()) @ np.abs(v64[kv, lo:p + 1])
    return out


# (T, H, Hkv, hd, S, start, window, float16 KV): decode with GQA; a sliding window; a block of
# queries (causal among themselves) over a float16 cache; plain multi-head; more keys than threads
CASES = [
    (1, 4, 2, 8, 12, 9, None, False),
    (1, 4, 2, 8, 12, 9, 4, False),
    (3, 2, 1, 16, 8, 0, None, True),
    (2, 2, 2, 4, 6, 3, 3, True),
    (1, 2, 1, 8, 48, 40, None, False),
]


@pytest.mark.parametrize(("T", "H", "Hkv", "hd", "S", "start", "window", "half"), CASES,
                         ids=[f"T{c[0]}-H{c[1]}-kv{c[2]}-hd{c[3]}-at{c[5]}-win{c[6]}-f{16 if c[7] else 32}"
                              for c in CASES])
def test_attention_matches_cpu_kernel(T, H, Hkv, hd, S, start, window, half):
    from loomlab.gpu.attention_cuda import attend as attend_gpu

    q, keys, values = inputs(T, H, Hkv, hd, S, half, seed=T * 100 + S)
    scale = hd**-0.5
    want = attend(q, keys, values, start, window, scale)
    got = attend_gpu(q, keys, values, start, window, scale, threads=THREADS)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == want.shape
    n = start + T if window is None else min(start + T, window)
    bound = (4 * n + 32) * 2.0**-24 * magnitude(q, keys, values, start, window, scale)
    excess = np.abs(got.astype(np.float64) - want) - bound
    assert excess.max() <= 0, f"worst difference exceeds the bound by {excess.max():.3g}"


def test_soft_capped_scores_match_the_cpu_kernel():
    """gemma2's cap on each score, ``tanh(s / c) * c`` (CUDA's tanhf against the CPU's, each a
    few ulp of c at most, which the exponentials carry over unamplified): within the bound above,
    with the capped scores' weights, and far from the uncapped result."""
    from loomlab.gpu.attention_cuda import attend as attend_gpu

    q, keys, values = inputs(3, 4, 2, 16, 20, False, seed=21)
    want = attend(q, keys, values, 17, 6, 0.5, softcap=1.5)
    got = attend_gpu(q, keys, values, 17, 6, 0.5, 1.5, threads=THREADS)
    bound = (4 * 6 + 32) * 2.0**-24 * magnitude(q, keys, values, 17, 6, 0.5, softcap=1.5)
    excess = np.abs(got.astype(np.float64) - want) - bound
    assert excess.max() <= 0, f"worst difference exceeds the bound by {excess.max():.3g}"
    assert np.abs(want - attend(q, keys, values, 17, 6, 0.5)).max() > 0.05


def test_device_arrays_in_device_arrays_out():
    from numba import cuda

    from loomlab.gpu.attention_cuda import attend as attend_gpu

    q, keys, values = inputs(1, 2, 1, 4, 5, False, seed=7)
    got = attend_gpu(cuda.to_device(q), cuda.to_device(keys), cuda.to_device(values), 4, None, 0.5,
                     threads=THREADS)
    assert not isinstance(got, np.ndarray)
    want = attend(q, keys, values, 4, None, 0.5)
    np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-5, atol=1e-6)


def test_half_bits_convert_exactly():
    """Every float16 bit pattern but NaNs: the kernel's conversion (run as the simulator runs it,
    as Python) equals numpy's ``astype``, signed zeros, subnormals and infinities included."""
    from loomlab.gpu.attention_cuda import _half

    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    bits = bits[~np.isnan(bits.view(np.float16))]
    want = bits.view(np.float16).astype(np.float32)
    got = np.array([_half(b) for b in bits], np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
    assert np.isnan(_half(np.uint16(0x7E00))) and np.isnan(_half(np.uint16(0xFC01)))


def test_bad_input_is_named():
    from loomlab.gpu.attention_cuda import attend as attend_gpu

    q, keys, values = inputs(1, 4, 2, 8, 6, False, seed=1)
    with pytest.raises(LoomShapeError, match="divisor of them as KV heads"):
        attend_gpu(q, keys[:, :, :4], values[:, :, :4], 0, None, 1.0)
    with pytest.raises(LoomShapeError, match="float32 or float16 bits"):
        attend_gpu(q, keys.astype(np.float64), values.astype(np.float64), 0, None, 1.0)
    with pytest.raises(LoomShapeError, match="queries at 6..6 need keys up to there; 6 positions"):
        attend_gpu(q, keys, values, 6, None, 1.0)
    with pytest.raises(LoomShapeError, match="at least the query itself; got 0"):
        attend_gpu(q, keys, values, 0, 0, 1.0)
    with pytest.raises(LoomShapeError, match=r"alike; got \(1, 4, 8\), \(2, 6, 8\), \(2, 5, 8\)"):
        attend_gpu(q, keys, values[:, :5], 0, None, 1.0)
