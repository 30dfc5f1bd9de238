"""A language model on plain numpy, with nothing compiled: what answers while a first run's
kernels compile.

numba compiles the CPU kernels for this CPU on first use (minutes on 2 cores); until then a model
can run as on a device backend (``CausalLM.place``), through the array-API code of its layers,
on numpy itself. :func:`numpy_backend` is that backend: its namespace is numpy's own functions
under another module object (the engine takes any namespace that is not numpy for a device),
and :class:`NumpyKernels` dequantizes each matrix once with gguf-py's numpy decoders (no numba)
and multiplies with BLAS. It computes in float32 as the exact path does, and holds every matrix
as float32 while in use (538 MB for the 98 MB smollm2-135m), which :func:`float32_bytes` tells
beforehand.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from ...backend import Backend
from .device_kernels import LLMKernels

NAME = "numpy (kernels compiling)"


class NumpyKernels(LLMKernels):
    """:class:`LLMKernels` on numpy without numba: matrices dequantized by gguf-py, each once
    (the tied embedding table and head share one array)."""

    def __init__(self, backend: Backend):
        super().__init__(backend)
        self._done: dict[int, tuple[object, np.ndarray]] = {}  # id(m) -> (m, float32): m keeps its id

    def host_float32(self, m) -> np.ndarray:
        hit = self._done.get(id(m))
        if hit is None:
            hit = self._done[id(m)] = (m, _decoded(m))
        return hit[1]


def _decoded(m) -> np.ndarray:
    if isinstance(m, np.ndarray):
        return np.asarray(m, dtype=np.float32)
    raw = m.raw_blocks
    if raw is None or m.decoded:  # a plain or decoded type is kept as float32 values already
        return m.dequantize()
    values = dequantize(np.asarray(raw), GGMLQuantizationType(m.ggml_type))
    return np.asarray(values, dtype=np.float32).reshape(m.shape)


def float32_bytes(matrices) -> int:
    """What :class:`NumpyKernels` would hold for ``matrices`` (each counted once)."""
    return sum(4 * int(np.prod(m.shape)) for m in {id(m): m for m in matrices}.values())


def _namespace() -> ModuleType:
    ns = ModuleType(NAME)
    ns.__dict__.update((k, v) for k, v in vars(np).items() if not k.startswith("__"))
    return ns


@cache
def numpy_backend() -> Backend:
    """The backend of :class:`NumpyKernels` (one namespace object for the process: caches made
    on it and the network compare namespaces by identity)."""
    return Backend(NAME, _namespace(), llm_kernels=NumpyKernels)
