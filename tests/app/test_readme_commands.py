"""The README's commands run when pasted: every ``loomlab`` line of its shell blocks parses with
the real command line (no ``[--optional]`` brackets, no unknown flags), and the headless network
walk-through (the Python example, then the ``net`` block) runs as written."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from loomlab.app.cli import CliError, build_parser, main

README = Path(__file__).resolve().parents[2] / "README.md"
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def blocks(kind: str) -> list[str]:
    return [body for lang, body in BLOCK.findall(README.read_text("utf-8")) if lang == kind]


def loomlab_lines() -> list[str]:
    return [line for body in blocks("sh") for line in body.splitlines() if line.startswith("loomlab ")]


def words(line: str) -> list[str]:
    return shlex.split(line, comments=True)[1:]


def status(argv: list[str]) -> int:
    """What ``loomlab ARGV`` exits with (``--version`` exits through argparse)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_the_readme_has_commands_to_check():
    assert len(loomlab_lines()) >= 15  # the walk-through, language models, evolution


@pytest.mark.parametrize("line", loomlab_lines())
def test_every_readme_command_parses(line):
    argv = words(line)
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --version prints and exits 0
        assert e.code == 0, line
        return
    except CliError as e:
        pytest.fail(f"{line!r} does not parse: {e}")
    assert getattr(args, "handler", None) is not None, line


def test_the_network_walk_through_runs_as_written(tmp_path, monkeypatch, capsys):
    """The Python example saves net.json; then every line of the ``net`` block runs (status 0)."""
    monkeypatch.chdir(tmp_path)
    example = next(body for body in blocks("python") if "save_network(net, \"net.json\")" in body)
    exec(compile(example, "README example", "exec"), {})
    net_block = next(body for body in blocks("sh") if "loomlab net info net.json" in body)
    for line in net_block.splitlines():
        if line.startswith("~/.loomlab/bin/python -c "):  # the README's interpreter: ours here
            exec(words(line)[1], {})
        elif line.startswith("loomlab "):
            assert status(words(line)) == 0, line
    out = capsys.readouterr().out
    assert "Dense" in out and Path("out.npy").exists() and Path("net8.loom").exists()
