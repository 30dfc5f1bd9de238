"""Reading and writing networks: Loom's JSON wire format (and, later, our own checkpoint)."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import LoomFormatError
from ..network import VolumetricNetwork
from .checkpoint import load_checkpoint, save_checkpoint
from .loom_json import dumps, load_json, network_to_dict, save_json

_SAVERS = {".json": save_json, ".loom": save_checkpoint}


def save_network(net: VolumetricNetwork, path: str | os.PathLike) -> None:
    """Save ``net`` atomically; the suffix picks the format: ``.json`` is Loom's persistence
    JSON, ``.loom`` Loom Lab's compact checkpoint (safetensors)."""
    saver = _SAVERS.get(Path(path).suffix.lower())
    if saver is None:
        raise LoomFormatError(str(path), "cannot save a network here: name the file .json or .loom")
    saver(net, path)


def load_network(source, *, schema: str = "auto", seed: int | None = None,
                 backend: str = "numpy") -> VolumetricNetwork:
    """Read a network: a ``.loom`` checkpoint, or Loom's JSON (a path, the text, or bytes).

    See :func:`loomlab.core.io.loom_json.load_json` for ``schema`` and ``seed``.
    """
    if isinstance(source, str | os.PathLike) and Path(source).suffix.lower() == ".loom":
        return load_checkpoint(source, backend=backend)
    return load_json(source, schema=schema, seed=seed, backend=backend)


__all__ = ["dumps", "load_checkpoint", "load_json", "load_network", "network_to_dict",
           "save_checkpoint", "save_network"]
