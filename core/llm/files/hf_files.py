"""HF model directories: config.json plus safetensors weights (one file or a sharded index).

The safetensors header (8-byte little-endian length, then JSON) is parsed here with bounds, not
by the safetensors library: a header length past the file or over 16 MiB, bad JSON, unsupported
dtypes, a shape that does not match its byte range, and byte ranges that leave the data area,
overlap or leave holes all raise ModelFormatError. An index may only name files inside the
model directory; a symlink is followed only to a target inside the directory, or, for a
snapshot of the HF hub cache, inside that repository's ``blobs`` folder.

``HFTensor.data()`` is a read-only zero-copy view of the memory-mapped file: float32, float16,
or ``ml_dtypes.bfloat16`` for BF16 (``.astype(np.float32)`` widens it exactly).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from ...errors import ModelFormatError
from .mapped import MappedFile

CONFIG = "config.json"
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
GENERATION_CONFIG = "generation_config.json"
# JSON costs up to ~25 times its size as Python objects (``[{}, {}, ...]``), so a header or a
# config / index file is at most 16 MiB (~400 MB parsed): a header this size lists ~150,000
# tensors, an index ~180,000 (the largest real ones list under 100,000).
MAX_HEADER_BYTES = 16 * 1024 * 1024
MAX_JSON_FILE_BYTES = 16 * 1024 * 1024
DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype(ml_dtypes.bfloat16)}
_LEN = struct.Struct("<Q")


@dataclass(frozen=True, eq=False)
class HFTensor:
    """One tensor of a safetensors file; ``offset`` is the absolute byte offset in ``file``."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # "F32", "F16" or "BF16"
    file: Path
    offset: int
    nbytes: int
    _shard: MappedFile = field(repr=False)

    def data(self) -> np.ndarray:
        """A read-only zero-copy view shaped ``shape`` (BF16 as ``ml_dtypes.bfloat16``)."""
        raw = self._shard.bytes()[self.offset:self.offset + self.nbytes]
        return raw.view(DTYPES[self.dtype]).reshape(self.shape)


class HFFiles:
    """An opened HF model directory. Use :func:`open_hf`; close it (or use ``with``).

    ``tensors`` follows the order of the file (single) or of the index's ``weight_map``
    (sharded); a shard's tensors that the index does not list are left out, as transformers
    would report them unexpected. Tokenizer and generation files are ``None`` when absent.
    """

    def __init__(self, path: Path, config: dict[str, Any], shards: list[MappedFile],
                 tensors: dict[str, HFTensor]):
        self.path = path
        self.config = config
        self.tensors = tensors
        self.tokenizer_json = _optional(path, TOKENIZER_JSON)
        self.tokenizer_config_json = _optional(path, TOKENIZER_CONFIG)
        self.generation_config_json = _optional(path, GENERATION_CONFIG)
        self._shards = shards

    def close(self) -> None:
        """Drop the mappings; arrays already returned by ``data()`` keep theirs alive."""
        for shard in self._shards:
            shard.close()

    def __enter__(self) -> HFFiles:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"HFFiles({str(self.path)!r}, tensors={len(self.tensors)}, shards={len(self._shards)})"


def open_hf(path: str | os.PathLike[str]) -> HFFiles:
    """Open an HF model directory: ``config.json`` and ``model.safetensors`` (preferred, as in
    transformers) or ``model.safetensors.index.json`` with its shards.

    Raises ModelFormatError(field, message, offset) for a missing or malformed config, index or
    safetensors file, and for files that leave the directory.
    """
    root = Path(path)
    if not root.is_dir():
        raise ModelFormatError(str(root), "not a directory (an HF model is a folder with config.json)")
    config = _read_json_object(_inside(root, CONFIG, CONFIG))
    shards: list[MappedFile] = []
    try:
        if _optional(root, SINGLE) is not None:
            shard, tensors = _open_shard(_inside(root, SINGLE, SINGLE))
            shards.append(shard)
        else:
            tensors = _open_index(root, shards)
    except BaseException:
        for shard in shards:
            shard.close()
        raise
    return HFFiles(root, config, shards, tensors)


def _optional(root: Path, name: str) -> Path | None:
    return _inside(root, name, name) if (root / name).exists() or (root / name).is_symlink() else None


def _inside(root: Path, name: str, fld: str) -> Path:
    """``root/name`` when ``name`` is a plain relative path whose target stays inside ``root``
    (or in the HF hub cache's ``blobs`` folder for a snapshot); ModelFormatError otherwise."""
    rel = Path(name)
    if not name or rel.is_absolute() or ".." in rel.parts or "\\" in name or rel.drive:
        raise ModelFormatError(fld, f"{name!r} is not a file name inside the model directory")
    target = (root / rel).resolve()
    allowed = [root.resolve()]
    if root.resolve().parent.name == "snapshots":
        allowed.append(root.resolve().parent.parent / "blobs")
    if not any(target.is_relative_to(a) for a in allowed):
        raise ModelFormatError(fld, f"{name!r} leads outside the model directory (to {target})")
    if not target.is_file():
        raise ModelFormatError(fld, f"{name!r} is missing from {root}")
    return root / rel


def _read_json_object(path: Path) -> dict[str, Any]:
    size = path.stat().st_size
    if size > MAX_JSON_FILE_BYTES:
        raise ModelFormatError(path.name, f"{size} bytes; a JSON file here is at most {MAX_JSON_FILE_BYTES}")
    return _parse_json_object(path.read_bytes(), path.name, 0)


def _parse_json_object(raw: bytes, fld: str, base: int) -> dict[str, Any]:
    """JSON bytes -> dict; duplicate keys, non-objects and deep nesting are format errors."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelFormatError(fld, f"not UTF-8 ({e.reason})", base + e.start) from None
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise ModelFormatError(fld, f"invalid JSON: {e.msg}", base + len(text[:e.pos].encode())) from None
    except (RecursionError, ValueError) as e:
        raise ModelFormatError(fld, f"invalid JSON: {e}", base) from None
    if not isinstance(value, dict):
        raise ModelFormatError(fld, f"expected a JSON object, got {type(value).__name__}", base)
    return value


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise ValueError(f"duplicate key {dup!r}")
    return out


def _open_index(root: Path, shards: list[MappedFile]) -> dict[str, HFTensor]:
    """Tensors in ``weight_map`` order; each shard opened once and appended to ``shards``."""
    if _optional(root, INDEX) is None:
        raise ModelFormatError(SINGLE, f"neither {SINGLE} nor {INDEX} is in {root}")
    weight_map = _read_json_object(_inside(root, INDEX, INDEX)).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ModelFormatError(f"{INDEX}:weight_map", "missing, empty or not an object")
    opened: dict[Path, dict[str, HFTensor]] = {}
    places: dict[str, Path] = {}  # each file name checked once: an index names ~100,000 tensors
    tensors: dict[str, HFTensor] = {}
    for name, file in weight_map.items():
        fld = f"{INDEX}:weight_map.{name}"
        if not isinstance(file, str):
            raise ModelFormatError(fld, f"expected a file name, got {type(file).__name__}")
        shard_path = places.get(file) or places.setdefault(file, _inside(root, file, fld))
        if shard_path not in opened:
            shard, opened[shard_path] = _open_shard(shard_path)
            shards.append(shard)
        if name not in opened[shard_path]:
            raise ModelFormatError(fld, f"the index puts {name!r} in {file}, which does not hold it")
        tensors[name] = opened[shard_path][name]
    return tensors


def _open_shard(path: Path) -> tuple[MappedFile, dict[str, HFTensor]]:
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header_len = _header_length(f.read(_LEN.size), size, path.name)
        header = _parse_json_object(f.read(header_len), f"{path.name}:header", _LEN.size)
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    shard = MappedFile(path, mapping)
    try:
        return shard, _tensors(shard, header, _LEN.size + header_len, size)
    except BaseException:
        shard.close()
        raise


def _header_length(raw: bytes, size: int, name: str) -> int:
    if len(raw) < _LEN.size:
        raise ModelFormatError(f"{name}:header_length", f"file has {size} bytes; the header length "
                                                        f"alone needs {_LEN.size}", 0)
    n = _LEN.unpack(raw)[0]
    if n > size - _LEN.size or n > MAX_HEADER_BYTES:
        raise ModelFormatError(f"{name}:header_length", f"header of {n} bytes in a {size}-byte file "
                                                        f"(at most {MAX_HEADER_BYTES} allowed)", 0)
    return n


def _tensors(shard: MappedFile, header: dict[str, Any], data_start: int, size: int) -> dict[str, HFTensor]:
    """Header entries -> tensors; their byte ranges must tile the data area exactly, as the
    safetensors library requires (no overlap, no hole, nothing past the end)."""
    name = shard.path.name
    if not isinstance(header.pop("__metadata__", {}), dict):
        raise ModelFormatError(f"{name}:__metadata__", "expected an object", _LEN.size)
    tensors = {key: _tensor(shard, key, entry, data_start, size) for key, entry in header.items()}
    end = data_start
    for t in sorted(tensors.values(), key=lambda t: (t.offset, t.nbytes)):
        if t.offset != end:
            what = "overlaps the tensor before it" if t.offset < end else "leaves a hole before it"
            raise ModelFormatError(f"{name}:{t.name}.data_offsets", f"data at byte {t.offset} {what} "
                                                                    f"(which ends at byte {end})", t.offset)
        end = t.offset + t.nbytes
    if end != size:
        raise ModelFormatError(f"{name}:data", f"tensors end at byte {end}, the file at {size}", end)
    return tensors


def _tensor(shard: MappedFile, key: str, entry: Any, data_start: int, size: int) -> HFTensor:
    fld = f"{shard.path.name}:{key}"
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise ModelFormatError(fld, "expected an object with dtype, shape and data_offsets", _LEN.size)
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise ModelFormatError(f"{fld}.dtype", f"unsupported dtype {dtype!r}; supported: {sorted(DTYPES)}",
                               _LEN.size)
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise ModelFormatError(f"{fld}.shape", f"expected a list of non-negative integers, got {shape!r}",
                               _LEN.size)
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_count(o) for o in offsets)
            and offsets[0] <= offsets[1]):
        raise ModelFormatError(f"{fld}.data_offsets", f"expected [begin, end] with begin <= end, "
                                                      f"got {offsets!r}", _LEN.size)
    begin, end = offsets
    at = data_start + begin
    if end > size - data_start:
        raise ModelFormatError(f"{fld}.data_offsets", f"range [{begin}, {end}) runs past the "
                                                      f"{size - data_start}-byte data area", at)
    if _n_bytes(shape, DTYPES[dtype].itemsize, end - begin) != end - begin:
        raise ModelFormatError(f"{fld}.data_offsets", f"shape {shape} of {dtype} does not fill the "
                                                      f"{end - begin} bytes of range [{begin}, {end})", at)
    return HFTensor(key, tuple(shape), dtype, shard.path, data_start + begin, end - begin, shard)


def _n_bytes(shape: list[int], itemsize: int, limit: int) -> int:
    """Bytes the shape needs, or ``limit + 1`` as soon as it exceeds ``limit`` (so a long list of
    huge dims never builds a giant integer)."""
    if 0 in shape:
        return 0
    n = itemsize
    for d in shape:
        n *= d
        if n > limit:
            return limit + 1
    return n


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0
