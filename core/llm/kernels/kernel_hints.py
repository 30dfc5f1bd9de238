"""Hints to LLVM for the numba kernels: software prefetch, and the vector width.

Prefetch, for the kernels that stream weight matrices. A decode step reads every weight once,
matrix after matrix, so the weights come from memory, not from cache. The hardware prefetchers
follow each stream only within a 4 KiB page and only so far ahead; the kernels do enough
arithmetic per byte that the cache misses then stall them instead of overlapping with the work.
Asking for the row a few KiB ahead (``llvm.prefetch``, a ``prefetcht0`` on x86, a no-op where the
target has none) lets the memory system work while the core computes (docs/kernels.md has the
measurements).

The vector width, for the float kernels: :func:`wide_vectors`.
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

AHEAD_BYTES = 4096  # how far ahead of the row being multiplied (2, 4 and 8 KiB measured alike)
LINE = 64  # cache line bytes on x86 and most ARM cores

_I8, _I32 = ir.IntType(8), ir.IntType(32)


@intrinsic
def _prefetch(typingctx, a, byte_offset):
    """Hint that the cache line holding byte ``byte_offset`` of array ``a``'s buffer will be read."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        ptr = builder.gep(builder.bitcast(data, _I8.as_pointer()), [args[1]], inbounds=True)
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr.type, _I32, _I32, _I32]), "llvm.prefetch.p0")
        builder.call(fn, [ptr, _I32(0), _I32(3), _I32(1)])  # read, keep in every level, data cache
        return context.get_dummy_value()
    return types.none(a, byte_offset), codegen


@njit(inline="always")
def prefetch_row(a, r):
    """Prefetch the row ``AHEAD_BYTES`` ahead of row ``r`` of the C-contiguous 2-D array ``a``
    (nothing past the last row)."""
    row_bytes = a.shape[1] * a.itemsize
    t = r + (AHEAD_BYTES + row_bytes - 1) // row_bytes
    if t < a.shape[0]:
        start = t * row_bytes
        for o in range(0, row_bytes + LINE - 1, LINE):
            _prefetch(a, start + min(o, row_bytes - 1))


@njit(inline="always")
def prefetch_until(a, at, end):
    """Prefetch the bytes of ``a``'s buffer from ``at`` up to ``end`` (not past the buffer), a
    line at a time; returns where the next call goes on from. A loop streaming a matrix calls it
    as it goes with ``end`` AHEAD_BYTES past what it reads next, so the prefetches stay that far
    ahead, spread among the work, however long the stream."""
    end = min(end, a.size * a.itemsize)
    while at < end:
        _prefetch(a, at)
        at += LINE
    return at


@intrinsic
def wide_vectors(typingctx):
    """Let LLVM vectorize the calling function with 512-bit registers where the CPU has AVX-512.

    LLVM's tuning for AVX-512 Intel cores prefers 256-bit vectors (the ``prefer-256-bit`` tuning
    flag: wide instructions once lowered the clock); the loop vectorizer then never uses zmm. The
    float kernels are compute-bound, and on an AVX-512 Xeon 512-bit code decodes faster
    (docs/kernels.md). Called in a parallel loop's body, it marks the outlined function the body
    runs in.
    """
    def codegen(context, builder, sig, args):
        # a string attribute, which llvmlite's attribute set does not list: added to the set itself
        set.add(builder.function.attributes, '"prefer-vector-width"="512"')
        return context.get_dummy_value()
    return types.none(), codegen
