"""``--backend numpy|cupy|auto`` on every command that computes.

Oracles: the numpy backend's output (auto without a GPU must give the same numbers), the engine's
own messages (install hint, no device), and each command's parser.
"""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from loomlab.app.cli import build_parser, main
from loomlab.app.commands import net as net_commands
from loomlab.core import backend
from loomlab.core.backend import Backend

from ..core.goldens import case_input, forward_case

# every command that computes on a backend, with the arguments it needs besides --backend
COMPUTING = {
    "net run": ["net", "run", "n.json", "--input-json", "[1]"],
    "net morph-report": ["net", "morph-report", "n.json"],
    "generate": ["generate", "m", "--prompt", "hi"],
    "chat": ["chat", "m"],
    "tokenize": ["tokenize", "m", "hi"],
    "bench": ["bench", "m"],
    "quant-report": ["quant-report", "m"],
    "serve": ["serve", "m"],
}


@pytest.fixture
def golden_net(tmp_path):
    case = forward_case("parallel_concat")
    path = tmp_path / "net.json"
    path.write_text(json.dumps(case["network"]))
    return path, case_input(case)


def run_argv(path, x) -> list[str]:
    return ["net", "run", str(path), "--input-json", json.dumps(x.ravel().tolist()), "--shape",
            ",".join(map(str, x.shape))]


def one_error_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    assert lines[0].startswith("loomlab: error: ")
    return lines[0]


@pytest.mark.parametrize("command", COMPUTING)
def test_every_computing_command_takes_the_option(command):
    parser = build_parser()
    assert parser.parse_args(COMPUTING[command]).backend == "numpy"
    assert parser.parse_args([*COMPUTING[command], "--backend", "auto"]).backend == "auto"


@pytest.mark.parametrize("command", ["net run", "generate"])
def test_an_unknown_backend_is_one_line_naming_the_choices(command, capsys):
    assert main([*COMPUTING[command], "--backend", "gpu"]) == 2
    line = one_error_line(capsys)
    assert "argument --backend: unknown backend 'gpu'; choose from auto, cupy, numpy" in line


def test_cupy_without_cupy_says_how_to_install_it(golden_net, no_cupy, capsys):
    path, x = golden_net
    assert main([*run_argv(path, x), "--backend", "cupy"]) == 2
    assert "needs CuPy, which is not installed: pip install 'loomlab[gpu]'" in one_error_line(capsys)
    # a language model: the same message, before any model is looked for
    assert main(["generate", "no-such-model", "--prompt", "hi", "--backend", "cupy"]) == 2
    assert "pip install 'loomlab[gpu]'" in one_error_line(capsys)


def test_cupy_without_a_device_says_so(golden_net, monkeypatch, capsys):
    no_device = SimpleNamespace(cuda=SimpleNamespace(runtime=SimpleNamespace(getDeviceCount=lambda: 0)))
    monkeypatch.setitem(sys.modules, "cupy", no_device)
    path, x = golden_net
    assert main([*run_argv(path, x), "--backend", "cupy"]) == 2
    assert one_error_line(capsys).endswith("CuPy found no CUDA device")


def test_auto_runs_on_numpy_here_with_numpys_numbers(golden_net, no_cupy, capsys):
    path, x = golden_net
    outputs = {}
    for name in ("numpy", "auto"):
        assert main([*run_argv(path, x), "--backend", name]) == 0
        outputs[name] = np.array(json.loads(capsys.readouterr().out))
    np.testing.assert_array_equal(outputs["auto"], outputs["numpy"])


def test_morph_report_runs_its_probe_on_the_chosen_backend(golden_net, monkeypatch, capsys):
    path, _ = golden_net
    seen = []
    real = net_commands.load_net
    monkeypatch.setattr(net_commands, "load_net",
                        lambda p, backend, seed=None: seen.append(backend) or real(p, backend, seed))
    assert main(["net", "morph-report", str(path), "--backend", "auto", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["rows"]) == 21
    assert len(seen) > 21 and set(seen) == {"auto"}  # every network read: at least one per dtype


def test_a_language_model_generates_on_the_chosen_backend(monkeypatch, capsys):
    """A working CuPy (here with numpy's namespace: the host path) and auto, which picks it, and
    the strict checking device all generate numpy's greedy text on the exact path (a device
    backend's products are float32 whatever the activations setting)."""
    monkeypatch.setitem(backend._FACTORIES, "cupy", lambda: Backend("cupy", np))  # a usable GPU
    texts, argv = {}, ["generate", "smollm2-135m", "--prompt", "Hi", "--max-tokens", "3", "--exact"]
    for name in ("numpy", "cupy", "auto", "strict"):
        assert main([*argv, "--backend", name]) == 0
        out = capsys.readouterr()
        assert f"backend: {'cupy' if name == 'auto' else name}]" in out.err
        texts[name] = out.out
    assert texts["numpy"].strip() and set(texts.values()) == {texts["numpy"]}


def test_bench_reports_the_backend_and_its_device_memory(capsys):
    argv = ["bench", "smollm2-135m", "--tokens", "2", "--repeat", "1", "--backend", "auto"]
    assert main([*argv, "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["backend"] == "numpy" and result["device_memory"] is None
    assert main(argv) == 0
    lines = dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())
    assert lines["backend"] == "numpy" and lines["device_memory"] == "none (numpy)"


def test_the_workbench_takes_the_option_too(capsys):
    from loomlab.app.cli import gui_parser
    from loomlab.app.gui import GuiOptions

    assert GuiOptions(**vars(gui_parser().parse_args(["--backend", "auto"]))).backend == "auto"
    assert GuiOptions(**vars(gui_parser().parse_args([]))).backend is None  # the saved choice
    assert main(["--backend", "tpu"]) == 2  # refused before any window or display is needed
    assert "argument --backend: unknown backend 'tpu'" in one_error_line(capsys)
