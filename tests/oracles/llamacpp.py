"""llama.cpp's reference quantizers (``quantize_row_*_ref`` in ``ggml/src/ggml-quants.c``),
compiled from llama.cpp's own C and called through ctypes: the oracle for
``loomlab.core.llm.kernels.quantize``.

The C comes from PyPI: the sdist of ``llama-cpp-python`` (pinned in :data:`VERSION`) vendors
llama.cpp. :func:`load` downloads it once with pip, compiles ``ggml-quants.c`` alone with gcc into
a small shared library (a few stubs stand in for the rest of ggml, which the reference
quantizers never call) and caches it under ``~/.cache/loomlab/oracles/`` keyed by that version;
later runs load the cached library. The C is compiled as written: ``-O2`` with
``-ffp-contract=off`` (no fused multiply-adds, as C's float semantics say; llama.cpp's own builds
may fuse them where the target has FMA) and ``-DNDEBUG`` as in a release build.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GT

PACKAGE = "llama-cpp-python"
VERSION = "0.3.36"
CFLAGS = ["-O2", "-ffp-contract=off", "-fno-fast-math", "-DNDEBUG", "-fPIC", "-shared", "-std=gnu11"]

# ggml-quants.c refers to these for its imatrix paths and asserts; the reference quantizers do not.
STUBS = r"""
#include <stdlib.h>
#include "ggml.h"
void ggml_abort(const char * file, int line, const char * fmt, ...) {
    (void) file; (void) line; (void) fmt; abort();
}
size_t ggml_row_size(enum ggml_type type, int64_t ne) { (void) type; (void) ne; abort(); }
const char * ggml_type_name(enum ggml_type type) { (void) type; abort(); }
size_t ggml_type_size(enum ggml_type type) { (void) type; abort(); }
"""


class OracleBuildError(RuntimeError):
    """The oracle library could not be downloaded, unpacked or compiled."""


def cache_dir() -> Path:
    return Path.home() / ".cache" / "loomlab" / "oracles" / f"{PACKAGE}-{VERSION}"


_lib = None


def load() -> ctypes.CDLL:
    """The compiled reference quantizers, built on first use (about 30 s: mostly pip)."""
    global _lib
    if _lib is None:
        path = cache_dir() / "ggml_quants_ref.so"
        if not path.exists():
            _build(path)
        _lib = ctypes.CDLL(str(path))
    return _lib


def _row_function(name: str):
    """ggml-quants.c's ``void name(const void *, void *, int64_t)`` (every row quantizer and
    dequantizer has that signature)."""
    fn = getattr(load(), name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    fn.restype = None
    return fn


def quantize(matrix: np.ndarray, fmt: str) -> np.ndarray:
    """``matrix`` float32 [rows, cols] encoded by llama.cpp's ``quantize_row_<fmt>_ref``:
    uint8 [rows, row_bytes]. Blocks never straddle rows, so the whole matrix is one C call."""
    W = np.ascontiguousarray(matrix, dtype=np.float32)
    elems, nbytes = GGML_QUANT_SIZES[GT[fmt]]
    assert W.ndim == 2 and W.shape[1] % elems == 0, (W.shape, fmt)
    out = np.zeros((W.shape[0], W.shape[1] // elems * nbytes), np.uint8)
    _row_function(f"quantize_row_{_c_name(fmt)}_ref")(W.ctypes.data, out.ctypes.data, W.size)
    return out


def dequantize(blocks: np.ndarray, fmt: str) -> np.ndarray:
    """uint8 ``blocks`` [rows, row_bytes] of type ``fmt`` decoded by llama.cpp's
    ``dequantize_row_<fmt>``: float32 [rows, cols]. Any type ggml-quants.c reads (Q2_K, IQ4_XS,
    MXFP4 ...), as one C call."""
    q = np.ascontiguousarray(blocks, dtype=np.uint8)
    elems, nbytes = GGML_QUANT_SIZES[GT[fmt]]
    assert q.ndim == 2 and q.shape[1] % nbytes == 0, (q.shape, fmt)
    out = np.zeros((q.shape[0], q.shape[1] // nbytes * elems), np.float32)
    _row_function(f"dequantize_row_{_c_name(fmt)}")(q.ctypes.data, out.ctypes.data, out.size)
    return out


def _c_name(fmt: str) -> str:
    return fmt.lower().replace("_k", "_K")


def _build(target: Path) -> None:
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise OracleBuildError("no C compiler (gcc or cc) on PATH: the llama.cpp oracle needs one")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        work = Path(tmp)
        _run([sys.executable, "-m", "pip", "download", f"{PACKAGE}=={VERSION}", "--no-deps",
              "--no-binary", ":all:", "--disable-pip-version-check", "-d", str(work)],
             f"pip could not download the {PACKAGE} {VERSION} sdist (llama.cpp's C sources) from PyPI")
        sdists = list(work.glob("*.tar.gz"))
        if len(sdists) != 1:
            raise OracleBuildError(f"pip download left {[p.name for p in work.iterdir()]}, not one sdist")
        ggml = _unpack(sdists[0], work / "src")
        (work / "stubs.c").write_text(STUBS)
        built = work / "lib.so"
        _run([compiler, *CFLAGS, "-I", str(ggml / "include"), "-I", str(ggml / "src"),
              str(ggml / "src" / "ggml-quants.c"), str(work / "stubs.c"), "-lm", "-o", str(built)],
             f"{compiler} could not compile llama.cpp's ggml-quants.c")
        os.replace(built, target)  # atomic: a concurrent build leaves one whole library


def _unpack(sdist: Path, dest: Path) -> Path:
    """Only ggml's headers and ggml-quants.c; returns the ggml folder."""
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.isfile() and "/vendor/llama.cpp/ggml/" in m.name
                   and (m.name.endswith(".h") or m.name.endswith("/ggml/src/ggml-quants.c"))]
        if not any(m.name.endswith("ggml-quants.c") for m in members):
            raise OracleBuildError(f"{sdist.name} holds no vendor/llama.cpp/ggml/src/ggml-quants.c")
        tar.extractall(dest, members=members, filter="data")
    return next(dest.glob("*/vendor/llama.cpp/ggml"))


def _run(cmd: list[str], what: str) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise OracleBuildError(f"{what}: {e}") from e
    if done.returncode:
        raise OracleBuildError(f"{what} (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
