"""numba's on-disk kernel cache, kept fresh for code a kernel takes from other files.

numba reuses a cached kernel while the kernel's own source file is unchanged (its modification
time and size). The functions it inlines or calls from other files are not looked at: after an
upgrade that changed only those, the cached kernel would go on running the old code (it
happened here: the fused decode step kept an old ``is_superblock_kind`` from another file).

:func:`install` (run by the packages of the kernels that take code from other files: the
language models' kernels and model, and the batched evolution kernels, before any of their
kernels is defined) puts a stamp of the contents of every engine file that holds numba code
(:func:`kernel_sources`) beside each of those kernels' own: a change to any of them compiles those
kernels again, once. Other kernels (one file each) keep numba's own rule.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from numba.core.caching import CacheImpl

ROOT = Path(__file__).resolve().parent  # the engine: loomlab/core
# the folders whose modules define kernels (a module mentioning numba is taken for one)
KERNEL_FOLDERS = (".", "llm/kernels", "llm/model", "evolve/search")
STAMPED = tuple(ROOT / folder for folder in KERNEL_FOLDERS[1:])  # whose kernels get the stamp


def kernel_sources(root: Path = ROOT) -> tuple[Path, ...]:
    """The engine's source files that hold numba code, in a fixed order."""
    return tuple(path for folder in KERNEL_FOLDERS for path in sorted((root / folder).glob("*.py"))
                 if b"numba" in path.read_bytes())


def sources_stamp(paths: tuple[Path, ...]) -> str:
    """One digest of the files' names (relative to their folder) and contents."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(f"{path.parent.name}/{path.name}\0".encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@functools.cache
def engine_stamp() -> str:
    """:func:`sources_stamp` of :func:`kernel_sources`, read once per process."""
    return sources_stamp(kernel_sources())


def _stamped(locator: type) -> type:
    """``locator`` for the kernels of :data:`STAMPED` only, its source stamp joined with
    :func:`engine_stamp`."""

    class Stamped(locator):
        engine = True

        @classmethod
        def from_function(cls, py_func, py_file):
            if Path(py_file).resolve().parent not in STAMPED:
                return None
            return super().from_function(py_func, py_file)

        def get_source_stamp(self):
            return super().get_source_stamp(), engine_stamp()

    Stamped.__name__ = Stamped.__qualname__ = f"Engine{locator.__name__}"
    return Stamped


def install() -> None:
    """Put the stamped locators before numba's own (once per process)."""
    classes = CacheImpl._locator_classes
    if not any(getattr(c, "engine", False) for c in classes):
        classes[:0] = [_stamped(c) for c in list(classes)]
