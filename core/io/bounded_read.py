"""Reading small user files (recipes, configs, schemas, probes) with a size cap, from regular
files only: ``/dev/zero`` would read without end and a FIFO would block forever."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from ..errors import LoomConfigError

SMALL_FILE_LIMIT = 16 * 1024 * 1024  # bytes: recipes and configs are a few KB; a probe text a few MB


def read_small_bytes(path: str | os.PathLike, what: str, limit: int = SMALL_FILE_LIMIT) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them, else one
    :class:`LoomConfigError` naming ``what`` ("the recipe file") and why. Opened non-blocking so
    a FIFO is refused at once instead of waiting for a writer."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_BINARY", 0))
    except OSError as e:
        raise LoomConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise LoomConfigError(f"{what} {path} is not a regular file")
        if info.st_size > limit:
            raise LoomConfigError(f"{what} {path} is {info.st_size:,} bytes; the limit is {limit:,}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(min(info.st_size, limit) + 1)
            if len(data) > info.st_size:  # it grew since fstat: the rest, up to just past the limit
                data += f.read(limit + 1 - len(data))
    except OSError as e:
        raise LoomConfigError(f"cannot read {what} {path}: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if len(data) > limit:  # grew while we read it
        raise LoomConfigError(f"{what} {path} is over the limit of {limit:,} bytes")
    return data


def read_small_text(path: str | os.PathLike, what: str, limit: int = SMALL_FILE_LIMIT) -> str:
    """:func:`read_small_bytes` decoded as UTF-8 (a typed error when it is not)."""
    try:
        return read_small_bytes(path, what, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise LoomConfigError(f"{what} {path} is not UTF-8 text") from None


def parse_json_text(text: str | bytes, what: str) -> Any:
    """``json.loads`` with its failures as one :class:`LoomConfigError`: bad JSON, and nesting too
    deep for the parser (RecursionError), which a 100,000-deep ``[[[...`` reaches."""
    try:
        return json.loads(text)
    except RecursionError:
        raise LoomConfigError(f"{what} is nested too deeply") from None
    except ValueError as e:
        raise LoomConfigError(f"{what} is not JSON: {e}") from None
