"""One compiled product function per repacked weight kind, called through its address.

The integer dots are large (:mod:`.quant_int8_rows`, :mod:`.quant_int8_tiles`,
:mod:`.quant_int8_superblocks`: every format unrolled for one to four activation rows), and a
kernel that picks the format at run time carries all ten formats' machine code: numba compiled
each such kernel for minutes on a 2-core CPU, once for the grid's products and again inside the
fused decode step. Here each kind's products are one C-callable function (``numba.cfunc``),
compiled the first time a matrix of that kind is multiplied and cached on disk like any kernel;
the kernels that drive them (:mod:`.quant_int8`'s parallel loop, the fused step) hold only the
function's address and call it (:func:`call_product`), so they compile once for every format,
and a model compiles only the formats it has. A call costs a few nanoseconds against the
microseconds of work each does (a range of rows).

Arguments of every product function (:data:`PRODUCT`): the repacked matrix (address, rows, bytes
per row), the range of rows r0 .. r1 - 1, the four activation arrays (:func:`~.quant_int8_rows.
quantize_grouped`'s ``xg, d, s, nsum``, or Q8_K's ``qs, d, nsum16, bsum32``) for T rows of n
values, and ``out[T, out_cols]``, every array C-contiguous.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path
from types import SimpleNamespace

import numpy as np
from llvmlite import ir
from numba import carray, njit, types
from numba.core import event
from numba.core.ccallback import CFunc
from numba.core.sigutils import normalize_signature
from numba.extending import intrinsic

from . import quant_int8_rows, quant_int8_superblocks, quant_int8_tiles
from .quant_int8_rows import ROW_KINDS, rows_products
from .quant_int8_superblocks import SUPER_KINDS, superblock_products
from .quant_int8_tiles import TILE_KINDS, tiles_products

_P, _N = types.voidptr, types.int64
PRODUCT = types.void(_P, _N, _N, _N, _N, _P, _P, _P, _P, _N, _N, _P, _N)
_ARG_IS_POINTER = tuple(t == _P for t in PRODUCT.args)
KINDS = 1 + max(*ROW_KINDS, *SUPER_KINDS, *TILE_KINDS)  # kind numbers 0 .. KINDS - 1

_functions: dict[int, object] = {}  # kind -> its cfunc, kept alive: callers hold its address
_lock = threading.Lock()


def families_stamp() -> int:
    """The three families' source files as one number, which every product function captures.
    numba keys a cached function by its own file and its captured values, not by the files of
    the functions it calls: without this, an edit of a family (an upgrade) would load the old
    machine code from the cache."""
    digest = hashlib.sha256()
    for family in (quant_int8_rows, quant_int8_tiles, quant_int8_superblocks):
        digest.update(Path(family.__file__).read_bytes())
    return int.from_bytes(digest.digest()[:7], "little")  # non-negative, an int64


FAMILIES = families_stamp()


def product_address(kind: int) -> int:
    """The address of ``kind``'s product function, compiled (or loaded from numba's cache) on
    first use."""
    with _lock:
        fn = _functions.get(kind)
        if fn is None:
            fn = _functions[kind] = _compiled(product_function(kind))
    return fn.address


def product_function(kind: int):
    """The Python function ``kind``'s product function is compiled from."""
    return (_superblocks if kind in SUPER_KINDS else _tiles if kind in TILE_KINDS else _rows)(kind)


def _compiled(product):
    """``product`` as a :data:`PRODUCT` cfunc, loaded from numba's cache or compiled into it
    (as ``cfunc(PRODUCT, cache=True)`` does)."""
    fn = _AnnouncedCFunc(product, normalize_signature(PRODUCT), locals={}, options={})
    fn.enable_caching()
    fn.compile()
    return fn


class _AnnouncedCFunc(CFunc):
    """A cfunc whose compilation, unlike numba's own cfuncs', tells numba's event listeners as a
    kernel's does (``numba:compile``, the function as the dispatcher's ``py_func``): warm-up
    counts it, and can stop before it (:mod:`.kernel_warmup`). A load from the cache says
    nothing, as for a kernel."""

    def _compile_uncached(self):
        announced = {"dispatcher": SimpleNamespace(py_func=self.__wrapped__)}
        with event.trigger_event("numba:compile", data=announced):
            return super()._compile_uncached()


# Three factories, not one taking the family's function: numba keys a cached closure by its
# captured values, and a captured dispatcher pickles with a per-process id, so such a function
# would never be found in the cache again. Each factory captures only the kind and the families'
# stamp (ints), and returns the function _compiled makes a cfunc of.


def _rows(kind: int):
    stamp = FAMILIES

    def product(w, rows, row_bytes, r0, r1, xq, xd, xa, xb, T, n, out, out_cols):
        if stamp < 0:  # never: the stamp is captured only to key the cache (families_stamp)
            return
        rows_products(kind, carray(w, (rows, row_bytes), np.uint8), r0, r1, carray(xq, (T, n), np.int8),
                      carray(xd, (T, n // 32), np.float32), carray(xa, (T, n // 32), np.float32),
                      carray(xb, (T, n // 8), np.int32), carray(out, (T, out_cols), np.float32))
    return product


def _tiles(kind: int):
    stamp = FAMILIES

    def product(w, rows, row_bytes, r0, r1, xq, xd, xa, xb, T, n, out, out_cols):
        if stamp < 0:  # never: the stamp is captured only to key the cache (families_stamp)
            return
        tiles_products(kind, carray(w, (rows, row_bytes), np.uint8), r0, r1, carray(xq, (T, n), np.int8),
                       carray(xd, (T, n // 32), np.float32), carray(xa, (T, n // 32), np.float32),
                       carray(xb, (T, n // 8), np.int32), carray(out, (T, out_cols), np.float32))
    return product


def _superblocks(kind: int):
    stamp = FAMILIES

    def product(w, rows, row_bytes, r0, r1, xq, xd, xa, xb, T, n, out, out_cols):
        if stamp < 0:  # never: the stamp is captured only to key the cache (families_stamp)
            return
        superblock_products(kind, carray(w, (rows, row_bytes), np.uint8), r0, r1, carray(xq, (T, n), np.int8),
                            carray(xd, (T, n // 256), np.float32), carray(xa, (T, n // 4), np.int32),
                            carray(xb, (T, n // 32), np.int32), carray(out, (T, out_cols), np.float32))
    return product


@intrinsic
def _call(typingctx, fn, w, rows, row_bytes, r0, r1, xq, xd, xa, xb, T, n, out, out_cols):
    """Call the :data:`PRODUCT` function at address ``fn`` with the other arguments (addresses
    as integers)."""
    sig = types.void(fn, w, rows, row_bytes, r0, r1, xq, xd, xa, xb, T, n, out, out_cols)

    def codegen(context, builder, sig, args):
        i8p, i64 = ir.IntType(8).as_pointer(), ir.IntType(64)
        params = [i8p if pointer else i64 for pointer in _ARG_IS_POINTER]
        values = [builder.inttoptr(a, t) if t == i8p else a for a, t in zip(args[1:], params, strict=True)]
        target = builder.inttoptr(args[0], ir.FunctionType(ir.VoidType(), params).as_pointer())
        builder.call(target, values)
        return context.get_dummy_value()
    return sig, codegen


@njit(inline="always")
def call_product(fn, w2, r0, r1, xq, xd, xa, xb, out):
    """``out[:, r0:r1]`` for rows r0 .. r1 - 1 of the repacked ``w2`` (``[rows, row bytes]``) times
    the quantized activations, by the product function at address ``fn`` (:func:`product_address`
    of the matrix's kind)."""
    call_product_at(fn, w2.ctypes.data, w2.shape[0], w2.shape[1], r0, r1, xq, xd, xa, xb, out)


@njit(inline="always")
def call_product_at(fn, w, rows, row_bytes, r0, r1, xq, xd, xa, xb, out):
    """:func:`call_product` of the repacked matrix at address ``w``, ``rows`` rows of
    ``row_bytes`` (its array kept alive by the caller)."""
    _call(fn, w, rows, row_bytes, r0, r1, xq.ctypes.data, xd.ctypes.data, xa.ctypes.data, xb.ctypes.data,
          xq.shape[0], xq.shape[1], out.ctypes.data, out.shape[1])
