"""On a real GPU: device memory read from CuPy's pool and the device, and ``--backend cupy|auto``
on the command line against numpy's output. Runs only where CuPy and a GPU exist; elsewhere the
skip says why (it is not counted as passing)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from loomlab.app.cli import main
from loomlab.core.backend import device_memory, get_backend

from ..core.goldens import case_input, forward_case

cupy = pytest.importorskip("cupy", reason="CuPy is not installed (pip install 'loomlab[gpu]')")
try:
    get_backend("cupy")
except Exception as e:  # pragma: no cover - depends on the machine
    pytest.skip(f"no usable CUDA device: {e}", allow_module_level=True)

MiB = 2**20


def test_device_memory_counts_an_array_and_agrees_with_the_driver():
    gpu = get_backend("cupy")
    before = device_memory(gpu)
    a = cupy.ones(64 * MiB // 4, dtype=cupy.float32)
    after = device_memory(gpu)
    assert after.used - before.used == a.nbytes  # the pool hands out whole 512-byte blocks
    assert after.peak >= after.used and 0 < after.free < after.total
    assert after.total == cupy.cuda.runtime.memGetInfo()[1]
    del a
    assert device_memory(gpu).used == before.used
    assert device_memory(gpu).peak == after.peak  # the pool keeps the freed block for reuse


@pytest.mark.parametrize("name", ["cupy", "auto"])
def test_net_run_on_the_gpu_matches_numpy(name, tmp_path, capsys):
    case = forward_case("parallel_concat")
    path = tmp_path / "net.json"
    path.write_text(json.dumps(case["network"]))
    x = case_input(case)
    argv = ["net", "run", str(path), "--input-json", json.dumps(x.ravel().tolist()),
            "--shape", ",".join(map(str, x.shape))]
    outputs = {}
    for backend in ("numpy", name):
        assert main([*argv, "--backend", backend]) == 0
        outputs[backend] = np.array(json.loads(capsys.readouterr().out))
    np.testing.assert_allclose(outputs[name], outputs["numpy"], rtol=1e-5, atol=1e-6)
