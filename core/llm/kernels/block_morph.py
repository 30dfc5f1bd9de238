"""GGUF block formats as morph targets of a language model's matrices.

A matrix morphed to Q8_0, Q4_K ... is encoded from the model's own weights (the file's blocks,
dequantized one matrix at a time: no float32 copy of the model is ever kept) by the reference
quantizer (:mod:`.quantize`) into a new :class:`~.quant.QuantMatrix`, which the decode kernels
then read as they read the file's. Reverting drops the new blocks; the file's were never touched.
Vectors (norm gains, biases) stay float32, as llama.cpp keeps them in every quantization type.

Two layers that share a matrix (a tied LM head and the token embedding) share its encoding too:
encodings are cached by (source matrix, format, importance) for as long as some layer holds them.
"""

from __future__ import annotations

import hashlib
import weakref

import numpy as np
from gguf import GGMLQuantizationType as GT

from .quant import FORMATS, QuantMatrix

#: the block formats a language model's matrices morph to, largest first
BLOCK_FORMATS = ("Q8_0", "Q6_K", "Q5_1", "Q5_K", "Q5_0", "Q4_K", "Q4_1", "Q4_0", "Q3_K", "Q2_K")

# (id(source), format, digest of the importance or None) -> matrix
_encoded: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def is_block_format(name: str) -> bool:
    return name in BLOCK_FORMATS


def block_elems(fmt: str) -> int:
    """Weights per block of ``fmt`` (32, or 256 for the K formats)."""
    return FORMATS[int(GT[fmt])].block_elems


def encoding_name(m) -> str:
    """How matrix ``m`` is stored: its GGUF type (``"Q4_1"``), or ``"F32"`` for a float32 array."""
    return "F32" if isinstance(m, np.ndarray) else m.type_name


def stored_nbytes(m) -> int:
    """Bytes of ``m`` as stored in a GGUF file: its blocks (not the float32 side arrays the kernels
    keep), 4 per weight for float32."""
    if isinstance(m, np.ndarray):
        return int(m.nbytes)
    fmt = FORMATS[m.ggml_type]
    return m.shape[0] * (m.shape[1] // fmt.block_elems) * fmt.block_bytes


def is_matrix(m) -> bool:
    """What block formats apply to: 2-D weights (vectors stay float32)."""
    return len(m.shape) == 2


def encode(source, fmt: str, importance: np.ndarray | None = None) -> QuantMatrix:
    """``source`` (a QuantMatrix or a float32 array ``[rows, cols]``) in block format ``fmt`` (or F16); the
    source itself when it already is, a cached encoding when another layer asked for the same.

    ``importance`` (float ``[cols]``, llama.cpp's imatrix entry for the matrix) picks llama.cpp's
    importance-weighted quantizer (see :func:`.quantize.quantize`); F16, and a source already in
    ``fmt``, have no choice to weigh and ignore it."""
    if not isinstance(source, np.ndarray) and source.type_name == fmt:
        return source
    key = (id(source), fmt, _digest(importance) if fmt != "F16" else None)
    hit = _encoded.get(key)
    if hit is not None and hit.source is source:
        return hit
    from .quantize import quantize  # its kernels compile on first use, not when a model loads

    dense = np.asarray(source if isinstance(source, np.ndarray) else source.dequantize(), np.float32)
    # F16: llama.cpp's last fallback for a matrix whose rows are not whole blocks (quality.recipe)
    data = dense.astype(np.float16) if fmt == "F16" else quantize(dense, fmt, importance)
    m = QuantMatrix(data, int(GT[fmt]), source.shape, name=fmt)
    m.source = source  # the cache's check that the id was not reused by another matrix
    _encoded[key] = m
    return m


def _digest(importance) -> bytes | None:
    """The importance's part of the cache key: its values, not its id (an equal vector rebuilt
    finds the encoding; an array reused with other values does not). What quantize() rejects
    is never cached, so any digest serves it."""
    if importance is None:
        return None
    q = np.ascontiguousarray(importance)
    key = q.dtype.str.encode() + repr(q.shape).encode() + q.tobytes()
    return hashlib.blake2b(key, digest_size=16).digest()
