"""Atomic file replacement: a crash during a save leaves the old file or the new one.

Only a regular file (or a new path) is replaced: a device, a FIFO or a folder at the path is
refused before anything is written, and a symlink is followed, so its target is replaced and the
link stays a link. SIGTERM during a write unwinds as Ctrl-C does, so the temporary file goes too.
"""

from __future__ import annotations

import os
import secrets
import signal
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ..errors import LoomConfigError

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
    ``path`` is left as it was.

    Raises:
        LoomConfigError: ``path`` is (or links to) something other than a regular file: a device,
            a FIFO, a folder; nothing is written.
    """
    path = destination(path)
    with terminate_unwinds():
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


def destination(path: str | os.PathLike) -> Path:
    """The file a save to ``path`` replaces: ``path`` with its symlinks followed, when it is a
    regular file or nothing yet.

    Raises:
        LoomConfigError: anything else is there (a device such as /dev/null, a FIFO, a folder).
    """
    target = Path(os.path.realpath(path))
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return target
    if not stat.S_ISREG(mode):
        raise LoomConfigError(f"cannot save to {path}: it is {_kind(mode)}, not a regular file; give a "
                              f"file's path")
    return target


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived during a save (a KeyboardInterrupt, so whatever cleans up after Ctrl-C runs)."""


@contextmanager
def terminate_unwinds() -> Iterator[None]:
    """While the block runs, SIGTERM raises :class:`Terminated` instead of killing the process
    on the spot, so the ``except``/``finally`` clauses that remove temporary files run. Only on
    the main thread and only when SIGTERM has its default action (a server's own handler stays)."""
    if threading.current_thread() is not threading.main_thread() \
            or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _raise_terminated(signum, frame) -> None:
    raise Terminated(f"terminated by signal {signum}")


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
