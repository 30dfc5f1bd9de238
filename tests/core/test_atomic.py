"""core/io/atomic.py: saved files get the permissions a plain write would give them; only a regular
file or a new path is replaced (a symlink's target); SIGTERM leaves no temporary file."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys

import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.io.atomic import replacing, terminate_unwinds, write_atomic


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def umask():
    """Set the process umask for one test, and put the old one back."""
    old = os.umask(0o022)
    os.umask(old)
    yield lambda mask: os.umask(mask)
    os.umask(old)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002, 0o027])
def test_a_new_file_gets_the_mode_the_umask_gives(tmp_path, umask, mask):
    umask(mask)
    oracle = tmp_path / "written-in-place"
    with open(oracle, "wb") as f:  # what any program's new file gets under this umask
        f.write(b"x")
    write_atomic(tmp_path / "saved", b"data")
    assert _mode(tmp_path / "saved") == _mode(oracle) == 0o666 & ~mask
    assert (tmp_path / "saved").read_bytes() == b"data"


@pytest.mark.parametrize("mode", [0o640, 0o600, 0o644, 0o444, 0o660])
def test_replacing_a_file_keeps_its_mode(tmp_path, umask, mode):
    umask(0o022)
    path = tmp_path / "net.json"
    path.write_bytes(b"old")
    path.chmod(mode)
    write_atomic(path, b"new")
    assert _mode(path) == mode and path.read_bytes() == b"new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.json"]  # no temporary left


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "net.json"
    path.write_bytes(b"old")
    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError, match="disk gone"):
        write_atomic(path, b"new")
    assert path.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.json"]


# ----- what may be replaced: a regular file or a new path ---------------------------------------
def test_a_device_is_refused_before_anything_is_written(tmp_path):
    """/dev/null: as root the save would turn it into a regular file; as anyone it must be
    refused before a temporary file is made (there or anywhere)."""
    before = os.stat("/dev/null")
    with pytest.raises(LoomConfigError, match="cannot save to /dev/null: it is a character device"):
        with replacing("/dev/null") as f:
            f.write(b"never")
            raise AssertionError("the block ran: something was written")
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev


def test_a_fifo_and_a_folder_are_refused_and_left_alone(tmp_path):
    fifo, folder = tmp_path / "pipe", tmp_path / "folder"
    os.mkfifo(fifo)
    folder.mkdir()
    (folder / "kept.txt").write_bytes(b"kept")
    for path, kind in ((fifo, "a FIFO"), (folder, "a folder")):
        with pytest.raises(LoomConfigError, match=f"cannot save to {path}: it is {kind}, not a regular file"):
            write_atomic(path, b"data")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and (folder / "kept.txt").read_bytes() == b"kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder", "pipe"]  # no temporary made


def test_a_symlink_is_written_through_and_stays_a_link(tmp_path):
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "net.json"
    target.write_bytes(b"old")
    target.chmod(0o640)
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_atomic(link, b"new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_bytes() == b"new" and _mode(target) == 0o640
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "real" / "new.json")
    write_atomic(dangling, b"made")
    assert dangling.is_symlink() and (tmp_path / "real" / "new.json").read_bytes() == b"made"


# ----- SIGTERM during a save --------------------------------------------------------------------
WRITER = """
import sys, time
from loomlab.core.io.atomic import replacing
with replacing(sys.argv[1]) as f:
    f.write(b"x" * 4096)
    f.flush()
    print("writing", flush=True)
    time.sleep(30)
"""


def test_sigterm_during_a_save_removes_the_temporary_file(tmp_path):
    """A save killed by SIGTERM (as `timeout` or a service manager stops it) leaves the old file
    and no hidden temporary beside it, as Ctrl-C does."""
    out = tmp_path / "out.gguf"
    out.write_bytes(b"old")
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(out)], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "writing\n"
        assert len(list(tmp_path.iterdir())) == 2  # the temporary exists while writing
        child.send_signal(signal.SIGTERM)
        assert child.wait(timeout=20) != 0
    finally:
        child.kill()
        child.stdout.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.gguf"] and out.read_bytes() == b"old"


def test_terminate_unwinds_puts_the_default_back():
    with terminate_unwinds():
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
