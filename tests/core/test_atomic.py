"""core/io/atomic.py: saved files get the permissions a plain write would give them."""

from __future__ import annotations

import os
import stat

import pytest

from loomlab.core.io.atomic import write_atomic


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
