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
import re
from pathlib import Path

import numpy as np

from ..errors import LoomFormatError
from ..network import VolumetricNetwork
from ..weights import LoomShapedWeights
from .atomic import write_atomic
from .loom_json import (
    MAX_LAYERS,
    brief,
    foreign_format,
    max_parameters,
    network_to_dict,
    parse_json,
    read_network,
    regular_file_size,
)

METADATA_KEY = "loomlab"
#: a layer's blob named ``layers[3]`` + this holds the rest of Loom's weights of a CNN1 or
#: ConvTransposed1D NEAT re-initialised (float32; core.weights.LoomShapedWeights)
LOOM_REST = "#loom_rest"
FORMAT = "loomlab-checkpoint/1"
MAX_HEADER_BYTES = 100_000_000  # safetensors' own limit on the header


def checkpoint_bytes(net: VolumetricNetwork) -> bytes:
    """The checkpoint file's bytes; the same network always gives the same bytes."""
    from safetensors.numpy import save

    blobs: dict[str, bytes | memoryview] = {}
    spec = network_to_dict(net, blobs)
    for i, layer in enumerate(net.cells):
        if layer is not None and isinstance(layer.weights, LoomShapedWeights):
            blobs[f"layers[{i}]{LOOM_REST}"] = layer.weights.loom_rest.astype("<f4").tobytes()
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
        size = regular_file_size(path)
        with open(path, "rb") as f:
            head = f.read(16)
            what = foreign_format(head, "checkpoint")
            if what is not None:
                raise LoomFormatError(origin, what)
            header_bytes = _header_size(head, size, origin)
            f.seek(8)
            meta = _checked_header(f.read(header_bytes), size - 8 - header_bytes, origin)
    except OSError as e:
        raise LoomFormatError(origin, f"cannot read: {e.strerror}") from None
    try:
        with safe_open(origin, framework="numpy") as f:
            # arrays we own: a float32 master can be a view of one
            blobs = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - not a mapping
    except SafetensorError as e:
        raise LoomFormatError(origin, f"not a valid safetensors file: {e}") from None
    except (OSError, ValueError) as e:
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
    header_bytes = _header_size(data[:8], len(data), origin)
    meta = _checked_header(bytes(data[8:8 + header_bytes]), len(data) - 8 - header_bytes, origin)
    try:
        blobs = load(bytes(data))
    except SafetensorError as e:
        raise LoomFormatError(origin, f"not a valid safetensors file: {e}") from None
    return _network_from(meta, blobs, origin, backend)


def _header_size(head: bytes, file_bytes: int, origin: str) -> int:
    """The header length a safetensors file starts with, checked against the file and
    :data:`MAX_HEADER_BYTES` before the header is read."""
    size = int.from_bytes(head[:8], "little") if len(head) >= 8 else -1
    if not 0 < size <= min(file_bytes - 8, MAX_HEADER_BYTES):
        raise LoomFormatError(origin, "not a valid safetensors file: bad header size")
    return size


def _checked_header(raw: bytes, payload_bytes: int, origin: str) -> str:
    """The ``loomlab`` metadata of a safetensors header, once every tensor it lists is known to be
    what a checkpoint holds: at most one 1-D uint8 blob per layer, inside the file, with no more
    bytes in all than the most weights a network may have, each in the widest dtype (8 bytes)."""
    header = parse_json(raw, origin)
    if not isinstance(header, dict):
        raise LoomFormatError(origin, "not a valid safetensors file: the header is not an object")
    meta = header.pop("__metadata__", None)
    meta = meta.get(METADATA_KEY, "") if isinstance(meta, dict) else ""
    if len(header) > MAX_LAYERS:
        raise LoomFormatError(origin, f"{len(header):,} tensors; a network holds at most {MAX_LAYERS:,} "
                                      "layers")
    total = sum(_tensor_bytes(name, entry, payload_bytes) for name, entry in header.items())
    if total > 8 * max_parameters():
        raise LoomFormatError(origin, f"{total:,} bytes of weights, over the {max_parameters():,} "
                                      "parameters a network may have on this machine")
    if not isinstance(meta, str):
        raise LoomFormatError(origin, f"not a Loom Lab checkpoint (metadata {METADATA_KEY!r} is not text)")
    return meta


def _tensor_bytes(name: str, entry, payload_bytes: int) -> int:
    """Bytes of one header entry, which must be a 1-D uint8 tensor inside the payload."""
    if not isinstance(entry, dict):
        raise LoomFormatError(f"$.{name}", "tensor entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype != "U8" or not _ints(shape, 1):
        raise LoomFormatError(f"$.{name}", f"tensor must be 1-D uint8 (U8), got {brief(dtype)} "
                                           f"{brief(shape)}")
    if not _ints(offsets, 2) or not 0 <= offsets[0] <= offsets[1] <= payload_bytes \
            or offsets[1] - offsets[0] != shape[0]:
        raise LoomFormatError(f"$.{name}", f"data_offsets {brief(offsets)} do not hold {shape[0]} bytes "
                                           f"within the {payload_bytes} bytes of tensor data")
    return shape[0]


def _ints(v, n: int) -> bool:
    return isinstance(v, list) and len(v) == n and all(isinstance(i, int) and not isinstance(i, bool)
                                                       for i in v)


def _network_from(meta: str, blobs: dict[str, np.ndarray], origin: str, backend: str) -> VolumetricNetwork:
    doc = parse_json(meta.encode("utf-8"))
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else doc
        raise LoomFormatError(origin, f"not a Loom Lab checkpoint (format {brief(found)}, "
                                      f"expected {FORMAT!r})")
    rests = {name: blobs.pop(name) for name in [n for n in blobs if n.endswith(LOOM_REST)]}
    net = read_network(doc.get("network"), schema="persistence", backend=backend, blobs=blobs)
    for name, rest in rests.items():
        index = re.fullmatch(r"layers\[(\d+)\]", name[:-len(LOOM_REST)])
        i = int(index[1]) if index else -1
        store = net.cells[i].weights if 0 <= i < len(net.cells) and net.cells[i] is not None else None
        if store is None or len(rest) % 4:
            raise LoomFormatError(f"$.{name}", "Loom's further weights for no weighted layer")
        shaped = LoomShapedWeights(store.master, np.frombuffer(bytes(rest), "<f4"), store.scale)
        shaped.native = store.native
        net.cells[i].weights = shaped
    return net
