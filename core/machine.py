"""What this machine can hold: bounds on work a file or a config asks for follow from it, so a
header that asks for more than the machine has is refused before anything is allocated."""

from __future__ import annotations

import functools
import os

FALLBACK_MEMORY_BYTES = 8 << 30  # where the OS does not say (no sysconf): a modest machine


@functools.cache
def physical_memory_bytes() -> int:
    """Bytes of physical memory (pages x page size), or :data:`FALLBACK_MEMORY_BYTES` where the
    operating system does not report them."""
    try:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return FALLBACK_MEMORY_BYTES
    if pages <= 0 or page_size <= 0:
        return FALLBACK_MEMORY_BYTES
    return pages * page_size
