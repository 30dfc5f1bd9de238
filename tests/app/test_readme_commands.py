"""The README's commands run when pasted as written.

Every ``loomlab`` line of a shell block in README.md and docs/*.md parses with the real command
line (no ``[--optional]`` brackets, no placeholders, no unknown flags), every shell block is valid
bash, and the README's headless commands run, in the README's order, from a fresh folder on the
tiny network its Python example saves and the example files of resources/examples. Commands of
language models are parsed here and run by their own commands' tests (they take minutes with the
built-in models); the set-up and test blocks are checked against the script CI runs."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from loomlab.app.cli import CliError, build_parser, main

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LANGUAGE_MODELS = ("smollm2-135m", "gemma3-270m")
# commands that load a language model (or its files) whatever their arguments
MODEL_COMMANDS = {"models", "chat", "generate", "tokenize", "bench", "quant-report", "quantize", "serve",
                  "merge", "inspect", "imatrix"}
# words a reader would have to replace: a pasted command must not hold one
PLACEHOLDERS = {"MODEL", "FILE", "PATH", "NAME", "KEY", "PATTERN", "DIR", "NET", "CONFIG", "TEXT", "RUN",
                "OUT", "IN", "N", "VENV", "..."}
FILE_SUFFIXES = (".json", ".loom", ".npy", ".gguf", ".toml")


def sections(path: Path) -> list[tuple[str, str, str]]:
    """``(section heading, block language, block body)`` for every fenced block of ``path``."""
    text = path.read_text("utf-8")
    heads = [(m.start(), m.group(1)) for m in re.finditer(r"^## (.+)$", text, re.M)]
    out = []
    for m in BLOCK.finditer(text):
        head = next((h for start, h in reversed(heads) if start < m.start()), "")
        out.append((head, m.group(1), m.group(2)))
    return out


def sh_blocks(path: Path) -> list[tuple[str, str]]:
    return [(head, body) for head, lang, body in sections(path) if lang == "sh"]


def lines_of(body: str) -> list[str]:
    return [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def loomlab_argv(line: str) -> list[str] | None:
    """The arguments of the ``loomlab`` a shell line runs (after ``xvfb-run``'s options), or None."""
    words = shlex.split(line, comments=True)
    if words[:1] == ["xvfb-run"]:
        words = words[words.index("loomlab"):] if "loomlab" in words else []
    return words[1:] if words[:1] == ["loomlab"] else None


def commands(paths) -> list[tuple[str, str]]:
    return [(path.name, line) for path in paths for _, body in sh_blocks(path) for line in lines_of(body)
            if loomlab_argv(line) is not None]


def needs_a_language_model(argv: list[str]) -> bool:
    return bool(argv) and (argv[0] in MODEL_COMMANDS or any(m in argv for m in LANGUAGE_MODELS))


def status(argv: list[str]) -> int:
    """What ``loomlab ARGV`` exits with (``--version`` exits through argparse)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


# ----- the README as a whole -----------------------------------------------------------------------

def test_the_readme_is_a_short_guide_for_users():
    text = README.read_text("utf-8")
    assert len(text.splitlines()) <= 300
    # dates belong to the measurements' machines, nowhere else (the history is in docs/performance.md)
    measured = text.split("## Measured", 1)[1].split("\n## ", 1)[0]
    outside = text.replace(measured, "")
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", outside)


def test_the_readme_has_commands_to_check():
    assert len(commands([README])) >= 15  # the walk-through, language models, evolution


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_shell_block_is_valid_bash(path):
    for _, body in sh_blocks(path):
        done = subprocess.run(["bash", "-n"], input=body, text=True, capture_output=True)
        assert done.returncode == 0, (path.name, body, done.stderr)


@pytest.mark.parametrize("name, line", commands([README, *DOCS]), ids=lambda v: v[:80])
def test_every_command_parses_as_pasted(name, line):
    argv = loomlab_argv(line)
    assert not [w for w in argv if w in PLACEHOLDERS or w.startswith("[-")], f"{name}: {line}"
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:  # --version prints and exits 0
        assert e.code == 0, f"{name}: {line}"
        return
    except CliError as e:
        pytest.fail(f"{name}: {line!r} does not parse: {e}")
    # a command has its handler; without one the line opens the workbench in some state
    assert args.command is None or getattr(args, "handler", None) is not None, f"{name}: {line}"


def waits(argv: list[str]) -> bool:
    """Whether the command keeps the terminal: an interactive chat, a server, the window."""
    if argv[:1] == ["chat"]:
        return "--message" not in argv
    if argv[:1] == ["serve"]:
        return True
    if "--version" in argv or "--screenshot" in argv:
        return False
    return build_parser().parse_args(argv).command is None


@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_a_command_that_keeps_the_terminal_ends_its_block(path):
    """Pasted as a block, the lines after an interactive chat would become its messages."""
    for _, body in sh_blocks(path):
        argvs = [loomlab_argv(line) for line in lines_of(body)]
        for argv in argvs[:-1]:
            assert argv is None or not waits(argv), f"{path.name}: 'loomlab {shlex.join(argv)}' is not last"


def test_files_the_readme_commands_read_come_from_earlier_lines():
    """Pasted from the top, every file a command reads exists by then: the Python example's
    net.json, an earlier command's output, or a shipped example ($ex)."""
    made = {"net.json"}  # saved by the Python example the walk-through starts from
    for _, body in sh_blocks(README):
        for line in lines_of(body):
            if "np.save('in.npy'" in line:
                made.add("in.npy")
            argv = loomlab_argv(line)
            if not argv:
                continue
            outputs = {argv[i + 1] for i, w in enumerate(argv[:-1]) if w in ("-o", "--output")}
            if argv[0] == "quantize":
                outputs.add([w for w in argv[1:] if not w.startswith("-")][1])
            for word in argv:
                if word.startswith("examples/"):  # the clone's top-level examples
                    assert (ROOT / word).is_file(), f"{line!r} reads {word}, which the clone lacks"
                elif word.endswith(FILE_SUFFIXES) and word not in outputs and not word.startswith("$ex/"):
                    assert word in made, f"{line!r} reads {word}, which no earlier line makes"
            made |= outputs


# ----- the blocks a user pastes first: set-up and tests -------------------------------------------

def setup_script_packages() -> set[str]:
    script = (ROOT / "tests" / "setup-and-test.sh").read_text("utf-8")
    listed = re.search(r"SYSTEM_PACKAGES=\((.*?)\)", script, re.S).group(1)
    return {w for line in listed.splitlines() for w in line.split("#")[0].split()}


def test_the_set_up_installs_what_the_window_needs():
    """The README's apt line installs every library the test script installs for Qt (the script
    adds Xvfb for its virtual display, which a desktop does not need)."""
    setup = [body for head, body in sh_blocks(README) if head == "Set up"]
    apt = next(line for body in setup for line in body.splitlines() if "apt-get install" in line)
    installed = set(apt.split("--no-install-recommends", 1)[1].split())
    assert setup_script_packages() - {"xvfb", "xauth"} <= installed
    assert "python3-venv" in installed
    assert any("~/.loomlab/bin/pip install ." in body for body in setup)


def test_the_tests_section_names_the_command_ci_runs():
    block = [body for head, body in sh_blocks(README) if head == "Run the tests"]
    assert [lines_of(b) for b in block] == [["bash tests/setup-and-test.sh"]]
    assert "exec bash tests/setup-and-test.sh" in (ROOT / ".ci" / "run").read_text("utf-8")


# ----- the headless commands, run ----------------------------------------------------------------

def test_every_readme_shell_line_is_run_parsed_or_set_up():
    """A new kind of line in a README shell block has to be taught to this test: run here, parsed
    only (it needs a language model or opens the window), or part of the set-up."""
    for head, body in sh_blocks(README):
        if head in ("Set up", "Run the tests"):
            continue
        for line in lines_of(body):
            argv = loomlab_argv(line)
            known = (argv is not None or line.startswith(("ex=", "~/.loomlab/bin/python -c ")))
            assert known, f"the README's {head!r} section has a line no test runs: {line!r}"


def test_the_headless_readme_commands_run_as_pasted(tmp_path, monkeypatch, capsys):
    """The Python example saves net.json; then, block after block, every line that needs neither a
    language model nor a display runs from a fresh folder and workspace (status 0)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOOMLAB_DATA", str(tmp_path / "data"))
    example = next(body for _, lang, body in sections(README)
                   if lang == "python" and 'save_network(net, "net.json")' in body)
    exec(compile(example, "README example", "exec"), {})
    ex = None
    ran = []
    for head, body in sh_blocks(README):
        if head in ("Set up", "Run the tests"):
            continue
        for line in lines_of(body):
            words = shlex.split(line, comments=True)
            if line.startswith("ex="):
                assert words == ["ex=resources/examples"]
                ex = str(ROOT / "resources" / "examples")  # the clone's folder, seen from here
            elif line.startswith("~/.loomlab/bin/python -c "):  # the README's interpreter: ours here
                exec(words[words.index("-c") + 1], {})
            argv = loomlab_argv(line.replace("$ex", ex or "$ex").replace(" examples/", f" {ROOT}/examples/"))
            if argv is None or needs_a_language_model(argv) or not argv:
                continue
            if argv != ["--version"] and build_parser().parse_args(argv).command is None:
                continue  # opens the window
            assert status(argv) == 0, (line, capsys.readouterr().err)
            ran.append(" ".join(argv[:2]))
    assert ran == ["--version", "net info", "net run", "net run", "net morph", "net morph-report",
                   "dna " + ex + "/dense3.json", "net morph", "dna " + ex + "/dense3.json",
                   "splice " + ex + "/dense3.json", "evolve " + ex + "/xor.toml", "evolve --resume",
                   "evolve --list", f"evolve {ROOT}/examples/cartpole.toml"]
    out = capsys.readouterr().out
    assert "Dense" in out and "logic shifts" in out and "run 1 finished at generation 10" in out
    assert "run 2 solved" in out and "cartpole-run-2.gif" in out
    for made in ("out.npy", "net8.loom", "dense3-int8.json", "child.loom", "cartpole-run-2.gif"):
        assert (tmp_path / made).is_file(), made


# ----- links ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", [README, *DOCS], ids=lambda p: p.name)
def test_every_relative_link_resolves(path):
    for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text("utf-8")):
        if "://" in target or target.startswith("#"):
            continue
        assert (path.parent / target.split("#")[0]).exists(), f"{path.name} links to {target}"


def test_the_readme_links_every_guide():
    guides = {"workbench.md", "engine.md", "language-models.md", "recipes.md", "serving.md", "evolution.md",
              "gpu.md", "performance.md", "compat.md", "quantization.md"}
    linked = set(re.findall(r"\]\(docs/([\w-]+\.md)\)", README.read_text("utf-8")))
    assert guides <= linked and guides <= {p.name for p in DOCS}
