"""tests/setup-and-test.sh, run against stand-ins for apt, dpkg and python3 that record their calls:
Debian's python3-venv is installed only where python3 cannot make a virtual environment itself."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "setup-and-test.sh"

# Each stand-in appends "name args..." to $CALLS. dpkg-query reports every package as missing, so
# apt-get is asked for exactly the packages the script wants.
STUBS = {
    "dpkg-query": "exit 1",
    "apt-get": 'echo "apt-get $*" >> "$CALLS"',
    "sudo": 'exec "$@"',
    "python3": '''echo "python3 $*" >> "$CALLS"
if [ "$1" = -c ]; then exit "$ENSUREPIP_RC"; fi
if [ "$1 $2" = "-m venv" ]; then mkdir -p "$3/bin" && cp "$STUBS/venv-python" "$3/bin/python"; fi''',
    "venv-python": '''echo "venv-python $*" >> "$CALLS"
if [ "$1" = -c ]; then echo "$STUBS"; fi''',
    "lint-imports": "true",
    "ruff": "true",
}


def _run(tmp_path: Path, *, ensurepip_works: bool, venv_exists: bool = False) -> list[str]:
    root = tmp_path / "repo"
    (root / "tests").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "tests" / SCRIPT.name)
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text(f"#!/bin/sh\n{body}\n")
        (stubs / name).chmod(0o755)
    if venv_exists:
        (root / ".venv" / "bin").mkdir(parents=True)
        shutil.copy(stubs / "venv-python", root / ".venv" / "bin" / "python")
    calls = tmp_path / "calls"
    calls.write_text("")
    env = {"PATH": f"{stubs}:/usr/bin:/bin", "CALLS": str(calls), "STUBS": str(stubs),
           "ENSUREPIP_RC": "0" if ensurepip_works else "1", "HOME": str(tmp_path)}
    done = subprocess.run(["bash", str(root / "tests" / SCRIPT.name), "-x"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return calls.read_text().splitlines()


def _apt_packages(calls: list[str]) -> list[str]:
    (install,) = [c for c in calls if c.startswith("apt-get install")]
    return install.split("--no-install-recommends ")[1].split()


def test_a_python_that_can_make_a_venv_pulls_no_debian_python(tmp_path):
    calls = _run(tmp_path, ensurepip_works=True)
    packages = _apt_packages(calls)
    assert "python3-venv" not in packages and "xvfb" in packages and "libxcb-cursor0" in packages
    assert "python3 -m venv .venv" in calls
    # everything after that runs in the project's .venv, the pytest arguments passed on
    assert "venv-python -m pip install -e .[dev,cluster,control]" in calls
    assert calls[-1] == "venv-python -m pytest -x"


def test_a_python_without_ensurepip_gets_python3_venv(tmp_path):
    assert "python3-venv" in _apt_packages(_run(tmp_path, ensurepip_works=False))


def test_an_existing_venv_needs_no_python3_venv(tmp_path):
    calls = _run(tmp_path, ensurepip_works=False, venv_exists=True)
    assert "python3-venv" not in _apt_packages(calls)
    assert not any(c.startswith("python3 ") for c in calls)  # neither asked nor used
