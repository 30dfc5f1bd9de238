"""HF model directories: tensors read as the safetensors library reads them, sharded or not, and
bad headers, offsets and indexes raise one ModelFormatError quickly, without large allocations."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import ml_dtypes  # noqa: F401  registers bfloat16 with numpy, which safetensors.numpy needs
import numpy as np
import pytest
from safetensors import SafetensorError
from safetensors.numpy import load_file, save_file

from loomlab.core.errors import ModelFormatError
from loomlab.core.llm.files import hf_files
from loomlab.core.llm.files.hf_files import open_hf

from ...bad_input import raises_quickly_and_small

TINY = Path(__file__).resolve().parents[3] / "data" / "tiny-hf"
DTYPE_NAMES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(ml_dtypes.bfloat16): "BF16"}


def assert_same_tensors(model, reference: dict[str, np.ndarray]) -> None:
    assert set(model.tensors) == set(reference)
    for name, ref in reference.items():
        t = model.tensors[name]
        data = t.data()
        assert (t.name, t.shape, t.dtype) == (name, ref.shape, DTYPE_NAMES[ref.dtype])
        assert data.dtype == ref.dtype and not data.flags.writeable and not data.flags.owndata
        np.testing.assert_array_equal(data.view(np.uint8), ref.view(np.uint8), err_msg=name)


@pytest.mark.parametrize("name, dtype", [("tiny-llama", "F32"), ("tiny-qwen2", "BF16"),
                                         ("tiny-gemma3", "F32")])
def test_tiny_checkpoints_read_as_safetensors_reads_them(name, dtype):
    folder = TINY / name
    with open_hf(folder) as model:
        assert model.config == json.loads((folder / "config.json").read_text())
        assert {t.dtype for t in model.tensors.values()} == {dtype}
        assert_same_tensors(model, load_file(folder / "model.safetensors"))
        assert model.generation_config_json == folder / "generation_config.json"
        assert model.tokenizer_json is None and model.tokenizer_config_json is None


def test_bfloat16_widens_exactly():
    with open_hf(TINY / "tiny-qwen2") as model:
        t = model.tensors["model.embed_tokens.weight"]
        bits = t.data().view(np.uint16).astype(np.uint32) << 16
        np.testing.assert_array_equal(t.data().astype(np.float32), bits.view(np.float32))


def test_data_outlives_close_and_closed_files_refuse():
    model = open_hf(TINY / "tiny-llama")
    view = model.tensors["lm_head.weight"].data()
    model.close()
    ref = load_file(TINY / "tiny-llama" / "model.safetensors")["lm_head.weight"]
    np.testing.assert_array_equal(view, ref)
    with pytest.raises(ValueError, match="closed"):
        model.tensors["lm_head.weight"].data()


def make_sharded(tmp_path: Path, source: str = "tiny-llama") -> tuple[Path, dict[str, np.ndarray]]:
    """``source`` split in two shards plus an index, written by the safetensors library."""
    folder = tmp_path / "sharded"
    folder.mkdir()
    shutil.copy(TINY / source / "config.json", folder)
    tensors = load_file(TINY / source / "model.safetensors")
    names = sorted(tensors)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, folder / file)
    write_index(folder, {n: file for file, part in halves.items() for n in part})
    return folder, tensors


def write_index(folder: Path, weight_map: dict) -> None:
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))


@pytest.mark.parametrize("source", ["tiny-llama", "tiny-qwen2"])
def test_sharded_directory_reads_the_same_tensors(tmp_path, source):
    folder, tensors = make_sharded(tmp_path, source)
    with open_hf(folder) as model:
        assert_same_tensors(model, tensors)
        assert {t.file.name for t in model.tensors.values()} == {
            "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"}


def test_hub_cache_snapshot_symlinks_into_blobs_are_followed(tmp_path):
    repo = tmp_path / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        shutil.copy(TINY / "tiny-llama" / name, repo / "blobs" / f"blob-{name}")
        (snapshot / name).symlink_to(Path("..") / ".." / "blobs" / f"blob-{name}")
    with open_hf(snapshot) as model:
        assert_same_tensors(model, load_file(TINY / "tiny-llama" / "model.safetensors"))


# ---------------------------------------------------------------- bad files

def write_st(path: Path, header, data: bytes = b"", header_len: int | None = None) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if header_len is None else header_len) + raw + data)


def entry(dtype: str, shape: list, begin: int, end: int) -> dict:
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def single(tmp_path: Path, header, data: bytes = b"", header_len: int | None = None) -> Path:
    """A directory with a good config and a crafted model.safetensors."""
    folder = tmp_path / "model"
    folder.mkdir(parents=True)
    shutil.copy(TINY / "tiny-llama" / "config.json", folder)
    write_st(folder / "model.safetensors", header, data, header_len)
    return folder


def sparse_file_with_huge_header(tmp_path: Path) -> Path:
    folder = single(tmp_path, {}, header_len=150 << 20)
    with open(folder / "model.safetensors", "r+b") as f:
        f.truncate(200 << 20)  # sparse: the size is there, nothing is written
    return folder


def two_byte_file(tmp_path: Path) -> Path:
    folder = single(tmp_path, {})
    (folder / ST).write_bytes(b"\x01\x02")
    return folder


F8 = bytes(8)
ST = "model.safetensors"
BAD_SAFETENSORS = {
    "header length past the file": (lambda p: single(p, {}, header_len=1 << 40), f"{ST}:header_length", 0),
    "header length over 100 MB": (sparse_file_with_huge_header, f"{ST}:header_length", 0),
    "shorter than the length field": (two_byte_file, f"{ST}:header_length", 0),
    "invalid JSON": (lambda p: single(p, b'{"a": [1, 2'), f"{ST}:header", 19),
    "header not an object": (lambda p: single(p, [1, 2]), f"{ST}:header", 8),
    "deeply nested JSON": (lambda p: single(p, b"[" * 100000 + b"]" * 100000), f"{ST}:header", 8),
    "duplicate key": (lambda p: single(p, b'{"a": 1, "a": 2}'), f"{ST}:header", 8),
    "unsupported dtype": (lambda p: single(p, {"w": entry("I64", [1], 0, 8)}, F8), f"{ST}:w.dtype", 8),
    "entry missing keys": (lambda p: single(p, {"w": {"dtype": "F32"}}), f"{ST}:w", 8),
    "negative offset": (lambda p: single(p, {"w": entry("F32", [2], -8, 0)}, F8), f"{ST}:w.data_offsets", 8),
    "float offset": (lambda p: single(p, {"w": entry("F32", [2], 0.0, 8)}, F8), f"{ST}:w.data_offsets", 8),
    "end before begin": (lambda p: single(p, {"w": entry("F32", [0], 8, 0)}, F8), f"{ST}:w.data_offsets", 8),
    "bad shape": (lambda p: single(p, {"w": entry("F32", [-2], 0, 8)}, F8), f"{ST}:w.shape", 8),
    "past the data area": (lambda p: single(p, {"w": entry("F32", [2], 0, 1 << 40)}, F8),
                           f"{ST}:w.data_offsets", None),
    "shape does not fit the bytes": (lambda p: single(p, {"w": entry("F32", [3], 0, 8)}, F8),
                                     f"{ST}:w.data_offsets", None),
    "a thousand huge dims": (lambda p: single(p, {"w": entry("F32", [1 << 62] * 1000, 0, 8)}, F8),
                             f"{ST}:w.data_offsets", None),
    "overlapping": (lambda p: single(p, {"a": entry("F32", [2], 0, 8), "b": entry("F32", [1], 4, 8)}, F8),
                    f"{ST}:b.data_offsets", None),
    "hole": (lambda p: single(p, {"a": entry("F32", [1], 0, 4)}, F8), f"{ST}:data", None),
    "hole between tensors": (lambda p: single(p, {"a": entry("F16", [1], 0, 2), "b": entry("F16", [1], 4, 6)},
                                              bytes(6)), f"{ST}:b.data_offsets", None),
    "bad __metadata__": (lambda p: single(p, {"__metadata__": [1]}), f"{ST}:__metadata__", 8),
}


@pytest.mark.parametrize("case", list(BAD_SAFETENSORS), ids=list(BAD_SAFETENSORS))
def test_bad_safetensors_raise_one_typed_error_quickly_and_small(case, tmp_path):
    make, field, offset = BAD_SAFETENSORS[case]
    folder = make(tmp_path)
    error = open_expecting_error(folder)
    assert error.field == field, str(error)
    if offset is not None:
        assert error.offset == offset, str(error)
    assert error.offset is not None and 0 <= error.offset <= (folder / ST).stat().st_size


def open_expecting_error(folder: Path) -> ModelFormatError:
    return raises_quickly_and_small(lambda: open_hf(folder), ModelFormatError, seconds=1.0, peak_bytes=4e6)


def test_the_safetensors_library_also_rejects_the_offset_tricks(tmp_path):
    """Our strict tiling rule is the library's own: what it refuses, we refuse."""
    for case in ("overlapping", "hole", "hole between tensors", "past the data area"):
        folder = BAD_SAFETENSORS[case][0](tmp_path / case.replace(" ", "-"))
        with pytest.raises(SafetensorError):
            load_file(folder / ST)


def test_missing_or_bad_config(tmp_path):
    folder, _ = make_sharded(tmp_path)
    (folder / "config.json").write_text('{"model_type": "llama",}')
    error = open_expecting_error(folder)
    assert (error.field, error.offset) == ("config.json", 23)
    (folder / "config.json").write_text("[]")
    assert open_expecting_error(folder).field == "config.json"
    (folder / "config.json").unlink()
    assert "missing" in str(open_expecting_error(folder))


def test_no_weights_at_all(tmp_path):
    folder, _ = make_sharded(tmp_path)
    (folder / "model.safetensors.index.json").unlink()
    assert open_expecting_error(folder).field == "model.safetensors"


WM = "model.safetensors.index.json:weight_map"


@pytest.mark.parametrize("file", ["../outside.safetensors", "/etc/passwd", "sub/../../outside.safetensors"])
def test_index_naming_files_outside_the_directory(tmp_path, file):
    folder, tensors = make_sharded(tmp_path)
    save_file({"x": np.zeros(2, np.float32)}, tmp_path / "outside.safetensors")
    write_index(folder, {"x": file})
    error = open_expecting_error(folder)
    assert error.field == f"{WM}.x" and "not a file name inside" in str(error)


def test_symlink_leading_outside_the_directory(tmp_path):
    folder, _ = make_sharded(tmp_path)
    save_file({"x": np.zeros(2, np.float32)}, tmp_path / "outside.safetensors")
    (folder / "evil.safetensors").symlink_to(tmp_path / "outside.safetensors")
    write_index(folder, {"x": "evil.safetensors"})
    error = open_expecting_error(folder)
    assert error.field == f"{WM}.x" and "leads outside" in str(error)


def test_missing_shard(tmp_path):
    folder, _ = make_sharded(tmp_path)
    (folder / "model-00002-of-00002.safetensors").unlink()
    error = open_expecting_error(folder)
    assert error.field.startswith(f"{WM}.") and "missing" in str(error)


def test_index_lists_a_tensor_its_shard_lacks(tmp_path):
    folder, tensors = make_sharded(tmp_path)
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"]["ghost.weight"] = "model-00001-of-00002.safetensors"
    write_index(folder, index["weight_map"])
    error = open_expecting_error(folder)
    assert error.field == f"{WM}.ghost.weight" and "does not hold" in str(error)


@pytest.mark.parametrize("weight_map", [[], {}, {"x": 3}])
def test_malformed_weight_map(tmp_path, weight_map):
    folder, _ = make_sharded(tmp_path)
    write_index(folder, weight_map)
    assert open_expecting_error(folder).field.startswith(WM)


def test_bad_shard_header_is_named_by_its_file(tmp_path):
    folder, _ = make_sharded(tmp_path)
    write_st(folder / "model-00002-of-00002.safetensors", b"not json")
    assert open_expecting_error(folder).field == "model-00002-of-00002.safetensors:header"


def test_json_over_16_mib_is_refused_before_it_is_read(tmp_path):
    """JSON costs up to ~25 times its size as Python objects: a 100 MB header or a 64 MB index of
    ``[{}, {}, ...]`` would take gigabytes, so a header or a JSON file is at most 16 MiB."""
    limit = hf_files.MAX_HEADER_BYTES
    assert limit == hf_files.MAX_JSON_FILE_BYTES == 16 << 20
    header = json.dumps({"w": entry("F32", [2], 0, 8)}).encode()
    folder = single(tmp_path / "header", header.ljust(limit + 1), F8)  # JSON may end in spaces
    error = open_expecting_error(folder)
    assert (error.field, error.offset) == (f"{ST}:header_length", 0)
    size = 8 + limit + 1 + 8  # length, header, data
    assert error.detail == f"header of {limit + 1} bytes in a {size}-byte file (at most {limit} allowed)"
    shutil.rmtree(folder)
    folder = single(tmp_path / "header", header.ljust(limit), F8)
    with open_hf(folder) as model:
        assert model.tensors["w"].shape == (2,)
    config = folder / "config.json"
    config.write_bytes(config.read_bytes().ljust(limit + 1))
    error = open_expecting_error(folder)
    assert error.field == "config.json"
    assert error.detail == f"{limit + 1} bytes; a JSON file here is at most {limit}"


def test_an_index_checks_each_shard_path_once_not_once_per_tensor(tmp_path, monkeypatch):
    """Resolving a path is ~100 us: once per tensor it took 11 s of CPU for a 100,000-tensor index."""
    folder = tmp_path / "many"
    folder.mkdir()
    shutil.copy(TINY / "tiny-llama" / "config.json", folder)
    shards = {f"model-0000{k}-of-00002.safetensors": [f"t{k}.{i}" for i in range(1000)] for k in (1, 2)}
    for file, names in shards.items():
        save_file({n: np.zeros(1, np.float32) for n in names}, folder / file)
    write_index(folder, {n: file for file, names in shards.items() for n in names})
    resolved = []
    resolve = Path.resolve
    monkeypatch.setattr(Path, "resolve", lambda path, *a: resolved.append(path) or resolve(path, *a))
    with open_hf(folder) as model:
        assert len(model.tensors) == 2000
    # at most three per file checked (the file, the folder twice): config, index (found, read)
    # and each shard
    assert len(resolved) <= 3 * (3 + len(shards))
