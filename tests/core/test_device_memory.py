"""Device memory (used, free, peak) and the backends a language model may run on.

Oracles: the numbers a CuPy-like stand-in reports (its memory pool and cudaMemGetInfo), so the
path a GPU takes runs here without pretending a GPU exists; numpy has no device (None).
"""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core.backend import NUMPY, Backend, DeviceMemory, backend_names, device_memory
from loomlab.core.errors import LoomConfigError, ModelNotFoundError
from loomlab.core.llm.generate.textmodel import load_model

from .fake_cupy import GiB, MiB, cupy_like


def test_numpy_has_no_device_memory():
    assert device_memory(NUMPY) is None


def test_a_cupy_like_backend_reports_its_pool_and_device():
    xp = cupy_like()
    mem = device_memory(Backend("cupy", xp))
    assert mem == DeviceMemory(used=3 * MiB, free=70 * GiB, total=80 * GiB, peak=8 * MiB)
    assert mem.describe() == "GPU 0.00 GiB used, peak 0.01 GiB, 70.0 of 80.0 GiB free"
    # read now, not cached: the pool grows and the numbers follow
    xp.get_default_memory_pool().used, xp.get_default_memory_pool().held = 3 * GiB, 5 * GiB
    later = device_memory(Backend("cupy", xp))
    assert (later.used, later.peak) == (3 * GiB, 5 * GiB)
    assert later.describe() == "GPU 3.00 GiB used, peak 5.00 GiB, 70.0 of 80.0 GiB free"


def test_backend_names_are_the_registry_the_entry_points_and_auto(registry):
    assert {"numpy", "cupy", "auto"} <= set(backend_names())
    registry["tpu"] = lambda: NUMPY
    assert "tpu" in backend_names() and backend_names() == sorted(backend_names())


def test_a_language_model_on_cupy_without_cupy_says_how_to_install_it(registry, no_cupy):
    with pytest.raises(LoomConfigError, match=r"needs CuPy.*pip install 'loomlab\[gpu\]'"):
        load_model("no-such-model", backend="cupy")


@pytest.mark.parametrize("name", ["numpy", "auto", "cupy", "strict"])
def test_every_usable_backend_passes_the_backend_check(registry, name):
    registry["cupy"] = lambda: Backend("cupy", np)  # a machine where CuPy works: language models run there
    with pytest.raises(ModelNotFoundError):  # past the backend check: the name is what fails
        load_model("no-such-model", backend=name)


def test_an_unknown_backend_is_named():
    with pytest.raises(LoomConfigError, match="unknown backend 'tpu'"):
        load_model("no-such-model", backend="tpu")


def test_metrics_carry_the_device_memory_of_the_models_backend(smollm2, monkeypatch):
    assert smollm2.backend is NUMPY and smollm2.metrics().device_memory is None
    monkeypatch.setattr(smollm2.net, "backend", Backend("cupy", cupy_like()))  # the model's is its network's
    assert smollm2.metrics().device_memory == DeviceMemory(3 * MiB, 70 * GiB, 80 * GiB, 8 * MiB)
