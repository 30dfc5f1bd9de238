"""The language-model path on a device backend, checked under array-api-strict (issue 16 §1).

Oracles: the numpy path (pinned to transformers by test_llm_logits / test_textmodel) on the same
weights, and the CPU attention kernel for the array-API fallback's attention. ``strict`` runs on
the simulated ``device1`` (implicit host copies, non-standard calls and mixed devices raise),
``strict-no-float64`` on a device without float64. Host transfers are counted by wrapping
array_api_strict's ways off a device (:class:`TransferCounter`).

Float32 bounds: the device path multiplies dequantized float32 matrices with ``x @ W.T`` (BLAS)
where the host path sums the same products in float32 lanes of its own kernels. Two float32 sums
of n products differ by at most ~n·u·Σ|x_i w_i| (u = 2**-24, n <= 128 here: ~1e-5 relative to the
magnitudes summed); the norms between blocks rescale rather than amplify such errors, so the
logits agree within ``RTOL = 1e-5`` of their largest magnitude (measured: ~5e-7).
"""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

from loomlab.core.backend import NUMPY, get_backend, to_host
from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.generate.prefix_cache import PrefixCache
from loomlab.core.llm.generate.sampling import argmax_id
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.kernels.attention_kernel import attend
from loomlab.core.llm.kernels.device_kernels import LLMKernels, kernels_for
from loomlab.core.llm.model.kv_cache import KVCache
from loomlab.core.llm.model.llm_layers import LLMAttention, Uploads
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.morph import morph_layer

from ...test_backend_strict_engine import TransferCounter

pytest.importorskip("array_api_strict", reason="the strict backend needs array-api-strict (dev extra)")

STRICT = ["strict", "strict-no-float64"]
TINY = Path(__file__).resolve().parents[3] / "data" / "tiny-hf"
CHECKPOINTS = ["tiny-llama", "tiny-qwen2", "tiny-gemma3", "tiny-phi3", "tiny-granite", "tiny-smollm3"]
RTOL = 1e-5  # of the largest logit (module docstring)
U = 2.0**-24  # float32's unit roundoff


def _ids(n: int, seed: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (1, n))


def _pair(name: str, backend: str):
    """The checkpoint on numpy and on ``backend``."""
    device = load_causal_lm(TINY / name)
    device.place(backend)
    return load_causal_lm(TINY / name), device


def _greedy(net, prompt: np.ndarray, n: int) -> tuple[list[int], list]:
    """Prefill then ``n`` greedy steps through the KV caches: the tokens and each step's logits."""
    cache = [net.make_cache(prompt.shape[1] + n)]
    logits = net.step(prompt, cache)
    tokens, rows = [], [to_host(logits)]
    for _ in range(n):
        tokens.append(argmax_id(logits[0, ...]))
        logits = net.step(np.array([[tokens[-1]]]), cache)
        rows.append(to_host(logits))
    return tokens, rows


# ----- the array-API fallback of the device kernels --------------------------------------------
@pytest.mark.parametrize("backend", STRICT)
@pytest.mark.parametrize("T, H, n_kv, S, start, window", [
    (1, 4, 2, 9, 8, None),  # a decode step, GQA
    (5, 4, 1, 12, 3, 3),  # a chunk of queries, one KV head, a sliding window
    (3, 6, 3, 3, 0, None),  # a fresh prompt
    (4, 2, 2, 20, 10, 2),  # keys past the last query are never read
])
def test_fallback_attention_is_the_cpu_kernels(backend, T, H, n_kv, S, start, window):
    rng = np.random.default_rng(T + S)
    q = rng.standard_normal((T, H, 8)).astype(np.float32)
    keys, values = (rng.standard_normal((n_kv, S, 8)).astype(np.float32) for _ in range(2))
    b = get_backend(backend)
    got = LLMKernels(b).attend(b.xp.asarray(q), b.xp.asarray(keys), b.xp.asarray(values), start, window, 0.3)
    assert str(got.device) == str(b.device)
    ref = attend(q, keys, values, start, window, 0.3)
    # a convex combination of value rows whose <= S softmax weights each carry ~S float32 roundings
    np.testing.assert_allclose(to_host(got), ref, rtol=0, atol=4 * S * U * np.abs(values).max())


def test_a_backend_names_its_own_kernels_and_none_means_the_fallback():
    class Mine(LLMKernels):
        pass

    strict = get_backend("strict")
    assert type(kernels_for(strict)) is LLMKernels
    import dataclasses

    assert type(kernels_for(dataclasses.replace(strict, llm_kernels=Mine))) is Mine


def test_a_tied_table_is_uploaded_once_for_the_embedding_and_the_head():
    _, net = _pair("tiny-gemma3", "strict")
    embedding, head = net.cells[0], net.cells[-1]
    assert head.weights.blocks["weight"] is embedding.weights.blocks["table"]
    ctx = types.SimpleNamespace(net=net)
    table = embedding.device_copy.arrays(embedding, ctx)["table"]
    assert table is head.device_copy.arrays(head, ctx)["weight"]


def test_a_morphed_layer_is_uploaded_again_and_computes_what_the_host_computes():
    host, device = _pair("tiny-llama", "strict")
    ids = _ids(10)
    for dtype in ("int8", "Q4_0", "float32"):  # a Loom dtype, a block format, back to the file's
        for net in (host, device):
            morph_layer(net, 5, dtype)  # the LM head
        ref = host.forward(ids)
        np.testing.assert_allclose(to_host(device.forward(ids)), ref, rtol=0, atol=RTOL * np.abs(ref).max())


# ----- logits and greedy tokens against the numpy path ---------------------------------------------
@pytest.mark.parametrize("backend", STRICT)
@pytest.mark.parametrize("name", CHECKPOINTS)
def test_logits_on_strict_equal_the_numpy_paths(name, backend):
    host, device = _pair(name, backend)
    ids = _ids(30)  # longer than gemma's window of 8: the sliding layers' mask matters
    ref = host.forward(ids)
    got = device.forward(ids)
    assert str(got.device) == str(device.backend.device)
    np.testing.assert_allclose(to_host(got), ref, rtol=0, atol=RTOL * np.abs(ref).max())
    tokens, rows = _greedy(device, ids, 12)
    ref_tokens, ref_rows = _greedy(host, ids, 12)
    assert tokens == ref_tokens
    for row, ref_row in zip(rows, ref_rows, strict=True):
        np.testing.assert_allclose(row, ref_row, rtol=0, atol=RTOL * np.abs(ref_row).max())


def test_gemma3_sliding_windows_and_qk_norms_run_on_the_device():
    """tiny-gemma3: every layer slides over 8 positions with Q/K norms; 40 positions through the
    caches decode past the window, and the numpy path (and so transformers) agrees."""
    host, device = _pair("tiny-gemma3", "strict")
    attention = [la for la in device.all_layers() if isinstance(la, LLMAttention)]
    assert {la.spec.window for la in attention} == {8}
    assert all("q_norm" in la.device_copy.arrays(la, types.SimpleNamespace(net=device)) for la in attention)
    ids = _ids(28, seed=5)
    tokens, rows = _greedy(device, ids, 12)
    ref_tokens, ref_rows = _greedy(host, ids, 12)
    assert tokens == ref_tokens
    np.testing.assert_allclose(rows[-1], ref_rows[-1], rtol=0, atol=RTOL * np.abs(ref_rows[-1]).max())
    # the window is what the device computes: without it the last logits differ far beyond rounding
    for la in attention:
        object.__setattr__(la.spec, "window", None)
    _, unwindowed = _greedy(device, ids, 12)
    assert np.abs(unwindowed[-1] - ref_rows[-1]).max() > 100 * RTOL * np.abs(ref_rows[-1]).max()


@pytest.fixture(scope="module")
def smollm2():
    """numpy's model on the exact path, the oracle: a device backend's products are float32
    whatever the activations setting."""
    with load_model("smollm2-135m", activations="float32") as model:
        yield model


@pytest.fixture(scope="module")
def strict_smollm2():
    with load_model("smollm2-135m", backend="strict") as model:
        yield model


PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]


def test_smollm2_on_strict_generates_numpys_greedy_tokens(strict_smollm2, smollm2):
    assert strict_smollm2.backend.name == "strict" and smollm2.backend is NUMPY
    for prompt in PROMPTS:
        got = [r.id for r in strict_smollm2.generate(prompt, max_tokens=10)]
        assert got == [r.id for r in smollm2.generate(prompt, max_tokens=10)], prompt
    chat = [{"role": "user", "content": "Name a colour."}]
    assert [r.text for r in strict_smollm2.chat(chat, max_tokens=6)] == \
        [r.text for r in smollm2.chat(chat, max_tokens=6)]
    assert strict_smollm2.batch_generate(PROMPTS, max_tokens=6) == \
        smollm2.batch_generate(PROMPTS, max_tokens=6)


def test_speculation_classify_and_embed_on_strict_are_numpys(strict_smollm2, smollm2):
    prompt = "one two three four, one two three four, one two"  # prompt lookup finds drafts
    got = list(strict_smollm2.generate(prompt, max_tokens=8, speculative="prompt-lookup"))
    assert [r.id for r in got] == [r.id for r in smollm2.generate(prompt, max_tokens=8)]
    assert strict_smollm2.metrics().accepted_tokens > 0
    (got,), (ref,) = strict_smollm2.classify([prompt]), smollm2.classify([prompt])
    assert got.token == ref.token
    np.testing.assert_allclose(got.logits, ref.logits, rtol=0, atol=RTOL * np.abs(ref.logits).max())
    got, ref = strict_smollm2.embed(PROMPTS), smollm2.embed(PROMPTS)
    np.testing.assert_allclose(got, ref, rtol=0, atol=RTOL * np.abs(ref).max())


def test_logprobs_penalties_and_sampling_on_strict_are_numpys(strict_smollm2, smollm2):
    sampled = {"temperature": 0.8, "top_p": 0.9, "seed": 4}
    for kwargs in ({"logprobs": 3}, {"repetition_penalty": 1.3}, sampled):
        got = list(strict_smollm2.generate("Hello", max_tokens=5, **kwargs))
        ref = list(smollm2.generate("Hello", max_tokens=5, **kwargs))
        assert [r.id for r in got] == [r.id for r in ref], kwargs
        for g, r in zip(got, ref, strict=True):
            if r.logprob is not None:  # float32 logits of two summation orders, logsumexp in float64
                assert g.logprob == pytest.approx(r.logprob, abs=1e-4)
                assert [t[:2] for t in g.top] == [t[:2] for t in r.top]
                np.testing.assert_allclose([t[2] for t in g.top], [t[2] for t in r.top], atol=1e-4)


# ----- host transfers per decode step ------------------------------------------------------------------
def test_a_greedy_decode_step_sends_the_host_one_transfer_of_the_token_id(strict_smollm2, monkeypatch):
    model = strict_smollm2
    model.prefix_cache.max_bytes = 0  # every call prefills from scratch
    counter = TransferCounter(monkeypatch)
    n = 6
    crossed = counter.during(lambda: list(model.generate("The capital of France is", max_tokens=n)))
    # the prefill's logits stay; each token (the prefill's and each step's) is its argmax's id: no
    # weight, cache, activation or logits row ever comes over
    assert crossed == [1] * n
    k = 3
    crossed = counter.during(lambda: list(model.generate("Hi", max_tokens=n, logprobs=k)))
    assert crossed == [1, 2 * k + 1] * n  # the id, then token's logprob + k values + k ids
    vocab = model.vocab_size
    crossed = counter.during(lambda: list(model.generate("Hi", max_tokens=n, temperature=0.7, seed=1)))
    assert crossed == [vocab] * n  # sampling on the host: the row comes over once per token


def test_kv_caches_live_on_the_backends_device(strict_smollm2):
    import array_api_strict

    net, strict_array = strict_smollm2.net, type(array_api_strict.asarray(0.0))
    caches = net.make_cache(8)
    assert len(caches) == net.args.num_layers
    for c in caches:
        for buffer in (c.keys, c.values):
            assert isinstance(buffer, strict_array)
            assert buffer.device == net.backend.device and buffer.dtype == array_api_strict.float32
    strict_smollm2.prefix_cache = PrefixCache(1 << 30)
    list(strict_smollm2.generate("Caches stay", max_tokens=3))
    (stored,) = strict_smollm2.prefix_cache._entries.values()  # the generation's, kept for its next turn
    assert all(isinstance(c.keys, strict_array) and c.keys.device == net.backend.device and c.offset > 0
               for c in stored)
    forked = stored[0].fork(2)
    assert forked.keys.device == net.backend.device and forked.offset == 2


def test_kv_cache_grows_and_forks_on_the_device_as_on_the_host():
    strict = get_backend("strict")
    rng = np.random.default_rng(0)
    chunks = [rng.standard_normal((2, t, 4)).astype(np.float32) for t in (3, 300, 1)]
    host, device = KVCache(2, 4, 1000), KVCache(2, 4, 1000, xp=strict.xp)
    for chunk in chunks:  # 304 positions: past the first step of 256, so the buffers grew
        keys, values = host.update_and_fetch(chunk, chunk * 2)
        d_keys, d_values = device.update_and_fetch(strict.xp.asarray(chunk), strict.xp.asarray(chunk * 2))
    np.testing.assert_array_equal(to_host(d_keys), keys)
    np.testing.assert_array_equal(to_host(d_values), values)
    assert device.keys.shape == (2, 512, 4) and device.nbytes == host.nbytes
    fork = device.fork(10)
    np.testing.assert_array_equal(to_host(fork.keys[:, :10, :]), keys[:, :10])


def test_a_float16_kv_cache_uses_the_devices_float16_and_strict_has_none():
    with pytest.raises(LoomConfigError, match="float16.*has no such type"):
        KVCache(2, 4, 64, 8, "float16", xp=get_backend("strict").xp)
    # a device namespace with float16 (numpy's functions, standing in for CuPy's)
    xp = types.ModuleType("device")
    xp.__getattr__ = lambda name: getattr(np, name)
    cache = KVCache(2, 4, 64, 8, "float16", xp=xp)
    k = np.random.default_rng(1).standard_normal((2, 3, 4)).astype(np.float32)
    keys, values = cache.update_and_fetch(k, -k)
    assert cache.keys.dtype == np.float16 and keys.dtype == np.float32
    np.testing.assert_array_equal(keys, k.astype(np.float16).astype(np.float32))
    assert cache.nbytes == 2 * 2 * 8 * 4 * 2


# ----- no float64, mixed devices, choosing the backend -------------------------------------------------
def test_strict_no_float64_runs_the_model_without_float64():
    """array_api_strict refuses float64 on ``no_float64``: a whole generation (greedy, logprobs,
    sampling) running there is the proof; logprobs are then reduced in float32."""
    with load_model("smollm2-135m", backend="strict-no-float64") as model:
        assert not model.backend.has_float64
        greedy = [r.id for r in model.generate("The capital of France is", max_tokens=5, logprobs=2)]
        assert len(greedy) == 5
        sampled = list(model.generate("Hi", max_tokens=3, temperature=0.9, seed=2))
        assert len(sampled) == 3
    with pytest.raises(Exception, match="float64"):  # the device itself refuses it
        get_backend("strict-no-float64").xp.zeros(1, dtype=get_backend("strict").xp.float64)


def test_a_network_mixing_devices_is_refused_with_a_clear_error():
    _, net = _pair("tiny-llama", "strict")
    ids = _ids(4)
    caches = [net.make_cache(8)]
    host_caches = [load_causal_lm(TINY / "tiny-llama").make_cache(8)]
    with pytest.raises(LoomConfigError, match="KV cache is not on the 'strict' backend's device"):
        net.step(ids, host_caches)
    other = Uploads(kernels_for(get_backend("strict-no-float64")))
    attention = next(la for la in net.all_layers() if isinstance(la, LLMAttention))
    attention.place(other)
    with pytest.raises(LoomConfigError, match=r"LLMAttention .* is not on the 'strict' backend's device"):
        net.step(ids, caches)
    # a layer left on the host in a device network, and a device layer in a host network
    attention.place(None)
    with pytest.raises(LoomConfigError, match="is not on the 'strict' backend's device"):
        net.step(ids, caches)
    host = load_causal_lm(TINY / "tiny-llama")
    next(la for la in host.all_layers() if isinstance(la, LLMAttention)).place(other)
    with pytest.raises(LoomConfigError, match="'strict-no-float64' backend's device .* runs on 'numpy'"):
        host.forward(ids)


def test_placing_back_on_numpy_is_the_host_path_again():
    host, net = _pair("tiny-qwen2", "strict")
    net.place("numpy")
    assert all(getattr(la, "device_copy", None) is None for la in net.all_layers())
    ids = _ids(6)
    np.testing.assert_array_equal(net.forward(ids), host.forward(ids))
    assert isinstance(net.make_cache(4)[0].keys, np.ndarray)

