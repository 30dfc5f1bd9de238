"""The headless CLI: loomlab --version, net info, net run; one-line errors with exit status 2."""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loomlab.app.cli import main
from loomlab.core import load_network

from ..core.goldens import case_input, forward_case


@pytest.fixture
def golden_net(tmp_path):
    case = forward_case("parallel_concat")
    path = tmp_path / "net.json"
    path.write_text(json.dumps(case["network"]))
    return path, case


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.startswith("loomlab 0.")


def test_net_info_table_and_json(golden_net, capsys):
    path, _ = golden_net
    assert main(["net", "info", str(path)]) == 0
    out = capsys.readouterr().out
    assert "Parallel" in out and out.count("Dense") == 2 and "64 parameters" in out
    assert main(["net", "info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["parameters"] == 64 and info["memory_bytes"] == 256
    assert [r["type"] for r in info["blueprint"]] == ["Parallel", "Dense", "Dense"]


def test_net_run_npy_matches_loom(golden_net, tmp_path):
    path, case = golden_net
    np.save(tmp_path / "in.npy", case_input(case))
    assert main(["net", "run", str(path), "--input", str(tmp_path / "in.npy"),
                 "--output", str(tmp_path / "out.npy")]) == 0
    y = np.load(tmp_path / "out.npy")
    np.testing.assert_allclose(y.ravel(), case["output"], rtol=1e-5, atol=1e-6)


def test_net_run_json_prints_the_output(golden_net, capsys):
    path, case = golden_net
    x = case_input(case)
    assert main(["net", "run", str(path), "--input-json", json.dumps(x.ravel().tolist()),
                 "--shape", ",".join(map(str, x.shape))]) == 0
    y = np.asarray(json.loads(capsys.readouterr().out))
    np.testing.assert_allclose(y.ravel(), case["output"], rtol=1e-5, atol=1e-6)
    assert y.shape == (2, 8)


@pytest.mark.parametrize("argv", [
    ["bogus"],
    ["net", "info", "/nonexistent/net.json"],
    ["net", "run", "NET", "--input-json", "[1, 2, 3]", "--shape", "2,2"],
    ["net", "run", "NET", "--input-json", "not json"],
    ["net", "run", "NET", "--input-json", "[1, 2]"],  # the network needs 8 inputs per row
    ["net", "run", "NET", "--input", "/nonexistent/in.npy"],
])
def test_errors_print_one_line_and_exit_2(argv, golden_net, capsys):
    path, _ = golden_net
    argv = [str(path) if a == "NET" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("loomlab: error: ") and err.count("\n") == 1


def test_bad_network_file_names_the_json_path(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"depth": 1, "rows": 1, "cols": 1, "layers_per_cell": 1, "layers": [{"type": "Conv9"}]}')
    assert main(["net", "info", str(bad)]) == 2
    assert "$.layers[0].type" in capsys.readouterr().err


def test_headless_commands_never_import_qt(golden_net):
    path, _ = golden_net
    code = ("import sys; from loomlab.app.cli import main; "
            f"rc = main(['net', 'info', {str(path)!r}]); "
            "assert not any(m.startswith(('PySide6', 'pyqtgraph')) for m in sys.modules), 'Qt imported'; "
            "sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert load_network(path).parameter_count() == 64


def test_net_morph_all_saves_a_checkpoint_loom_json_agrees_with(golden_net, tmp_path, capsys):
    path, case = golden_net
    out = tmp_path / "net8.loom"
    assert main(["net", "morph", str(path), "--all", "--dtype", "int8", "-o", str(out), "--json"]) == 0
    reports = json.loads(capsys.readouterr().out)
    assert [r["dtype"] for r in reports] == ["int8", "int8"] and all(r["cosine"] > 0.999 for r in reports)
    net = load_network(out)
    assert {la.cfg.dtype for la in net.weighted_layers()} == {"int8"}
    # an int8 net dequantizes to at most half a quantization step away from the float32 output
    x = case_input(case)
    drift = np.abs(net.forward(x).ravel() - np.asarray(case["output"])).max()
    assert 0 < drift < 0.05


def test_net_morph_one_layer_and_errors(golden_net, tmp_path, capsys):
    path, out = golden_net[0], str(tmp_path / "a.json")
    assert main(["net", "morph", str(path), "--layer", "0", "--dtype", "fp4", "-o", out]) == 2
    assert "no weights" in capsys.readouterr().err  # cell 0 is a Parallel: its children have the weights
    assert main(["net", "morph", str(path), "--all", "--dtype", "int3", "-o", out]) == 2
    assert "unknown dtype 'int3'" in capsys.readouterr().err


def test_net_morph_report_covers_every_dtype(golden_net, capsys):
    path, _ = golden_net
    assert main(["net", "morph-report", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["dtype"]: r for r in report["rows"]}
    assert len(rows) == 21 and report["probe_shape"] == [2, 8]
    assert rows["float32"]["output_drift"] == 0 and rows["float32"]["weight_bytes"] == 256
    assert rows["binary"]["weight_bytes"] == 8 and rows["int4"]["weight_bytes"] == 32
    assert rows["float16"]["rel_error"] < rows["int8"]["rel_error"] < rows["int4"]["rel_error"]
    assert 0 < rows["int8"]["output_drift"] < 0.02


def test_network_file_errors_name_the_file_and_say_what_it_is(golden_net, tmp_path, capsys):
    from loomlab.core.llm.files import registry

    gguf = registry.fetch("smollm2-135m")
    assert main(["net", "info", str(gguf)]) == 2
    assert capsys.readouterr().err == (f"loomlab: error: {gguf}: a GGUF language model, not a Loom network: "
                                       "use `loomlab models info` (or chat, generate)\n")
    missing = tmp_path / "missing.json"
    assert main(["net", "info", str(missing)]) == 2
    assert capsys.readouterr().err == f"loomlab: error: {missing}: cannot read: No such file or directory\n"
    # a problem inside the file: the file, then the JSON path of the culprit
    bad = tmp_path / "bad.json"
    bad.write_text('{"depth": 1, "rows": 1, "cols": 1, "layers_per_cell": 1, "layers": [{"type": "Conv9"}]}')
    for argv in (["net", "info", str(bad)], ["net", "run", str(bad), "--input-json", "[1]"],
                 ["net", "morph-report", str(bad)], ["net", "morph", str(bad), "--all", "--dtype", "int8",
                                                     "-o", str(tmp_path / "o.json")]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"loomlab: error: {bad}: $.layers[0].type: unknown layer type 'Conv9'"), err


def test_help_lists_the_workbench_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    out = capsys.readouterr().out
    assert e.value.code == 0
    for option in ("--screenshot PATH", "--panel PANEL", "--model MODEL", "--network NETWORK",
                   "--prompt PROMPT"):
        assert option in out
    assert "xvfb-run -a loomlab" in out


@pytest.mark.parametrize("env, platform, needs_display", [
    ({}, "linux", True),
    ({"DISPLAY": ":0"}, "linux", False),
    ({"WAYLAND_DISPLAY": "wayland-0"}, "linux", False),
    ({"QT_QPA_PLATFORM": "offscreen"}, "linux", False),
    ({"QT_QPA_PLATFORM": "vnc:size=800x600"}, "linux", False),
    ({"QT_QPA_PLATFORM": "xcb"}, "linux", True),  # xcb still needs an X server
    ({"DISPLAY": ""}, "linux", True),
    ({}, "darwin", False),
    ({}, "win32", False),
])
def test_display_problem(env, platform, needs_display):
    from loomlab.app.cli import display_problem

    problem = display_problem(env, platform)
    assert (problem is not None) == needs_display
    if needs_display:
        assert "xvfb-run -a loomlab" in problem and "headless commands" in problem


def test_no_display_is_one_line_and_exit_2_before_qt_starts(tmp_path):
    # Qt itself would abort with exit 134 and a hint about libxcb-cursor
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    code = ("import sys; from loomlab.app.cli import main; rc = main(sys.argv[1:]); "
            "assert 'PySide6' not in sys.modules, 'Qt imported'; sys.exit(rc)")
    for argv in ([], ["--panel", "chat"]):
        done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                              timeout=120, env=env, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert done.stdout == "" and done.stderr.count("\n") == 1
        assert done.stderr.startswith("loomlab: error: no display") and "xvfb-run -a loomlab" in done.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def clock(monkeypatch):
    """A fake time.monotonic for the CLI's progress output."""
    from loomlab.app import cli

    now = [100.0]
    monkeypatch.setattr(cli.time, "monotonic", lambda: now[0])
    return now


def test_progress_in_a_log_is_whole_lines_at_most_every_few_seconds(monkeypatch, clock):
    from loomlab.app import cli

    log = io.StringIO()  # not a terminal
    monkeypatch.setattr(sys, "stderr", log)
    for done in range(0, 101):  # a 100-step stage taking 1/8 s per step
        cli.progress_bar("download", done, 100)
        clock[0] += 0.125
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and log.getvalue().endswith("\n")
    # the first, one per LOG_INTERVAL_S (5 s = 40 steps) and the finished one
    assert [line.split("(")[1] for line in lines] == ["0/100)", "40/100)", "80/100)", "100/100)"]
    assert lines[-1] == f"download [{'#' * 30}] 100.0% (100/100)"
    log.truncate(0)
    log.seek(0)
    for done in range(1, 22):
        cli.progress(done, 21, "int8")
    assert log.getvalue().splitlines() == ["[1/21] int8", "[21/21] int8"]


def test_progress_on_a_terminal_redraws_one_line(monkeypatch, clock):
    from loomlab.app import cli

    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    for done in range(0, 4):
        cli.progress_bar("load", done, 3)
    out = term.getvalue()
    assert out.count("\r") == 4 and out.count("\n") == 1 and out.endswith("(3/3)\n")


def test_work_of_unknown_length_is_a_count_then_one_finished_line(monkeypatch, clock):
    """A first run's kernels: (stage, n, 0) while compiling, (stage, n, n) once ready."""
    from loomlab.app import cli
    from loomlab.core.llm.kernels.kernel_warmup import KERNELS_STAGE

    term = _Terminal()
    monkeypatch.setattr(sys, "stderr", term)
    for done in range(0, 3):
        cli.progress_bar(KERNELS_STAGE, done, 0)
    cli.progress_bar(KERNELS_STAGE, 2, 2)
    draws = term.getvalue().split("\r")[1:]
    assert draws[:3] == [f"{KERNELS_STAGE}: {n} done" for n in range(3)]
    assert draws[3].endswith("(2/2)\n") and term.getvalue().count("\n") == 1


def test_out_of_memory_and_too_deep_are_one_line_and_status_2(monkeypatch, capsys):
    """Whatever a command raises of these, the user gets one line, never a traceback."""
    from loomlab.app import cli

    class PanicException(BaseException):  # what the Rust tokenizer's panic is called
        pass

    for error, words in ((MemoryError(), "out of memory"), (RecursionError(), "nested too deeply"),
                         (PanicException("regex"), "the tokenizer failed: regex")):
        def fail(args, error=error):
            raise error

        monkeypatch.setattr(cli, "build_parser", lambda fail=fail: _Parsed(argparse.Namespace(handler=fail)))
        assert main(["tokenize", "smollm2-135m", "x"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err


def test_sigterm_during_a_save_exits_143_and_ctrl_c_130(monkeypatch, capsys):
    from loomlab.app import cli
    from loomlab.core.io.atomic import Terminated

    for error, status, line in ((Terminated(), 143, "loomlab: terminated"),
                                (KeyboardInterrupt(), 130, "loomlab: cancelled")):
        def fail(args, error=error):
            raise error

        monkeypatch.setattr(cli, "build_parser", lambda fail=fail: _Parsed(argparse.Namespace(handler=fail)))
        assert main(["quantize", "m", "out.gguf"]) == status
        assert capsys.readouterr().err == line + "\n"


class _Parsed:
    """A parser whose parse gives ``args`` whatever the words."""

    def __init__(self, args):
        self.args = args

    def parse_args(self, argv):
        return self.args


def test_an_hf_folder_without_tokenizer_json_says_it_is_missing(tmp_path, capsys):
    import shutil

    folder = tmp_path / "tiny"
    shutil.copytree(Path(__file__).resolve().parent.parent / "data" / "tiny-hf" / "tiny-qwen2", folder)
    assert main(["generate", str(folder), "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    listed = ", ".join(sorted(p.name for p in folder.iterdir()))
    assert err == f"loomlab: error: {folder / 'tokenizer.json'}: missing; the folder holds {listed}"


def test_morph_report_of_a_build_schema_network_compares_copies_of_the_same_weights(tmp_path, capsys):
    path = tmp_path / "built.json"
    path.write_text(json.dumps({"depth": 1, "rows": 1, "cols": 1, "layers_per_cell": 1, "layers": [
        {"type": "Dense", "input_height": 4, "output_height": 3}]}))
    assert main(["net", "morph-report", str(path), "--json"]) == 0
    rows = {r["dtype"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["float32"]["output_drift"] == 0 and rows["float64"]["output_drift"] == 0
    assert 0 < rows["int8"]["output_drift"] < 0.05


@pytest.mark.parametrize("layer, where", [
    ({"type": "Softmax", "temperature": 10 ** 400}, "$.layers[0].temperature: expected a finite number"),
    ({"type": "Dense", "input_height": 1 << 14, "output_height": 1 << 15}, "$.layers[0]: network needs over"),
])
def test_net_info_of_an_impossible_number_is_one_line_naming_the_field(layer, where, tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"depth": 1, "rows": 1, "cols": 1, "layers_per_cell": 1, "layers": [layer]}))
    assert main(["net", "info", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"loomlab: error: {path}: {where}") and err.count("\n") == 1
