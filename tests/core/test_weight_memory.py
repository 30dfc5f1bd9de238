"""Large layers are converted a chunk at a time: the same numbers as converting them whole, with
temporaries bounded by the chunk instead of by the layer (a 2^28-weight layer took 6 GB)."""

from __future__ import annotations

import os
import tracemalloc

import numpy as np
import pytest

from loomlab.core import VolumetricNetwork, dtypes, machine, make_layer
from loomlab.core.morph import morph_all
from loomlab.core.weights import WeightStore, error_from_sums, error_sums

CHUNK = 1000  # small chunks here, so that a few thousand weights span several


def _master(n: int = 3500) -> np.ndarray:
    rng = np.random.default_rng(1)
    w = rng.standard_normal(n).astype(np.float32) * 0.2
    w[[5, 1700]] = [np.nan, 40.0]  # NaN and a large weight land in different chunks
    return w


@pytest.mark.parametrize("dtype", sorted(dtypes.FORMATS))
def test_chunked_conversion_gives_the_numbers_of_a_whole_one(dtype, monkeypatch):
    w = _master()
    scale = dtypes.auto_scale(w, dtype)
    native = dtypes.quantize(w, dtype, scale)
    values = dtypes.dequantize(native, dtype, scale)
    monkeypatch.setattr(dtypes, "CHUNK", CHUNK)
    np.testing.assert_equal(dtypes.auto_scale(w, dtype), scale)  # NaN too (binary)
    chunked = dtypes.quantize(w, dtype, scale)
    assert chunked.dtype == native.dtype
    np.testing.assert_array_equal(chunked, native)
    np.testing.assert_array_equal(dtypes.dequantize(native, dtype, scale), values)


def test_binary_scale_is_the_sequential_sum_across_chunks(monkeypatch):
    w = np.array([1e8] + [1.0] * 2999, np.float32)  # each 1.0 is lost against 1e8 in float32, not in f64
    monkeypatch.setattr(dtypes, "CHUNK", CHUNK)
    total = 0.0
    for v in np.abs(w).astype(np.float64):  # Go's loop, one addition at a time
        total += v
    assert dtypes.auto_scale(w, "binary") == float(np.float32(total) / np.float32(w.size))


def test_weight_error_summed_by_chunks_matches_the_whole_layer(monkeypatch):
    store = WeightStore(np.nan_to_num(_master()), 1.0)
    store.morph("int4")
    whole = error_from_sums(*error_sums(store.master, store.dequantized("int4")))
    monkeypatch.setattr(dtypes, "CHUNK", CHUNK)
    np.testing.assert_allclose(store.error("int4"), whole, rtol=1e-12)


def test_morphing_a_layer_holds_its_native_copy_and_a_chunk_of_temporaries(monkeypatch):
    n = 1024 * 1024
    net = VolumetricNetwork(1, 1, 1, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=1024, output_height=1024, rng=np.random.default_rng(0))
    monkeypatch.setattr(dtypes, "CHUNK", 1 << 14)
    morph_all(net, "float16")  # compile the error kernel outside the measurement
    net[0, 0, 0, 0].weights.native.clear()
    tracemalloc.start()
    try:
        [report] = morph_all(net, "int8")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert report.native_bytes == n and 0 < report.rel_error < 0.01
    # the int8 copy (1 MiB) and chunk temporaries, never a float32 or float64 copy of the layer
    assert peak < n + (1 << 20), peak


def test_physical_memory_comes_from_the_os_or_a_modest_fallback(monkeypatch):
    machine.physical_memory_bytes.cache_clear()
    try:
        monkeypatch.setattr(os, "sysconf", lambda name: {"SC_PHYS_PAGES": 1000, "SC_PAGE_SIZE": 4096}[name])
        assert machine.physical_memory_bytes() == 4_096_000
        machine.physical_memory_bytes.cache_clear()
        monkeypatch.delattr(os, "sysconf")
        assert machine.physical_memory_bytes() == machine.FALLBACK_MEMORY_BYTES
    finally:
        machine.physical_memory_bytes.cache_clear()
