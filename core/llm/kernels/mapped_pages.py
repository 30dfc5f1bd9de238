"""Giving back the pages of a memory-mapped model file that nothing reads any more.

A GGUF file is mapped read-only and its tensors are zero-copy views of the mapping. Every page
read is counted in the process's resident memory until the kernel needs it elsewhere, so once the
8-bit kernels have repacked a matrix (:mod:`.quant_int8`) the file's copy of it would be held a
second time for nothing. :func:`release` drops this process's pages of such a view
(``MADV_DONTNEED``); the file's bytes stay in the page cache and the mapping stays valid, so a
later reader (the exact path, a morph, an export) simply faults them in again. Only ranges inside a
mapping registered here are touched: the same advice on anonymous memory would zero it.

Linux 6 maps a page-cache folio (up to 2 MiB of the file) whole on a fault, so reading one tensor
maps pages of the tensors beside it again, those released before included (one byte read mapped
1.1 MB of the model file here). Each release therefore drops again the ranges released before it
within :data:`NEIGHBOURHOOD`.
"""

from __future__ import annotations

import mmap
import threading

import numpy as np

_lock = threading.Lock()
_mappings: dict[int, tuple[int, int, mmap.mmap]] = {}  # id(mapping) -> (address, length, mapping)
_released: dict[int, list[tuple[int, int]]] = {}  # id(mapping) -> the (offset, length) ranges released
NEIGHBOURHOOD = 2 << 20  # a page-cache folio's largest size: how far a fault can map pages around it


def register(mapping: mmap.mmap, view: np.ndarray) -> None:
    """Let :func:`release` give back pages of ``mapping``, whose whole extent ``view`` is."""
    with _lock:
        _mappings[id(mapping)] = (view.ctypes.data, view.nbytes, mapping)


def forget(mapping: mmap.mmap) -> None:
    """Before ``mapping`` closes."""
    with _lock:
        _mappings.pop(id(mapping), None)
        _released.pop(id(mapping), None)


def release(array: np.ndarray) -> bool:
    """Drop this process's pages of ``array`` (a contiguous view) when it lies in a registered
    read-only mapping; True when it did. Pages shared with a neighbouring tensor are dropped too,
    which costs that tensor a page fault, never its bytes."""
    if not hasattr(mmap, "MADV_DONTNEED") or not array.flags.c_contiguous or array.nbytes == 0:
        return False
    start = array.ctypes.data
    with _lock:
        for address, length, mapping in _mappings.values():
            if address <= start and start + array.nbytes <= address + length:
                first = (start - address) // mmap.PAGESIZE * mmap.PAGESIZE
                size = start - address + array.nbytes - first
                done = _released.setdefault(id(mapping), [])
                for at, n in done:  # mapped again by this array's reads: whole folios around them
                    if at < first + size + NEIGHBOURHOOD and first - NEIGHBOURHOOD < at + n:
                        mapping.madvise(mmap.MADV_DONTNEED, at, n)
                mapping.madvise(mmap.MADV_DONTNEED, first, size)
                done.append((first, size))
                return True
    return False
