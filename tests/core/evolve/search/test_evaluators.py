"""The evaluator protocol, the in-process evaluator and make_evaluator (no Dask needed here)."""

from __future__ import annotations

import sys
import threading

import pytest

from loomlab.core.errors import LoomCancelled, LoomConfigError, LoomError
from loomlab.core.evolve.genetics.neat import NEATConfig, neat_mutate
from loomlab.core.evolve.search.evaluators import Evaluator, InProcessEvaluator
from loomlab.core.evolve.search.schedulers import make_evaluator
from loomlab.core.evolve.search.tasks import XorTask, get_task


def population(task, n):
    """The task's seed network and mutants of mutants of it (various layer types and sizes)."""
    members = [task.seed_network()]
    for i in range(n - 1):
        members.append(neat_mutate(members[i // 2], NEATConfig.default(task.params["hidden"], seed=i)))
    return members


@pytest.mark.parametrize("scheduler", [None, "inprocess"])
def test_make_evaluator_in_process(scheduler):
    evaluator = make_evaluator(scheduler)
    assert isinstance(evaluator, InProcessEvaluator)
    assert isinstance(evaluator, Evaluator)


@pytest.mark.parametrize("name", ["xor", "sine", "spirals"])
def test_in_process_gives_the_tasks_fitness_in_member_order(name):
    task = get_task(name)
    members = population(task, 12)
    expected = [task.evaluate([m])[0] for m in members]
    with InProcessEvaluator() as evaluator:
        assert evaluator.evaluate(task, members) == expected
        assert evaluator.evaluate(task, members[::-1]) == expected[::-1]
    assert len(set(expected)) > 3  # the population really differs


def test_in_process_progress_reports_start_and_end():
    task = get_task("xor")
    calls = []
    InProcessEvaluator().evaluate(task, population(task, 5),
                                  progress=lambda done, total: calls.append((done, total)))
    assert calls == [(0, 5), (5, 5)]


@pytest.mark.parametrize("cancel", [threading.Event, lambda: (lambda: True)])
def test_in_process_cancel_before_start_evaluates_nothing(cancel, monkeypatch):
    task = get_task("xor")
    flag = cancel()
    if isinstance(flag, threading.Event):
        flag.set()
    monkeypatch.setattr(XorTask, "evaluate", lambda *a: pytest.fail("evaluated after cancel"))
    with pytest.raises(LoomCancelled):
        InProcessEvaluator().evaluate(task, population(task, 3), cancel=flag)


def test_bad_cancel_is_a_config_error():
    task = get_task("xor")
    with pytest.raises(LoomConfigError, match="cancel"):
        InProcessEvaluator().evaluate(task, [task.seed_network()], cancel=True)


def test_a_task_that_miscounts_is_one_loom_error():
    class ShortXor(XorTask):
        def evaluate(self, nets):
            return super().evaluate(nets)[:-1]

    task = ShortXor()
    with pytest.raises(LoomError, match="returned 1 fitness values for 2 members"):
        InProcessEvaluator().evaluate(task, population(task, 2))


@pytest.mark.parametrize("scheduler", ["", "  ", 8786])
def test_make_evaluator_rejects_what_is_no_scheduler(scheduler):
    with pytest.raises(LoomConfigError, match="scheduler must be"):
        make_evaluator(scheduler)


def test_in_process_takes_no_options():
    with pytest.raises(LoomConfigError, match="no options, got n_workers"):
        make_evaluator(None, n_workers=2)


@pytest.mark.parametrize("scheduler", ["local", "tcp://127.0.0.1:8786"])
def test_dask_without_the_cluster_extra_names_the_extra(scheduler, monkeypatch):
    # None in sys.modules makes `import distributed` raise ImportError, as on a machine without it
    monkeypatch.setitem(sys.modules, "distributed", None)
    with pytest.raises(LoomConfigError) as err:
        make_evaluator(scheduler)
    assert "pip install 'loomlab[cluster]'" in str(err.value)
    assert "'cluster' extra" in str(err.value)
