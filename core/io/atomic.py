"""Atomic file replacement: a crash during a save leaves the old file or the new one."""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

NEW_FILE_MODE = 0o666  # what open() asks for; the umask takes its bits away, as for any new file


def write_atomic(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync it, then ``os.replace`` it.

    The result has the mode of the file it replaces, or, for a new file, the one the umask
    gives (0644 under the usual 022), as if it had been written in place.
    """
    with replacing(path) as f:
        f.write(data)


@contextmanager
def replacing(path: str | os.PathLike) -> Iterator[BinaryIO]:
    """:func:`write_atomic` for content written a piece at a time: yields the temporary file
    beside ``path``, open for binary writing; when the block ends, fsyncs it and replaces
    ``path`` with it. On any exception (a cancel included) the temporary file is removed and
    ``path`` is left as it was."""
    path = Path(path)
    fd, tmp = _create_temporary(path)
    try:
        with os.fdopen(fd, "wb") as f:
            _keep_mode(path, f.fileno())
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # persist the rename itself (directory entry); not supported on every platform
    try:
        dir_fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(dir_fd)
    except OSError:
        pass
    finally:
        os.close(dir_fd)


def _create_temporary(path: Path) -> tuple[int, Path]:
    """A new, uniquely named file beside ``path``. Not ``tempfile.mkstemp``: it creates 0600
    whatever the umask, and a saved network would stay private to its owner."""
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0),
                           NEW_FILE_MODE), tmp
        except FileExistsError:
            continue


def _keep_mode(path: Path, fd: int) -> None:
    """Give the temporary file the permission bits of the file it will replace, if any."""
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return
    os.fchmod(fd, mode)
