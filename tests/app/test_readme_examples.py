"""The Python, TOML and JSON examples of README.md and docs/*.md: each compiles or parses, the names
they import exist (only public ones: a guide must not reach into modules that move), the engine
guide runs end to end on its tiny network, and the example files the README's commands use are
package data."""

from __future__ import annotations

import ast
import json
import shlex
import tomllib
from importlib.resources import files
from pathlib import Path

import pytest

from loomlab.core import llm

from .test_readme_commands import DOCS, LANGUAGE_MODELS, README, ROOT, lines_of, main, sections

GUIDES = [README, *DOCS]
# names a guide may import from loomlab.core.llm: its public face, the package's re-exports
LLM_PUBLIC = set(llm.__all__)


def blocks(path: Path, lang: str) -> list[str]:
    return [body for _, kind, body in sections(path) if kind == lang]


def python_examples() -> list[tuple[str, int, str]]:
    return [(p.name, i, body) for p in GUIDES for i, body in enumerate(blocks(p, "python"))]


def imports(source: str) -> list[ast.ImportFrom | ast.Import]:
    return [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Import | ast.ImportFrom)]


def test_the_example_files_are_package_data():
    examples = files("loomlab.resources") / "examples"
    assert {p.name for p in examples.iterdir()} >= {"xor.toml", "dense3.json", "dense3-permuted.json"}


@pytest.mark.parametrize("name, index, source", python_examples(), ids=lambda v: str(v)[:40])
def test_every_python_example_compiles_and_its_imports_exist(name, index, source):
    compile(source, f"{name} example {index}", "exec")
    for node in imports(source):
        if isinstance(node, ast.ImportFrom) and node.module.startswith("loomlab.core.llm"):
            assert node.module == "loomlab.core.llm", f"{name}: {node.module} is not public"
            assert {a.name for a in node.names} <= LLM_PUBLIC, name
        statement = ast.unparse(node)
        if "openai" in statement:
            pytest.importorskip("openai")
        exec(statement, {})  # the name is there (a lazy export resolves on import)


def test_the_readme_shows_a_language_model_from_python():
    """The README's language-model example loads a built-in model through the public entry point
    (it runs in the language-model tests: loading SmolLM2 takes seconds)."""
    example = next(body for body in blocks(README, "python") if "load_model" in body)
    assert "from loomlab.core.llm import load_model" in example
    assert any(f'load_model("{m}")' in example for m in LANGUAGE_MODELS)


@pytest.mark.parametrize("path", GUIDES, ids=lambda p: p.name)
def test_every_toml_and_json_example_parses(path):
    for body in blocks(path, "toml"):
        config = tomllib.loads(body)
        assert "task" in config["run"], path.name
    for body in blocks(path, "json"):
        json.loads(body)


def test_the_engine_guide_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/engine.md on its tiny network: both Python examples in order, then its commands."""
    monkeypatch.chdir(tmp_path)
    guide = ROOT / "docs" / "engine.md"
    for i, source in enumerate(blocks(guide, "python")):
        exec(compile(source, f"engine.md example {i}", "exec"), {})
    (block,) = blocks(guide, "sh")
    for line in lines_of(block):
        words = shlex.split(line)
        if words[0] == "python3":
            exec(words[words.index("-c") + 1], {})
        else:
            assert words[0] == "loomlab" and main(words[1:]) == 0, line
    out = capsys.readouterr().out
    assert "loss" in out and "forward (0, 0, 0, 0)" in out and "Dense" in out
    for made in ("net.json", "net8.loom", "out.npy", "net-fp4.json"):
        assert (tmp_path / made).is_file(), made
