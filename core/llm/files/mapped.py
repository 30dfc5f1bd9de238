"""A read-only memory-mapped file handed out as a uint8 array (GGUF files, safetensors shards)."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np

from ..kernels import mapped_pages


class MappedFile:
    """One ``mmap`` of a file; :meth:`bytes` gives a zero-copy uint8 view of it."""

    def __init__(self, path: Path, mapping: mmap.mmap):
        self.path = path
        self._mmap: mmap.mmap | None = mapping
        self._array: np.ndarray | None = None  # made on first bytes(): until then close() always unmaps

    def bytes(self) -> np.ndarray:
        if self._mmap is None:
            raise ValueError(f"{self.path.name} is closed")
        if self._array is None:
            self._array = np.frombuffer(self._mmap, dtype=np.uint8)
            mapped_pages.register(self._mmap, self._array)  # pages repacked tensors no longer need
        return self._array

    def close(self) -> None:
        """Drop the mapping; arrays already returned by ``bytes()`` keep it alive until they go."""
        self._array = None
        if self._mmap is not None:
            mapped_pages.forget(self._mmap)
            try:
                self._mmap.close()
            except BufferError:  # views handed out still export it; it unmaps when they die
                pass
            self._mmap = None
