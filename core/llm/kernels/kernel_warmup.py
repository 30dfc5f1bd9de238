"""Compiling the kernels up front, announced: the top of the kernels floor.

numba compiles a kernel for this CPU on its first call and caches the machine code, so on a new
install the first reply of a model would wait, with nothing said, while its kernels compile. Two
ways to have them ready first:

* :func:`warm_model` runs one token through a model as it loads (a prompt step and a decode step,
  with throwaway caches): every kernel of that model's path;
* :func:`warm_up` runs every kernel of this floor once, on a thread that ends: what the workbench
  does before its window shows.

Every kernel numba compiles meanwhile is reported as ``progress(KERNELS_STAGE, done, 0)`` (0: the
number still to come is not known), and :func:`warm_model` ends with ``(KERNELS_STAGE, n, n)``;
``cancel`` is checked between kernels. With a warm cache nothing is compiled, nothing is
reported, and the step costs milliseconds.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from numba.core import event

from ...cancel import Cancel, as_cancel_check
from ...errors import LoomCancelled
from ...stats_kernel import error_sums
from .attention_kernel import attend
from .quant import FORMATS, BlockFormat, QuantMatrix, float_matmul
from .quant_int8 import int8_matmul, supports
from .quant_int8_tiles import TILE
from .quantize import QUANTIZE_FORMATS, quantize

KERNELS_STAGE = "preparing kernels for this CPU (first run only)"
COMPILE_EVENT = "numba:compile"
OUR_PACKAGE = "loomlab."
PROMPT_TOKENS = 2  # a prompt of more than one token takes the batch kernels
F32 = np.float32

Progress = Callable[[str, int, int], None]


class _CompileCounter(event.Listener):
    """Counts the compilations of our own kernels (numba's library functions compiled on the way
    are part of them) and stops before the next one once ``cancelled()``."""

    def __init__(self, progress: Progress | None, cancelled: Callable[[], bool]):
        self.progress, self.cancelled, self.done = progress, cancelled, 0

    def on_start(self, ev: event.Event) -> None:
        if not ours(ev):
            return
        if self.cancelled():
            raise LoomCancelled("cancelled while preparing kernels")
        if self.done == 0 and self.progress is not None:
            self.progress(KERNELS_STAGE, 0, 0)  # said before the first one, which may take a while

    def on_end(self, ev: event.Event) -> None:
        if ours(ev) and ev.data.get("exc_details") is None:
            self.done += 1
            if self.progress is not None:
                self.progress(KERNELS_STAGE, self.done, 0)


def ours(ev: event.Event) -> bool:
    """Whether a compile event is for one of Loom Lab's kernels."""
    dispatcher = ev.data.get("dispatcher")
    return getattr(getattr(dispatcher, "py_func", None), "__module__", "").startswith(OUR_PACKAGE)


@contextmanager
def compile_progress(progress: Progress | None, cancel: Cancel = None) -> Iterator[_CompileCounter]:
    """Report every kernel numba compiles inside the block; raise :class:`LoomCancelled` before
    the next compilation once ``cancel`` asks."""
    counter = _CompileCounter(progress, as_cancel_check(cancel))
    event.register(COMPILE_EVENT, counter)
    try:
        yield counter
    finally:
        event.unregister(COMPILE_EVENT, counter)


def warm_model(net, progress: Progress | None = None, cancel: Cancel = None) -> int:
    """Run one token through ``net`` (a :class:`~loomlab.core.llm.model.causal_lm.CausalLM`) as a reply
    would, a two-token prompt step then a decode step on caches made for it and dropped, so that every
    kernel of its path is compiled now. Returns how many kernels were compiled (0 when cached).
    The model's step count is left as it was."""
    steps = net.step_count
    try:
        with compile_progress(progress, cancel) as counter:
            caches = [net.make_cache(PROMPT_TOKENS + 1)]
            net.step(np.zeros((1, PROMPT_TOKENS), np.int64), caches)  # a prompt: the batch kernels
            net.step(np.zeros((1, 1), np.int64), caches)  # a reply's token: the one-row kernels
    finally:
        net.step_count = steps
    if counter.done and progress is not None:
        progress(KERNELS_STAGE, counter.done, counter.done)  # the end: every kernel is ready
    return counter.done


def warm_up(progress: Progress | None = None, cancel: Cancel = None) -> None:
    """Run every kernel once on a one-block matrix (the 8-bit-activation ones too, attention, and
    the encoders a morph to a block format uses), so none is loaded on first use. On a new
    install that compiles them all: each is reported to ``progress`` and ``cancel`` is checked
    between them, as in :func:`compile_progress`.

    numba's first call initialises its compiler and loads the cached machine code, holding the
    GIL for about 0.35 s (then ~10 ms per further kernel); a GUI calls this before it shows
    rather than let a worker's first matrix product freeze it.

    The kernels run on a thread of their own that ends here. OpenMP keeps a pool of worker
    threads for every thread that has started a parallel region, and while two pools live their
    idle workers spin against each other: a decode in a worker thread ran at half speed once the
    GUI thread had warmed up. A pool ends with its thread, so the caller is left with none.
    """
    def run() -> None:
        try:
            with compile_progress(progress, cancel):
                _run_each_kernel()
        except BaseException as e:  # handed to the caller's thread, which raises it
            failure.append(e)

    failure: list[BaseException] = []
    worker = threading.Thread(target=run, name="loomlab-warm-up")
    worker.start()
    worker.join()
    if failure:
        raise failure[0]


def _run_each_kernel() -> None:
    """Every kernel of this floor once, on the calling thread."""
    for fmt in (f for f in FORMATS.values() if isinstance(f, BlockFormat)):
        m = QuantMatrix(np.zeros((1, fmt.block_bytes), np.uint8), fmt.ggml_type,
                        shape=(1, fmt.block_elems), name="warm-up")
        m.matvec(np.zeros(fmt.block_elems, F32))
        m.matmul(np.zeros((2, fmt.block_elems), F32))  # the batch kernel
        m.rows(np.zeros(1, np.int64))
        for rows in (1, TILE) if supports(m) else ():  # 8-bit activations: row and tile layouts
            int8_matmul(QuantMatrix(np.zeros((rows, fmt.block_bytes), np.uint8), fmt.ggml_type,
                                    shape=(rows, fmt.block_elems), name="warm-up"),
                        np.zeros((1, fmt.block_elems), F32))
    float_matmul(np.zeros((1, 1), F32), np.zeros((1, 1), F32))
    for storage in (F32, np.uint16):  # attention over float32 and float16 (bits) KV caches
        kv = np.zeros((1, 1, 8), storage)
        attend(np.zeros((1, 1, 8), F32), kv, kv, 0, None, 1.0)
    for name in QUANTIZE_FORMATS:  # a morph to a block format: its encoder
        quantize(np.zeros((1, 256), F32), name)
    error_sums(np.zeros(1, F32), np.zeros(1, F32))  # a morph's report: a layer against the file's weights
