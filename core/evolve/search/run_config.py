"""An evolution run's settings, read from one nested mapping and validated in one place.

``loomlab evolve`` reads them from a TOML file and the Evolution panel from its form; both hand
the same mapping to :func:`plan_from_dict`, so a run started from either is built the same way
and, with the same seed, gives the same history. Sections (all but ``run`` optional)::

    [run]         task (required), population, generations, until, scheduler, workers
    [task]        the task's parameters (hidden, depth, activation, seed, ...)
    [neat]        NEATConfig fields; seed seeds the whole run (default: random)
    [speciation]  present: speciated reproduction with these SpeciationConfig settings
    [evaluator]   accepted for compatibility (options of the evaluator come from [run] workers)

Errors are :class:`~loomlab.core.errors.LoomConfigError` with one line naming the field.
"""

from __future__ import annotations

import dataclasses
import os
import reprlib
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...errors import LoomConfigError
from ...io.bounded_read import read_small_text
from ...units import format_bytes
from ...workspace.store import Workspace
from ..genetics.budget import check_fits, shown_count
from ..genetics.neat import NEATConfig
from ..genetics.values import check_number
from .evaluators import Evaluator
from .reporters import Reporter
from .run import Evolution, check_run_fits
from .speciation import SpeciationConfig
from .tasks import NetworkTask, Task, get_task

CONFIG_LIMIT = 1 << 20  # bytes: a config is a few hundred
SECTIONS = ("run", "task", "neat", "speciation", "evaluator")
RUN_KEYS = frozenset({"task", "population", "generations", "until", "scheduler", "workers"})
IN_PROCESS = "inprocess"
WORKER_BYTES = 256 << 20  # a Dask worker process with numpy, distributed and the engine loaded


@dataclass(frozen=True)
class RunPlan:
    """What builds a run (:meth:`evolution`); its evaluator comes from
    ``make_evaluator(plan.scheduler, **plan.evaluator)``."""

    task: Task
    neat: NEATConfig
    speciation: SpeciationConfig | None
    population: int
    generations: int | None = None
    until: float | None = None
    scheduler: str | None = None  # None or "inprocess": this process; "local"; a Dask address
    evaluator: dict[str, Any] = field(default_factory=dict)

    def evolution(self, *, evaluator: Evaluator | None = None, reporters: Sequence[Reporter] = (),
                  store: Workspace | None = None) -> Evolution:
        """The run this plan describes (the CLI's and the Evolution panel's, so they cannot differ)."""
        return Evolution(self.task, config=self.neat, population=self.population, evaluator=evaluator,
                         speciation=self.speciation, reporters=reporters, store=store)


def plan_from_dict(doc: Mapping[str, Any]) -> RunPlan:
    """The run ``doc`` describes (see the module docstring), each part built and validated."""
    unknown = set(doc) - set(SECTIONS)
    if unknown:
        raise LoomConfigError(f"unknown section(s) {', '.join(sorted(unknown))} "
                              f"(known: {', '.join(SECTIONS)})")
    run = _section(doc, "run")
    bad = set(run) - RUN_KEYS
    if bad:
        raise LoomConfigError(f"unknown key(s) in [run]: {', '.join(sorted(bad))} "
                              f"(known: {', '.join(sorted(RUN_KEYS))})")
    if "task" not in run:
        raise LoomConfigError("[run] needs task = \"xor\" (or sine, spirals, quant-recipe)")
    task = get_task(run["task"], **_section(doc, "task"))
    neat_fields = dict(_section(doc, "neat"))
    seed = neat_fields.get("seed")
    if "d_model" in neat_fields:
        base = NEATConfig.default(neat_fields["d_model"], seed=seed)
    elif isinstance(task, NetworkTask):
        base = task.neat_config(seed=seed)  # what the task's seed network evolves well with
    else:  # members that are not networks (quant-recipe): the config only seeds the run
        base = NEATConfig.default(1, seed=seed)
    try:
        neat = dataclasses.replace(base, **neat_fields)
        speciation = SpeciationConfig(**_section(doc, "speciation")) if "speciation" in doc else None
    except TypeError as e:  # an unknown field name
        raise LoomConfigError(str(e)) from None
    population = run.get("population", 150)
    if isinstance(population, bool) or not isinstance(population, int) or population < 2:
        raise LoomConfigError(f"[run] population must be an integer >= 2, got {reprlib.repr(population)}")
    check_run_fits(task, neat, population)
    generations = run.get("generations")
    if generations is not None and (isinstance(generations, bool) or not isinstance(generations, int)
                                    or generations < 0):
        raise LoomConfigError(f"[run] generations must be an integer >= 0, got {reprlib.repr(generations)}")
    until = run.get("until")
    if until is not None:
        until = check_number("[run] until", until)
    scheduler = check_scheduler(run.get("scheduler"))
    if not isinstance(task, NetworkTask) and speciation is not None:
        raise LoomConfigError(f"task {task.name!r} does not evolve networks: speciation groups networks "
                              "by their DNA and does not apply")
    if not isinstance(task, NetworkTask) and scheduler not in (None, IN_PROCESS):
        raise LoomConfigError(f"task {task.name!r} is evaluated in this process only "
                              "(a cluster's work items are networks)")
    workers = run.get("workers")
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise LoomConfigError(f"[run] workers must be an integer >= 1, got {reprlib.repr(workers)}")
    if workers is not None:
        check_fits(workers * WORKER_BYTES, f"[run] workers {shown_count(workers)} (Dask worker processes "
                                           f"of about {format_bytes(WORKER_BYTES)} each)")
    return RunPlan(task, neat, speciation, population, generations, until, scheduler,
                   {"n_workers": workers} if workers is not None else {})


def read_plan(path: str | os.PathLike) -> RunPlan:
    """The run a TOML config file describes (:func:`plan_from_dict`), read with a size cap from a
    regular file only; every failure is one :class:`LoomConfigError` naming the file."""
    text = read_small_text(path, "the evolution config", limit=CONFIG_LIMIT)
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise LoomConfigError(f"{path}: not a TOML file: {e}") from None
    except RecursionError:  # tomllib parses nested arrays and tables recursively
        raise LoomConfigError(f"{path}: nested too deeply for a TOML config") from None
    try:
        return plan_from_dict(doc)
    except LoomConfigError as e:
        raise LoomConfigError(f"{path}: {e}") from None


def check_scheduler(scheduler: Any) -> str | None:
    """``scheduler`` as :func:`.schedulers.make_evaluator` takes it: None / "inprocess", "local",
    or a Dask scheduler address (``tcp://host:port`` and the like)."""
    if scheduler is None or scheduler in (IN_PROCESS, "local"):
        return scheduler
    if not isinstance(scheduler, str) or not scheduler or any(c.isspace() for c in scheduler) \
            or scheduler.endswith("://"):
        raise LoomConfigError(f"scheduler must be 'inprocess', 'local' or a Dask scheduler address such as "
                              f"tcp://host:8786, got {scheduler!r}")
    return scheduler


def _section(doc: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = doc.get(name, {})
    if not isinstance(value, Mapping):
        raise LoomConfigError(f"[{name}] must be a table of settings, got {reprlib.repr(value)}")
    return value


def model_source(model: Any) -> str:
    """What names a loaded language model for a quant-recipe run's ``model`` parameter: its
    file or folder (so a resumed run loads the same weights), else its name."""
    source = getattr(getattr(model, "net", None), "source", None)
    path = getattr(source, "path", None)
    return str(path) if path is not None else str(getattr(model, "name", "") or "")
