"""An evolution run people can trust and repeat: a task and injected components, as neat-python
composes them: the genome (what members are, how they are bred and stored, :mod:`.genetics.genome`; by
default networks grown from the task's seed network by NEAT mutation), the evaluator, speciation,
reproduction, stagnation, reporters and a checkpoint store.

The default run is Loom's own population (:class:`.reproduction.LoomReproduction`, as
:class:`.population.NEATPopulation` breeds): the same seed gives Loom's members. With
``speciation``, members are grouped into species (:mod:`.speciation`) and, unless another
reproduction is given, bred within them with fitness sharing, stagnant species dying out
(:class:`.reproduction.SpeciesReproduction`, :class:`.stagnation.Stagnation`). Either way every
random number comes from one Go generator seeded by the NEAT config, and the evaluator only
returns floats in member order, so the history does not depend on how or where members are
evaluated.

With a ``store`` (a workspace), a checkpoint is written after every generation: the members to
evaluate next (``.loom`` bytes), the generator's state, species and statistics. :meth:`Evolution.
resume` continues a stored run exactly as if it had never stopped.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ...cancel import as_cancel_check
from ...errors import LoomCancelled, LoomConfigError
from ...network import VolumetricNetwork
from ...units import format_bytes
from ...workspace.evolution_runs import EvolutionRuns
from ...workspace.store import Workspace
from ..genetics.budget import check_fits, run_budget, shown_count
from ..genetics.genome import Genome, NetworkGenome
from ..genetics.gorand import GoRand
from ..genetics.neat import NEATConfig
from .evaluators import Evaluator, InProcessEvaluator
from .population import NEATPopulation, check_population_size
from .reporters import GenerationStats, Reporter
from .reproduction import LoomReproduction, Reproduction, SpeciesReproduction, reproduction_from_dict
from .speciation import Speciation, SpeciationConfig
from .stagnation import Stagnation
from .tasks import NetworkTask, Task, get_task


@dataclass(frozen=True)
class RunResult:
    run_id: int | None
    generation: int  # generations evaluated so far
    best_fitness: float
    solved: bool
    status: str  # "finished", "solved" or "stopped"


class Evolution:
    """Evolve networks for ``task``.

    Args:
        task: what fitness means (:func:`.tasks.get_task`).
        genome: the starting network (default: the task's seed network).
        config: NEAT mutation; its seed seeds the whole run (default, with a random seed: the
            task's :meth:`~.tasks.NetworkTask.neat_config` for its seed network, Loom's default
            for the width of a genome given here).
        population: members per generation.
        evaluator: computes fitness (default: in-process; see :mod:`.evaluators`).
        speciation: None for no species, or the settings of speciation (and of the default
            species reproduction and stagnation).
        reproduction: how a generation breeds the next (default: Loom's without speciation,
            :class:`~.reproduction.SpeciesReproduction` from the speciation settings with it).
        stagnation: the default species reproduction's :class:`~.stagnation.Stagnation`, instead
            of one from the speciation settings (a reproduction given here brings its own).
        reporters: hook receivers (:mod:`.reporters`).
        store: a workspace to checkpoint into after every generation.
    """

    def __init__(self, task: Task, genome: VolumetricNetwork | Genome | None = None,
                 config: NEATConfig | None = None, *, population: int = 150,
                 evaluator: Evaluator | None = None, speciation: SpeciationConfig | None = None,
                 reproduction: Reproduction | None = None, stagnation: Stagnation | None = None,
                 reporters: Sequence[Reporter] = (), store: Workspace | None = None):
        if not isinstance(task, Task):
            raise LoomConfigError(f"an evolution needs a task, got {type(task).__name__}")
        config = config or _default_config(task, genome)
        if genome is None:
            check_run_fits(task, config, population)
            genome = task_genome(task, config, task.seed_network() if isinstance(task, NetworkTask) else None)
        elif not isinstance(genome, Genome):
            genome = task_genome(task, config, genome)
        self._setup(task, config, population, evaluator, speciation, reporters, genome)
        self.reproduction = _reproduction(reproduction, stagnation, speciation)
        self.population = NEATPopulation(None, population, config, genome=genome)
        self.runs = EvolutionRuns(store) if store is not None else None
        self.run_id = self.runs.create(task.name, self.describe()) if self.runs else None
        self._checkpoint("running")

    def _setup(self, task, config, population, evaluator, speciation, reporters, genome) -> None:
        self.task, self.config, self.size, self.genome = task, config, population, genome
        self.evaluator = evaluator or InProcessEvaluator()
        if genome.member_kind != "network":
            if speciation is not None:
                raise LoomConfigError(f"task {task.name!r} evolves {genome.member_kind}s: speciation groups "
                                      "networks by their DNA and does not apply")
            if not isinstance(self.evaluator, InProcessEvaluator):
                raise LoomConfigError(f"task {task.name!r} evolves {genome.member_kind}s, which are "
                                      "evaluated in this process only (a cluster's work items are networks)")
        self.speciation = Speciation(speciation) if speciation is not None else None
        self.reporters = list(reporters)
        self.generation = 0
        self.history: list[GenerationStats] = []
        self.best: VolumetricNetwork | None = None
        self.best_fitness = -math.inf

    # ----- the run -------------------------------------------------------------------------------
    @property
    def members(self) -> list[VolumetricNetwork]:
        return self.population.members

    def describe(self) -> dict:
        """What rebuilds this run (stored with it): task, NEAT config, size, speciation,
        reproduction."""
        return {"task": {"name": self.task.name, "params": self.task.params},
                "neat": self.config.to_loom(), "population": self.size,
                "speciation": self.speciation.config.to_dict() if self.speciation else None,
                "reproduction": self.reproduction.to_dict()}

    def run(self, generations: int, until: float | None = None,
            cancel: Callable[[], bool] | None = None,
            progress: Callable[[int, int], None] | None = None) -> RunResult:
        """Evaluate and reproduce ``generations`` times, or until a member reaches ``until`` (or
        the task's threshold). ``cancel`` stops at the next chance, keeping the last checkpoint;
        ``progress(done, total)`` reports members evaluated in the current generation."""
        if isinstance(generations, bool) or not isinstance(generations, int) or generations < 0:
            raise LoomConfigError(f"generations must be an integer >= 0, got {generations!r}")
        stop = as_cancel_check(cancel)
        for _ in range(generations):
            if stop():
                return self._stopped()
            try:
                solved = self._generation(until, stop, progress)
            except LoomCancelled:
                return self._stopped()
            if solved:
                return RunResult(self.run_id, self.generation, self.best_fitness, True, "solved")
        if self.runs:
            self.runs.set_status(self.run_id, "finished")
        return RunResult(self.run_id, self.generation, self.best_fitness, False, "finished")

    def _generation(self, until, stop, progress) -> bool:
        g = self.generation + 1
        for r in self.reporters:
            r.start_generation(g)
        members = self.members
        fitness = self.evaluator.evaluate(self.task, members, progress=progress, cancel=stop)
        for r in self.reporters:
            r.post_evaluate(g, fitness)
        sizes = {}
        if self.speciation:
            self.speciation.speciate(members, g)
            sizes = self.speciation.sizes()
            for r in self.reporters:
                r.species_changed(g, sizes)
        stats = GenerationStats.of(g, fitness, sizes)
        top = max(range(len(fitness)), key=lambda i: (fitness[i], -i))
        if fitness[top] > self.best_fitness:
            self.best, self.best_fitness = members[top], fitness[top]
        solved = self.task.solved(fitness[top]) or (until is not None and fitness[top] >= until)
        self.population.members = self.reproduction.reproduce(members, fitness, g, self.population.rng,
                                                              self.genome, self.speciation)
        self.population.fitness = sorted(fitness, reverse=True)
        self.generation = g
        self.history.append(stats)
        self._checkpoint("solved" if solved else "running")
        for r in self.reporters:
            r.end_generation(stats, self.size)
        if solved:
            for r in self.reporters:
                r.found_solution(g, fitness[top])
        return solved

    def _stopped(self) -> RunResult:
        if self.runs:
            self.runs.set_status(self.run_id, "stopped")
        return RunResult(self.run_id, self.generation, self.best_fitness, False, "stopped")

    # ----- checkpoints -----------------------------------------------------------------------------
    def _checkpoint(self, status: str) -> None:
        if not self.runs:
            return
        state = {"generation": self.generation, "rng": self.population.rng.state().hex(),
                 "fitness": self.population.fitness, "history": [s.to_dict() for s in self.history],
                 "best_fitness": None if self.best is None else self.best_fitness,
                 "best": None if self.best is None else self.genome.encode(self.best).hex(),
                 "speciation": self.speciation.to_state() if self.speciation else None}
        self.runs.save_checkpoint(self.run_id, self.generation, state,
                                  [self.genome.encode(m) for m in self.members], status)
        for r in self.reporters:
            r.checkpointed(self.run_id, self.generation)

    @classmethod
    def resume(cls, store: Workspace, run_id: int, *, evaluator: Evaluator | None = None,
               reproduction: Reproduction | None = None, reporters: Sequence[Reporter] = ()) -> Evolution:
        """The stored run ``run_id`` as it was at its last checkpoint; :meth:`run` continues it.
        A run that bred with a custom reproduction needs it again (``reproduction``); a built-in
        one is rebuilt from the run's record."""
        runs = EvolutionRuns(store)
        record = runs.get(run_id)
        cfg = record.config
        task = get_task(cfg["task"]["name"], **cfg["task"]["params"])
        config = NEATConfig.from_loom(cfg["neat"])
        speciation = SpeciationConfig(**cfg["speciation"]) if cfg["speciation"] is not None else None
        genome = task_genome(task, config, None)  # members come from the checkpoint, not a seed
        self = cls.__new__(cls)
        self._setup(task, config, cfg["population"], evaluator, speciation, reporters, genome)
        self.reproduction = _reproduction(reproduction, None, speciation) if reproduction is not None \
            else reproduction_from_dict(cfg.get("reproduction"), speciation)
        self.runs, self.run_id = runs, run_id
        point = runs.latest_checkpoint(run_id)
        state = point.state
        self.population = NEATPopulation.restore([genome.decode(m) for m in point.members], config,
                                                 GoRand.from_state(bytes.fromhex(state["rng"])),
                                                 state["fitness"], genome=genome)
        self.generation = state["generation"]
        self.history = [GenerationStats.from_dict(d) for d in state["history"]]
        if state["best"] is not None:
            self.best = genome.decode(bytes.fromhex(state["best"]))
            self.best_fitness = state["best_fitness"]
        if self.speciation:
            self.speciation.restore(state["speciation"])
            for sp in self.speciation.species:
                sp.representative.precision = genome.precision
        runs.set_status(run_id, "running")
        return self


def _default_config(task: Task, genome: VolumetricNetwork | Genome | None) -> NEATConfig:
    """A run's NEAT config when none is given: the task's own for its seed network, Loom's default
    for the width of another network, Loom's for width 1 where it only seeds the run's generator."""
    if isinstance(genome, VolumetricNetwork):
        return NEATConfig.default(genome_width(genome))
    if genome is None and isinstance(task, NetworkTask):
        return task.neat_config()
    return NEATConfig.default(1)


def check_run_fits(task: Task, config: NEATConfig, population: int) -> None:
    """Refuse, before anything is built, a run of ``population`` members of ``task`` that would
    need more memory than a run may use here (:mod:`.genetics.budget`)."""
    check_population_size(population)
    member = task.member_bytes(config)
    most = run_budget() // member
    check_fits(population * member, f"population {shown_count(population)} (at most {most:,} here) of "
                                    f"task {task.name!r} members of about {format_bytes(member)} each")


def _reproduction(reproduction: Reproduction | None, stagnation: Stagnation | None,
                  speciation: SpeciationConfig | None) -> Reproduction:
    """The run's reproduction: the one given, or the default for the run's speciation."""
    if reproduction is not None and not isinstance(reproduction, Reproduction):
        raise LoomConfigError(f"reproduction must be a Reproduction, got {type(reproduction).__name__}")
    if stagnation is not None and not isinstance(stagnation, Stagnation):
        raise LoomConfigError(f"stagnation must be a Stagnation, got {type(stagnation).__name__}")
    if reproduction is None:
        if speciation is not None:
            return SpeciesReproduction.from_config(speciation, stagnation)
        if stagnation is not None:
            raise LoomConfigError("stagnation removes species that stopped improving: "
                                  "the run needs speciation")
        return LoomReproduction()
    if stagnation is not None:
        raise LoomConfigError("a reproduction given to the run brings its own stagnation "
                              "(SpeciesReproduction(stagnation=...))")
    if reproduction.needs_species and speciation is None:
        raise LoomConfigError(f"{type(reproduction).__name__} breeds within species: "
                              "the run needs speciation")
    return reproduction


def task_genome(task: Task, config: NEATConfig, seed: VolumetricNetwork | None) -> Genome:
    """The genome a task's members have: networks grown from ``seed`` by NEAT at the task's
    precision (files do not carry a precision; the task's is what members ran at), or, for a task
    whose members are not networks, the task's own (``task.genome(config)``)."""
    if isinstance(task, NetworkTask):
        return NetworkGenome(seed, config, task.params["precision"])
    return task.genome(config)


def genome_width(genome: VolumetricNetwork) -> int:
    """The width NEAT re-initialises layers at: the widest layer output of the genome."""
    return max((layer.cfg.output_height for _, layer in genome.layers()), default=1) or 1
