"""Loom Lab's compact checkpoint (``.loom``): a safetensors file.

Each weighted layer's native blob (exactly the bytes Loom's JSON would base64-encode, spec §3.1)
is one ``uint8`` tensor named by the layer's path (``layers[3]``,
``layers[3].parallel_branches[0]``). The network itself, in Loom's persistence schema without
the ``weights`` fields, is in the one metadata entry ``loomlab`` (a JSON object
``{"format": "loomlab-checkpoint/1", "network": ...}``; one entry because safetensors writes
several in no fixed order, and a round trip must give identical bytes). Loading
memory-maps the file, so a 10M-parameter net loads without base64 or JSON number parsing.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from ..errors import LoomFormatError
from ..network import VolumetricNetwork
from .atomic import write_atomic
from .loom_json import MAX_FILE_BYTES, _parse_json, foreign_format, network_to_dict, read_network

METADATA_KEY = "loomlab"
FORMAT = "loomlab-checkpoint/1"


def checkpoint_bytes(net: VolumetricNetwork) -> bytes:
    """The checkpoint file's bytes; the same network always gives the same bytes."""
    from safetensors.numpy import save

    blobs: dict[str, bytes] = {}
    spec = network_to_dict(net, blobs)
    tensors = {name: np.frombuffer(blob, dtype=np.uint8) for name, blob in blobs.items()}
    metadata = {METADATA_KEY: json.dumps({"format": FORMAT, "network": spec}, separators=(",", ":"))}
    return save(tensors, metadata=metadata)


def save_checkpoint(net: VolumetricNetwork, path: str | os.PathLike) -> None:
    write_atomic(path, checkpoint_bytes(net))


def load_checkpoint(path: str | os.PathLike, *, backend: str = "numpy") -> VolumetricNetwork:
    """Read a ``.loom`` checkpoint; any defect raises :class:`LoomFormatError` (naming the file
    for a problem with the file as a whole)."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    origin = str(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise LoomFormatError(origin, f"cannot read: {e.strerror}") from None
    if size > 64 * MAX_FILE_BYTES:
        raise LoomFormatError(origin, f"{size} bytes; the limit for a checkpoint is {64 * MAX_FILE_BYTES}")
    what = foreign_format(head, "checkpoint")
    if what is not None:
        raise LoomFormatError(origin, what)
    try:
        with safe_open(origin, framework="numpy") as f:
            meta = (f.metadata() or {}).get(METADATA_KEY, "")
            blobs: dict[str, np.ndarray] = {}
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                t = f.get_tensor(name)
                if t.dtype != np.uint8 or t.ndim != 1:
                    raise LoomFormatError(f"$.{name}", f"tensor must be 1-D uint8, got {t.dtype} {t.shape}")
                blobs[name] = t  # an array we own: the float32 master can be a view of it
    except SafetensorError as e:
        raise LoomFormatError(origin, f"not a valid safetensors file: {e}") from None
    except (OSError, ValueError) as e:
        if isinstance(e, LoomFormatError):
            raise
        raise LoomFormatError(origin, f"cannot read checkpoint: {e}") from None
    return _network_from(meta, blobs, origin, backend)


def checkpoint_from_bytes(data: bytes, *, origin: str = "checkpoint bytes",
                          backend: str = "numpy") -> VolumetricNetwork:
    """Read a ``.loom`` checkpoint held in memory (as :func:`checkpoint_bytes` makes it, e.g.
    from a database); any defect raises :class:`LoomFormatError`."""
    from safetensors import SafetensorError
    from safetensors.numpy import load

    what = foreign_format(bytes(data[:16]), "checkpoint")
    if what is not None:
        raise LoomFormatError(origin, what)
    size = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if not 0 < size <= len(data) - 8:
        raise LoomFormatError(origin, "not a valid safetensors file: bad header size")
    header = _parse_json(bytes(data[8:8 + size]))
    meta = header.get("__metadata__", {}) if isinstance(header, dict) else {}
    try:
        blobs = load(bytes(data))
    except SafetensorError as e:
        raise LoomFormatError(origin, f"not a valid safetensors file: {e}") from None
    for name, t in blobs.items():
        if t.dtype != np.uint8 or t.ndim != 1:
            raise LoomFormatError(f"$.{name}", f"tensor must be 1-D uint8, got {t.dtype} {t.shape}")
    return _network_from(meta.get(METADATA_KEY, "") if isinstance(meta, dict) else "", blobs, origin, backend)


def _network_from(meta: str, blobs: dict[str, np.ndarray], origin: str, backend: str) -> VolumetricNetwork:
    doc = _parse_json(meta.encode("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else doc
        raise LoomFormatError(origin, f"not a Loom Lab checkpoint (format {found!r}, expected {FORMAT!r})")
    return read_network(doc.get("network"), schema="persistence", backend=backend, blobs=blobs)
