"""The GGUF reader: the two built-in models read as gguf-py reads them, and every kind of bad
file raises one ModelFormatError quickly, without large allocations."""

from __future__ import annotations

import struct
import time

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader

from loomlab.core.errors import ModelFormatError
from loomlab.core.llm.files import gguf_file, registry
from loomlab.core.llm.files.gguf_file import open_gguf

from ...bad_input import raises_quickly_and_small

# ---------------------------------------------------------------- real files, against gguf-py


@pytest.fixture(scope="module")
def smollm2():
    path = registry.fetch("smollm2-135m")
    with open_gguf(path) as f:
        yield f, GGUFReader(path)


@pytest.fixture(scope="module")
def gemma():
    path = registry.fetch("gemma3-270m")
    with open_gguf(path) as f:
        yield f, GGUFReader(path)


def test_smollm2_metadata_matches_the_facts(smollm2):
    f, _ = smollm2
    m = f.metadata
    assert (f.version, f.architecture, f.alignment) == (3, "llama", 32)
    assert (m["llama.block_count"], m["llama.embedding_length"]) == (30, 576)
    assert (m["llama.attention.head_count"], m["llama.attention.head_count_kv"]) == (9, 3)
    assert (m["llama.feed_forward_length"], m["llama.rope.freq_base"]) == (1536, 100000.0)
    assert m["llama.context_length"] == 8192
    assert m["tokenizer.ggml.model"] == "gpt2" and len(m["tokenizer.ggml.tokens"]) == 49152
    assert "tokenizer.chat_template" in m and "output.weight" not in f.tensors  # tied embeddings
    emb = f.tensors["token_embd.weight"]
    assert (emb.type_name, emb.shape, emb.data().shape) == ("Q8_0", (49152, 576), (49152, 612))
    attn = [f.tensors[f"blk.{i}.attn_{w}.weight"] for i in range(30) for w in ("q", "k", "v", "output")]
    assert len(attn) == 4 * 30 and {t.type_name for t in attn} == {"Q4_1"}
    assert f.tensors["blk.0.attn_k.weight"].shape == (3 * 64, 576)


def test_gemma_metadata_matches_the_facts(gemma):
    f, _ = gemma
    m = f.metadata
    assert f.architecture == "gemma3"
    assert (m["gemma3.block_count"], m["gemma3.embedding_length"]) == (18, 640)
    assert (m["gemma3.attention.head_count"], m["gemma3.attention.head_count_kv"]) == (4, 1)
    assert (m["gemma3.attention.key_length"], m["gemma3.feed_forward_length"]) == (256, 2048)
    assert (m["gemma3.attention.sliding_window"], m["gemma3.rope.freq_base"]) == (512, 1e6)
    assert len(m["tokenizer.ggml.tokens"]) == 262144 == m["tokenizer.ggml.scores"].shape[0]
    assert "tokenizer.chat_template" not in m
    types = {t.type_name for t in f.tensors.values()}
    assert types == {"F32", "Q5_0", "Q4_K", "Q6_K", "Q8_0"}
    assert f.tensors["token_embd.weight"].shape == (262144, 640)


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_every_field_and_tensor_record_matches_gguf_py(model, request):
    f, reader = request.getfixturevalue(model)
    fields = {k: v for k, v in reader.fields.items() if not k.startswith("GGUF.")}
    assert list(f.metadata) == list(fields)
    for key, field in fields.items():
        ours = f.metadata[key]
        assert (ours.tolist() if isinstance(ours, np.ndarray) else ours) == field.contents(), key
    assert list(f.tensors) == [t.name for t in reader.tensors]
    for rt in reader.tensors:
        t = f.tensors[rt.name]
        assert (t.shape, t.ggml_type, t.offset, t.nbytes) == (
            tuple(int(d) for d in reversed(rt.shape)), int(rt.tensor_type), rt.data_offset, rt.n_bytes)
        assert t.data().shape == rt.data.shape and t.n_elements == rt.n_elements


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_dequantized_data_equals_gguf_py_for_each_type(model, request):
    f, reader = request.getfixturevalue(model)
    smallest_of_type = {}
    for rt in sorted(reader.tensors, key=lambda rt: rt.n_bytes):
        smallest_of_type.setdefault(rt.tensor_type, rt)
    for qtype, rt in smallest_of_type.items():
        data = f.tensors[rt.name].data()
        assert not data.flags.owndata and not data.flags.writeable  # a view of the read-only map
        ours = gguf.quants.dequantize(data[:512], qtype)  # the first rows keep the test quick
        np.testing.assert_array_equal(ours, gguf.quants.dequantize(rt.data[:512], qtype), err_msg=rt.name)
        assert ours.shape[1:] == f.tensors[rt.name].shape[1:]


def _rss_bytes() -> int:
    with open("/proc/self/status") as s:
        return next(int(line.split()[1]) * 1024 for line in s if line.startswith("VmRSS:"))


def test_opening_smollm2_is_quick_and_reads_no_tensor_data():
    path = registry.fetch("smollm2-135m")
    open_gguf(path).close()  # warm the page cache and imports so the second open is the one timed
    rss = _rss_bytes()
    start = time.perf_counter()
    f = open_gguf(path)
    elapsed = time.perf_counter() - start
    grown = _rss_bytes() - rss
    f.close()
    assert elapsed < 1.0, f"open took {elapsed:.3f} s"
    # 98 MB of tensors; the vocabulary and merges as Python strings are ~10 MB
    assert grown < 40e6, f"RSS grew {grown / 1e6:.1f} MB"


def test_data_outlives_close_and_closed_file_refuses(smollm2):
    path = smollm2[0].path
    f = open_gguf(path)
    view = f.tensors["blk.0.attn_norm.weight"].data()
    f.close()
    np.testing.assert_array_equal(view, smollm2[0].tensors["blk.0.attn_norm.weight"].data())
    with pytest.raises(ValueError, match="closed"):
        f.tensors["blk.0.attn_norm.weight"].data()


def test_require_names_the_missing_or_mistyped_key(smollm2):
    f = smollm2[0]
    assert f.require("llama.block_count", int) == 30
    assert f.require("llama.rope.freq_base", float) == 100000.0
    assert isinstance(f.require("llama.block_count", float), float)
    assert f.require("tokenizer.ggml.add_bos_token") is False
    with pytest.raises(ModelFormatError):
        f.require("tokenizer.ggml.add_bos_token", int)
    with pytest.raises(ModelFormatError) as e:
        f.require("llama.nope", int)
    assert e.value.field == "llama.nope"
    with pytest.raises(ModelFormatError) as e:
        f.require("general.name", int)
    assert e.value.field == "general.name" and e.value.offset is not None


# ---------------------------------------------------------------- crafted files

U8, U32, I64, F32, F64, BOOL, STR, ARR = 0, 4, 11, 6, 12, 7, 8, 9


def s(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def kv(key: str, vtype: int, payload: bytes) -> bytes:
    return s(key) + struct.pack("<I", vtype) + payload


def info(name: str, dims: list[int], qtype: int, offset: int) -> bytes:
    return (s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
            + struct.pack("<IQ", qtype, offset))


RNG = np.random.default_rng(0)
W = RNG.standard_normal((2, 32)).astype(np.float32)
QW = gguf.quants.quantize(RNG.standard_normal((3, 32)).astype(np.float32), Q.Q8_0)
H = RNG.standard_normal(8).astype(np.float16)
DATA = W.tobytes() + QW.tobytes() + bytes(384 - 256 - QW.nbytes) + H.tobytes()


def base_kvs() -> list[bytes]:
    return [kv("general.architecture", STR, s("llama")),
            kv("llama.block_count", U32, struct.pack("<I", 2)),
            kv("llama.rope.freq_base", F32, struct.pack("<f", 10000.0)),
            kv("test.negative", I64, struct.pack("<q", -5)),
            kv("test.f64", F64, struct.pack("<d", 0.1)),
            kv("test.flag", BOOL, b"\x01"),
            kv("tokenizer.ggml.tokens", ARR, struct.pack("<IQ", STR, 3) + s("a") + s("b") + s("<s>")),
            kv("tokenizer.ggml.scores", ARR, struct.pack("<IQ3f", F32, 3, 0.5, -1.0, 2.0))]


def base_infos() -> list[bytes]:
    return [info("w", [32, 2], Q.F32, 0), info("q", [32, 3], Q.Q8_0, 256), info("h", [8], Q.F16, 384)]


def build(kvs=None, infos=None, data=DATA, *, magic=b"GGUF", version=3, n_tensors=None, n_kv=None,
          alignment=32) -> bytes:
    kvs = base_kvs() if kvs is None else kvs
    infos = base_infos() if infos is None else infos
    head = struct.pack("<4sIQQ", magic, version, len(infos) if n_tensors is None else n_tensors,
                       len(kvs) if n_kv is None else n_kv) + b"".join(kvs) + b"".join(infos)
    return head + bytes(-len(head) % alignment) + data


def test_crafted_base_file_reads_as_gguf_py_reads_it(tmp_path):
    path = tmp_path / "base.gguf"
    path.write_bytes(build())
    with open_gguf(path) as f:
        m = f.metadata
        assert m["general.architecture"] == "llama" and m["llama.block_count"] == 2
        assert m["test.negative"] == -5 and m["test.f64"] == 0.1 and m["test.flag"] is True
        assert m["tokenizer.ggml.tokens"] == ["a", "b", "<s>"]
        np.testing.assert_array_equal(m["tokenizer.ggml.scores"], [0.5, -1.0, 2.0])
        w, q, h = (f.tensors[n] for n in "wqh")
        assert (w.shape, q.shape, h.shape, q.type_name) == ((2, 32), (3, 32), (8,), "Q8_0")
        np.testing.assert_array_equal(w.data(), W)
        np.testing.assert_array_equal(h.data(), H)
        np.testing.assert_array_equal(q.data(), QW)
        reader = GGUFReader(path)
        for rt in reader.tensors:
            np.testing.assert_array_equal(f.tensors[rt.name].data(), rt.data)
        assert reader.fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "<s>"]


def test_gguf_writer_output_reads_back(tmp_path):
    path = tmp_path / "writer.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_array("test.ints", [1, 2, 3])
    writer.add_string("test.text", "héllo")
    x = RNG.standard_normal((4, 256)).astype(np.float32)
    for name, qtype in (("q4_0", Q.Q4_0), ("q5_0", Q.Q5_0), ("q8", Q.Q8_0)):  # no K-quantizer in gguf-py
        writer.add_tensor(name, gguf.quants.quantize(x, qtype), raw_dtype=qtype)
    writer.add_tensor("f", x)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = GGUFReader(path)
    with open_gguf(path) as f:
        assert f.architecture == "llama" and f.metadata["llama.block_count"] == 2
        assert f.metadata["test.text"] == "héllo" and f.metadata["test.ints"].tolist() == [1, 2, 3]
        for rt in reader.tensors:
            t = f.tensors[rt.name]
            assert t.shape == (4, 256)
            np.testing.assert_array_equal(gguf.quants.dequantize(t.data(), rt.tensor_type),
                                          gguf.quants.dequantize(rt.data, rt.tensor_type))


def header_size() -> int:
    """Bytes of the base file before the alignment padding."""
    return 24 + sum(map(len, base_kvs())) + sum(map(len, base_infos()))


def _kvs_with(*extra: bytes) -> list[bytes]:
    return base_kvs() + list(extra)


def _infos_with(index: int, replacement: bytes) -> list[bytes]:
    infos = base_infos()
    infos[index] = replacement
    return infos


BIG = 1 << 63
BAD_FILES = {
    "magic": (lambda: build(magic=b"GGML"), "magic"),
    "version 1": (lambda: build(version=1), "version"),
    "big-endian": (lambda: build(version=3 << 24), "version"),
    "tensor count 2^63": (lambda: build(n_tensors=BIG), "tensor_count"),
    "kv count 2^63": (lambda: build(n_kv=BIG), "kv_count"),
    "key longer than the file": (lambda: build([struct.pack("<Q", BIG)]), "metadata[0].key"),
    "string longer than the file": (
        lambda: build(_kvs_with(kv("general.name", STR, struct.pack("<Q", 1 << 40) + b"x"))), "general.name"),
    "string one byte too long": (
        lambda: build([kv("general.name", STR, struct.pack("<Q", 4) + b"abc")], [], b"", alignment=1),
        "general.name"),
    "array of 2^62 ints": (lambda: build(_kvs_with(kv("a", ARR, struct.pack("<IQ", U32, 1 << 62)))), "a"),
    "array of 2^62 strings": (lambda: build(_kvs_with(kv("a", ARR, struct.pack("<IQ", STR, 1 << 62)))), "a"),
    "nested array": (lambda: build(_kvs_with(kv("a", ARR, struct.pack("<IQ", ARR, 1) + struct.pack(
        "<IQ", U8, 1) + b"\x01"))), "a"),
    "unknown value type": (lambda: build(_kvs_with(kv("a", 13, b"\0" * 8))), "a"),
    "unknown array type": (lambda: build(_kvs_with(kv("a", ARR, struct.pack("<IQ", 99, 1)))), "a"),
    "bool of 2": (lambda: build(_kvs_with(kv("a", BOOL, b"\x02"))), "a"),
    "invalid utf-8": (lambda: build(_kvs_with(kv("a", STR, s(b"\xff\xfe")))), "a"),
    "duplicate key": (lambda: build(_kvs_with(kv("llama.block_count", U32, b"\0" * 4))), "llama.block_count"),
    "alignment 3": (lambda: build(_kvs_with(kv("general.alignment", U32, struct.pack("<I", 3)))),
                    "general.alignment"),
    "5 dims": (lambda: build(infos=_infos_with(2, info("h", [8, 1, 1, 1, 1], Q.F16, 384))), "h.n_dims"),
    "0 dims": (lambda: build(infos=_infos_with(2, info("h", [], Q.F16, 384))), "h.n_dims"),
    "zero dim": (lambda: build(infos=_infos_with(2, info("h", [8, 0], Q.F16, 384))), "h.dims"),
    "negative dim": (lambda: build(infos=_infos_with(2, info("h", [8, BIG], Q.F16, 384))), "h.dims"),
    "dims overflow int64": (lambda: build(infos=_infos_with(2, info("h", [1 << 32, 1 << 32], Q.F16, 384))),
                            "h.dims"),
    "size beyond the file": (lambda: build(infos=_infos_with(2, info("h", [1 << 20, 1 << 20], Q.F16, 384))),
                             "h.offset"),
    "data past the end": (lambda: build(infos=_infos_with(2, info("h", [8], Q.F16, 1 << 20))), "h.offset"),
    "offset 2^64-1": (lambda: build(infos=_infos_with(2, info("h", [8], Q.F16, (1 << 64) - 32))), "h.offset"),
    "one byte past the end": (lambda: build(data=DATA[:-1]), "h.offset"),
    "overlapping": (lambda: build(infos=_infos_with(1, info("q", [32, 3], Q.Q8_0, 224))), "q.offset"),
    "misaligned": (lambda: build(infos=_infos_with(2, info("h", [8], Q.F16, 370))), "h.offset"),
    "unknown ggml type": (lambda: build(infos=_infos_with(2, info("h", [8], 99, 384))), "h.type"),
    "removed ggml type Q4_2": (lambda: build(infos=_infos_with(2, info("h", [8], 4, 384))), "h.type"),
    "row not whole blocks": (lambda: build(infos=_infos_with(1, info("q", [16, 6], Q.Q8_0, 256))), "q.dims"),
    "duplicate tensor": (lambda: build(infos=_infos_with(2, info("w", [8], Q.F16, 384))), "w"),
    "empty tensor name": (lambda: build(infos=_infos_with(2, info("", [8], Q.F16, 384))), "tensors[2].name"),
    "truncated tensor infos": (lambda: build()[:header_size() - 6], "h.offset"),
    "too short for a header": (lambda: b"GGUF\x03\0\0\0", "header"),
}


@pytest.mark.parametrize("case", list(BAD_FILES), ids=list(BAD_FILES))
def test_bad_file_raises_one_typed_error_quickly_and_small(case, tmp_path):
    make, field = BAD_FILES[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(make())
    error = raises_quickly_and_small(lambda: open_gguf(path), ModelFormatError, seconds=0.5, peak_bytes=2e6)
    assert error.field == field, str(error)
    assert error.offset is not None and 0 <= error.offset <= path.stat().st_size, str(error)


def test_error_offsets_point_at_the_culprit(tmp_path):
    path = tmp_path / "bad.gguf"
    raw = build(infos=_infos_with(2, info("h", [8], 99, 384)))
    path.write_bytes(raw)
    with pytest.raises(ModelFormatError, match=r"h\.type at byte \d+: unknown ggml type 99") as e:
        open_gguf(path)
    assert raw[e.value.offset:e.value.offset + 9] == s("h")  # the tensor info's start


def test_every_truncation_and_byte_flip_of_the_header_is_a_format_error(tmp_path):
    raw = build()
    header_end = header_size()
    path = tmp_path / "fuzz.gguf"
    for cut in range(header_end):
        path.write_bytes(raw[:cut])
        with pytest.raises(ModelFormatError):
            open_gguf(path)
    for pos in range(header_end):
        for value in (0x00, 0x7F, 0xFF):
            path.write_bytes(raw[:pos] + bytes([value]) + raw[pos + 1:])
            try:
                open_gguf(path).close()
            except ModelFormatError:
                pass


# ---------------------------------------------------------------- counts the file size allows


def _raises_at_once(tmp_path, raw: bytes) -> ModelFormatError:
    path = tmp_path / "many.gguf"
    path.write_bytes(raw)
    return raises_quickly_and_small(lambda: open_gguf(path), ModelFormatError, seconds=0.5, peak_bytes=2e6)


def test_more_metadata_pairs_than_any_model_has_are_refused_before_reading_them(tmp_path):
    """Each pair costs Python objects: 65,537 pairs read in ~5 s; the 18 million a 256 MB file
    can hold would take gigabytes."""
    pairs = [kv(f"k{i:07d}", BOOL, b"\x01") for i in range(gguf_file.MAX_KV + 1)]
    error = _raises_at_once(tmp_path, build(pairs, [], b""))
    assert (error.field, error.offset) == ("kv_count", 16)
    assert error.detail == f"{gguf_file.MAX_KV + 1} metadata pairs; at most {gguf_file.MAX_KV} are read"


def test_more_tensors_than_any_model_has_are_refused_before_reading_them(tmp_path):
    n = gguf_file.MAX_TENSORS + 1
    infos = [info(f"t{i}", [8], Q.F16, 32 * i) for i in range(n)]
    error = _raises_at_once(tmp_path, build([], infos, bytes(32 * n)))
    assert (error.field, error.offset) == ("tensor_count", 8)
    assert error.detail == f"{n} tensors; at most {gguf_file.MAX_TENSORS} are read"


def test_more_strings_than_any_vocabulary_has_are_refused_before_reading_them(tmp_path):
    n = gguf_file.MAX_STRINGS + 1
    empty_strings = struct.pack("<IQ", STR, n) + bytes(8 * n)
    error = _raises_at_once(tmp_path, build(_kvs_with(kv("a", ARR, empty_strings))))
    assert error.field == "a" and f"array of {n} strings" in error.detail


def test_the_string_limit_counts_every_array_of_the_metadata(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_file, "MAX_STRINGS", 5)  # the base file's tokens are 3 of them
    path = tmp_path / "two.gguf"
    path.write_bytes(build(_kvs_with(kv("b", ARR, struct.pack("<IQ", STR, 2) + s("x") + s("y")))))
    assert len(open_gguf(path).metadata["b"]) == 2
    path.write_bytes(build(_kvs_with(kv("b", ARR, struct.pack("<IQ", STR, 3) + s("x") + s("y") + s("z")))))
    with pytest.raises(ModelFormatError, match="array of 3 strings; the metadata's arrays may hold 5") as e:
        open_gguf(path)
    assert e.value.field == "b"
