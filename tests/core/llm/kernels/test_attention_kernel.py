"""The decode-attention kernel: accuracy, query invariance, float16 caches.

Oracles: a float64 numpy causal GQA attention with sliding windows and soft-capped scores
(``tanh(s / c) * c``, transformers' gemma2 formula); numpy's float16 -> float32
conversion of every bit pattern (with and without F16C); the kernel itself called one query at a
time (invariance must be bitwise); SmolLM2's float32-cache logits for the float16 cache.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

from loomlab.core.errors import LoomShapeError
from loomlab.core.llm.files import registry
from loomlab.core.llm.kernels import quant_int8_rows
from loomlab.core.llm.kernels.attention_kernel import attend
from loomlab.core.llm.model import llm_layers
from loomlab.core.llm.model.llm_layers import linear
from loomlab.core.llm.model.loader import load_causal_lm

GOLDEN = Path(__file__).resolve().parents[3] / "data" / "llm" / "smollm2-135m-instruct-q4_1.json"


def _halves_to_floats(f16c: bool, monkeypatch):
    """The kernels' float16 conversion (quant_int8_rows.half_to_float) compiled as the host
    with or without F16C would have it, over an array of bits 16 at a time."""
    monkeypatch.setattr(quant_int8_rows, "host_features", lambda: {"f16c": f16c})

    @intrinsic
    def convert16(typingctx, bits, out, i):
        def codegen(context, builder, sig, args):
            src, dst = (context.make_array(sig.args[j])(context, builder, args[j]) for j in (0, 1))
            vi, vf = ir.VectorType(ir.IntType(16), 16), ir.VectorType(ir.FloatType(), 16)
            v = builder.load(builder.bitcast(builder.gep(src.data, [args[2]]), vi.as_pointer()), align=2)
            f = quant_int8_rows.half_to_float(builder, v)
            builder.store(f, builder.bitcast(builder.gep(dst.data, [args[2]]), vf.as_pointer()), align=4)
            return context.get_dummy_value()
        return types.none(bits, out, types.int64), codegen

    @njit
    def convert(bits):
        out = np.empty(bits.shape[0], np.float32)
        for i in range(0, bits.shape[0], 16):
            convert16(bits, out, i)
        return out
    return convert


@pytest.mark.parametrize("f16c", [True, False])
def test_half_to_float_matches_numpy_for_every_bit_pattern(f16c, monkeypatch):
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    expected = bits.view(np.float16).astype(np.float32)
    got = _halves_to_floats(f16c, monkeypatch)(bits)
    nan = np.isnan(expected)
    assert np.array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))
    assert np.isnan(got[nan]).all()
    if not f16c:  # integer operations keep a NaN's payload too (F16C's conversion quiets it)
        assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


def reference(q, keys, values, start, window, scale, softcap=None):
    """Causal GQA attention in float64, one (query, head) at a time; scores soft-capped at
    ``softcap`` when given."""
    T, H, hd = q.shape
    group = H // keys.shape[0]
    out = np.zeros((T, H, hd))
    for t in range(T):
        p = start + t
        lo = 0 if window is None else max(0, p - window + 1)
        for h in range(H):
            k, v = keys[h // group, lo:p + 1], values[h // group, lo:p + 1]
            s = k.astype(np.float64) @ q[t, h].astype(np.float64) * scale
            if softcap is not None:
                s = np.tanh(s / softcap) * softcap
            e = np.exp(s - s.max())
            out[t, h] = e / e.sum() @ v.astype(np.float64)
    return out.reshape(T, -1)


def random_qkv(rng, T, H, Hkv, hd, S, dtype="float32"):
    q = rng.standard_normal((T, H, hd)).astype(np.float32)
    k, v = rng.standard_normal((2, Hkv, S, hd)).astype(np.float32)
    if dtype == "float16":  # the kernel's inputs are the bits; the reference's the rounded values
        k, v = k.astype(np.float16), v.astype(np.float16)
        return q, k.view(np.uint16), v.view(np.uint16), k.astype(np.float32), v.astype(np.float32)
    return q, k, v, k, v


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("H, Hkv, hd", [(9, 3, 64), (4, 1, 256), (2, 2, 24)])
@pytest.mark.parametrize("window", [None, 1, 7])
def test_attend_matches_a_float64_reference(dtype, H, Hkv, hd, window):
    rng = np.random.default_rng(hd + H)
    T, S = 6, 40
    q, k, v, k_ref, v_ref = random_qkv(rng, T, H, Hkv, hd, S, dtype)
    start = S - T - 3  # keys past the last query exist (a cache's capacity) and must be ignored
    out = attend(q, k, v, start, window, hd ** -0.5)
    np.testing.assert_allclose(out, reference(q, k_ref, v_ref, start, window, hd ** -0.5), atol=2e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("window", [None, 1, 5, 16])
def test_each_query_gets_the_same_bits_alone_or_among_others(dtype, window):
    rng = np.random.default_rng(3)
    H, Hkv, hd, S = 6, 2, 64, 64
    for T in range(1, 18):
        q, k, v, _, _ = random_qkv(rng, T, H, Hkv, hd, S, dtype)
        start = int(rng.integers(0, S - T + 1))
        together = attend(q, k, v, start, window, 0.125)
        alone = np.concatenate([attend(q[t:t + 1], k, v, start + t, window, 0.125) for t in range(T)])
        assert np.array_equal(together, alone), (T, start)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("window", [None, 5])
def test_soft_capped_scores_match_the_formula_and_keep_each_querys_bits(dtype, window):
    """gemma2's attention logit soft-capping: within float32 rounding of the float64 formula,
    far from the uncapped result at these scores, and each query's bits alone or among others."""
    rng = np.random.default_rng(11)
    T, H, Hkv, hd, S, cap = 7, 4, 2, 32, 30, 1.5
    q, k, v, k_ref, v_ref = random_qkv(rng, T, H, Hkv, hd, S, dtype)
    start = S - T - 2
    capped = attend(q, k, v, start, window, 0.5, softcap=cap)
    np.testing.assert_allclose(capped, reference(q, k_ref, v_ref, start, window, 0.5, cap), atol=2e-6)
    assert np.abs(capped - attend(q, k, v, start, window, 0.5)).max() > 0.1
    alone = np.concatenate([attend(q[t:t + 1], k, v, start + t, window, 0.5, cap) for t in range(T)])
    assert np.array_equal(capped, alone)


def test_attend_rejects_inputs_that_do_not_fit():
    q, k, v, _, _ = random_qkv(np.random.default_rng(0), 2, 4, 2, 8, 10)
    with pytest.raises(LoomShapeError, match="3 query heads"):
        attend(q[:, :3], k, v, 0, None, 1.0)
    with pytest.raises(LoomShapeError, match="10 positions given"):
        attend(q, k, v, 9, None, 1.0)
    with pytest.raises(LoomShapeError, match="float16 bits"):
        attend(q, k.astype(np.float64), v.astype(np.float64), 0, None, 1.0)
    with pytest.raises(LoomShapeError, match="window"):
        attend(q, k, v, 0, 0, 1.0)
    with pytest.raises(LoomShapeError, match="alike"):
        attend(q, k, v[:, :5], 0, None, 1.0)
    for cap in (0.0, -1.0, np.inf, np.nan):
        with pytest.raises(LoomShapeError, match="a soft cap must be a positive number"):
            attend(q, k, v, 0, None, 1.0, softcap=cap)


@pytest.fixture(scope="module")
def smollm2():
    return load_causal_lm(registry.fetch("smollm2-135m"))


def test_prefill_in_one_step_or_two_gives_the_same_attention_and_logits(smollm2, monkeypatch):
    """20 prompt tokens at once vs 12 then 8. Every attention layer's output for the last 8
    queries must be the kernel's on the same inputs one step later (bitwise, on the model's real
    activations); the logits are bitwise equal too once ``linear`` is row-invariant."""
    net = smollm2
    ids = np.array([json.loads(GOLDEN.read_text())["generate"][0]["prompt_ids"][:20]])
    calls = []
    append_of = llm_layers.append_and_attend

    def recording(q, k, v, caches, starts, window, scale, softcap):
        assert softcap is None  # (SmolLM2's scores are not capped)
        out = append_of(q, k, v, caches, starts, window, scale)
        c = caches[0]
        calls.append((q[0].copy(), c.keys[:, :c.offset].copy(), c.values[:, :c.offset].copy(), starts[0],
                      window, scale, out[0]))
        return out

    monkeypatch.setattr(llm_layers, "append_and_attend", recording)
    whole = net.step(ids, [net.make_cache()])
    cache = [net.make_cache()]
    net.step(ids[:, :12], cache)
    split = net.step(ids[:, 12:], cache)
    monkeypatch.undo()

    layers = len(net.attention_layers)
    assert len(calls) == 3 * layers
    for q, keys, values, start, window, scale, out in calls[:layers]:
        assert start == 0 and q.shape[0] == 20
        np.testing.assert_array_equal(attend(q, keys, values, 0, window, scale), out)  # one call = B calls
        assert np.array_equal(attend(q[12:], keys, values, 12, window, scale), out[12:])
    for split_call, whole_call in zip(calls[2 * layers:], calls[:layers], strict=True):
        start, out = split_call[3], split_call[-1]
        assert start == 12 and np.array_equal(out, whole_call[-1][12:])  # the split step's own call
    x = np.random.default_rng(0).standard_normal((20, net.args.hidden_size)).astype(np.float32)
    first, head = net.attention_layers[0], net.cells[-1]
    matrices = [first.weights.current(first.cfg.dtype)["wq"], head.weights.current(head.cfg.dtype)["weight"]]
    if not all(np.array_equal(linear(x, m)[12:], linear(x[12:], m)) for m in matrices):
        pytest.skip("linear() is not row-invariant yet: the end-to-end bitwise logits wait for it")
    assert np.array_equal(whole, split)


def log_softmax(x):
    x = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def test_a_float16_cache_keeps_logits_and_greedy_output_of_a_float32_one(smollm2):
    """64 greedy tokens of a chat. float16 rounds keys and values by up to 2**-11 relative: on
    this model that moved logits by at most 0.026 (of ~25) and KL by at most 1e-5 (measured,
    every golden prompt; limits here 4x / 10x that), teacher-forced on the float32 cache's tokens.
    Greedy picks then agree wherever the float32 top-2 gap exceeds twice the limit."""
    net, n, limit = smollm2, 64, 0.1
    prompt = json.loads(GOLDEN.read_text())["generate"][0]["prompt_ids"]

    def decode(dtype, forced=None):
        cache = [net.make_cache(len(prompt) + n, dtype)]
        rows, tokens = [net.step(np.array([prompt]), cache)[0]], []
        while len(rows) < n:
            tokens.append(int(np.argmax(rows[-1])) if forced is None else forced[len(tokens)])
            rows.append(net.step(np.array([[tokens[-1]]]), cache)[0])
        return np.array(rows), tokens + [int(np.argmax(rows[-1]))]

    full, tokens = decode("float32")
    half, _ = decode("float16", forced=tokens)
    assert net.make_cache(8, "float16")[0].nbytes * 2 == net.make_cache(8)[0].nbytes
    assert np.abs(full - half).max() < limit
    a, b = log_softmax(full), log_softmax(half)
    assert (np.exp(a) * (a - b)).sum(axis=-1).max() < 1e-4
    _, greedy_half = decode("float16")
    top2 = np.sort(full, axis=-1)[:, -2:]
    ties = np.flatnonzero(top2[:, 1] - top2[:, 0] < 2 * limit)
    agree_until = ties[0] if ties.size else n
    assert greedy_half[:agree_until + 1] == tokens[:agree_until + 1]


@pytest.mark.parametrize("window", [None, 3])
def test_appending_and_attending_for_a_batch_equals_each_sequence_alone(window):
    """append_and_attend (one call per layer and step for all sequences, float32 caches) against
    update_and_fetch + attend per sequence: the same cache contents and the same bits, for
    sequences at different offsets, one of them growing past its capacity."""
    from loomlab.core.llm.kernels.attention_kernel import append_and_attend
    from loomlab.core.llm.model.kv_cache import KVCache

    rng = np.random.default_rng(7)
    B, T, H, Hkv, hd = 3, 2, 4, 2, 8
    offsets, capacities = (0, 5, 255), (4, 300, 256)
    batch, alone = [], []
    for offset, capacity in zip(offsets, capacities, strict=True):
        history = rng.standard_normal((2, Hkv, offset, hd)).astype(np.float32)
        for caches in (batch, alone):
            c = KVCache(Hkv, hd, 1024, capacity)
            c.update_and_fetch(history[0], history[1])
            caches.append(c)
    q = rng.standard_normal((B, T, H, hd)).astype(np.float32)
    k, v = rng.standard_normal((2, B, T, Hkv, hd)).astype(np.float32)
    got = append_and_attend(q, k, v, batch, offsets, window, 0.3)
    for b, c in enumerate(alone):
        keys, values = c.update_and_fetch(k[b].transpose(1, 0, 2), v[b].transpose(1, 0, 2))
        np.testing.assert_array_equal(got[b], attend(q[b], c.keys, c.values, offsets[b], window, 0.3))
        assert batch[b].offset == c.offset == offsets[b] + T
        np.testing.assert_array_equal(batch[b].keys[:, :c.offset], keys)
        np.testing.assert_array_equal(batch[b].values[:, :c.offset], values)
    with pytest.raises(LoomShapeError, match="exceed the context length"):
        append_and_attend(q, k, v, [KVCache(Hkv, hd, 1, 1)] * B, (0,) * B, window, 0.3)
