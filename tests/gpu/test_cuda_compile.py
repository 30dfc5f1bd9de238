"""Every CUDA kernel compiles for a real GPU (PTX for sm_90, an H100), with no GPU needed.

The simulator runs kernels as Python and accepts code NVVM refuses (it once accepted a shared
array sized by a closure's int); compiling with NVVM closes that gap. It needs NVVM and NVRTC,
which ``pip install 'loomlab[gpu]'`` brings (numba-cuda[cu12]); elsewhere the test skips saying so.
"""

from __future__ import annotations

import types

import numpy as np
import pytest

numba_types = pytest.importorskip("numba.types")


@pytest.fixture
def cuda(monkeypatch):
    if __import__("os").environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.skip("the CUDA simulator is on in this process: NVVM is not used")
    from numba import cuda

    try:
        from numba.cuda.cudadrv.nvvm import NVVM

        NVVM()
    except Exception as e:  # no libNVVM found, or it failed to load
        pytest.skip(f"NVVM (the CUDA compiler library) is not usable here: {e}; pip install 'loomlab[gpu]'")
    if not cuda.is_available():  # compiling a device function asks the current device for its
        from numba.cuda import dispatcher  # compute capability: stand in for an H100's

        monkeypatch.setattr(dispatcher, "get_current_device",
                            lambda: types.SimpleNamespace(compute_capability=(9, 0)))
    from loomlab.gpu import attention_cuda, population_cuda, quant_cuda

    for module in (attention_cuda, population_cuda, quant_cuda):
        monkeypatch.setattr(module, "numba_cuda", lambda: cuda)  # it would refuse: no device here
    return cuda


def A(dtype, ndim):
    return numba_types.Array(dtype, ndim, "C")


F32, I64 = numba_types.float32, numba_types.int64


def compiled(cuda, kernel, signature) -> list[str]:
    ptx, _ = cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))
    return ptx.splitlines()


def test_quant_kernel_compiles_to_float32_ptx(cuda):
    from loomlab.gpu.quant_cuda import _products_kernel

    signature = (I64, A(numba_types.uint8, 2), A(F32, 2), A(F32, 2), numba_types.boolean, I64, I64, I64,
                 I64, I64, F32, A(F32, 2), I64, A(F32, 2))
    ptx = compiled(cuda, _products_kernel(), signature)
    assert any(".entry" in line for line in ptx)
    assert not any(".f64" in line for line in ptx)  # nothing slips into float64 on the decode path


@pytest.mark.parametrize("half", [False, True])
def test_attention_kernel_compiles_to_float32_ptx(cuda, half):
    from loomlab.gpu.attention_cuda import _attend_kernel

    kv = A(numba_types.uint16 if half else F32, 3)
    ptx = compiled(cuda, _attend_kernel(half), (A(F32, 3), kv, kv, I64, I64, F32, F32, A(F32, 2), A(F32, 2)))
    assert any(".entry" in line for line in ptx)
    assert not any(".f64" in line for line in ptx)


@pytest.mark.parametrize("compute", [np.float32, np.float64])
def test_population_kernel_compiles(cuda, compute):
    from loomlab.gpu.population_cuda import _stack_kernel

    signature = (A(F32, 2), A(F32, 2), A(I64, 2), A(numba_types.int8, 2), A(F32, 2))
    ptx = compiled(cuda, _stack_kernel(np.dtype(compute)), signature)
    assert any(".entry" in line for line in ptx)
