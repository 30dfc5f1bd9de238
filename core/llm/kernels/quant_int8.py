"""Decode with 8-bit activations, as llama.cpp computes: integer dot products per block.

:mod:`.quant` multiplies the file's blocks by float32 activations, dequantizing every weight to
float32 first, and that decode is compute-bound. llama.cpp instead quantizes the activation
vector ``x`` to 8 bits per block (``quantize_row_q8_0/q8_1/q8_K_ref`` in ggml-quants.c) and
multiplies integers: per block one integer dot product of the weight's quants with ``x``'s, then
one float multiply by both scales (``ggml_vec_dot_*`` in ggml-cpu/quants.c). The result is not
the float product: ``x`` is rounded to 8 bits per block (llama.cpp's own numerics), so this is an
opt-in mode (:func:`int8_activations`), not a replacement for :meth:`QuantMatrix.matvec`.

Activation formats (``quantize_activations``), per block of ``x``:
    Q8_0: 32 values, ``d = fp16(max|x| / 127)``, ``q = roundf(x / d)`` (the unrounded d's inverse).
    Q8_1: Q8_0 plus ``s = fp16(d * sum(q))``, for weight formats with an offset (Q4_1, Q5_1).
    Q8_K: 256 values, ``d = max / -127`` (float32, of the signed value of largest magnitude),
          ``q = min(127, rint(x * -127 / max))``, and ``bsums``: sums of q per 16.
Each kind also keeps ``sums``, the integer sum of q per 32 (Q8_0, Q8_1) or per 16 (Q8_K): a
format with a zero point (Q4_0 nibbles are ``n - 8``) multiplies the unsigned quants and
subtracts ``zero * sum`` exactly, which is llama.cpp's result with a u8 x s8 product.

Kernel shape: each matrix's rows are repacked once, on first use (:mod:`.quant_int8_rows` for
the 32-weight formats, :mod:`.quant_int8_tiles` instead for Q4_0 / Q4_1 / Q8_0 matrices of whole
16-row tiles, :mod:`.quant_int8_superblocks` for the K-quants), so that 64 quants are one vector
load; the integer products are LLVM IR that LLVM's x86 backend compiles to
``vpdpbusd`` where the CPU has AVX-VNNI or AVX512-VNNI (plain IR elsewhere), then one float
multiply-add by both scales per block, as in llama.cpp. Each kind's products are one function
compiled when a matrix of that kind is first multiplied (:mod:`.quant_int8_products`). The
activations are quantized once per call (once for several matrices that share them:
:func:`int8_products`). Output rows run in parallel on numba's threads, paced by :mod:`.quant`'s
thread chooser.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as GT
from numba import njit, prange

from ...errors import LoomConfigError, LoomShapeError
from . import mapped_pages
from .quant import KERNEL_OPTIONS, ROW_CHUNK, QuantMatrix, pace, read_only
from .quant_int8_products import call_product, product_address
from .quant_int8_rows import (
    WIQ4_NL,
    WMXFP4,
    WQ4_0,
    WQ4_1,
    WQ5_0,
    WQ5_1,
    WQ8_0,
    fp16_round,
    q8_scale,
    quantize_grouped,
    repack,
    roundf,
)
from .quant_int8_superblocks import SUPER_KINDS, WIQ4_XS, WQ2_K, WQ3_K, WQ4_K, WQ5_K, WQ6_K, superblock_sums
from .quant_int8_superblocks import repack as superblocks_repack
from .quant_int8_tiles import TILE, TILE_KIND, TILE_KINDS, TILES_AT_ONCE, tiles_fit
from .quant_int8_tiles import repack as tiles_repack

F32 = np.float32
I32 = np.int32

# Activation kinds; the names are llama.cpp's block types.
AQ8_0, AQ8_1, AQ8_K = 0, 1, 2
ACTIVATION_KINDS = {"Q8_0": AQ8_0, "Q8_1": AQ8_1, "Q8_K": AQ8_K}
_BLOCK = {AQ8_0: 32, AQ8_1: 32, AQ8_K: 256}

# Weight kinds of the kernel, and the activation each one takes (llama.cpp's vec_dot_type).
_WEIGHT_KIND = {GT.Q4_0: (WQ4_0, AQ8_0), GT.Q4_1: (WQ4_1, AQ8_1), GT.Q5_0: (WQ5_0, AQ8_0),
                GT.Q5_1: (WQ5_1, AQ8_1), GT.Q8_0: (WQ8_0, AQ8_0), GT.Q4_K: (WQ4_K, AQ8_K),
                GT.Q2_K: (WQ2_K, AQ8_K), GT.Q3_K: (WQ3_K, AQ8_K), GT.Q5_K: (WQ5_K, AQ8_K),
                GT.Q6_K: (WQ6_K, AQ8_K), GT.IQ4_XS: (WIQ4_XS, AQ8_K), GT.IQ4_NL: (WIQ4_NL, AQ8_0),
                GT.MXFP4: (WMXFP4, AQ8_0)}
INT8_TYPES: tuple[str, ...] = tuple(GT(t).name for t in _WEIGHT_KIND)


@dataclass(frozen=True)
class QuantizedActivations:
    """Rows of ``x`` in one of llama.cpp's 8-bit activation formats (module docstring).

    Attributes:
        kind: ``"Q8_0"``, ``"Q8_1"`` or ``"Q8_K"``.
        qs: int8 ``[T, n]``, the quants in ``x``'s order.
        d: float32 ``[T, n / block]``, each block's scale (an fp16 value for Q8_0 / Q8_1).
        s: float32 ``[T, n / 32]``, Q8_1's ``fp16(d * sum(q))``; zeros for the other kinds.
        sums: int32 ``[T, n / span]``, the sum of q per 32 (Q8_0, Q8_1) or per 16 (Q8_K: bsums).
    """

    kind: str
    qs: np.ndarray
    d: np.ndarray
    s: np.ndarray
    sums: np.ndarray


# ---------------------------------------------------------------------------------------------
# Activation quantizers (serial: a few microseconds per row, run before the parallel loop).


@njit(cache=True, nogil=True)
def _quantize_rows(akind, X, qs, d, s, sums):
    T, n = X.shape
    B = 256 if akind == AQ8_K else 32
    for t in range(T):
        x = X[t]
        for b in range(n // B):
            o = b * B
            if akind == AQ8_K:
                amax, top = F32(0), F32(0)
                for j in range(B):  # the signed value of largest magnitude, first one on ties
                    if abs(x[o + j]) > amax:
                        amax, top = abs(x[o + j]), x[o + j]
                if amax == 0:
                    d[t, b] = 0
                    qs[t, o:o + B] = 0
                else:
                    iscale = F32(-127) / top
                    for j in range(B):
                        qs[t, o + j] = min(127, np.int32(np.rint(iscale * x[o + j])))
                    d[t, b] = F32(1) / iscale
                for k in range(B // 16):
                    acc = I32(0)
                    for j in range(16):
                        acc += qs[t, o + 16 * k + j]
                    sums[t, b * (B // 16) + k] = acc
            else:
                dd, inv = q8_scale(x, o)
                acc = I32(0)
                for j in range(B):
                    q = roundf(x[o + j] * inv)
                    qs[t, o + j] = q
                    acc += q
                d[t, b] = fp16_round(dd)
                sums[t, b] = acc
                s[t, b] = fp16_round(F32(acc) * dd) if akind == AQ8_1 else F32(0)


@njit(cache=True, nogil=True)
def _activation_buffers(akind, T, n):
    """Empty (qs, d, s, sums) for T rows of n values of ``akind``."""
    B, span = (256, 16) if akind == AQ8_K else (32, 32)
    return (np.empty((T, n), np.int8), np.empty((T, n // B), F32), np.empty((T, n // 32), F32),
            np.empty((T, n // span), np.int32))


def quantize_activations(x: np.ndarray, kind: str) -> QuantizedActivations:
    """Quantize ``x[n]`` or ``X[T, n]`` row by row as llama.cpp's ``quantize_row_<kind>_ref``.

    Args:
        x: float32 values, the last axis a whole number of blocks (32; 256 for Q8_K).
        kind: ``"Q8_0"``, ``"Q8_1"`` or ``"Q8_K"``.

    Returns:
        The quants and scales, always 2-D (one row for a vector).

    Raises:
        LoomConfigError: an unknown kind.
        LoomShapeError: ``x`` is not 1-D or 2-D, or its rows are not whole blocks.
    """
    akind = ACTIVATION_KINDS.get(kind)
    if akind is None:
        raise LoomConfigError(f"activation kind must be one of {', '.join(ACTIVATION_KINDS)}; got {kind!r}")
    X = np.asarray(x, dtype=F32)
    if X.ndim == 1:
        X = X[None]
    if X.ndim != 2 or X.shape[1] % _BLOCK[akind]:
        raise LoomShapeError(f"{kind} needs x of shape (n,) or (T, n) with n a multiple of "
                             f"{_BLOCK[akind]}; got {np.shape(x)}")
    X = np.ascontiguousarray(X)
    qs, d, s, sums = _activation_buffers(akind, *X.shape)
    _quantize_rows(akind, X, qs, d, s, sums)
    return QuantizedActivations(kind, qs, d, s, sums)


@njit(**KERNEL_OPTIONS)
def _matmul(fn, chunk, w, xq, xd, xa, xb, out):
    """``out[t, r]`` = repacked weight row r (``chunk`` rows an iteration, in parallel) times
    activation row t, by the kind's product function at address ``fn``
    (:mod:`.quant_int8_products`). Each (r, t) is the same operations whatever T is, so a row of
    X gets the same bits alone or among others."""
    rows = out.shape[1]
    w2 = w.reshape(rows, -1)
    for c in prange((rows + chunk - 1) // chunk):
        call_product(fn, w2, c * chunk, min(rows, c * chunk + chunk), xq, xd, xa, xb, out)


@njit(cache=True, nogil=True)
def quantize_q8_k(X, qs, d, s, sums, nsum16, bsum32):
    _quantize_rows(AQ8_K, X, qs, d, s, sums)
    superblock_sums(sums, nsum16, bsum32)


# ---------------------------------------------------------------------------------------------
# Per call: the activations quantized into per-thread buffers, reused while the shape repeats (a
# decode step quantizes ~150 times; returning new arrays from numba costs a microsecond each).

_scratch = threading.local()
_SHAPES_KEPT = 8  # shapes a thread keeps buffers for (batch sizes vary while serving)


def _buffers(family: str, T: int, n: int, make) -> tuple:
    kept = _scratch.__dict__.setdefault(family, {})
    bufs = kept.get((T, n))
    if bufs is None:
        if len(kept) >= _SHAPES_KEPT:
            kept.clear()
        bufs = kept[(T, n)] = make(T, n)
    return bufs


def _grouped_buffers(T: int, n: int) -> tuple:
    # nsum's lanes between the 4b-th stay zero: allocated zeroed, never written
    return np.empty((T, n), np.int8), np.empty((T, n // 32), F32), np.empty((T, n // 32), F32), \
        np.zeros((T, n // 8), np.int32)


def _q8_k_buffers(T: int, n: int) -> tuple:
    spread = np.zeros((T, n // 4), np.int32)  # as nsum above: only the 4j-th lanes are written
    return (*_activation_buffers(AQ8_K, T, n), spread, np.empty((T, n // 32), np.int32))


def _quantized(superblocks: bool, X: np.ndarray) -> tuple:
    """``X`` quantized for the 32-weight formats (Q8_1 in the group layout) or the super-blocks
    (Q8_K and its sums): the kernels' activation arguments."""
    T, n = X.shape
    if superblocks:
        qs, d, s, sums, nsum16, bsum32 = bufs = _buffers("q8_k", T, n, _q8_k_buffers)
        quantize_q8_k(X, *bufs)
        return qs, d, nsum16, bsum32
    bufs = _buffers("grouped", T, n, _grouped_buffers)
    quantize_grouped(X, *bufs)
    return bufs


# ---------------------------------------------------------------------------------------------
# Each matrix's rows repacked once (:mod:`.quant_int8_rows`, :mod:`.quant_int8_superblocks`) and
# kept on the matrix while it lives; a memory-mapped file's pages of it are given back
# (:mod:`.mapped_pages`), so the weights are held once.

_repack_lock = threading.Lock()
REPACK_ROWS_BYTES = 8 << 20  # the file's bytes repacked at a time (_repacked_in_parts)


def repacked(qm: QuantMatrix) -> tuple:
    rows = qm.int8_rows
    if rows is None:
        with _repack_lock:
            rows = qm.int8_rows
            if rows is None:
                kind, akind = _WEIGHT_KIND[GT(qm.ggml_type)]
                nb = qm.shape[1] // (256 if akind == AQ8_K else 32)
                if kind in TILE_KIND and tiles_fit(qm.shape[0]):  # 16 rows interleaved
                    kind, layout = TILE_KIND[kind], tiles_repack
                else:
                    layout = superblocks_repack if akind == AQ8_K else repack
                rows = qm.int8_rows = (kind, read_only(_repacked_in_parts(layout, kind, qm.raw_blocks, nb)))
    return rows


def _repacked_in_parts(layout, kind: int, raw: np.ndarray, nb: int) -> np.ndarray:
    """``layout(kind, raw, nb)`` flattened, made REPACK_ROWS_BYTES of the file's rows at a time
    (whole tiles), each part's pages of a mapped file given back once it is made: a table larger
    than the rest of the model (Gemma 3's 178 MB of Q8_0 token embeddings) is then never held
    twice, even while it is repacked. Every layout repacks rows independently of the others."""
    step = max(TILE, REPACK_ROWS_BYTES // max(1, raw.shape[1]) // TILE * TILE)
    out = None
    for r0 in range(0, raw.shape[0], step):
        part = raw[r0:r0 + step]
        rows = layout(kind, part, nb)  # [rows of the part, repacked bytes per row]
        if out is None:
            out = np.empty((raw.shape[0], rows.shape[1]), np.uint8)
        out[r0:r0 + part.shape[0]] = rows
        mapped_pages.release(part)  # the file's copy: read again only if asked
    return out.reshape(-1)


def supports(qm: QuantMatrix) -> bool:
    """Whether :func:`int8_matvec` has a kernel for this matrix's encoding."""
    return isinstance(qm, QuantMatrix) and qm.raw_blocks is not None and qm.ggml_type in _WEIGHT_KIND


def int8_matmul(qm: QuantMatrix, X: np.ndarray) -> np.ndarray:
    """``X @ W.T`` with each row of ``X[T, in]`` quantized to 8 bits as llama.cpp does for
    ``qm``'s format (Q8_1 for Q4_1 / Q5_1, Q8_K for the K-quants, Q8_0 otherwise) and integer dot
    products per block -> float32 ``[T, out]``. Row t has the same bits as ``int8_matvec(qm, X[t])``.

    Raises:
        LoomConfigError: the matrix's encoding has no integer kernel (see ``INT8_TYPES``).
        LoomShapeError: ``X`` is not ``(T, in_features)``.
    """
    if not supports(qm):
        raise LoomConfigError(f"int8 activations need a {', '.join(INT8_TYPES)} matrix; got {qm!r}")
    X = np.asarray(X)
    if X.ndim != 2 or X.shape[1] != qm.shape[1]:
        raise LoomShapeError(f"{qm.type_name} matrix {qm.shape} needs input (T, {qm.shape[1]}); "
                             f"got {X.shape}")
    return int8_product(qm, np.ascontiguousarray(X, dtype=F32))


def int8_product(qm: QuantMatrix, X: np.ndarray) -> np.ndarray:
    """:func:`int8_matmul` without its checks, for a caller that has made them (``linear()``, a
    few microseconds per matrix, ~200 matrices a token): ``qm`` supported, ``X`` float32
    C-contiguous ``(T, in_features)``."""
    return int8_products((qm,), X)[0]


def int8_products(qms, X: np.ndarray) -> list[np.ndarray]:
    """:func:`int8_product` of each matrix with the same ``X``, which is quantized once per
    kind of activations (attention's Q, K and V, the MLP's gate and up share their input)."""
    pace()
    X = read_only(X)
    quantized = {}
    outs = []
    for qm in qms:
        kind, packed = repacked(qm)
        out = np.empty((X.shape[0], qm.shape[0]), F32)
        superblocks = kind in SUPER_KINDS
        acts = quantized.get(superblocks)
        if acts is None:
            acts = quantized[superblocks] = _quantized(superblocks, X)
        chunk = TILES_AT_ONCE * TILE if kind in TILE_KINDS else ROW_CHUNK  # whole passes' tiles
        _matmul(product_address(kind), chunk, packed, *acts, out)
        outs.append(out)
    return outs


def int8_matvec(qm: QuantMatrix, x: np.ndarray) -> np.ndarray:
    """``W @ x`` for one vector ``x[in]`` with 8-bit activations (:func:`int8_matmul`) -> float32
    ``[out]``."""
    x = np.asarray(x)
    if x.ndim != 1:
        raise LoomShapeError(f"int8_matvec needs a vector x of shape ({qm.shape[1]},); got {x.shape}")
    return int8_matmul(qm, x[None])[0]


_mode = threading.local()


@contextmanager
def int8_activations(enabled: bool = True):
    """A context in which this thread's decode may use the integer kernels: ``linear()`` can ask
    :func:`int8_enabled` and call :func:`int8_matmul` for a supported matrix."""
    before = getattr(_mode, "on", False)
    _mode.on = enabled
    try:
        yield
    finally:
        _mode.on = before


def int8_enabled() -> bool:
    """Whether the calling thread is inside :func:`int8_activations`."""
    return getattr(_mode, "on", False)
