"""GGUF reader: validates the whole header itself, then memory-maps the tensor data.

gguf-py's ``GGUFReader`` trusts lengths it reads (a string past the end is accepted, an array
length of 2^62 makes it allocate until killed), so the header is parsed here with ``struct``
over the mapping, every length bounded by the bytes that remain. Nothing is allocated in
proportion to a length before that length has been checked against the file, and no tensor
data is read at open. gguf-py supplies only the table of ggml types and their block sizes.

Metadata values become Python values: integers -> ``int``, floats -> ``float``, bools ->
``bool``, strings -> ``str``, string arrays -> ``list[str]``, numeric and bool arrays -> a
read-only 1-D numpy array (a copy, so the metadata outlives the mapping). Nested arrays are
rejected.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES

from ...errors import ModelFormatError
from .mapped import MappedFile

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_KEY_BYTES = 65535  # the GGUF spec bounds keys to 2^16 - 1 bytes
INT64_MAX = (1 << 63) - 1
HEADER = struct.Struct("<4sIQQ")  # magic, version, tensor count, kv count
# The smallest a KV pair (8-byte key length, 1-byte key, type, 1-byte bool) and a tensor info
# (name length, 1-byte name, n_dims, one dim, type, offset) can be: bounds the counts.
MIN_KV_BYTES = 8 + 1 + 4 + 1
MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8
# Each pair, tensor and string becomes Python objects (~200-700 bytes, ~10-70 us each), so counts
# the file size allows (millions) would cost gigabytes and minutes: real models hold ~50 pairs,
# ~1,000 tensors and ~500,000 vocabulary and merge strings; these are far above.
MAX_KV = 1 << 16
MAX_TENSORS = 1 << 17
MAX_STRINGS = 1 << 21  # in all string arrays of the metadata together

# GGUF value type -> numpy dtype for fixed-size values; 7 is bool, 8 string, 9 array.
_NUMERIC = {0: np.dtype("<u1"), 1: np.dtype("<i1"), 2: np.dtype("<u2"), 3: np.dtype("<i2"),
            4: np.dtype("<u4"), 5: np.dtype("<i4"), 6: np.dtype("<f4"), 10: np.dtype("<u8"),
            11: np.dtype("<i8"), 12: np.dtype("<f8")}
_BOOL, _STRING, _ARRAY = 7, 8, 9
# Non-quantized types whose data() is an array shaped like the tensor; BF16 stays raw uint16.
_PLAIN = {GGMLQuantizationType.F32: np.dtype("<f4"), GGMLQuantizationType.F16: np.dtype("<f2"),
          GGMLQuantizationType.BF16: np.dtype("<u2"), GGMLQuantizationType.F64: np.dtype("<f8"),
          GGMLQuantizationType.I8: np.dtype("i1"), GGMLQuantizationType.I16: np.dtype("<i2"),
          GGMLQuantizationType.I32: np.dtype("<i4"), GGMLQuantizationType.I64: np.dtype("<i8")}


@dataclass(frozen=True, eq=False)
class GGUFTensor:
    """One tensor's record. ``shape`` is in numpy order (GGUF dims reversed): a weight of
    ``rows`` outputs by ``cols`` inputs has shape ``(rows, cols)``. ``offset`` is absolute."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    type_name: str
    offset: int
    nbytes: int
    n_elements: int
    block_size: int  # elements per quantization block (1 for plain types)
    type_size: int  # bytes per block
    _file: GGUFFile = field(repr=False)

    @property
    def is_quantized(self) -> bool:
        return self.ggml_type not in _PLAIN

    def data(self) -> np.ndarray:
        """A read-only, zero-copy view of the tensor's bytes in the mapping.

        Plain types give an array shaped like ``shape`` (float32, float16, int…; BF16 as its raw
        uint16 bits). Quantized types give uint8 blocks shaped ``shape[:-1] + (bytes_per_row,)``,
        ready for ``gguf.quants.dequantize``. The view keeps the mapping alive after ``close()``.
        """
        raw = self._file._bytes()[self.offset:self.offset + self.nbytes]
        plain = _PLAIN.get(self.ggml_type)
        if plain is not None:
            return raw.view(plain).reshape(self.shape)
        row_bytes = self.shape[-1] // self.block_size * self.type_size
        return raw.reshape(self.shape[:-1] + (row_bytes,))


class GGUFFile:
    """An opened, validated GGUF file. Use :func:`open_gguf`; close it (or use ``with``).

    ``metadata`` maps each key to its value as described in the module docstring (vocabularies
    are ``list[str]``, scores and token types read-only numpy arrays); ``tensors`` maps names to
    :class:`GGUFTensor` in file order; ``data_offset`` is where the aligned tensor data begins.
    """

    def __init__(self, path: Path, version: int, metadata: dict[str, Any], kv_offsets: dict[str, int],
                 alignment: int, data_offset: int, file_size: int, mapping: mmap.mmap,
                 kv_types: dict[str, tuple[int, int | None]] | None = None):
        self.path = path
        self.version = version
        self.metadata = metadata
        self.kv_offsets = kv_offsets  # key -> byte offset of its KV pair, for precise errors
        # key -> (GGUF value type, element type of an array or None): the Python values above no
        # longer say whether an int was a uint32 or an int32, which llama.cpp checks (and a copy needs)
        self.kv_types = kv_types or {}
        self.alignment = alignment
        self.data_offset = data_offset
        self.file_size = file_size
        self.tensors: dict[str, GGUFTensor] = {}
        self.parts: list[GGUFFile] = []  # a split model's other files (.gguf_splits), tensors included above
        self._map = MappedFile(path, mapping)

    @property
    def architecture(self) -> str:
        """``general.architecture`` (``llama``, ``gemma3`` …)."""
        return self.require("general.architecture", str)

    def require(self, key: str, kind: type | tuple[type, ...] = object) -> Any:
        """``metadata[key]`` checked to be of ``kind``; ModelFormatError when missing or mistyped.

        ``int`` never accepts a bool; ``float`` accepts an int and returns it as a float.
        """
        if key not in self.metadata:
            raise ModelFormatError(key, f"required metadata key is missing from {self.path.name}")
        value = self.metadata[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if float in kinds:
            kinds += (int,)
        if not isinstance(value, kinds) or (isinstance(value, bool) and int in kinds and bool not in kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise ModelFormatError(key, f"expected {names}, got {type(value).__name__}",
                                   self.kv_offsets.get(key))
        return float(value) if kind is float else value

    @property
    def model_bytes(self) -> int:
        """Bytes of the whole model: this file's and those of its other parts."""
        return self.file_size + sum(part.file_size for part in self.parts)

    def close(self) -> None:
        """Drop the mappings (the parts' too); arrays already returned by ``data()`` keep theirs
        alive until they go."""
        for part in self.parts:
            part.close()
        self._map.close()

    def _bytes(self) -> np.ndarray:
        return self._map.bytes()

    def __enter__(self) -> GGUFFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"GGUFFile({str(self.path)!r}, version={self.version}, "
                f"kv={len(self.metadata)}, tensors={len(self.tensors)})")


def open_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """Open ``path`` read-only and memory-mapped, validating every header field.

    Raises ModelFormatError(field, message, offset) for anything malformed (magic, version,
    counts, lengths, types, dims, alignment, tensor placement, duplicates, truncation).
    Missing or unreadable files raise the usual OSError.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        header = check_header(f.read(HEADER.size), size)  # before mmap, which refuses an empty file
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        return _parse(path, mapping, size, header)
    except BaseException:
        mapping.close()
        raise


def check_header(head: bytes, size: int) -> tuple[int, int, int]:
    """Validate the fixed header (the first ``HEADER.size`` bytes of a ``size``-byte file):
    magic, version, and counts that fit the file. Returns (version, tensor count, kv count).

    Cheap enough for listing folders of models; it reads none of the metadata.
    """
    if size < HEADER.size or len(head) < HEADER.size:
        raise ModelFormatError("header", f"file has {size} bytes; a GGUF header needs {HEADER.size}", 0)
    magic, version, n_tensors, n_kv = HEADER.unpack_from(head, 0)
    if magic != MAGIC:
        raise ModelFormatError("magic", f"expected {MAGIC!r}, found {magic!r}: not a GGUF file", 0)
    if version not in VERSIONS:
        hint = " (big-endian files are not supported)" if version.to_bytes(4, "little")[0] == 0 else ""
        raise ModelFormatError("version", f"unsupported GGUF version {version}{hint}; "
                                          f"supported: {VERSIONS}", 4)
    room = size - HEADER.size
    if n_tensors > room // MIN_TENSOR_INFO_BYTES:
        raise ModelFormatError("tensor_count", f"{n_tensors} tensors cannot fit in a {size}-byte file", 8)
    if n_kv > (room - n_tensors * MIN_TENSOR_INFO_BYTES) // MIN_KV_BYTES:
        raise ModelFormatError("kv_count", f"{n_kv} metadata pairs cannot fit in a {size}-byte file", 16)
    if n_tensors > MAX_TENSORS:
        raise ModelFormatError("tensor_count", f"{n_tensors} tensors; at most {MAX_TENSORS} are read", 8)
    if n_kv > MAX_KV:
        raise ModelFormatError("kv_count", f"{n_kv} metadata pairs; at most {MAX_KV} are read", 16)
    return version, n_tensors, n_kv


def leading_architecture(head: bytes) -> str | None:
    """``general.architecture`` when it is the file's first metadata pair (llama.cpp's and
    gguf-py's writers put it first), read from the file's first bytes ``head`` (a header that
    :func:`check_header` passed); None when it is not there or not whole in ``head``."""
    cur = _Cursor(head, len(head), HEADER.size)
    try:
        key = cur.string("metadata[0].key", MAX_KEY_BYTES)
        if key != "general.architecture" or cur.unpack(_U32, key) != _STRING:
            return None
        return cur.string(key, MAX_KEY_BYTES)
    except ModelFormatError:
        return None


def _parse(path: Path, buf: mmap.mmap, size: int, header: tuple[int, int, int]) -> GGUFFile:
    version, n_tensors, n_kv = header
    cur = _Cursor(buf, size, HEADER.size)
    metadata, kv_offsets, kv_types = _read_metadata(cur, n_kv)
    alignment = _alignment(metadata, kv_offsets)
    infos = [_read_tensor_info(cur, i) for i in range(n_tensors)]
    data_offset = -(-cur.pos // alignment) * alignment
    gguf = GGUFFile(path, version, metadata, kv_offsets, alignment, data_offset, size, buf, kv_types)
    gguf.tensors = _place_tensors(gguf, infos)
    return gguf


class _Cursor:
    """Reads little-endian values from the mapping; every read is checked against the end."""

    def __init__(self, buf: mmap.mmap, size: int, pos: int):
        self.buf, self.size, self.pos = buf, size, pos
        self.strings_left = MAX_STRINGS  # what string arrays may still hold

    def take(self, n: int, fld: str) -> int:
        """Reserve ``n`` bytes for ``fld``; returns where they start."""
        start = self.pos
        if n > self.size - start:
            raise ModelFormatError(fld, f"needs {n} bytes but only {self.size - start} remain "
                                        "(length past the end of the file, or a truncated file)", start)
        self.pos = start + n
        return start

    def unpack(self, st: struct.Struct, fld: str) -> Any:
        return st.unpack_from(self.buf, self.take(st.size, fld))[0]

    def string(self, fld: str, limit: int | None = None) -> str:
        start = self.pos
        n = self.unpack(_U64, fld)
        if limit is not None and n > limit:
            raise ModelFormatError(fld, f"string length {n} exceeds {limit}", start)
        at = self.take(n, fld)
        try:
            return self.buf[at:at + n].decode("utf-8")
        except UnicodeDecodeError as e:
            raise ModelFormatError(fld, f"string is not valid UTF-8 ({e.reason})", at + e.start) from None


_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
_SCALARS = {t: struct.Struct("<" + c) for t, c in zip(_NUMERIC, "BbHhIifQqd", strict=True)}


def _read_metadata(cur: _Cursor, n_kv: int
                   ) -> tuple[dict[str, Any], dict[str, int], dict[str, tuple[int, int | None]]]:
    metadata: dict[str, Any] = {}
    offsets: dict[str, int] = {}
    types: dict[str, tuple[int, int | None]] = {}
    for i in range(n_kv):
        start = cur.pos
        key = cur.string(f"metadata[{i}].key", MAX_KEY_BYTES)
        if not key:
            raise ModelFormatError(f"metadata[{i}].key", "empty key", start)
        if key in metadata:
            raise ModelFormatError(key, f"duplicate metadata key (first at byte {offsets[key]})", start)
        vtype = cur.unpack(_U32, key)
        value_at = cur.pos
        metadata[key] = _read_value(cur, vtype, key, start)
        offsets[key] = start
        # an array's element type is its first field, read (and so bounded) just above
        types[key] = (vtype, _U32.unpack_from(cur.buf, value_at)[0] if vtype == _ARRAY else None)
    return metadata, offsets, types


def _read_value(cur: _Cursor, vtype: int, key: str, kv_start: int) -> Any:
    if vtype in _SCALARS:
        value = cur.unpack(_SCALARS[vtype], key)
        return float(value) if _NUMERIC[vtype].kind == "f" else int(value)
    if vtype == _BOOL:
        return _read_bools(cur, 1, key)[0].item()
    if vtype == _STRING:
        return cur.string(key)
    if vtype == _ARRAY:
        return _read_array(cur, key)
    raise ModelFormatError(key, f"unknown metadata value type {vtype}", kv_start)


def _read_array(cur: _Cursor, key: str) -> list[str] | np.ndarray:
    at = cur.pos
    etype = cur.unpack(_U32, key)
    count = cur.unpack(_U64, key)
    if etype == _ARRAY:
        raise ModelFormatError(key, "nested arrays are not supported", at)
    if etype == _STRING:
        if count > (cur.size - cur.pos) // _U64.size:  # each string takes at least its length
            raise ModelFormatError(key, f"array of {count} strings cannot fit in the file", at)
        if count > cur.strings_left:
            raise ModelFormatError(key, f"array of {count} strings; the metadata's arrays may hold "
                                        f"{MAX_STRINGS} strings in all", at)
        cur.strings_left -= count
        return [cur.string(f"{key}[{j}]") for j in range(count)]
    if etype == _BOOL:
        return _read_bools(cur, count, key)
    if etype not in _NUMERIC:
        raise ModelFormatError(key, f"unknown array element type {etype}", at)
    dtype = _NUMERIC[etype]
    if count > (cur.size - cur.pos) // dtype.itemsize:
        raise ModelFormatError(key, f"array of {count} {dtype} values cannot fit in the file", at)
    return _frozen(cur, count, dtype, key)


def _read_bools(cur: _Cursor, count: int, key: str) -> np.ndarray:
    values = _frozen(cur, count, np.dtype(np.uint8), key)
    if values.size and values.max() > 1:
        raise ModelFormatError(key, "bool value other than 0 or 1", cur.pos - count)
    return values.view(np.bool_)


def _frozen(cur: _Cursor, count: int, dtype: np.dtype, key: str) -> np.ndarray:
    """A read-only copy (no view of the mapping, so closing it stays possible)."""
    start = cur.take(count * dtype.itemsize, key)
    return np.frombuffer(cur.buf[start:cur.pos], dtype=dtype)


def _alignment(metadata: dict[str, Any], offsets: dict[str, int]) -> int:
    value = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0 or value & (value - 1):
        raise ModelFormatError("general.alignment", f"must be a positive power of two, got {value!r}",
                               offsets.get("general.alignment"))
    return value


@dataclass(frozen=True)
class _Info:
    name: str
    dims: tuple[int, ...]  # GGUF order: fastest-varying first
    ggml_type: int
    rel_offset: int
    at: int  # byte offset of this tensor info


def _read_tensor_info(cur: _Cursor, i: int) -> _Info:
    at = cur.pos
    name = cur.string(f"tensors[{i}].name")
    if not name:
        raise ModelFormatError(f"tensors[{i}].name", "empty tensor name", at)
    n_dims = cur.unpack(_U32, f"{name}.n_dims")
    if not 1 <= n_dims <= MAX_DIMS:
        raise ModelFormatError(f"{name}.n_dims", f"{n_dims} dims; GGUF allows 1..{MAX_DIMS}", cur.pos - 4)
    dims = tuple(cur.unpack(_U64, f"{name}.dims") for _ in range(n_dims))
    ggml_type = cur.unpack(_U32, f"{name}.type")
    rel_offset = cur.unpack(_U64, f"{name}.offset")
    return _Info(name, dims, ggml_type, rel_offset, at)


def _place_tensors(gguf: GGUFFile, infos: list[_Info]) -> dict[str, GGUFTensor]:
    tensors: dict[str, GGUFTensor] = {}
    for info in infos:
        if info.name in tensors:
            raise ModelFormatError(info.name, "duplicate tensor name", info.at)
        tensors[info.name] = _make_tensor(gguf, info)
    _check_no_overlap(list(tensors.values()), {i.name: i.at for i in infos})
    return tensors


def _make_tensor(gguf: GGUFFile, info: _Info) -> GGUFTensor:
    name, at = info.name, info.at
    try:
        qtype = GGMLQuantizationType(info.ggml_type)
        block_size, type_size = GGML_QUANT_SIZES[qtype]
    except (ValueError, KeyError):
        raise ModelFormatError(f"{name}.type", f"unknown ggml type {info.ggml_type}", at) from None
    n_elements = 1
    for d in info.dims:
        if not 0 < d <= INT64_MAX:
            raise ModelFormatError(f"{name}.dims", f"dimension {d} is not in 1..2^63-1", at)
        n_elements *= d
        if n_elements > INT64_MAX:
            raise ModelFormatError(f"{name}.dims", f"dims {list(info.dims)} overflow int64", at)
    if info.dims[0] % block_size:
        raise ModelFormatError(f"{name}.dims", f"row length {info.dims[0]} is not a multiple of the "
                                               f"{qtype.name} block size {block_size}", at)
    nbytes = n_elements // block_size * type_size
    if info.rel_offset % gguf.alignment:
        raise ModelFormatError(f"{name}.offset", f"offset {info.rel_offset} is not a multiple of the "
                                                 f"alignment {gguf.alignment}", at)
    start = gguf.data_offset + info.rel_offset
    if nbytes > gguf.file_size or start > gguf.file_size - nbytes:
        raise ModelFormatError(f"{name}.offset", f"data [{start}, {start + nbytes}) runs past the end "
                                                 f"of the {gguf.file_size}-byte file", at)
    return GGUFTensor(name, tuple(reversed(info.dims)), int(qtype), qtype.name, start, nbytes,
                      n_elements, block_size, type_size, gguf)


def _check_no_overlap(tensors: list[GGUFTensor], info_at: dict[str, int]) -> None:
    ordered = sorted(tensors, key=lambda t: t.offset)
    for prev, t in pairwise(ordered):
        if t.offset < prev.offset + prev.nbytes:
            raise ModelFormatError(f"{t.name}.offset", f"data at byte {t.offset} overlaps {prev.name!r} "
                                                       f"[{prev.offset}, {prev.offset + prev.nbytes})",
                                   info_at[t.name])
