"""A spinning barrier for the threads of one compiled parallel region, with a way out.

Why: a decoded token of a small model is ~200 matrix products of a few microseconds each. Each
numba ``prange`` is a launch of the thread team and a join (microseconds), and between them
Python glue runs. One region whose threads each run the whole step
(:mod:`loomlab.core.llm.model.fused_decode`), meeting at a barrier between the products, pays one
launch per token and a barrier of ~0.1 us per meeting.

The barrier is one counter per thread, each on its own cache line: a thread arriving at its
``epoch``-th meeting stores ``epoch`` (release), then waits until every other thread's counter
reaches it (acquire loads, so what they wrote before arriving is visible after). No counter is
ever reset inside a region; the caller zeroes them before the next.

Waiting beside other processes: a thread that spins holds its core, and the thread it waits
for may be queued behind another process (on 2 cores a spinning barrier then costs a whole time
slice per meeting). After ``YIELD_AFTER`` pauses the waiter yields its core at every round, so
the late thread can run there. (The kernels' thread count also drops to
one beside a busy process: :mod:`.cpu_threads`.)

The way out: a region whose threads do not all run at once (a threading layer that runs two
iterations on one thread, or a team smaller than asked for) would wait forever. A thread that
finds itself on another thread than its index, or waits longer than ``GIVE_UP_CYCLES`` (over a
second), raises the shared abort flag, and every waiting thread returns False: the
caller then computes the step another way (its writes are repeated there, so it is as if the
region never ran).
"""

from __future__ import annotations

import os

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .quant_int8_rows import host_features

PAD = 8  # int64 counters per cache line: each thread's counter on its own line
YIELD_AFTER = 1 << 12  # pauses (~50 ns each here) before a wait also yields its core, each round
GIVE_UP_CYCLES = 1 << 32  # a wait longer than this (~1.5 s at 2.6 GHz) abandons the region
_I64 = ir.IntType(64)


def _element_pointer(context, builder, sig, args):
    a = context.make_array(sig.args[0])(context, builder, args[0])
    return builder.gep(a.data, [args[1]], inbounds=True)


@intrinsic
def load_acquire(typingctx, a, i):
    """``a[i]`` of an int64 array, read atomically with acquire ordering."""
    def codegen(context, builder, sig, args):
        return builder.load_atomic(_element_pointer(context, builder, sig, args), "acquire", 8)
    return types.int64(a, i), codegen


@intrinsic
def store_release(typingctx, a, i, v):
    """``a[i] = v`` for an int64 array, written atomically with release ordering."""
    def codegen(context, builder, sig, args):
        builder.store_atomic(args[2], _element_pointer(context, builder, sig, args), "release", 8)
        return context.get_dummy_value()
    return types.none(a, i, types.int64), codegen


@intrinsic
def cycles(typingctx):
    """The CPU's cycle counter (``rdtsc`` on x86): a clock for the wait's limit."""
    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_I64, []),
                                            "llvm.readcyclecounter")
        return builder.call(fn, [])
    return types.int64(), codegen


@intrinsic
def yield_cpu(typingctx):
    """``sched_yield()`` where the C library has it (POSIX), so that a thread we wait for,
    queued behind another process, can run on our core. Called by its symbol, which the JIT
    links from the process's libc (a ctypes function pointer would keep numba from caching)."""
    def codegen(context, builder, sig, args):
        if os.name == "posix":
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.IntType(32), []),
                                                "sched_yield")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.none(), codegen


@intrinsic
def cpu_relax(typingctx):
    """x86's ``pause`` in a spin loop (kinder to the sibling hyper-thread and to the memory
    ordering machinery); nothing elsewhere."""
    def codegen(context, builder, sig, args):
        if "sse2" in host_features():
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), []),
                                                "llvm.x86.sse2.pause")
            builder.call(fn, [])
        return context.get_dummy_value()
    return types.none(), codegen


def counters(threads: int) -> np.ndarray:
    """Zeroed counters for a region of ``threads`` threads (and the abort flag after them)."""
    return np.zeros((threads + 1) * PAD, np.int64)


@njit(inline="always")
def abort(flags, threads):
    """Raise the region's abort flag: every thread waiting, or about to wait, returns False."""
    store_release(flags, threads * PAD, np.int64(1))


@njit(inline="always")
def meet(flags, tid, threads, epoch):
    """Thread ``tid`` of ``threads`` arrives at meeting ``epoch`` (1, 2, ... within a region) and
    waits for the others; False when the region was abandoned (module doc)."""
    store_release(flags, tid * PAD, np.int64(epoch))
    for other in range(threads):
        if other == tid:
            continue
        spins, since = 0, np.int64(0)
        while load_acquire(flags, other * PAD) < epoch:
            if load_acquire(flags, threads * PAD) != 0:
                return False
            cpu_relax()
            spins += 1
            if spins == YIELD_AFTER:
                since = cycles()
            elif spins > YIELD_AFTER:
                yield_cpu()
                if cycles() - since > GIVE_UP_CYCLES:
                    abort(flags, threads)
                    return False
    return load_acquire(flags, threads * PAD) == 0
