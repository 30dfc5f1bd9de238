"""The README's DNA / splice / evolve / merge block runs as pasted, on the example files shipped
in resources/examples (package data)."""

from __future__ import annotations

import re
import shlex
from importlib.resources import files
from pathlib import Path

from loomlab.app.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[2]
LANGUAGE_MODELS = ("smollm2-135m", "gemma3-270m")


def readme_block(first_command: str) -> list[str]:
    """The lines of the README's ```sh block that holds ``first_command``, comments removed."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)
    block = next(b for b in blocks if first_command in b)
    return [" ".join(shlex.split(line, comments=True)) for line in block.splitlines() if line.strip()]


def test_the_example_files_are_package_data():
    examples = files("loomlab.resources") / "examples"
    assert {p.name for p in examples.iterdir()} >= {"xor.toml", "dense3.json", "dense3-permuted.json"}


def test_the_dna_splice_evolve_block_runs_as_pasted(tmp_path, monkeypatch, capsys):
    """Every command runs from a fresh folder and workspace; those of language models (minutes
    with the built-in models) are parsed here, and run by their own commands' tests."""
    lines = readme_block("loomlab dna $ex/dense3.json")
    assert lines[0] == "ex=resources/examples"
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOOMLAB_DATA", str(tmp_path / "data"))
    ran = []
    for line in lines[1:]:
        argv = shlex.split(line.replace("$ex", str(ROOT / "resources" / "examples")))
        assert argv[0] == "loomlab"
        if any(model in argv for model in LANGUAGE_MODELS):
            build_parser().parse_args(argv[1:])  # no bracketed options or other words argparse refuses
            continue
        assert main(argv[1:]) == 0, (line, capsys.readouterr().err)
        ran.append(argv[1])
    assert ran == ["dna", "net", "dna", "splice", "evolve", "evolve", "evolve"]
    out = capsys.readouterr().out
    assert "logic shifts" in out and "run 1 finished at generation 10" in out
    assert (tmp_path / "child.loom").is_file() and (tmp_path / "dense3-int8.json").is_file()
