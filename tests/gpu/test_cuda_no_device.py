"""Without a GPU (and without the simulator) the CUDA kernels say so with one LoomConfigError, and
importing ``loomlab.gpu`` or a kernel module stays safe. Each check runs in a fresh interpreter:
numba decides about the simulator and the driver once per process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NO_DEVICE = {"NUMBA_ENABLE_CUDASIM": "0", "CUDA_VISIBLE_DEVICES": ""}  # hides any GPU from the driver


def run(code: str) -> str:
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, **NO_DEVICE},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout.strip()


def test_importing_the_gpu_package_loads_no_cuda_target():
    assert run("import sys, loomlab.gpu; print('numba.cuda' in sys.modules)") == "False"


@pytest.mark.parametrize("call", [
    "from loomlab.gpu.quant_cuda import CudaQuantMatrix;"
    "from loomlab.core.llm.kernels.quant import QuantMatrix;"
    "CudaQuantMatrix(QuantMatrix(np.zeros((1, 32), np.float32), 0, (1, 32)))",
    "from loomlab.gpu.attention_cuda import attend; attend(np.zeros((1, 1, 4), np.float32),"
    "np.zeros((1, 1, 4), np.float32), np.zeros((1, 1, 4), np.float32), 0, None, 1.0)",
    "from loomlab.gpu.population_cuda import forward; forward(np.zeros((1, 2), np.float32),"
    "np.zeros((1, 4), np.float32), [(2, 2, 0)], [[0]], np.float32)",
], ids=["quant", "attention", "population"])
def test_no_device_is_one_clear_error(call):
    out = run(f"""
import numpy as np
from loomlab.core.errors import LoomConfigError
try:
    {call}
except LoomConfigError as e:
    print(e)
""")
    assert out.startswith("numba found no usable CUDA device or driver (set NUMBA_ENABLE_CUDASIM=1"), out


def test_numba_without_its_cuda_target_names_the_install():
    out = run("""
import sys
sys.modules["numba.cuda"] = None  # a numba without the CUDA target, and no numba-cuda
from loomlab.core.errors import LoomConfigError
from loomlab.gpu import cuda_common
try:
    cuda_common.numba_cuda()
except LoomConfigError as e:
    print(e)
""")
    assert "numba's CUDA target, which is not installed: pip install 'loomlab[gpu]'" in out, out
