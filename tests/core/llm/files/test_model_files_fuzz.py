"""Property tests of the language-model readers, on inputs built from a tiny valid model: a GGUF
with one header, metadata or tensor-info field overwritten (lengths, counts, types, values,
dims, offsets), cut short or with a byte changed, and an HF folder whose config.json holds random
JSON values. Describing and loading each gives a model (or its description) or one LoomError,
never another exception, within a time and memory bound far below the readers' limits."""

from __future__ import annotations

import functools
import itertools
import json
import shutil
import struct
import time
import tracemalloc
import warnings
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomlab.core.errors import LoomError
from loomlab.core.llm.files import gguf_file
from loomlab.core.llm.model.loader import ARCHITECTURES, load_causal_lm
from loomlab.core.llm.model.model_info import describe

TINY_LLAMA = Path(__file__).resolve().parents[3] / "data" / "tiny-hf" / "tiny-llama"
SECONDS = 2.0  # per input, describe and load together
PEAK_BYTES = 64 * 2**20  # the tiny models take under 2 MB
FUZZ = settings(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
# GGUF value types -> bytes of one value (7 bool; 8 string and 9 array have lengths)
VALUE_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
EDGES = [0, 1, 2, 3, 7, 8, 9, 12, 13, 31, 32, 33, 255, 2**16, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62,
         2**63 - 1, 2**63, 2**64 - 1]


@functools.cache
def tiny_tensors() -> tuple[tuple[str, np.ndarray, GGMLQuantizationType | None], ...]:
    """A 2-block llama's tensors (d=32, 2 heads over 1 KV head, 16 tokens): float32 embedding and
    norms, Q8_0 matrices."""
    d, ff, vocab, kv = 32, 32, 16, 16
    rng = np.random.default_rng(0)
    out = [("token_embd.weight", rng.standard_normal((vocab, d), dtype=np.float32), None),
           ("output_norm.weight", np.ones(d, np.float32), None)]
    shapes = {"attn_q": (d, d), "attn_k": (kv, d), "attn_v": (kv, d), "attn_output": (d, d),
              "ffn_gate": (ff, d), "ffn_up": (ff, d), "ffn_down": (d, ff)}
    q8 = GGMLQuantizationType.Q8_0
    for i in range(2):
        p = f"blk.{i}."
        out += [(f"{p}{stem}.weight", np.ones(d, np.float32), None) for stem in ("attn_norm", "ffn_norm")]
        out += [(f"{p}{stem}.weight", gguf.quants.quantize(rng.standard_normal(shape, np.float32), q8), q8)
                for stem, shape in shapes.items()]
    return tuple(out)


def write_tiny_gguf(path: Path, replace: dict[str, tuple] | None = None) -> Path:
    """:func:`tiny_tensors` as a GGUF with every kind of metadata value the readers meet;
    ``replace`` maps keys to new ``(value, GGUFValueType[, element type])``."""
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(2)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(32)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_token_list([f"t{i}" for i in range(16)])
    w.add_token_scores([0.0] * 16)
    w.add_add_bos_token(True)
    for key, value in (replace or {}).items():
        w.add_key_value(key, *value)
    for name, data, raw_dtype in tiny_tensors():
        w.add_tensor(name, data, raw_dtype=raw_dtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def gguf_fields(data: bytes) -> list[tuple[int, int, str]]:
    """(offset, width, kind) of every field of a GGUF header that is not text: version, counts, key
    and string lengths, metadata value types and array element types (kind "type"), scalar
    values, array counts, tensor dims, types and offsets."""
    out, pos = [(4, 4, "version"), (8, 8, "count"), (16, 8, "count")], 24
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)

    def field(width: int, kind: str) -> int:
        nonlocal pos
        out.append((pos, width, kind))
        value = int.from_bytes(data[pos:pos + width], "little")
        pos += width
        return value

    def string() -> None:
        nonlocal pos
        length = field(8, "length")
        pos += length

    for _ in range(n_kv):
        string()
        vtype = field(4, "type")
        if vtype == 8:
            string()
        elif vtype == 9:
            etype, count = field(4, "type"), field(8, "count")
            for _ in range(count):
                string() if etype == 8 else field(VALUE_BYTES[etype], "value")
        else:
            field(VALUE_BYTES[vtype], "value")
    for _ in range(n_tensors):
        string()
        for _ in range(field(4, "n_dims")):
            field(8, "dim")
        field(4, "ggml_type")
        field(8, "offset")
    return out


def within_bounds(*steps) -> None:
    """Run ``steps`` (describe, then load: the second reads all the first reads, and more) until
    one is refused: each gives a result or a LoomError, in time and memory, and no numpy overflow
    warning (a setting the checks let through that breaks the arithmetic)."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                for step in steps:
                    step()
        except LoomError:
            pass
        elapsed, (_, peak) = time.perf_counter() - start, tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < SECONDS and peak < PEAK_BYTES, (elapsed, peak)


def load_and_close(path: Path) -> None:
    load_causal_lm(path).source.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory) -> tuple[bytes, list[tuple[int, int, str]], Path]:
    folder = tmp_path_factory.mktemp("gguf")
    path = write_tiny_gguf(folder / "tiny.gguf")
    load_and_close(path)  # valid as written: a mutation is what breaks it
    data = path.read_bytes()
    return data, gguf_fields(data), folder


FILE_NUMBERS = itertools.count()


def check_gguf(folder: Path, data: bytes) -> None:
    path = folder / f"m{next(FILE_NUMBERS)}.gguf"  # a fresh file: a loaded model may still map the last one
    path.write_bytes(data)
    try:
        within_bounds(lambda: describe(path), lambda: load_and_close(path))
    finally:
        path.unlink()


def test_the_field_walk_covers_the_whole_header(tiny_gguf):
    data, fields, _ = tiny_gguf
    at, width, _ = fields[-1]
    tensor_data = -(-(at + width) // 32) * 32  # the default alignment
    embedding, norms = 16 * 32 * 4, (1 + 2 * 2) * 32 * 4  # float32
    matrices = 2 * (5 * 32 + 2 * 16) * 34  # Q8_0 rows of 32 values: q, o, gate, up, down; k, v
    assert len(fields) > 60 and len(data) == tensor_data + embedding + norms + matrices


V = gguf.GGUFValueType
# One value of each GGUF type, edges where a type has them.
EVERY_TYPE = [(0, V.UINT8), (-1, V.INT8), (2**32 - 1, V.UINT32), (-2**63, V.INT64),
              (float("inf"), V.FLOAT32), (float("nan"), V.FLOAT64), (1.5, V.FLOAT64), (True, V.BOOL),
              ("32", V.STRING), ([32, 2], V.ARRAY, V.UINT32), (["llama"], V.ARRAY, V.STRING)]


def test_every_metadata_key_holding_a_value_of_every_type_loads_or_is_refused(tiny_gguf):
    """Each key of the tiny model written with a value of each GGUF type in turn."""
    original, fields, folder = tiny_gguf
    with gguf_file.open_gguf(folder / "tiny.gguf") as f:
        keys = [k for k in f.metadata if not k.startswith("GGUF.")]
    assert len(keys) == 13
    for key in keys:
        for value in EVERY_TYPE:
            path = write_tiny_gguf(folder / "typed.gguf", {key: value})
            try:
                within_bounds(lambda: describe(path), lambda: load_and_close(path))  # noqa: B023
            finally:
                path.unlink()


@settings(FUZZ, max_examples=100)
@given(data=st.data())
def test_a_gguf_with_one_field_overwritten_loads_or_is_refused(tiny_gguf, data):
    original, fields, folder = tiny_gguf
    at, width, _ = data.draw(st.sampled_from(fields), label="field")
    value = data.draw(st.sampled_from(EDGES) | st.integers(0, 13) | st.integers(0, 2**64 - 1), label="value")
    value %= 1 << 8 * width
    check_gguf(folder, original[:at] + value.to_bytes(width, "little") + original[at + width:])


@settings(FUZZ, max_examples=60)
@given(data=st.data())
def test_a_gguf_cut_short_or_with_a_byte_changed_loads_or_is_refused(tiny_gguf, data):
    original, fields, folder = tiny_gguf
    header_end = fields[-1][0] + fields[-1][1]
    if data.draw(st.booleans(), label="cut"):
        changed = original[:data.draw(st.integers(0, len(original) - 1), label="length")]
    else:
        at = data.draw(st.integers(0, header_end - 1), label="at")
        changed = original[:at] + bytes([data.draw(st.integers(0, 255), label="byte")]) + original[at + 1:]
    check_gguf(folder, changed)


# ----- HF folders ----------------------------------------------------------------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 300) | st.sampled_from(EDGES) | st.integers(-2**70, 2**70)
    | st.floats() | st.text(max_size=6) | st.sampled_from(["default", "linear", "llama3", "yarn", "llama"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=5)
ROPE_KEYS = ["rope_type", "type", "rope_theta", "factor", "low_freq_factor", "high_freq_factor",
             "original_max_position_embeddings", "full_attention", "sliding_attention"]
ROPE = st.dictionaries(st.sampled_from(ROPE_KEYS), JSON | st.floats(0.5, 1e6), max_size=4)
CONFIG_KEYS = sorted({*json.loads((TINY_LLAMA / "config.json").read_text()), "sliding_window", "layer_types",
                      "rope_scaling", "rope_theta", "sliding_window_pattern", "query_pre_attn_scalar"})


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf")
    shutil.copyfile(TINY_LLAMA / "model.safetensors", folder / "model.safetensors")
    return folder


# one entry per block of the tiny model, so that the entries themselves are read
LAYER_TYPES = st.lists(st.sampled_from(["full_attention", "sliding_attention", [], {}]) | JSON, min_size=3,
                       max_size=3)


@settings(FUZZ, max_examples=60)
@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON, min_size=1, max_size=4),
       rope=st.none() | ROPE, layer_types=st.none() | LAYER_TYPES,
       model_type=st.sampled_from([*ARCHITECTURES, "x"]))
def test_an_hf_config_with_random_values_loads_or_is_refused(hf_folder, changes, rope, layer_types,
                                                             model_type):
    config = {**json.loads((TINY_LLAMA / "config.json").read_text()), "model_type": model_type, **changes}
    if rope is not None:
        config["rope_parameters" if "rope_parameters" not in changes else "rope_scaling"] = rope
    if layer_types is not None:
        config["layer_types"] = layer_types
    (hf_folder / "config.json").write_text(json.dumps(config))
    within_bounds(lambda: describe(hf_folder), lambda: load_and_close(hf_folder))
