"""The language-model kernels of the cupy backend (gpu/llm_kernels.py) in numba's CUDA simulator,
on a backend whose namespace is numpy: ``upload`` + ``linear`` against the CPU kernels
(``QuantMatrix.matmul`` / ``matvec``) for every format, ``attend`` against
:func:`loomlab.core.llm.kernels.attention_kernel.attend`, and a small model's decode steps through them
against the numpy path. Tolerances are the kernel tests' (their module docstrings derive them):
the same float32 operations summed in another order.
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as GT

from loomlab.core.backend import Backend
from loomlab.core.errors import LoomShapeError
from loomlab.core.llm.kernels.attention_kernel import attend
from loomlab.core.llm.kernels.quant import QuantMatrix

from ..core.llm.kernels.test_quant import QUANTIZED
from .test_cuda_sim_attention import CASES as ATTEND_CASES
from .test_cuda_sim_attention import inputs, magnitude
from .test_cuda_sim_quant import DEVICE_TYPES, assert_matches_cpu, matrix

pytestmark = pytest.mark.cuda_simulator
THREADS = 32  # the simulator runs every GPU thread as a Python thread: one warp per block
HOST = Backend("numpy", np)  # the kernels' arrays are then host arrays, copied over per call


def kernels():
    from loomlab.gpu.llm_kernels import CudaLLMKernels

    return CudaLLMKernels(HOST, threads=THREADS)


FORMATS = [*DEVICE_TYPES, GT.F16, GT.F32, GT.BF16]


def any_matrix(ggml_type: GT, rows: int, n_blocks: int, seed: int) -> QuantMatrix:
    """``matrix`` of the kernel tests, and the plain types it does not make."""
    if ggml_type in (*QUANTIZED, GT.F16):
        return matrix(ggml_type, rows, n_blocks, seed)
    values = np.random.default_rng(seed).standard_normal((rows, 32 * n_blocks + 3)).astype(np.float32)
    if ggml_type == GT.BF16:
        values = (values.view(np.uint32) >> 16).astype(np.uint16)  # the top half of each float32
    return QuantMatrix(values, ggml_type, values.shape)


@pytest.mark.parametrize("ggml_type", FORMATS, ids=[t.name for t in FORMATS])
@pytest.mark.parametrize("T", [1, 5])  # a decode step; a prefill of one full and one partial group of 4
def test_upload_and_linear_equal_the_cpu_kernels(ggml_type, T):
    from loomlab.gpu.quant_cuda import CudaQuantMatrix

    m = any_matrix(ggml_type, 3, 2, seed=int(ggml_type) * 10 + T)
    X = np.random.default_rng(T).standard_normal((T, m.shape[1])).astype(np.float32)
    k = kernels()
    w = k.upload(m)
    if ggml_type in QUANTIZED:  # the file's blocks on the device, not a float32 matrix
        assert isinstance(w, CudaQuantMatrix) and w.type_name == ggml_type.name
    else:
        assert isinstance(w, np.ndarray) and w.dtype == np.float32 and w.shape == m.shape
    got = k.linear(X, w)
    assert_matches_cpu(got, m.matmul(X), m, X)
    if T == 1:
        assert_matches_cpu(got, m.matvec(X[0])[None], m, X)


def test_a_float32_matrix_uploads_as_it_is():
    W = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    X = np.random.default_rng(1).standard_normal((2, 6)).astype(np.float32)
    k = kernels()
    w = k.upload(W.astype(np.float64))  # converted to float32 on the way
    assert w.dtype == np.float32
    np.testing.assert_array_equal(w, W)
    np.testing.assert_allclose(k.linear(X, w), X @ W.T, rtol=1e-6)


def test_linear_reads_a_strided_input():
    m = matrix(GT.Q4_K, 2, 1, seed=4)
    wide = np.random.default_rng(4).standard_normal((3, 2 * m.shape[1])).astype(np.float32)
    X = wide[:, ::2]  # not C-contiguous
    k = kernels()
    assert_matches_cpu(k.linear(X, k.upload(m)), m.matmul(np.ascontiguousarray(X)), m, X)


def assert_attention_matches_cpu(got, q, keys, values, start, window, scale) -> None:
    """``got`` ~ the CPU kernel on the same (contiguous) inputs, within test_cuda_sim_attention's bound."""
    want = attend(q, keys, values, start, window, scale)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32 and got.shape == want.shape
    n = start + q.shape[0] if window is None else min(start + q.shape[0], window)
    bound = (4 * n + 32) * 2.0**-24 * magnitude(q, keys, values, start, window, scale)
    excess = np.abs(got.astype(np.float64) - want) - bound
    assert excess.max() <= 0, f"worst difference exceeds the bound by {excess.max():.3g}"


@pytest.mark.parametrize(("T", "H", "Hkv", "hd", "S", "start", "window", "half"), ATTEND_CASES,
                         ids=[f"T{c[0]}-H{c[1]}-kv{c[2]}-hd{c[3]}-at{c[5]}-win{c[6]}-f{16 if c[7] else 32}"
                              for c in ATTEND_CASES])
def test_attend_equals_the_cpu_kernel(T, H, Hkv, hd, S, start, window, half):
    q, keys, values = inputs(T, H, Hkv, hd, S, half, seed=T * 100 + S + 1)
    scale = hd**-0.5
    assert_attention_matches_cpu(kernels().attend(q, keys, values, start, window, scale),
                                 q, keys, values, start, window, scale)


def test_attend_reads_a_kv_cache_view():
    """A cache's keys: a transposed view of a head_dim-major buffer, with spare capacity after
    the positions written (sliding window 3, GQA 4 query heads on 2 KV heads)."""
    q, keys, values = inputs(2, 4, 2, 8, 16, False, seed=9)
    keys_view = np.ascontiguousarray(keys.transpose(0, 2, 1)).transpose(0, 2, 1)
    values_view = np.concatenate([values, values], axis=1)[:, :16]
    assert not keys_view.flags.c_contiguous and not values_view.flags.c_contiguous
    got = kernels().attend(q, keys_view, values_view, 10, 3, 0.25)
    assert_attention_matches_cpu(got, q, keys, values, 10, 3, 0.25)


def test_bad_input_is_named():
    k = kernels()
    with pytest.raises(LoomShapeError, match=r"2-D float matrix \[out, in\]; got ndarray of shape \(4,\)"):
        k.upload(np.zeros(4, np.float32))
    with pytest.raises(LoomShapeError, match="got str"):
        k.upload("weights")
    m = matrix(GT.Q8_0, 2, 1, seed=5)
    with pytest.raises(LoomShapeError, match="in_features=32; got \\(1, 31\\)"):
        k.linear(np.zeros((1, 31), np.float32), k.upload(m))
    q, keys, values = inputs(1, 4, 2, 8, 6, False, seed=1)
    with pytest.raises(LoomShapeError, match="queries at 6..6 need keys up to there"):
        k.attend(q, keys, values, 6, None, 1.0)
    assert repr(k) == "CudaLLMKernels(numpy, threads=32)"



# ----- a language model stepping through the kernels ---------------------------------------------
def device_backend():
    """A backend standing in for CuPy's: a namespace that is not numpy (so the model takes its
    device path: matrices uploaded once through the kernels, caches made in the namespace) whose
    functions are numpy's, and these kernels, run by the simulator on its arrays. Its device is
    None, as CuPy's backend's is (the namespace's current device), while its caches name
    numpy's "cpu": the model's placement check must accept that."""
    from functools import partial

    from loomlab.gpu.llm_kernels import CudaLLMKernels

    xp = types.ModuleType("cuda-simulator")
    xp.__getattr__ = lambda name: getattr(np, name)
    return Backend("cuda-simulator", xp, None, llm_kernels=partial(CudaLLMKernels, threads=THREADS))


def test_a_model_steps_through_the_kernels_as_the_numpy_path_does():
    """tiny-gemma3 (GQA 4 query heads on 2 KV heads, Q/K norms, a sliding window of 8, a tied
    embedding table): a 9-token prefill (the window slides) and two greedy decode steps through
    KV caches, every attention in the simulator, against the numpy path's logits and tokens.

    Bound: attention outputs differ by the kernel tests' bound (a few 1e-6 of the values'
    magnitude), and the float32 matrix products by their summation order (test_llm_strict's
    RTOL); the logits agree within 1e-5 of their largest magnitude, far below one wrong key or
    head (which moves them by ~1e-2 of it here)."""
    from loomlab.core.llm.generate.sampling import argmax_id
    from loomlab.core.llm.model.loader import load_causal_lm
    from loomlab.gpu.llm_kernels import CudaLLMKernels

    path = Path(__file__).parents[1] / "data" / "tiny-hf" / "tiny-gemma3"
    host, device = load_causal_lm(path), load_causal_lm(path)
    device.place(device_backend())
    prompt = np.random.default_rng(3).integers(0, 256, (1, 9))
    runs = []
    for net in (host, device):
        cache = [net.make_cache(12)]
        logits = [np.asarray(net.step(prompt, cache))]
        for _ in range(2):
            logits.append(np.asarray(net.step(np.array([[argmax_id(logits[-1][0])]]), cache)))
        runs.append(logits)
    assert isinstance(device.cells[0].device_copy.kernels, CudaLLMKernels)
    for got, want in zip(*reversed(runs), strict=True):
        assert got.shape == want.shape == (1, 256)
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()
        assert argmax_id(got[0]) == argmax_id(want[0])
