"""pyproject.toml against the folders: every folder holding an ``__init__.py`` is a package a wheel
carries (a package missing from the list installs in editable mode and vanishes from a wheel)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROOMS = ("app", "core", "gpu", "views", "resources")


def test_every_package_folder_is_listed_and_mapped():
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {"loomlab." + ".".join(p.parent.relative_to(ROOT).parts): p.parent.relative_to(ROOT).as_posix()
             for room in ROOMS for p in (ROOT / room).rglob("__init__.py")}
    assert sorted(setup["packages"]) == sorted(found)
    assert setup["package-dir"] == found
