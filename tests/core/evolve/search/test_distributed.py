"""The Dask evaluator on real local clusters (worker processes on loopback); oracle: the in-process
evaluation of the same members. Every cluster is closed by its fixture or test."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time

import numpy as np
import pytest

from loomlab.core.errors import LoomCancelled, LoomConfigError
from loomlab.core.evolve.genetics.neat import NEATConfig
from loomlab.core.evolve.search.distributed import ClusterError, DaskEvaluator
from loomlab.core.evolve.search.evaluators import InProcessEvaluator
from loomlab.core.evolve.search.run import Evolution
from loomlab.core.evolve.search.schedulers import make_evaluator
from loomlab.core.evolve.search.speciation import SpeciationConfig
from loomlab.core.evolve.search.tasks import XorTask, get_task
from loomlab.core.io.checkpoint import checkpoint_bytes

from .test_evaluators import population

dd = pytest.importorskip("distributed")

# Upper bound for any one blocking step of these tests, so a broken cluster fails instead of hanging.
STEP_S = 60
# Clusters started here keep their scheduler's HTTP server on loopback, on a free port.
LOOPBACK_HTTP = {"dashboard": False, "dashboard_address": "127.0.0.1:0"}


def bits(values):
    return np.asarray(values, dtype=np.float64).tobytes()


@pytest.fixture(scope="module")
def two_workers():
    with make_evaluator("local", n_workers=2) as evaluator:
        yield evaluator


@pytest.fixture(scope="module")
def one_worker():
    with make_evaluator("local", n_workers=1) as evaluator:
        yield evaluator


@pytest.fixture(scope="module", autouse=True)
def _dask_process_pools(two_workers):
    """Start Dask's two process-wide one-thread pools (offloading, future callbacks) before the
    tests, which must leave no thread of their own behind (tests/conftest.py)."""
    task = get_task("xor")
    two_workers.evaluate(task, [task.seed_network()])


def scheduler_keys(client):
    """Keys of our fitness chunks the scheduler still holds."""
    return client.run_on_scheduler(
        lambda dask_scheduler: [k for k in dask_scheduler.tasks if str(k).startswith("loomlab-fitness")])


@pytest.mark.parametrize("name, n", [("xor", 40), ("sine", 25), ("spirals", 20),
                                     ("cartpole", 30), ("pendulum", 12)])
def test_one_and_two_workers_give_the_in_process_fitness_bit_for_bit(name, n, one_worker, two_workers):
    task = get_task(name)
    members = population(task, n)
    expected = InProcessEvaluator().evaluate(task, members)
    assert len(set(expected)) > 3  # mutants differ, some are broken (the floor), order matters
    for evaluator in (one_worker, two_workers):
        assert bits(evaluator.evaluate(task, members)) == bits(expected)
    for chunk_size in (1, 7):
        evaluator = DaskEvaluator(two_workers.scheduler_address, chunk_size=chunk_size)
        try:
            assert bits(evaluator.evaluate(task, members)) == bits(expected)
        finally:
            evaluator.close()


@pytest.mark.parametrize("speciation", [None, SpeciationConfig()], ids=["loom", "speciated"])
def test_a_seeded_run_is_the_same_whoever_evaluates_it(speciation, one_worker, two_workers):
    task = get_task("xor")

    def run(evaluator):
        evolution = Evolution(task, config=NEATConfig.default(4, seed=11), population=24,
                              evaluator=evaluator, speciation=speciation)
        evolution.run(4)
        return [s.to_dict() for s in evolution.history], [checkpoint_bytes(m) for m in evolution.members]

    history, members = run(InProcessEvaluator())
    assert len(history) == 4 and len(set(members)) > 1  # four generations of differing members
    for evaluator in (one_worker, two_workers):
        assert run(evaluator) == (history, members)


def test_members_keep_their_own_precision(two_workers):
    task = get_task("sine")  # precision "loom" by default
    members = population(task, 6)
    for net in members[::2]:
        net.precision = "fast"
    assert bits(two_workers.evaluate(task, members)) == bits(InProcessEvaluator().evaluate(task, members))


def test_progress_counts_members_as_chunks_finish(two_workers):
    task = get_task("xor")
    members = population(task, 23)
    calls = []
    two_workers.chunk_size = 5
    try:
        two_workers.evaluate(task, members, progress=lambda done, total: calls.append((done, total)))
    finally:
        two_workers.chunk_size = None
    assert {total for _, total in calls} == {23}
    done = [d for d, _ in calls]
    assert done[0] == 0 and done[-1] == 23
    steps = sorted(np.diff(done).tolist())
    assert steps == [3, 5, 5, 5, 5]  # one report per chunk, whatever order they finished in


def test_cancel_stops_the_generation_and_drops_pending_chunks(two_workers):
    task = get_task("sine", points=512)
    members = population(task, 200)
    stop = threading.Event()
    seen = []

    def progress(done, total):
        seen.append(done)
        if done >= 10:
            stop.set()

    two_workers.chunk_size = 1
    try:
        with pytest.raises(LoomCancelled, match="cancelled after"):
            two_workers.evaluate(task, members, progress=progress, cancel=stop)
    finally:
        two_workers.chunk_size = None
    assert 10 <= seen[-1] < 200
    deadline = time.monotonic() + STEP_S
    while scheduler_keys(two_workers.client) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert scheduler_keys(two_workers.client) == []
    # the evaluator is still good for the next generation
    assert two_workers.evaluate(task, members[:8]) == InProcessEvaluator().evaluate(task, members[:8])


def test_cancel_before_start_submits_nothing(two_workers, monkeypatch):
    task = get_task("xor")
    monkeypatch.setattr(two_workers.client, "map", lambda *a, **k: pytest.fail("submitted after cancel"))
    with pytest.raises(LoomCancelled):
        two_workers.evaluate(task, population(task, 4), cancel=lambda: True)


def test_a_worker_killed_mid_generation_costs_no_result():
    task = get_task("sine", points=512)
    members = population(task, 300)
    expected = InProcessEvaluator().evaluate(task, members)
    killed = {}

    def kill_a_busy_worker(done, total):
        if killed or done < 20:
            return
        client = evaluator.client
        pids = client.run(os.getpid)
        busy = [w for w, keys in client.processing().items() if keys]
        victim = busy[0] if busy else next(iter(pids))
        killed.update(pid=pids[victim], at=done, busy=bool(busy))
        os.kill(pids[victim], signal.SIGKILL)

    with DaskEvaluator("local", n_workers=2, chunk_size=1) as evaluator:
        got = evaluator.evaluate(task, members, progress=kill_a_busy_worker)
        assert killed["busy"], "the killed worker was running a chunk"
        assert 20 <= killed["at"] < len(members)
        assert killed["pid"] not in evaluator.client.run(os.getpid).values()
    assert bits(got) == bits(expected)


def test_starting_a_local_cluster_leaves_our_environment_alone():
    before = dict(os.environ)
    with DaskEvaluator("local", n_workers=1) as evaluator:
        # its workers do get Dask's one-thread settings
        assert set(evaluator.client.run(lambda: os.environ.get("OMP_NUM_THREADS")).values()) == {"1"}
        assert dict(os.environ) == before
    assert dict(os.environ) == before


def test_an_existing_cluster_by_address():
    with dd.LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address=None, scheduler_kwargs=LOOPBACK_HTTP) as cluster:
        task = get_task("xor")
        members = population(task, 9)
        with make_evaluator(cluster.scheduler_address, timeout=STEP_S) as evaluator:
            assert evaluator.evaluate(task, members) == InProcessEvaluator().evaluate(task, members)


def test_a_scheduler_without_workers_is_one_cluster_error():
    with dd.LocalCluster(n_workers=0, processes=True, host="127.0.0.1", dashboard_address=None,
                         scheduler_kwargs=LOOPBACK_HTTP) as cluster:
        with pytest.raises(ClusterError, match="has no worker after 1 s"):
            make_evaluator(cluster.scheduler_address, timeout=1)


def bounded(call):
    """Run ``call`` in a thread and return what it raised; fail if it is still running after STEP_S."""
    raised = []

    def run():
        try:
            call()
        except Exception as e:  # noqa: BLE001 - the test looks at what came out
            raised.append(e)

    thread = threading.Thread(target=run, name="bounded-call")
    thread.start()
    thread.join(STEP_S)
    assert not thread.is_alive(), f"still waiting after {STEP_S} s"
    return raised[0] if raised else None


def test_a_closed_port_is_one_cluster_error():
    with socket.socket() as s:  # a loopback port that nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = bounded(lambda: make_evaluator(f"tcp://127.0.0.1:{port}", timeout=1))
    assert isinstance(err, ClusterError) and f"127.0.0.1:{port}" in str(err)


def test_a_port_that_never_answers_is_one_cluster_error():
    # accepts connections and says nothing: distributed.Client alone would wait for ever
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        address = f"tcp://127.0.0.1:{server.getsockname()[1]}"
        err = bounded(lambda: make_evaluator(address, timeout=1))
    assert isinstance(err, ClusterError)
    assert str(err) == f"no Dask scheduler answered at {address} within 1 s"


@pytest.mark.parametrize("address", ["nonsense", "foo://127.0.0.1:1"])
def test_a_malformed_address_is_one_config_error(address):
    with pytest.raises(LoomConfigError, match="not a Dask scheduler address"):
        make_evaluator(address, timeout=1)


@pytest.mark.parametrize("options, message", [
    ({"n_workers": 0}, "n_workers must be an integer >= 1"),
    ({"n_workers": 2.0}, "n_workers must be an integer >= 1"),
    ({"chunk_size": 0}, "chunk_size must be an integer >= 1"),
    ({"timeout": -1}, "timeout must be a positive number"),
])
def test_bad_options_are_config_errors(options, message):
    with pytest.raises(LoomConfigError, match=message):
        DaskEvaluator("local", **options)


def test_n_workers_is_for_a_local_cluster_only():
    with pytest.raises(LoomConfigError, match="n_workers applies to scheduler='local' only"):
        DaskEvaluator("tcp://127.0.0.1:8786", n_workers=2)


def test_a_task_a_worker_cannot_rebuild_is_refused(two_workers):
    class OwnXor(XorTask):  # not in the registry: a worker would build a plain XorTask instead
        pass

    task = OwnXor()
    with pytest.raises(LoomConfigError, match="rebuilt from its params differs"):
        two_workers.evaluate(task, population(task, 2))


def test_a_closed_evaluator_says_so(two_workers):
    evaluator = DaskEvaluator(two_workers.scheduler_address)
    evaluator.close()
    evaluator.close()  # closing twice is harmless
    task = get_task("xor")
    with pytest.raises(LoomConfigError, match="is closed"):
        evaluator.evaluate(task, [task.seed_network()])
