"""Fitness evaluation on a Dask cluster (needs the ``cluster`` extra: ``pip install 'loomlab[cluster]'``).

A work item is plain data: the task's name and its params as JSON text, and a chunk of members,
each as its ``.loom`` checkpoint bytes and its precision (which the file format does not carry). A
worker rebuilds the task once per process (cached) and the networks from their bytes, and returns
a list of floats; no live object, closure or network object travels. ``.loom`` rather than Loom
JSON: each weight blob travels as its raw native bytes (JSON base64-encodes them, a third more to
send and decode), the same network always gives the same bytes, and they are the bytes a run's
checkpoints already store its members as.

Results go back into member order by chunk index, so completion order never matters. A worker
that dies mid-generation (killed, out of memory) costs time, not results: the scheduler runs its
chunks again elsewhere, and evaluation being deterministic, the list is the one a healthy cluster
gives. Dask's own protocol pickles what client, scheduler and workers send each other (functions,
exceptions), so use a cluster you trust, as Dask's security notes say; TLS addresses
(``tls://``) work as Dask configures them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import os
import queue
import uuid
from collections.abc import Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from types import ModuleType

from ...cancel import Cancel
from ...errors import LoomCancelled, LoomConfigError, LoomError
from ...io.checkpoint import checkpoint_bytes, checkpoint_from_bytes
from ...network import VolumetricNetwork
from .evaluators import Progress, begin_evaluation, checked_fitness
from .tasks import Task, get_task

INSTALL_HINT = "pip install 'loomlab[cluster]'"
# How often a waiting evaluation looks at its cancel flag.
CANCEL_POLL_S = 0.05


class ClusterError(LoomError):
    """The Dask cluster cannot be reached, or lost what it was evaluating (a chunk whose workers
    kept dying, a scheduler that went away)."""


class DaskEvaluator:
    """Evaluates fitness on Dask workers, one chunk of members per Dask task.

    Parameters
    ----------
    scheduler:
        ``"local"`` starts a ``LocalCluster`` on loopback (``n_workers`` worker processes of one
        thread each), closed with the evaluator; an address such as ``"tcp://host:8786"``
        connects to an existing scheduler, which must have at least one worker within
        ``timeout``.
    n_workers:
        Worker processes of a local cluster (default: the CPUs this process may use).
    chunk_size:
        Members per Dask task. Default: a quarter of an even share per worker thread, so a slow
        or lost worker holds back little and progress moves in small steps, while each task still
        batches its same-shaped members.
    timeout:
        Seconds allowed to reach the scheduler (and, for an address, to find a worker there).

    Raises :class:`LoomConfigError` for bad arguments, or with :data:`INSTALL_HINT` when Dask is
    not installed, and :class:`ClusterError` when the cluster cannot be started or reached.
    """

    def __init__(self, scheduler: str = "local", *, n_workers: int | None = None,
                 chunk_size: int | None = None, timeout: float = 10.0):
        dd = require_distributed()
        if chunk_size is not None and (isinstance(chunk_size, bool) or not isinstance(chunk_size, int)
                                       or chunk_size < 1):
            raise LoomConfigError(f"chunk_size must be an integer >= 1, got {chunk_size!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            raise LoomConfigError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self.chunk_size = chunk_size
        self.timeout = float(timeout)
        self._cluster = None
        self._local = scheduler == "local"
        if self._local:
            self._cluster = _start_local_cluster(dd, _worker_count(n_workers))
            address = self._cluster.scheduler_address
        elif n_workers is not None:
            raise LoomConfigError("n_workers applies to scheduler='local' only; an existing cluster "
                                  "has the workers it has")
        else:
            address = scheduler
            _probe_scheduler(address, self.timeout)
        try:
            self._client = dd.Client(address, timeout=self.timeout, set_as_default=False)
        except Exception as e:
            self._close_cluster()
            raise ClusterError(f"cannot connect to the Dask scheduler at {address}: {e}") from None
        if self._cluster is None:
            try:
                self._client.wait_for_workers(1, timeout=self.timeout)
            except TimeoutError:
                self.close()
                raise ClusterError(f"the Dask scheduler at {address} has no worker after "
                                   f"{self.timeout:g} s") from None
        self.scheduler_address: str = address

    @property
    def client(self):
        """The ``distributed.Client`` in use (its workers, scheduler information, ...); None once closed."""
        return self._client

    def evaluate(self, task: Task, members: Sequence[VolumetricNetwork], *,
                 progress: Progress | None = None, cancel: Cancel = None) -> list[float]:
        """One fitness per member, in member order; see :mod:`.evaluators` for progress and cancel.

        On cancel, chunks not yet finished are cancelled on the cluster (a chunk already running
        on a worker runs to its end there, unobserved) and :class:`LoomCancelled` is raised.
        """
        if self._client is None:
            raise LoomConfigError(f"{self!r} is closed")
        params = _task_params_json(task)
        total = len(members)
        stop = begin_evaluation(task, total, cancel, progress)
        if total == 0:
            return []
        items = [(checkpoint_bytes(net), net.precision) for net in members]
        size = self.chunk_size or self._auto_chunk_size(total)
        chunks = [items[i:i + size] for i in range(0, total, size)]
        run = uuid.uuid4().hex[:12]
        finished: queue.Queue[int] = queue.Queue()
        pending = {}  # chunk index -> future, until its result is read
        try:
            n = len(chunks)
            for i, future in enumerate(self._client.map(
                    evaluate_work_item, [task.name] * n, [params] * n, chunks,
                    key=[f"loomlab-fitness-{run}-{i}" for i in range(n)], pure=False)):
                future.add_done_callback(lambda _f, i=i: finished.put(i))
                pending[i] = future
            by_chunk: dict[int, list[float]] = {}
            done = 0
            while pending:
                if stop():
                    raise LoomCancelled(f"evaluation on task {task.name!r} cancelled after "
                                        f"{done} of {total} members")
                try:
                    i = finished.get(timeout=CANCEL_POLL_S)
                except queue.Empty:
                    continue
                # read and release at once: a result left on a worker that dies would be computed again
                future = pending.pop(i)
                by_chunk[i] = checked_fitness(_result(future, task.name), len(chunks[i]), task.name)
                future.release()
                done += len(chunks[i])
                if progress is not None:
                    progress(done, total)
            return [f for i in range(len(chunks)) for f in by_chunk[i]]
        finally:
            if pending:
                self._client.cancel(list(pending.values()))

    def _auto_chunk_size(self, total: int) -> int:
        threads = max(1, sum(self._client.nthreads().values()))
        return max(1, math.ceil(total / (4 * threads)))

    def close(self) -> None:
        """Disconnect, and stop the local cluster if this evaluator started one."""
        client, self._client = getattr(self, "_client", None), None
        if client is not None:
            client.close()
        self._close_cluster()

    def _close_cluster(self) -> None:
        cluster, self._cluster = self._cluster, None
        if cluster is not None:
            cluster.close()

    def __enter__(self) -> DaskEvaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        where = "local cluster" if self._local else "scheduler"
        return f"DaskEvaluator({where} at {getattr(self, 'scheduler_address', '?')})"


def require_distributed() -> ModuleType:
    """The ``distributed`` module, or one :class:`LoomConfigError` naming the extra to install."""
    try:
        import distributed
    except ImportError as e:
        raise LoomConfigError(f"evaluating on Dask needs the 'cluster' extra ({e.msg}): "
                              f"{INSTALL_HINT}") from None
    return distributed


def evaluate_work_item(task_name: str, params_json: str,
                       members: Sequence[tuple[bytes, str]]) -> list[float]:
    """Run on a worker: fitness of each member (``.loom`` bytes, precision) on the named task."""
    task = _worker_task(task_name, params_json)
    nets = []
    for blob, precision in members:
        net = checkpoint_from_bytes(blob)
        net.precision = precision
        nets.append(net)
    return checked_fitness(task.evaluate(nets), len(nets), task_name)


@functools.lru_cache(maxsize=8)
def _worker_task(name: str, params_json: str) -> Task:
    # a task builds its data once; every chunk of a run on this worker process reuses it
    return get_task(name, **json.loads(params_json))


def _task_params_json(task: Task) -> str:
    """``task.params`` as JSON, after checking that a worker can rebuild an equal task from it."""
    try:
        params = json.dumps(task.params, sort_keys=True, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise LoomConfigError(f"task {task.name!r} params are not plain JSON ({e}); a Dask worker "
                              "rebuilds the task from them") from None
    try:
        rebuilt = get_task(task.name, **json.loads(params))
    except LoomConfigError as e:
        raise LoomConfigError(f"a Dask worker cannot rebuild task {task.name!r} by name: {e}") from None
    if rebuilt != task:
        raise LoomConfigError(f"task {task.name!r} rebuilt from its params differs from the one given; "
                              "a Dask worker would evaluate another task")
    return params


def _result(future, task_name: str) -> list[float]:
    """The chunk's fitness list; a chunk the cluster lost becomes one :class:`ClusterError`."""
    from distributed import KilledWorker

    try:
        return future.result()
    except KilledWorker as e:
        raise ClusterError(f"task {task_name!r}: the Dask workers running a chunk of members died "
                           f"repeatedly ({e}); a member may exhaust a worker's memory") from None
    except CancelledError as e:
        raise ClusterError(f"task {task_name!r}: the cluster dropped a chunk of members ({e}); "
                           "the scheduler may have gone away") from None


def _worker_count(n_workers: int | None) -> int:
    if n_workers is None:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if isinstance(n_workers, bool) or not isinstance(n_workers, int) or n_workers < 1:
        raise LoomConfigError(f"n_workers must be an integer >= 1, got {n_workers!r}")
    return n_workers


def _start_local_cluster(dd: ModuleType, n_workers: int):
    # Dask's nannies write their workers' environment (OMP_NUM_THREADS=1, ...) into ours and
    # leave it there: this process's later children (and nproc) would inherit one thread
    saved = dict(os.environ)
    try:
        return _local_cluster(dd, n_workers)
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _local_cluster(dd: ModuleType, n_workers: int):
    try:
        # worker processes (not threads): evaluation holds the GIL, and a killed one loses nothing.
        # The scheduler's HTTP server (health, metrics; no dashboard) takes any free loopback port
        # instead of trying 8787, which another cluster on the machine may hold.
        return dd.LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True,
                               host="127.0.0.1", dashboard_address=None,
                               scheduler_kwargs={"dashboard": False, "dashboard_address": "127.0.0.1:0"})
    except Exception as e:
        raise ClusterError(f"cannot start a local Dask cluster of {n_workers} workers: {e}") from None


def _probe_scheduler(address: str, timeout: float) -> None:
    """Connect to ``address`` and finish Dask's handshake within ``timeout`` seconds.

    ``distributed.Client`` waits for the handshake without a limit, so a port that accepts and
    stays silent would hang it; this bounds that wait (in a thread of its own, so a caller that
    runs an event loop is not disturbed).
    """
    from distributed.comm import connect

    async def handshake():
        comm = await connect(address, timeout=timeout)
        await comm.close()

    def attempt():
        asyncio.run(asyncio.wait_for(handshake(), timeout))

    with ThreadPoolExecutor(1, thread_name_prefix="loomlab-dask-probe") as pool:
        try:
            pool.submit(attempt).result()
        except ValueError as e:
            raise LoomConfigError(f"{address!r} is not a Dask scheduler address ({e}); expected "
                                  "'local' or an address such as 'tcp://host:8786'") from None
        except TimeoutError:
            raise ClusterError(f"no Dask scheduler answered at {address} within {timeout:g} s") from None
        except Exception as e:
            raise ClusterError(f"cannot reach a Dask scheduler at {address}: {e}") from None
