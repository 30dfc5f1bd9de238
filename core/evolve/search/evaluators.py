"""Who computes a population's fitness: this process, or a Dask cluster.

An evaluator turns ``(task, members)`` into one fitness per member, in member order, whatever
order the work finishes in. A built-in task's fitness of a member does not depend on the other
members in the call (:mod:`.tasks`), so in-process, one worker or many give bit-identical lists
and a seeded run repeats exactly on any of them.

Every evaluator takes ``progress(done, total)`` (members evaluated so far) and ``cancel`` (see
:mod:`loomlab.core.cancel`); a cancelled evaluation raises :class:`LoomCancelled` and returns no
partial list, so a run drops that generation whole. Evaluators hold resources (a cluster, a
connection): close them, or use them as context managers. :func:`.schedulers.make_evaluator` makes
the one a scheduler's name asks for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from ...cancel import Cancel, as_cancel_check
from ...errors import LoomCancelled, LoomError
from ...network import VolumetricNetwork
from .tasks import Task

Progress = Callable[[int, int], None]


@runtime_checkable
class Evaluator(Protocol):
    """Computes fitness for members of a population (see the module docstring)."""

    def evaluate(self, task: Task, members: Sequence[VolumetricNetwork], *,
                 progress: Progress | None = None, cancel: Cancel = None) -> list[float]:
        """One fitness per member, in member order."""
        ...

    def close(self) -> None:
        """Release what the evaluator holds; closing twice is harmless."""
        ...

    def __enter__(self) -> Evaluator: ...

    def __exit__(self, *exc) -> None: ...


class InProcessEvaluator:
    """Evaluates in the calling thread: ``task.evaluate(members)`` in one call, so the task batches
    same-shaped members into one matmul per layer.

    Being one call, it checks ``cancel`` before it starts (a request during the call lets the call
    finish, and the complete list is returned) and reports progress at 0 and at the end; a task
    that evaluates ``member_by_member`` gets both and reports and stops between members.
    """

    def evaluate(self, task: Task, members: Sequence[VolumetricNetwork], *,
                 progress: Progress | None = None, cancel: Cancel = None) -> list[float]:
        total = len(members)
        if task.member_by_member:  # slow members: the task reports each (0 too) and stops on request
            stop = begin_evaluation(task, total, cancel, None)
            return checked_fitness(task.evaluate(list(members), progress=progress, cancel=stop), total,
                                   task.name)
        begin_evaluation(task, total, cancel, progress)
        fitness = checked_fitness(task.evaluate(list(members)), total, task.name)
        if progress is not None:
            progress(total, total)
        return fitness

    def close(self) -> None:
        """Nothing to release."""

    def __enter__(self) -> InProcessEvaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return "InProcessEvaluator()"


def begin_evaluation(task: Task, total: int, cancel: Cancel, progress: Progress | None) -> Callable[[], bool]:
    """What every evaluator does first: refuse a cancelled request, report 0 of ``total`` done;
    returns the cancel check to use while evaluating."""
    stop = as_cancel_check(cancel)
    if stop():
        raise LoomCancelled(f"evaluation of {total} members on task {task.name!r} cancelled")
    if progress is not None:
        progress(0, total)
    return stop


def checked_fitness(values: Sequence[float], n_members: int, task_name: str) -> list[float]:
    """``values`` as plain floats, after checking that the task gave one per member."""
    if len(values) != n_members:
        raise LoomError(f"task {task_name!r} returned {len(values)} fitness values for {n_members} members")
    return [float(v) for v in values]
