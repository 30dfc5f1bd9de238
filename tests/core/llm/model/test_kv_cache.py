"""The KV cache and the run context that carries it to the attention layers.

Oracles: the keys and values concatenated by hand, buffer sizes from the shapes, and a full
forward over the whole sequence for cached decoding through a layer.
"""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core import VolumetricNetwork
from loomlab.core.errors import LoomConfigError, LoomShapeError
from loomlab.core.llm.model.kv_cache import CachedRun, KVCache
from loomlab.core.llm.model.layer_builders import attention_layer
from loomlab.core.llm.model.model_args import ModelArgs
from loomlab.core.llm.model.rope import Rope, RopeConfig


def test_kv_cache_appends_fetches_and_trims():
    rng = np.random.default_rng(0)
    cache = KVCache(n_kv_heads=2, head_dim=4, max_size=64, capacity=8)
    k1, v1 = rng.standard_normal((2, 2, 3, 4)).astype(np.float32)
    keys, values = cache.update_and_fetch(k1, v1)
    assert cache.offset == 3 and np.array_equal(keys, k1) and np.array_equal(values, v1)
    k2, v2 = rng.standard_normal((2, 2, 1, 4)).astype(np.float32)
    keys, values = cache.update_and_fetch(k2, v2)
    assert cache.offset == 4
    assert np.array_equal(keys, np.concatenate([k1, k2], axis=1))
    assert np.array_equal(values, np.concatenate([v1, v2], axis=1))
    assert cache.trim(2) == 2 and cache.offset == 2
    keys, _ = cache.update_and_fetch(k2, v2)  # overwrites the trimmed positions
    assert np.array_equal(keys, np.concatenate([k1[:, :2], k2], axis=1))
    assert cache.trim(10) == 3 and cache.offset == 0
    assert cache.trim(-5) == 0 and cache.offset == 0


def test_kv_cache_grows_keeps_its_content_and_stops_at_the_context():
    cache = KVCache(n_kv_heads=1, head_dim=2, max_size=300, capacity=4)
    rows = np.arange(600, dtype=np.float32).reshape(1, 300, 2)
    for start in range(0, 300, 13):
        keys, _ = cache.update_and_fetch(rows[:, start:start + 13], rows[:, start:start + 13])
    assert cache.offset == 300 and np.array_equal(keys, rows)
    assert cache.keys.shape[1] == 300  # grew in steps, never past the context
    with pytest.raises(LoomShapeError, match="context length 300"):
        cache.update_and_fetch(rows[:, :1], rows[:, :1])


def test_kv_cache_preallocates_up_to_the_context_and_grows_in_steps():
    heads, hd = 3, 8
    assert KVCache(heads, hd, max_size=100, capacity=1000).keys.shape == (heads, 100, hd)
    cache = KVCache(heads, hd, max_size=1000, capacity=10)
    assert cache.nbytes == 2 * heads * 10 * hd * 4  # float32 keys and values
    k = np.ones((heads, 11, hd), np.float32)
    cache.update_and_fetch(k, k)
    assert cache.keys.shape[1] == KVCache.step  # the next multiple of the step, not 11
    assert cache.nbytes == 2 * heads * KVCache.step * hd * 4


def test_a_float16_cache_stores_rounded_values_in_half_the_memory():
    rng = np.random.default_rng(1)
    k, v = rng.standard_normal((2, 2, 5, 8)).astype(np.float32)
    half, full = KVCache(2, 8, 64, 6, dtype="float16"), KVCache(2, 8, 64, 6)
    keys, values = half.update_and_fetch(k, v)
    assert keys.dtype == np.float16 and np.array_equal(keys, k.astype(np.float16))
    assert np.array_equal(values, v.astype(np.float16))
    assert half.keys.dtype == np.uint16  # the bits the attention kernel converts
    full.update_and_fetch(k, v)
    assert half.nbytes * 2 == full.nbytes
    half.update_and_fetch(k, v)  # grows: the first positions survive the copy
    assert np.array_equal(half.update_and_fetch(k[:, :0], v[:, :0])[0][:, :5], k.astype(np.float16))
    with pytest.raises(LoomConfigError, match="'bfloat16'"):
        KVCache(2, 8, 64, dtype="bfloat16")


def test_keys_are_head_dim_major_so_the_kernel_reads_them_without_a_copy():
    cache = KVCache(3, 8, 64, 10)
    buffer = cache.keys.transpose(0, 2, 1)
    assert buffer.shape == (3, 8, 10) and buffer.flags.c_contiguous


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_fork_copies_the_first_positions_and_keeps_the_dtype(dtype):
    rng = np.random.default_rng(2)
    k, v = rng.standard_normal((2, 2, 6, 4)).astype(np.float32)
    cache = KVCache(2, 4, 32, dtype=dtype)
    keys, values = (a.copy() for a in cache.update_and_fetch(k, v))
    clone = cache.fork(4)
    assert clone.dtype == dtype and clone.offset == 4
    clone_keys, clone_values = clone.update_and_fetch(k[:, :0], v[:, :0])
    assert np.array_equal(clone_keys, keys[:, :4]) and np.array_equal(clone_values, values[:, :4])
    clone.update_and_fetch(-k[:, :1], -v[:, :1])  # the copy grows; the original stays as it was
    assert np.array_equal(cache.update_and_fetch(k[:, :0], v[:, :0])[0], keys)
    assert cache.fork(100).offset == 6


def test_cached_run_hands_each_attention_layer_its_slot_of_every_row():
    net = VolumetricNetwork(1, 1, 1, 1, precision="fast")
    rows = [[KVCache(1, 2, 8) for _ in range(3)] for _ in range(2)]
    run = CachedRun(net, rows)
    assert run.layer_caches(1, 2) == [rows[0][1], rows[1][1]]
    assert CachedRun(net, None).layer_caches(1, 2) is None
    assert not run.train
    with pytest.raises(LoomShapeError, match="2 caches for a batch of 3"):
        run.layer_caches(0, 3)


def test_attention_continues_a_sequence_only_under_a_cached_run():
    """Prefill then one-token steps through the cache give the full-sequence outputs; a plain
    forward (Loom's run context) always starts a fresh sequence at position 0."""
    rng = np.random.default_rng(5)
    d, heads, kv_heads, hd, T = 16, 4, 2, 4, 7
    args = ModelArgs("llama", d, 1, heads, kv_heads, hd, 32)
    shapes = {"q": (heads * hd, d), "k": (kv_heads * hd, d), "v": (kv_heads * hd, d), "o": (d, heads * hd)}
    weights = {f"model.layers.0.self_attn.{n}_proj.weight": rng.standard_normal(s).astype(np.float32) * 0.3
               for n, s in shapes.items()}
    layer = attention_layer(args, weights, 0, Rope(RopeConfig().inv_freq(hd)))
    net = VolumetricNetwork(1, 1, 1, 1, precision="fast")
    net[0, 0, 0, 0] = layer
    x = rng.standard_normal((1, T, d)).astype(np.float32)
    full = net.forward(x)

    cache = [[KVCache(kv_heads, hd, 64)]]
    run = CachedRun(net, cache)
    steps = [run.call(layer, x[:, :4])[0]]
    steps += [run.call(layer, x[:, t:t + 1])[0] for t in range(4, T)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, atol=1e-5)
    assert cache[0][0].offset == T
    # the last token alone, without the cache, is position 0 of a new sequence: not the same output
    alone = net.forward(x[:, -1:])
    np.testing.assert_allclose(alone, CachedRun(net, None).call(layer, x[:, -1:])[0], atol=0)
    assert not np.allclose(alone, full[:, -1:], atol=1e-3)


def test_rope_keeps_the_last_angles_and_recomputes_for_new_positions():
    """Every layer of a step asks for the same positions: the kept cos/sin must be those of the
    positions asked, never the previous step's (oracle: the rotation written out in float64)."""
    inv = RopeConfig().inv_freq(8)
    rope = Rope(inv)
    rng = np.random.default_rng(3)
    v = rng.standard_normal((1, 2, 1, 8)).astype(np.float32)

    def reference(pos):
        angle = pos.astype(np.float32)[:, :, None, None] * inv  # float32 angles, as transformers
        a, b = v[..., :4].astype(np.float64), v[..., 4:].astype(np.float64)
        c, s = np.cos(angle.astype(np.float64)), np.sin(angle.astype(np.float64))
        return np.concatenate([a * c - b * s, b * c + a * s], axis=-1)

    for start in (5, 5, 7, 5):
        (got,) = rope((start,), 2, v)
        np.testing.assert_allclose(got, reference(np.array([[start, start + 1]])), rtol=1e-5, atol=1e-6)
    (again,) = rope((5,), 2, v)  # a hit gives the bits a fresh computation gives
    np.testing.assert_array_equal(again, Rope(inv)((5,), 2, v)[0])


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_kernel_gives_the_bits_of_the_numpy_rotation(interleaved):
    """The compiled rotation against the same formula in numpy (float32, unfused)."""
    rng = np.random.default_rng(4)
    rope = Rope(RopeConfig().inv_freq(64), interleaved)
    v = rng.standard_normal((3, 5, 4, 64)).astype(np.float32)
    starts = tuple(int(p) for p in rng.integers(0, 4000, 3))
    positions = np.array(starts)[:, None] + np.arange(5)
    (got,) = rope(starts, 5, v)
    angle = positions.astype(np.float32)[:, :, None, None] * rope.inv_freq
    cos, sin = np.cos(angle), np.sin(angle)
    if interleaved:
        a, b = v[..., 0::2], v[..., 1::2]
        want = np.empty_like(v)
        want[..., 0::2], want[..., 1::2] = a * cos - b * sin, b * cos + a * sin
    else:
        a, b = v[..., :32], v[..., 32:]
        want = np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
