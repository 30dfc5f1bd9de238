"""The backend registry: numpy built in, CuPy a plugin found through its entry point.

Oracles: the installed package's own metadata (pyproject.toml's entry point), which modules a fresh
interpreter has imported, and the registry's answers with a stand-in plugin in place of CuPy.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from importlib.metadata import entry_points

import numpy as np
import pytest

from loomlab.core import backend
from loomlab.core.backend import NUMPY, Backend, DeviceKernels, get_backend, register_backend
from loomlab.core.errors import LoomConfigError


def test_numpy_is_built_in_and_unknown_names_list_the_known_ones():
    assert get_backend() is NUMPY and get_backend("numpy").xp is np
    known = r"\['cupy', 'numpy', 'strict', 'strict-no-float64'\]"
    with pytest.raises(LoomConfigError, match=rf"unknown backend 'tpu'; known: {known}"):
        get_backend("tpu")


def test_the_installed_package_declares_the_gpu_plugin():
    (ep,) = entry_points(group=backend.ENTRY_POINT_GROUP, name="cupy")
    assert ep.value == "loomlab.gpu"


def test_core_imports_the_gpu_plugin_through_its_entry_point_only_when_asked_for():
    code = "\n".join([
        "import sys",
        "from loomlab.core import backend",
        "backend.get_backend('numpy')",
        "before = 'loomlab.gpu' in sys.modules",
        "backend.get_backend('auto')",
        "import loomlab.gpu as gpu",
        "print(before, 'loomlab.gpu' in sys.modules, backend._FACTORIES['cupy'] is gpu.cupy_backend)"])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    assert out.stdout.split() == ["False", "True", "True"]


def test_without_cupy_the_gpu_backend_says_how_to_install_it_and_auto_falls_back(registry, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` fail, CuPy installed or not
    with pytest.raises(LoomConfigError, match=r"needs CuPy.*pip install 'loomlab\[gpu\]'"):
        get_backend("cupy")
    assert get_backend("auto") is NUMPY


def test_auto_takes_the_gpu_backend_when_it_works(registry):
    fake = Backend("cupy", np)  # stands for a machine with a usable GPU
    register_backend("cupy", lambda: fake)
    assert get_backend("auto") is fake and get_backend("cupy") is fake


def test_a_plugin_that_fails_to_import_is_reported_as_such(registry, monkeypatch):
    class BrokenEntryPoint:
        name, value = "broken", "no_such_plugin_module"

        def load(self):
            raise ImportError("No module named 'no_such_plugin_module'")

    monkeypatch.setattr(backend, "entry_points",
                        lambda group, name=None: [BrokenEntryPoint()] if name in (None, "broken") else [])
    with pytest.raises(LoomConfigError, match="'no_such_plugin_module' failed to import"):
        get_backend("broken")


def test_backends_describe_the_language_model_kernels_without_importing_them():
    """``Backend.llm_kernels`` makes a :class:`DeviceKernels`, which the language models' array-API
    fallback is; the backends' module imports nothing of the language models (its source says)."""
    from loomlab.core.llm.kernels.device_kernels import kernels_for

    assert isinstance(kernels_for(NUMPY), DeviceKernels)
    tree = ast.parse(inspect.getsource(backend))
    imported = [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    imported += [a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names]
    assert not [name for name in imported if "llm" in name.split(".")]
