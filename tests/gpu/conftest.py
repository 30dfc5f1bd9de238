"""Tests marked ``cuda_simulator`` run their kernels in numba's CUDA simulator, in a child pytest.

The simulator is chosen when numba is first imported (``NUMBA_ENABLE_CUDASIM=1``), and in a whole
test run other modules import numba long before these. So a marked module, collected in a process
without the simulator, is run once more, whole, in a child ``pytest`` with the variable set; each
of its tests here then passes or fails as it did there (its failure text shown), and a test the
child skipped or never ran fails here: a skip in the simulator is not a pass. Run with
``NUMBA_ENABLE_CUDASIM=1`` already set, the marked tests simply run in this process (that is how
coverage of ``gpu/`` is measured, see docs/gpu.md).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

IN_SIMULATOR = os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"
ROOT = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT_S = 600
_runs: dict[Path, tuple[dict[str, tuple[str, str]], str]] = {}


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda_simulator: run in numba's CUDA simulator (a child pytest "
                                       "with NUMBA_ENABLE_CUDASIM=1 unless this process has it)")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if IN_SIMULATOR or pyfuncitem.get_closest_marker("cuda_simulator") is None:
        return None  # run the test here, as usual
    outcomes, output = _child_run(Path(pyfuncitem.path))
    outcome, text = outcomes.get(pyfuncitem.name, ("missing", "the child run did not report it"))
    if outcome != "passed":
        pytest.fail(f"in the CUDA simulator: {outcome}\n{text}\n--- child pytest output (tail) ---\n"
                    f"{output[-6000:]}", pytrace=False)
    return True


def _child_run(path: Path) -> tuple[dict[str, tuple[str, str]], str]:
    """Each test of ``path`` -> (outcome, message) from one child pytest run under the simulator."""
    if path not in _runs:
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.xml"
            env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
            cmd = [sys.executable, "-m", "pytest", str(path), "-q", "-p", "no:cacheprovider",
                   "-p", "no:xvfb", f"--junitxml={report}"]
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True,
                                      timeout=CHILD_TIMEOUT_S)
                output = proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as e:
                output = f"timed out after {CHILD_TIMEOUT_S} s\n{e.stdout or ''}"
            outcomes = _outcomes(report) if report.exists() else {}
        _runs[path] = outcomes, output
    return _runs[path]


def _outcomes(report: Path) -> dict[str, tuple[str, str]]:
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        name = case.get("name")
        problem = next((child for child in case if child.tag in ("failure", "error", "skipped")), None)
        if problem is not None:  # a teardown error comes as a second entry: it wins over the pass
            outcomes[name] = (problem.tag, f"{problem.get('message', '')}\n{problem.text or ''}")
        else:
            outcomes.setdefault(name, ("passed", ""))
    return outcomes
