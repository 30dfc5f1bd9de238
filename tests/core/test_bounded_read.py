"""Small user files: regular files only, a size cap, and JSON too deep for the parser typed."""

from __future__ import annotations

import os

import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.io.bounded_read import parse_json_text, read_small_bytes, read_small_text


def test_a_regular_file_is_read_whole(tmp_path):
    path = tmp_path / "r.json"
    path.write_text('{"*": "Q8_0"}')
    assert read_small_text(path, "the recipe file") == '{"*": "Q8_0"}'
    assert parse_json_text(read_small_bytes(path, "the recipe file"), "the recipe") == {"*": "Q8_0"}


@pytest.mark.parametrize("make", ["device", "fifo", "folder"])
def test_what_is_not_a_regular_file_is_refused_at_once(tmp_path, make):
    makers = {"device": lambda: "/dev/zero", "fifo": lambda: _fifo(tmp_path), "folder": lambda: tmp_path}
    path = makers[make]()
    with pytest.raises(LoomConfigError, match="is not a regular file|cannot read"):
        read_small_bytes(path, "the config")


def _fifo(folder):
    path = folder / "pipe"
    os.mkfifo(path)  # nobody writes: a blocking open or read would wait forever
    return path


def test_a_file_over_the_limit_is_refused_naming_its_size(tmp_path):
    path = tmp_path / "big.toml"
    path.write_bytes(b"x" * 101)
    assert read_small_bytes(path, "the config", limit=101) == b"x" * 101
    with pytest.raises(LoomConfigError, match="the config .* is 101 bytes; the limit is 100"):
        read_small_bytes(path, "the config", limit=100)


def test_text_that_is_not_utf8_and_json_nested_too_deeply_are_typed(tmp_path):
    path = tmp_path / "r.json"
    path.write_bytes(b"\xff\xfe")
    with pytest.raises(LoomConfigError, match="not UTF-8"):
        read_small_text(path, "the recipe file")
    with pytest.raises(LoomConfigError, match="nested too deeply"):
        parse_json_text("[" * 100_000, "the recipe")
    with pytest.raises(LoomConfigError, match="is not JSON"):
        parse_json_text("{", "the recipe")
