"""A first run's kernels compiled in a child process while the model answers on numpy, or the
window is used.

On a new install (or a new CPU, or after an upgrade) numba has none of a model's kernels in its
cache, and compiling them takes minutes on 2 cores. Rather than make the first reply wait,
``load_model`` asks :func:`kernels_cached`; when the answer is no, the model answers on plain
numpy (:mod:`~loomlab.core.llm.kernels.numpy_kernels`) while :class:`KernelCompilation` runs
``python -m loomlab.core.llm.model.kernel_compilation MODEL MODE`` (a child loads the model and
runs :func:`~loomlab.core.llm.kernels.kernel_warmup.warm_model`, writing numba's cache), then the
model switches to the compiled kernels. The window's start-up does the same for every kernel
(:func:`every_kernel_cached`, ``KernelCompilation(None)``) and shows the count in its status bar.
A child, not a thread: numba's compiler is mostly Python, and a compiling thread would take the
GIL from every numpy call of the answering one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable

from ...cancel import Cancel, as_cancel_check
from ...errors import LoomCancelled, LoomConfigError
from ..kernels.kernel_warmup import KERNELS_STAGE, warm_model, warm_up
from ..kernels.numpy_kernels import float32_bytes, numpy_backend
from ..kernels.quant_int8 import int8_activations
from .causal_lm import CausalLM
from .loader import load_causal_lm

#: The most a model may hold as float32 to answer on numpy while its kernels compile (a larger one
#: waits for them): gemma3-270m's matrices are 1.07 GB as float32.
FIRST_RUN_MAX_BYTES = 2 << 30
FIRST_RUN_MODES = ("answer", "wait")
#: the first-run mode when none is given: "answer" unless this variable says "wait"
FIRST_RUN_ENV = "LOOMLAB_FIRST_RUN"
EVERY_KERNEL = "--all"  # the child's argument for every kernel (kernel_warmup.warm_up), not one model's
PROGRESS_PREFIX = "compiled "
CHILD_NICENESS = 5  # below the process it works for, which answers meanwhile
POLL_S = 0.1
ERROR_TAIL = 2000  # characters of the child's stderr kept when it fails

Progress = Callable[[str, int, int], None]


def first_run_mode(first_run: str | None) -> str:
    """``first_run``, or ``$LOOMLAB_FIRST_RUN``, or "answer"; checked."""
    mode = first_run or os.environ.get(FIRST_RUN_ENV) or "answer"
    if mode not in FIRST_RUN_MODES:
        raise LoomConfigError(f"first_run (or ${FIRST_RUN_ENV}) must be one of {FIRST_RUN_MODES}, "
                              f"got {mode!r}")
    return mode


def make_kernels_ready(net: CausalLM, path: str | os.PathLike, int8: bool, *, answer_meanwhile: bool,
                       progress: Progress | None = None, cancel: Cancel = None) -> KernelCompilation | None:
    """Make ``net``'s kernels ready as it loads from ``path``. With them all cached: loaded, and
    None. Otherwise, when ``answer_meanwhile`` and the model's matrices fit
    :data:`FIRST_RUN_MAX_BYTES` as float32: a :class:`KernelCompilation` started, and ``net``
    placed on numpy until they are ready (``TextModel`` switches; nothing is said to
    ``progress``, as nothing is waited for). Else compiled here, counted to ``progress``, as
    :func:`warm_model` does."""
    if answer_meanwhile and float32_bytes(matrices(net)) <= FIRST_RUN_MAX_BYTES:
        if kernels_cached(net, int8):
            return None
        compilation = KernelCompilation(path, int8)
        try:
            net.place(numpy_backend())
        except BaseException:
            compilation.stop()
            raise
        return compilation
    with int8_activations(int8):
        warm_model(net, progress, cancel)
    return None


def matrices(net: CausalLM) -> list:
    """The 2-D weight matrices of ``net``'s layers as they compute now."""
    return [m for la in net.weighted_layers() for m in la.weights.current(la.cfg.dtype).values()
            if len(getattr(m, "shape", ())) == 2]


def kernels_cached(net: CausalLM, int8: bool) -> bool:
    """Whether numba's cache holds every kernel of ``net``'s path (8-bit activations or not):
    :func:`warm_model` run until it would compile one. The cached ones are loaded on the way,
    so a True costs what a warm start's warm-up costs and leaves nothing to do."""
    with int8_activations(int8):
        return _runs_cached(lambda cancel: warm_model(net, cancel=cancel))


def every_kernel_cached() -> bool:
    """Whether numba's cache holds every kernel :func:`warm_up` runs; the cached ones are loaded
    on the way (what a warm start does anyway)."""
    return _runs_cached(lambda cancel: warm_up(cancel=cancel))


def _runs_cached(warm: Callable[[Cancel], object]) -> bool:
    """Whether ``warm(cancel)`` runs without compiling: ``cancel`` is asked before each
    compilation, and says stop at the first."""
    try:
        warm(lambda: True)
    except LoomCancelled:
        return False
    return True


class KernelCompilation:
    """The child process that compiles a model's kernels (``path`` None: every kernel) into
    numba's cache.

    ``compiled`` counts the kernels done so far; :attr:`finished` says the child has exited
    (:attr:`error`: why it failed, None when it succeeded). :meth:`stop` ends it early: each
    kernel it finished stays cached for the next run."""

    def __init__(self, path: str | os.PathLike | None, int8: bool = False):
        self._stderr = tempfile.TemporaryFile()
        what = [EVERY_KERNEL] if path is None else [os.fspath(path), "int8" if int8 else "float32"]
        cmd = [sys.executable, "-m", __name__, *what]
        self._proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                      stderr=self._stderr, text=True)
        self.compiled = 0
        self.error: str | None = None
        self._done = threading.Event()
        self._reader = threading.Thread(target=self._read, name="loomlab-kernel-compilation", daemon=True)
        self._reader.start()

    @property
    def finished(self) -> bool:
        return self._done.is_set()

    def wait(self, progress: Progress | None = None, cancel: Cancel = None) -> None:
        """Block until the child has finished, reporting ``progress(KERNELS_STAGE, compiled, 0)``
        as the count moves; :class:`LoomCancelled` (the child stopped) once ``cancel`` asks."""
        cancelled = as_cancel_check(cancel)
        said = -1
        while not self._done.wait(POLL_S):
            if cancelled():
                self.stop()
                raise LoomCancelled("cancelled while preparing kernels")
            if progress is not None and self.compiled != said:
                said = self.compiled
                progress(KERNELS_STAGE, said, 0)
        if progress is not None:
            progress(KERNELS_STAGE, self.compiled, self.compiled)  # the end

    def stop(self) -> None:
        """End the child (if it still runs) and its reader."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        self._reader.join()
        self._stderr.close()

    def _read(self) -> None:
        for line in self._proc.stdout:
            if line.startswith(PROGRESS_PREFIX):
                self.compiled = int(line[len(PROGRESS_PREFIX):])
        code = self._proc.wait()
        self._proc.stdout.close()
        if code != 0:
            self._stderr.seek(0)
            tail = self._stderr.read().decode(errors="replace")[-ERROR_TAIL:]
            self.error = f"the kernel compilation exited with status {code}: {tail.strip()}"
        self._done.set()


def main(argv: list[str]) -> int:
    """The child: load the model at ``argv[0]`` and compile its path for mode ``argv[1]``; or,
    given ``--all``, every kernel."""
    os.nice(CHILD_NICENESS)

    def report(stage: str, done: int, total: int) -> None:
        print(f"{PROGRESS_PREFIX}{done}", flush=True)

    if argv == [EVERY_KERNEL]:
        warm_up(report)
        return 0
    path, mode = argv
    net = load_causal_lm(path)
    try:
        with int8_activations(mode == "int8"):
            warm_model(net, report)
    finally:
        net.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
