"""The first run's kernel compilation, announced: a model's kernels are compiled (or loaded from
numba's cache) while it loads, with progress, instead of in silence inside the first reply.

numba compiles a kernel for this CPU on its first call and caches the machine code; on a new
install the first reply of SmolLM2 used to wait about 19 s on 2 cores with nothing said. Loading
now runs one token through the model (a prompt step and a decode step, with throwaway caches),
and every kernel numba compiles meanwhile is reported as ``progress(KERNELS_STAGE, done, 0)``
(0: the number still to come is not known), then ``(KERNELS_STAGE, n, n)`` once all are ready;
``cancel`` is checked between kernels. With a warm cache nothing is compiled, nothing is
reported, and the step costs milliseconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
from numba.core import event

from ...cancel import Cancel, as_cancel_check
from ...errors import LoomCancelled

KERNELS_STAGE = "preparing kernels for this CPU (first run only)"
COMPILE_EVENT = "numba:compile"
OUR_PACKAGE = "loomlab."
PROMPT_TOKENS = 2  # a prompt of more than one token takes the batch kernels

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
    with compile_progress(progress, cancel) as counter:
        caches = [net.make_cache(PROMPT_TOKENS + 1)]
        net.step(np.zeros((1, PROMPT_TOKENS), np.int64), caches)  # a prompt: the batch kernels
        net.step(np.zeros((1, 1), np.int64), caches)  # a reply's token: the one-row kernels
    net.step_count = steps
    if counter.done and progress is not None:
        progress(KERNELS_STAGE, counter.done, counter.done)  # the end: every kernel is ready
    return counter.done
