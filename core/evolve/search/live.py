"""What a running evolution tells a live view, as plain events, and the buffer a view drains.

A :class:`LiveReporter` runs on the thread that runs the evolution and turns its reporter hooks
into events: :class:`RunStarted` (what a run, new or resumed, already has), one
:class:`~.reporters.GenerationStats` and one :class:`Snapshot` (the population table) per
generation, :class:`BestMember` when the best member changes, :class:`References` once after the
first generation (a task with reference recipes: ``gguf-recipe``'s llama.cpp presets), and
:class:`Progress`. It hands each to a ``sink`` callable. In the same process the sink is
:meth:`LiveBuffer.accept`, which a GUI timer drains; across processes (:mod:`.run_process`) it is
a line of JSON (:func:`event_to_dict` / :func:`event_from_dict`), which the reading side hands to
its own buffer. So a view never sees whether the run is beside it or in another process.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ...io.checkpoint import checkpoint_bytes, checkpoint_from_bytes
from ...network import VolumetricNetwork
from .evaluators import Evaluator
from .reporters import GenerationStats, Reporter
from .run import Evolution, RunResult
from .schedulers import make_evaluator

MAX_TABLE_ROWS = 500  # the population table lists the fittest members up to this many
PROGRESS_INTERVAL_S = 0.033  # progress events a sink receives while a generation is evaluated
KEEP_GENE = "float32"  # a quant-recipe gene meaning the layer keeps the file's own blocks
KEPT = "as loaded"  # how the population table names that gene


@dataclass(frozen=True)
class MemberRow:
    """One evaluated member as the population table lists it."""

    rank: int  # 1 = fittest
    index: int  # its place in the generation
    species: int | None
    fitness: float
    layer_types: str  # "Dense×2" for a network, "as loaded×93 int8×30" for a recipe
    parameters: int  # weights of a network, packed bytes of a recipe
    kl: float | None = None  # a recipe's mean KL against the unmorphed model
    recipe: tuple[str, ...] | None = None
    heldout_kl: float | None = None  # a gguf-recipe member's KL on the held-out text, once re-scored


@dataclass(frozen=True)
class Snapshot:
    generation: int
    rows: list[MemberRow]  # fittest first


@dataclass(frozen=True)
class RunStarted:
    """A run began (or resumed): what it already has."""

    run_id: int | None
    task: str
    history: list[GenerationStats]
    best: Any
    best_fitness: float
    layer_names: tuple[str, ...] = ()  # a recipe run's layers, in recipe order


@dataclass(frozen=True)
class BestMember:
    member: Any
    fitness: float


@dataclass(frozen=True)
class References:
    """Recipes a run is compared with (``gguf-recipe``: llama.cpp's presets planned for the model),
    each ``(name, weight bytes, KL on the held-out text)``."""

    points: list[tuple[str, int, float]]


@dataclass(frozen=True)
class Progress:
    stage: str  # "generation" (done of the run's generations) or "evaluate" (members of one)
    done: int
    total: int


Event = RunStarted | GenerationStats | Snapshot | BestMember | References | Progress


class LiveBuffer:
    """Filled by the run's side, drained by the view's timer. Every generation's statistics are
    kept (they are the plots), and the references; the population table and the best member are
    only the latest, so a hidden view's buffer stays small however long the run. ``append`` and
    attribute assignment are atomic, so no lock is needed."""

    def __init__(self):
        self._events: deque[RunStarted | GenerationStats | References] = deque()
        self.snapshot: Snapshot | None = None
        self.best: BestMember | None = None

    def accept(self, event: Event) -> None:
        """Keep ``event`` for the next :meth:`drain` (progress is not the buffer's: dropped)."""
        if isinstance(event, Snapshot):
            self.snapshot = event
        elif isinstance(event, BestMember):
            self.best = event
        elif isinstance(event, RunStarted | GenerationStats | References):
            self._events.append(event)

    def drain(self) -> tuple[list, Snapshot | None, BestMember | None]:
        events = self._events
        items = [events.popleft() for _ in range(len(events))]
        snapshot, self.snapshot = self.snapshot, None
        best, self.best = self.best, None
        return items, snapshot, best


class LiveReporter(Reporter):
    """Collects each generation's members, fitness and species and hands ``sink`` the events of
    the module docstring. ``pause`` set: the run stops after the checkpoint of the generation under
    way (:meth:`cancel_check` says so to the run)."""

    def __init__(self, sink: Callable[[Event], None], pause: threading.Event | None = None,
                 generations: int = 0):
        self.sink, self.pause, self.generations = sink, pause, generations
        self.run = None
        self.halt = False
        self._first = 0
        self._members: list = []
        self._fitness: list[float] = []
        self._species: dict[int, int] = {}
        self._scores: list = []
        self._best = None
        self._last_progress = 0.0
        self._cancelled: Callable[[], bool] = lambda: False
        self._referenced = False

    def attach(self, run: Evolution) -> None:
        """Watch ``run`` (an :class:`~.run.Evolution` built with this reporter); tells the sink what
        the run already has."""
        self.run, self._first, self._best = run, run.generation, run.best
        names = tuple(run.task.space.names) if run.genome.member_kind == "recipe" else ()
        self.sink(RunStarted(run.run_id, run.task.name, list(run.history), run.best, run.best_fitness, names))

    def cancel_check(self, cancelled: Callable[[], bool] = lambda: False) -> Callable[[], bool]:
        """The run's ``cancel``: a pause that took effect, or ``cancelled()``."""
        self._cancelled = cancelled
        return lambda: self.halt or cancelled()

    def progress(self, done: int, total: int) -> None:
        """The run's ``progress`` (members evaluated), at most ~30 events a second to the sink."""
        now = time.monotonic()
        if done < total and now - self._last_progress < PROGRESS_INTERVAL_S:
            return
        self._last_progress = now
        self.sink(Progress("evaluate", done, total))

    def start_generation(self, generation: int) -> None:
        self._members, self._species, self._scores = list(self.run.members), {}, []

    def post_evaluate(self, generation: int, fitness: list[float]) -> None:
        self._fitness = list(fitness)
        if self.run.genome.member_kind == "recipe":
            self._scores = list(getattr(self.run.task, "last_scores", []))

    def species_changed(self, generation: int, sizes: dict[int, int]) -> None:
        self._species = {i: sp.id for sp in self.run.speciation.species for i in sp.members}

    def end_generation(self, stats: GenerationStats, population: int) -> None:
        self.sink(Snapshot(stats.generation, member_rows(self._members, self._fitness, self._species,
                                                         self._scores)))
        self.sink(stats)
        if not self._referenced:
            self._referenced = True
            references = getattr(self.run.task, "references", None)
            if callable(references):  # the first generation measured them; else now (Stop: LoomCancelled)
                self.sink(References([(name, int(s.bytes), float(s.kl_mean))
                                      for name, s in references(cancel=self._cancelled).items()]))
        if self.run.best is not self._best:
            self._best = self.run.best
            self.sink(BestMember(self.run.best, self.run.best_fitness))
        self.sink(Progress("generation", stats.generation - self._first, self.generations))

    def checkpointed(self, run_id: int, generation: int) -> None:
        if self.pause is not None and self.pause.is_set() and generation > self._first:
            self.halt = True  # the run checks this before its next generation


def run_live(build: Callable[[Evaluator, list[Reporter]], Evolution], sink: Callable[[Event], None], *,
             generations: int, until: float | None = None, scheduler: str | None = None,
             options: dict | None = None, pause: threading.Event | None = None,
             cancelled: Callable[[], bool] = lambda: False) -> RunResult:
    """Run ``build(evaluator, reporters)`` for ``generations`` (or ``until``) with a
    :class:`LiveReporter` telling ``sink``; the evaluator is ``make_evaluator(scheduler,
    **options)``, closed at the end. ``pause`` and ``cancelled``: see :class:`LiveReporter`."""
    reporter = LiveReporter(sink, pause, generations)
    with make_evaluator(scheduler, **(options or {})) as evaluator:
        run = build(evaluator, [reporter])
        reporter.attach(run)
        return run.run(generations, until=until, cancel=reporter.cancel_check(cancelled),
                       progress=reporter.progress)


def member_rows(members: Sequence, fitness: Sequence[float], species: dict[int, int],
                scores: Sequence = ()) -> list[MemberRow]:
    """The population table's rows, fittest first (ties: the earlier member), at most
    :data:`MAX_TABLE_ROWS`."""
    order = sorted(range(len(fitness)), key=lambda i: (-fitness[i], i))[:MAX_TABLE_ROWS]
    rows = []
    for rank, i in enumerate(order, 1):
        m = members[i]
        if isinstance(m, VolumetricNetwork):
            types, size = _counted(la.type_name for _, la in m.layers()), m.parameter_count()
            kl, recipe, heldout = None, None, None
        else:  # a recipe: one dtype per layer
            score = scores[i] if i < len(scores) else None
            types, recipe = _counted(KEPT if gene == KEEP_GENE else gene for gene in m), tuple(m)
            size, kl = (score.bytes, score.kl_mean) if score is not None else (0, None)
            heldout = getattr(score, "heldout_kl", None)
        rows.append(MemberRow(rank, i, species.get(i), float(fitness[i]), types, size, kl, recipe, heldout))
    return rows


def _counted(names) -> str:
    return " ".join(f"{name}×{n}" for name, n in Counter(names).items())


# ----- events as JSON-ready dicts (the run process's lines) ---------------------------------------
def event_to_dict(event: Event) -> dict:
    """``event`` as plain JSON values; networks travel as ``.loom`` bytes in hex with their
    precision (which the bytes do not carry). Floats keep every bit through ``json``."""
    if isinstance(event, GenerationStats):
        return {"event": "generation", **event.to_dict()}
    if isinstance(event, Snapshot):
        return {"event": "snapshot", "generation": event.generation,
                "rows": [dataclasses.astuple(r) for r in event.rows]}
    if isinstance(event, Progress):
        return {"event": "progress", "stage": event.stage, "done": event.done, "total": event.total}
    if isinstance(event, References):
        return {"event": "references", "points": [list(p) for p in event.points]}
    if isinstance(event, BestMember):
        return {"event": "best", "member": _network_to_dict(event.member), "fitness": event.fitness}
    if isinstance(event, RunStarted):
        return {"event": "started", "run_id": event.run_id, "task": event.task,
                "history": [s.to_dict() for s in event.history],
                "best": None if event.best is None else _network_to_dict(event.best),
                "best_fitness": event.best_fitness, "layer_names": list(event.layer_names)}
    raise TypeError(f"not a live event: {type(event).__name__}")


def event_from_dict(d: dict) -> Event:
    """The event :func:`event_to_dict` wrote (``KeyError``/``ValueError``/``LoomFormatError`` on
    anything else)."""
    kind = d["event"]
    if kind == "generation":
        return GenerationStats.from_dict(d)
    if kind == "snapshot":
        return Snapshot(d["generation"], [_row(r) for r in d["rows"]])
    if kind == "progress":
        return Progress(d["stage"], int(d["done"]), int(d["total"]))
    if kind == "references":
        return References([(str(name), int(size), float(kl)) for name, size, kl in d["points"]])
    if kind == "best":
        return BestMember(_network_from_dict(d["member"]), d["fitness"])
    if kind == "started":
        best = None if d["best"] is None else _network_from_dict(d["best"])
        return RunStarted(d["run_id"], d["task"], [GenerationStats.from_dict(s) for s in d["history"]], best,
                          d["best_fitness"], tuple(d["layer_names"]))
    raise ValueError(f"unknown live event {kind!r}")


def _row(values: list) -> MemberRow:
    row = MemberRow(*values)
    return row if row.recipe is None else dataclasses.replace(row, recipe=tuple(row.recipe))


def _network_to_dict(net: Any) -> dict:
    if not isinstance(net, VolumetricNetwork):
        raise TypeError(f"only networks cross processes as live events, got {type(net).__name__}")
    return {"loom": checkpoint_bytes(net).hex(), "precision": net.precision}


def _network_from_dict(d: dict) -> VolumetricNetwork:
    net = checkpoint_from_bytes(bytes.fromhex(d["loom"]), origin="a live event's network")
    net.precision = d["precision"]
    return net
