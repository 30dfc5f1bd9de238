"""An evolution run in a child process, watched live from this one.

Why a process: a run of small networks is pure Python (mutation, splicing, speciation, forwards of
a few microseconds) that holds the GIL almost without a break. A GUI thread beside it needs the
GIL each time a redraw passes through Python (every pyqtgraph item's paint and bounding box is a
Python method), and each time it waits for the run to give the GIL up (up to the 1 ms switch
interval): an Evolution panel that ran the loop on a thread of its own process stalled 100-280 ms
per redraw. In ``python -m loomlab.core.evolve.search.run_process`` the run has its own interpreter, and
the parent only reads events from a pipe.

Protocol (:mod:`loomlab.core.pipe_messages`, JSON only): the parent sends one request, then
commands; the child sends live events (:func:`.live.event_to_dict`), then ``{"result": ...}``
(a :class:`~.run.RunResult`) or ``{"error": ...}`` (raised again, typed, in the parent)::

    request   {"workspace": path | null, "settings": {...} | "resume": run_id,
               "generations": n, "until": x | null, "scheduler": ..., "options": {...}}
    commands  {"command": "pause"} (stop after this generation's checkpoint), {"command": "stop"}

The end of the child's input also stops the run, so a child never outlives its parent's pipe.
Checkpoints go to the workspace database from the child (SQLite in WAL mode: the parent can read
the run list meanwhile).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any, BinaryIO

from ...errors import EngineProcessError, LoomConfigError
from ...pipe_messages import error_from, error_payload, readable, receive, send
from ...workspace.store import Workspace
from .live import Event, event_from_dict, event_to_dict, run_live
from .run import Evolution, RunResult
from .run_config import plan_from_dict
from .tasks import NetworkTask

WHO = "evolution run process"
POLL_S = 0.05  # how often the parent looks at pause and cancel while no event comes
STOP_GRACE_S = 30.0  # a stopped child that has not ended after this long is killed
STDERR_TAIL = 400  # characters of the child's stderr quoted when it dies without a word
CHILD_NICENESS = 5  # the run's priority below its parent's (Linux nice: higher yields sooner)


def run_in_child(request: dict[str, Any], sink: Callable[[Event], None], *,
                 pause: threading.Event | None = None,
                 cancelled: Callable[[], bool] = lambda: False) -> RunResult:
    """Run ``request`` (see the module docstring) in a child process, handing ``sink`` each of its
    live events as they come; returns the run's result. ``pause`` set: the run stops after the
    current generation's checkpoint; ``cancelled()`` true: it stops at once (keeping the last
    checkpoint), and a child that does not end within :data:`STOP_GRACE_S` is killed."""
    with tempfile.TemporaryFile() as stderr:
        proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=stderr, bufsize=0)
        try:
            send(proc.stdin, request)
            return _follow(proc, stderr, sink, pause, cancelled)
        finally:
            _end(proc)


def _follow(proc: subprocess.Popen, stderr: BinaryIO, sink, pause, cancelled) -> RunResult:
    told: set[str] = set()
    stopped_at = None
    while True:
        for command, asked in (("pause", pause is not None and pause.is_set()), ("stop", cancelled())):
            if asked and command not in told:
                told.add(command)
                _tell(proc, command)
                stopped_at = time.monotonic() if command == "stop" else stopped_at
        if stopped_at is not None and time.monotonic() - stopped_at > STOP_GRACE_S:
            proc.kill()
            raise EngineProcessError(f"the {WHO} did not stop within {STOP_GRACE_S:g} s and was killed")
        if not readable(proc.stdout, POLL_S):
            continue
        message = receive(proc.stdout, who=WHO)
        if message is None:
            raise _died(proc, stderr)
        if "result" in message:
            return RunResult(**message["result"])
        if "error" in message:
            raise error_from(message["error"], WHO)
        try:
            event = event_from_dict(message)
        except (KeyError, TypeError, ValueError) as e:
            raise EngineProcessError(f"the {WHO} sent an event that is none: {e}") from None
        sink(event)


def _tell(proc: subprocess.Popen, command: str) -> None:
    try:
        send(proc.stdin, {"command": command})
    except OSError:  # the child has ended: reading its output says how
        pass


def _end(proc: subprocess.Popen) -> None:
    try:
        proc.stdin.close()  # end of input: a child still running stops at its next chance
        proc.wait(timeout=STOP_GRACE_S)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    proc.stdout.close()


def _died(proc: subprocess.Popen, stderr: BinaryIO) -> EngineProcessError:
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        code = None
    stderr.seek(0)
    tail = stderr.read().decode(errors="replace").strip()[-STDERR_TAIL:]
    return EngineProcessError(f"the {WHO} ended without a result (exit code {code})"
                              + (f": {tail}" if tail else ""))


# ----- the child's side -----------------------------------------------------------------------------
def run_request(request: dict[str, Any], sink: Callable[[Event], None], pause: threading.Event,
                stop: threading.Event) -> RunResult:
    """What the child does with ``request``: build the run (a new one from its settings, or a
    stored one resumed) and run it with :func:`.live.run_live`."""
    path = request.get("workspace")
    workspace = Workspace(path) if path is not None else None
    try:
        if "resume" in request:
            if workspace is None:
                raise LoomConfigError("resuming a run needs the workspace that holds it")

            def build(evaluator, reporters):
                return Evolution.resume(workspace, request["resume"], evaluator=evaluator,
                                        reporters=reporters)
        else:
            plan = plan_from_dict(request["settings"])
            if not isinstance(plan.task, NetworkTask):
                raise LoomConfigError(f"task {plan.task.name!r} runs beside its model, not in a child")

            def build(evaluator, reporters):
                return plan.evolution(evaluator=evaluator, reporters=reporters, store=workspace)
        return run_live(build, sink, generations=request["generations"], until=request.get("until"),
                        scheduler=request.get("scheduler"), options=request.get("options"),
                        pause=pause, cancelled=stop.is_set)
    finally:
        if workspace is not None:
            workspace.close()


def _listen(inp: BinaryIO, pause: threading.Event, stop: threading.Event) -> None:
    try:
        while (message := receive(inp, who="parent")) is not None:
            command = message.get("command") if isinstance(message, dict) else None
            if command == "pause":
                pause.set()
            elif command == "stop":
                stop.set()
    except EngineProcessError:
        pass
    stop.set()  # the end of input: the parent is gone, or has what it wanted


def main() -> None:
    if hasattr(os, "nice"):
        # below the window that watches it: on 2 cores the run, the GUI thread and the X server
        # want 3, and a tick of the GUI waited 110 ms behind the run once in a test suite's run
        os.nice(CHILD_NICENESS)
    out = os.fdopen(os.dup(1), "wb", buffering=0)  # the protocol's channel
    os.dup2(2, 1)  # whatever a library prints goes to stderr, not into the protocol
    inp = sys.stdin.buffer
    request = receive(inp, who="parent")
    if request is None:
        return
    pause, stop = threading.Event(), threading.Event()
    threading.Thread(target=_listen, args=(inp, pause, stop), daemon=True, name="commands").start()
    try:
        result = run_request(request, lambda event: send(out, event_to_dict(event)), pause, stop)
    except Exception as e:  # every failure goes back to the parent, typed, never a silent exit
        send(out, {"error": error_payload(e)})
        return
    send(out, {"result": dataclasses.asdict(result)})


if __name__ == "__main__":
    main()
