"""Importance matrices (core/llm/quality/imatrix.py) against llama.cpp's llama-imatrix.

Oracles: ``tests/data/tiny-hf/tiny-<family>/imatrix.json``, written by
``tests/data/tiny-hf/make_imatrix_reference.py`` with torch (pre-hooks summing every nn.Linear's
input over the chunks llama-imatrix cuts); for the files, the layouts of imatrix.cpp's
``save_imatrix`` / ``save_imatrix_legacy`` built here byte by byte, and gguf-py's own reader.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType

from loomlab.core.errors import LoomCancelled, LoomConfigError, ModelFormatError
from loomlab.core.llm.files.gguf_file import open_gguf
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.quality.imatrix import (
    ImportanceMatrix,
    collect_imatrix,
    imatrix_chunks,
    legacy_bytes,
    read_imatrix,
    write_imatrix,
)

TINY = Path(__file__).resolve().parents[3] / "data" / "tiny-hf"
FAMILIES = ("llama", "gemma2", "phi3")  # plain, gelu + post-norms + tied head, fused Q/K/V and gate/up


@pytest.fixture(scope="module", params=FAMILIES)
def case(request):
    folder = TINY / f"tiny-{request.param}"
    return load_causal_lm(folder), json.loads((folder / "imatrix.json").read_text())


def test_chunks_are_cut_as_llama_imatrix_cuts_them(case):
    _, ref = case
    assert imatrix_chunks(ref["ids"], ref["ctx"], ref["bos"]) == ref["chunks"]
    assert imatrix_chunks(ref["ids"], ref["ctx"], ref["bos"], chunks=1) == ref["chunks"][:1]
    with pytest.raises(LoomConfigError, match="at least 2 × ctx"):
        imatrix_chunks(ref["ids"][:2 * ref["ctx"] - 1], ref["ctx"], ref["bos"])


def test_statistics_are_transformers_linear_inputs(case):
    net, ref = case
    im = collect_imatrix(net, ref["chunks"], datasets=["tiny.txt"], process_output=True)
    assert im.names == sorted(ref["tensors"])  # phi3: attn_qkv and ffn_up; a tied head: no output.weight
    assert (im.chunk_count, im.chunk_size, im.datasets) == (len(ref["chunks"]), ref["ctx"], ["tiny.txt"])
    for name, want in ref["tensors"].items():
        assert im.counts[name].tolist() == [want["count"]], name
        sum2, total = np.array(want["in_sum2"]), np.array(want["in_sum"])
        np.testing.assert_allclose(im.in_sum2[name][0], sum2, rtol=1e-4, atol=1e-6 * sum2.max(), err_msg=name)
        scale = np.sqrt(sum2 * want["count"]).max()  # a sum of signed values cancels: judge it by its size
        np.testing.assert_allclose(im.in_sum[name][0], total, atol=1e-5 * scale, err_msg=name)
        np.testing.assert_allclose(im.importance(name), sum2 / want["count"], rtol=1e-4,
                                   atol=1e-6 * sum2.max())


def test_the_head_only_on_request():
    net, ref = case_of("llama")
    names = collect_imatrix(net, ref["chunks"][:1]).names
    assert "output.weight" not in names and len(names) == 7 * net.args.num_layers


def test_mixture_of_experts_is_refused():
    net = load_causal_lm(TINY / "tiny-mixtral")
    with pytest.raises(LoomConfigError, match="mixture of experts"):
        collect_imatrix(net, [[1] * 16])


def test_cancel_stops_between_chunks():
    net, ref = case_of("llama")
    with pytest.raises(LoomCancelled):
        collect_imatrix(net, ref["chunks"], cancel=lambda: True)


def case_of(family: str):
    folder = TINY / f"tiny-{family}"
    return load_causal_lm(folder), json.loads((folder / "imatrix.json").read_text())


# ----- files ---------------------------------------------------------------------------------
def sample() -> ImportanceMatrix:
    """A dense tensor and a stacked one (3 experts, one never reached), as llama-imatrix keeps them."""
    rng = np.random.default_rng(0)
    dense, experts = "blk.0.attn_q.weight", "blk.1.ffn_up_exps.weight"
    return ImportanceMatrix(
        in_sum2={dense: rng.random((1, 8), np.float32) * 100,
                 experts: np.vstack([rng.random((2, 4), np.float32) * 50, np.zeros((1, 4), np.float32)])},
        counts={dense: np.array([64]), experts: np.array([40, 24, 0])},
        chunk_count=2, chunk_size=32, datasets=["calib.txt"],
        in_sum={dense: rng.standard_normal((1, 8)).astype(np.float32),
                experts: rng.standard_normal((3, 4)).astype(np.float32)})


def test_importance_is_sums_over_counts_and_one_where_unreached():
    im = sample()
    dense = "blk.0.attn_q.weight"
    np.testing.assert_array_equal(im.importance(dense), im.in_sum2[dense][0] / np.float32(64))
    got = im.importance("blk.1.ffn_up_exps.weight")
    np.testing.assert_allclose(got[:2], im.in_sum2["blk.1.ffn_up_exps.weight"][:2] / np.array([[40], [24]]),
                               rtol=1e-7)
    assert got.shape == (3, 4) and (got[2] == 1).all()


def test_gguf_round_trip_and_the_layout_llama_cpp_reads(tmp_path):
    im, path = sample(), tmp_path / "m.imatrix"
    write_imatrix(im, path)
    back = read_imatrix(path)
    assert (back.names, back.chunk_count, back.chunk_size, back.datasets) == (im.names, 2, 32, ["calib.txt"])
    for name in im.names:
        np.testing.assert_array_equal(back.in_sum2[name], im.in_sum2[name])
        np.testing.assert_array_equal(back.in_sum[name], im.in_sum[name])
        np.testing.assert_array_equal(back.counts[name], im.counts[name])

    r = GGUFReader(path)
    assert set(r.fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"} == {
        "general.type", "imatrix.datasets", "imatrix.chunk_count", "imatrix.chunk_size"}
    f = r.fields["general.type"]
    assert bytes(f.parts[f.data[0]]).decode() == "imatrix"
    f = r.fields["imatrix.datasets"]
    assert f.types == [GGUFValueType.ARRAY, GGUFValueType.STRING]
    assert [bytes(f.parts[i]).decode() for i in f.data] == ["calib.txt"]
    for key, want in (("imatrix.chunk_count", 2), ("imatrix.chunk_size", 32)):
        assert r.fields[key].types == [GGUFValueType.UINT32] and r.fields[key].contents() == want
    # sorted names; per name in_sum2, counts, in_sum; ggml's ne (a dense tensor's trailing 1 dropped)
    shapes = {t.name: (t.tensor_type.name, [int(d) for d in t.shape]) for t in r.tensors}
    assert [t.name for t in r.tensors] == [f"{name}.{part}" for name in im.names
                                           for part in ("in_sum2", "counts", "in_sum")]
    assert shapes["blk.0.attn_q.weight.in_sum2"] == ("F32", [8])
    assert shapes["blk.0.attn_q.weight.counts"] == ("F32", [1])
    assert shapes["blk.1.ffn_up_exps.weight.in_sum2"] == ("F32", [4, 3])
    assert shapes["blk.1.ffn_up_exps.weight.counts"] == ("F32", [1, 3])
    counts = next(t for t in r.tensors if t.name == "blk.1.ffn_up_exps.weight.counts")
    assert counts.data.reshape(-1).tolist() == [40.0, 24.0, 0.0]


def test_an_empty_dataset_list_is_written_as_an_empty_array(tmp_path):
    im = sample()
    im.datasets = []
    write_imatrix(im, tmp_path / "m.gguf")
    assert read_imatrix(tmp_path / "m.gguf").datasets == []


def legacy_file(entries, chunk_count: int | None = None, dataset: bytes | None = None) -> bytes:
    """save_imatrix_legacy's layout: int32 n_entries; per entry int32 name length, the name, int32
    ncall, int32 nval, float32 values; then int32 chunk count, int32 length, the dataset name."""
    out = struct.pack("<i", len(entries))
    for name, ncall, values in entries:
        raw = name.encode()
        out += struct.pack("<i", len(raw)) + raw + struct.pack("<ii", ncall, len(values))
        out += np.asarray(values, "<f4").tobytes()
    if chunk_count is not None:
        out += struct.pack("<i", chunk_count)
    if dataset is not None:
        out += struct.pack("<i", len(dataset)) + dataset
    return out


def test_a_hand_made_legacy_file_reads_as_llama_cpp_reads_it(tmp_path):
    path = tmp_path / "old.dat"
    path.write_bytes(legacy_file([("blk.0.ffn_down.weight", 3, [0.75, 3.0, 6.0]),
                                  ("blk.0.attn_k.weight", 1, [2.0, 0.5])], 3, b"wiki.train.raw"))
    im = read_imatrix(path)  # chunk size: llama.cpp's default --ctx, 512
    assert (im.chunk_count, im.chunk_size, im.datasets) == (3, 512, ["wiki.train.raw"])
    assert im.counts["blk.0.ffn_down.weight"].tolist() == [3 * 512]
    np.testing.assert_array_equal(im.in_sum2["blk.0.ffn_down.weight"][0], np.float32([0.75, 3.0, 6.0]) * 512)
    np.testing.assert_allclose(im.importance("blk.0.ffn_down.weight"), [0.25, 1.0, 2.0], rtol=1e-7)
    np.testing.assert_allclose(im.importance("blk.0.attn_k.weight"), [2.0, 0.5], rtol=1e-7)
    assert not im.in_sum
    assert read_imatrix(path, chunk_size=64).counts["blk.0.attn_k.weight"].tolist() == [64]
    path.write_bytes(legacy_file([("blk.0.attn_k.weight", 2, [2.0, 0.5])]))  # the oldest files end there
    old = read_imatrix(path)
    assert (old.chunk_count, old.datasets) == (2, [])


def test_legacy_round_trip_keeps_the_importance(tmp_path):
    im, path = sample(), tmp_path / "m.dat"
    write_imatrix(im, path, output_format="dat")
    data = path.read_bytes()
    assert data == legacy_bytes(im)
    # the layout: entries sorted by name; ncall = ceil(max count / chunk size); values * ncall / count
    assert struct.unpack_from("<i", data)[0] == 2
    name_len = struct.unpack_from("<i", data, 4)[0]
    assert data[8:8 + name_len] == b"blk.0.attn_q.weight"
    assert struct.unpack_from("<ii", data, 8 + name_len) == (2, 8)  # ceil(64 / 32) calls
    assert data.endswith(struct.pack("<i", 2) + struct.pack("<i", 9) + b"calib.txt")
    back = read_imatrix(path, chunk_size=im.chunk_size)
    assert back.chunk_count == 2 and back.datasets == ["calib.txt"]
    np.testing.assert_allclose(back.importance("blk.0.attn_q.weight"), im.importance("blk.0.attn_q.weight"),
                               rtol=1e-6)
    # a stacked tensor is one entry of n_mat * n_per_row values, an unreached expert's stored as 1 * ncall
    got = back.importance("blk.1.ffn_up_exps.weight").reshape(3, 4)
    np.testing.assert_allclose(got, im.importance("blk.1.ffn_up_exps.weight"), rtol=1e-6)


BAD_LEGACY = {
    "empty": b"",
    "wrong magic, short": b"GGU",
    "huge entry count": struct.pack("<i", 2**31 - 1) + b"\0" * 64,
    "negative entry count": struct.pack("<i", -5) + b"\0" * 64,
    "huge name length": struct.pack("<ii", 1, 2**31 - 1) + b"\0" * 64,
    "huge value count": legacy_file([("a", 1, [1.0])])[:13] + struct.pack("<i", 2**30) + b"\0" * 16,
    "truncated values": legacy_file([("a.weight", 1, [1.0, 2.0, 3.0])])[:-5],
    "negative ncall": legacy_file([("a.weight", -1, [1.0])], 1, b""),
    "duplicate name": legacy_file([("a.weight", 1, [1.0]), ("a.weight", 1, [1.0])], 1, b""),
    "dataset past the end": legacy_file([("a.weight", 1, [1.0])], 1) + struct.pack("<i", 1000) + b"x",
    "trailing bytes": legacy_file([("a.weight", 1, [1.0])], 1, b"d") + b"junk",
    "text file": b"this is not an importance matrix\n" * 10,
}


@pytest.mark.parametrize("what", list(BAD_LEGACY))
def test_bad_legacy_files_raise_one_error_fast(tmp_path, what):
    path = tmp_path / "bad.dat"
    path.write_bytes(BAD_LEGACY[what])
    t = time.perf_counter()
    with pytest.raises(ModelFormatError):
        read_imatrix(path)
    assert time.perf_counter() - t < 0.5


def test_bad_gguf_files_raise_one_error(tmp_path):
    path = tmp_path / "m.gguf"
    write_imatrix(sample(), path)
    whole = path.read_bytes()
    with open_gguf(path) as g:
        end = max(t.offset + t.nbytes for t in g.tensors.values())  # the file's padding follows
    for cut in (10, 60, len(whole) // 2, end - 3):
        path.write_bytes(whole[:cut])
        with pytest.raises(ModelFormatError):
            read_imatrix(path)
    # a string array claiming 2^62 entries: refused from the header, nothing allocated
    at = whole.index(b"imatrix.datasets") + len(b"imatrix.datasets") + 8  # after the value and element types
    path.write_bytes(whole[:at] + struct.pack("<Q", 2**62) + whole[at + 8:])
    t = time.perf_counter()
    with pytest.raises(ModelFormatError):
        read_imatrix(path)
    assert time.perf_counter() - t < 0.5
    path.write_bytes(whole.replace(b"blk.0.attn_q.weight.counts", b"blk.0.attn_q.weight.countz"))
    with pytest.raises(ModelFormatError, match="not both"):
        read_imatrix(path)
    path.write_bytes(whole.replace(b"imatrix.chunk_size", b"imatrix.chunk_sizz"))
    with pytest.raises(ModelFormatError, match="imatrix.chunk_size"):
        read_imatrix(path)
