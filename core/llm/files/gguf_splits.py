"""Split GGUF models (``name-00001-of-00003.gguf`` ...), as llama.cpp's ``gguf-split`` writes them
and llama.cpp loads them: one model whose tensors are spread over several files.

Each file is a whole GGUF with its own tensors; the first holds the model's metadata, and every
one says where it belongs (``split.no``, from 0, and ``split.count``); the first also says how
many tensors all of them hold (``split.tensors.count``). :func:`open_model_gguf` opens the first
file (whichever part it is given) and the others beside it, and returns the first with every
part's tensors, each still read in place from its own mapping.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from ...errors import ModelFormatError
from .gguf_file import GGUFFile, open_gguf

SPLIT_NAME = re.compile(r"(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf", re.IGNORECASE)
MAX_SPLITS = 9999  # llama.cpp's names have five digits; no model is near this
NO, COUNT, TENSORS = "split.no", "split.count", "split.tensors.count"


def split_name(path: Path, no: int, count: int) -> Path:
    """The file of part ``no`` (from 1) of ``count`` beside split file ``path``."""
    m = SPLIT_NAME.fullmatch(path.name)
    return path.with_name(f"{m['prefix']}-{no:05d}-of-{count:05d}.gguf")


def first_split(path: Path) -> Path:
    """The first part of the split model ``path`` belongs to (``path`` itself if it is not named
    as a part, or is the first)."""
    m = SPLIT_NAME.fullmatch(path.name)
    if m is None or int(m["no"]) <= 1 or int(m["count"]) < 1:
        return path
    return split_name(path, 1, int(m["count"]))


def split_parts(path: Path) -> list[Path]:
    """Every part of the split model whose first file is ``path`` (just ``[path]`` when its name
    is not a first part's), from the name alone: what a listing sums and checks are there."""
    m = SPLIT_NAME.fullmatch(path.name)
    if m is None or int(m["no"]) != 1 or not 1 <= int(m["count"]) <= MAX_SPLITS:
        return [path]
    count = int(m["count"])
    return [split_name(path, no, count) for no in range(1, count + 1)]


def open_model_gguf(path: str | os.PathLike[str]) -> GGUFFile:
    """The GGUF model at ``path``: a single file, or a split model opened from any of its parts.

    Raises:
        ModelFormatError: a part missing, misnamed or not of this model (its ``split.no`` or
            ``split.count`` disagree), a tensor in two parts, or a tensor count other than
            ``split.tensors.count``; any part's own format errors.
    """
    first = open_gguf(first_split(Path(path)))
    try:
        _add_parts(first)
    except BaseException:
        first.close()
        raise
    return first


def _split_key(gguf: GGUFFile, key: str, limit: int) -> int:
    value = gguf.require(key, int)
    if not 0 <= value <= limit:
        raise ModelFormatError(key, f"{value} is not in 0..{limit} ({gguf.path.name})",
                               gguf.kv_offsets.get(key))
    return value


def _add_parts(first: GGUFFile) -> None:
    """Open the parts after ``first`` (a model's first file) into ``first.parts`` and its tensors."""
    if COUNT not in first.metadata:
        return
    count = _split_key(first, COUNT, MAX_SPLITS)
    if _split_key(first, NO, MAX_SPLITS) != 0:
        raise ModelFormatError(NO, f"{first.path.name} is part {first.metadata[NO] + 1} of a split model, "
                                   "not its first file", first.kv_offsets.get(NO))
    if count <= 1:
        return
    m = SPLIT_NAME.fullmatch(first.path.name)
    if m is None or int(m["count"]) != count:
        raise ModelFormatError(COUNT, f"the model is split into {count} files, but {first.path.name} is not "
                                      f"named as the first of them (NAME-00001-of-{count:05d}.gguf)",
                               first.kv_offsets.get(COUNT))
    for no in range(1, count):
        path = split_name(first.path, no + 1, count)
        if not path.is_file():
            raise ModelFormatError(COUNT, f"part {no + 1} of {count} is missing: {path.name}")
        part = open_gguf(path)
        first.parts.append(part)  # closed with the first from here on
        for key, want in ((NO, no), (COUNT, count)):
            if _split_key(part, key, MAX_SPLITS) != want:
                raise ModelFormatError(f"{path.name}: {key}", f"{part.metadata[key]}, expected {want}: "
                                       "not a part of this model", part.kv_offsets.get(key))
        for name, tensor in part.tensors.items():
            if name in first.tensors:
                raise ModelFormatError(f"{path.name}: {name}", "a tensor an earlier part holds too")
            first.tensors[name] = tensor
    want = _split_key(first, TENSORS, 1 << 31)
    if len(first.tensors) != want:
        raise ModelFormatError(TENSORS, f"the {count} parts hold {len(first.tensors)} tensors, "
                                        f"{TENSORS} says {want}", first.kv_offsets.get(TENSORS))
