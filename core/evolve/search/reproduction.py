"""Reproduction: how one generation's members and fitnesses become the next generation.

neat-python's reproduction component. Two are built in:

* :class:`LoomReproduction`, Loom's ``NEATPopulation.Evolve`` (spec §7.6): the best quarter go on
  unchanged (best first), every other place is a child of two distinct elites, bred by the
  genome. No species; the same seed gives Loom's members.
* :class:`SpeciesReproduction`, neat-python's ``DefaultReproduction``: stagnant species die out
  (a :class:`~.stagnation.Stagnation` decides), each remaining species gets offspring in
  proportion to its mean fitness (fitness sharing), keeps its ``elitism`` best, and breeds the
  rest from its top ``survival_threshold``.

Every random number comes from the run's Go generator and every child from the run's genome,
so a reproduction holds no randomness and no members of its own: its state is its settings.
A custom reproduction subclasses :class:`Reproduction`; a run stores :meth:`Reproduction.to_dict`
with its checkpoints, and resuming a run of a custom kind takes the object again.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, Protocol

import numpy as np

from ...errors import LoomConfigError
from ..genetics.genome import Genome, NetworkGenome
from ..genetics.gorand import GoRand
from .species import SpeciesSet
from .stagnation import Stagnation


class ReproductionSettings(Protocol):
    """What :meth:`SpeciesReproduction.from_config` reads: its own settings and its default
    stagnation's (a run's :class:`~.speciation.SpeciationConfig` holds them, with speciation's)."""

    elitism: int
    survival_threshold: float
    min_species_size: int
    max_stagnation: int
    species_elitism: int


class Reproduction(ABC):
    """Breeds the next generation (see the module's docstring)."""

    kind: str = ""  # the name a checkpoint records; "" for a kind only its author can rebuild
    needs_species: bool = False  # whether it breeds within the run's species

    @abstractmethod
    def reproduce(self, members: list[Any], fitness: list[float], generation: int, rng: GoRand,
                  genome: Genome, species: SpeciesSet | None) -> list[Any]:
        """The next generation, ``len(members)`` members. ``fitness`` has one finite value per
        member (higher is better); ``species`` is the run's speciation, grouped for this
        generation (None in a run without speciation)."""

    def to_dict(self) -> dict:
        """Its kind and settings (stored with a run, so that a resumed run breeds alike)."""
        return {"kind": self.kind}


class LoomReproduction(Reproduction):
    """Loom's elitist truncation selection (see the module's docstring)."""

    kind = "loom"

    def reproduce(self, members, fitness, generation, rng, genome, species=None):
        size = len(members)
        # a stable sort, best first: ties keep their order, as Loom's bubble sort does
        order = sorted(range(size), key=lambda i: -fitness[i])
        ranked = [members[i] for i in order]
        fit = [fitness[i] for i in order]
        elite = elite_count(size)
        children = ranked[:elite]
        for _ in range(elite, size):
            a = rng.intn(elite)
            b = rng.intn(elite)
            while elite > 1 and b == a:
                b = rng.intn(elite)
            children.append(genome.offspring(ranked[a], ranked[b], fit[a], fit[b], rng))
        return children


def elite_count(size: int) -> int:
    """How many of a Loom population go on unchanged: a quarter, at least one."""
    return max(1, size // 4)


class SpeciesReproduction(Reproduction):
    """Speciated reproduction with fitness sharing (see the module's docstring).

    Args:
        elitism: members of each species kept unchanged (the overall best always is).
        survival_threshold: the fraction of each species (at least two) that parents come from.
        min_species_size: offspring each living species gets at least (as far as the population
            allows).
        stagnation: decides which species live on (default :class:`~.stagnation.Stagnation`).
    """

    kind = "species"
    needs_species = True

    def __init__(self, elitism: int = 1, survival_threshold: float = 0.2, min_species_size: int = 2,
                 stagnation: Stagnation | None = None):
        for name, value, low in (("elitism", elitism, 0), ("min_species_size", min_species_size, 1)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise LoomConfigError(f"reproduction {name} must be an integer >= {low}, got {value!r}")
        if (isinstance(survival_threshold, bool) or not isinstance(survival_threshold, (int, float))
                or not 0 < survival_threshold <= 1):
            raise LoomConfigError("reproduction survival_threshold must lie in (0, 1], "
                                  f"got {survival_threshold!r}")
        if stagnation is not None and not isinstance(stagnation, Stagnation):
            raise LoomConfigError(f"stagnation must be a Stagnation, got {type(stagnation).__name__}")
        self.elitism, self.survival_threshold = elitism, float(survival_threshold)
        self.min_species_size = min_species_size
        self.stagnation = stagnation if stagnation is not None else Stagnation()

    @classmethod
    def from_config(cls, config: ReproductionSettings,
                    stagnation: Stagnation | None = None) -> SpeciesReproduction:
        """The reproduction ``config`` (such as a :class:`~.speciation.SpeciationConfig`)
        describes: its elitism, survival threshold and minimum species size; stagnation from its
        max_stagnation and species_elitism unless given."""
        if stagnation is None:
            stagnation = Stagnation(config.max_stagnation, config.species_elitism)
        return cls(config.elitism, config.survival_threshold, config.min_species_size, stagnation)

    def reproduce(self, members, fitness, generation, rng, genome, species):
        if species is None:
            raise LoomConfigError("species reproduction needs a run with speciation")
        size = len(members)
        alive = species.species = self.stagnation.update(species.species, fitness, generation)
        lo, hi = min(fitness), max(fitness)
        span = max(1.0, hi - lo)
        # fitness sharing: a species' share is its members' mean fitness, shifted to be >= 0
        shares = [float(np.mean([fitness[i] for i in sp.members])) - lo for sp in alive]
        spawn = spawn_amounts([s / span for s in shares], size, self.min_species_size)
        best = max(range(size), key=lambda i: (fitness[i], -i))
        children = [members[best]]
        for sp, n in zip(alive, spawn, strict=True):
            ranked = sorted(sp.members, key=lambda i: (-fitness[i], i))
            keep = [members[i] for i in ranked[:self.elitism] if i != best][: max(0, n - 1)]
            children += keep
            parents = ranked[: max(2, math.ceil(self.survival_threshold * len(ranked)))]
            for _ in range(n - len(keep) - (best in sp.members)):
                a = parents[rng.intn(len(parents))]
                b = parents[rng.intn(len(parents))]
                children.append(_child(genome, members, fitness, a, b, lo, rng))
        return children[:size]

    def to_dict(self) -> dict:
        return {"kind": self.kind, "elitism": self.elitism, "survival_threshold": self.survival_threshold,
                "min_species_size": self.min_species_size, "stagnation": self.stagnation.to_dict()}


def _child(genome: Genome, members: list, fitness: list[float], a: int, b: int, lo: float, rng: GoRand):
    """A child of members ``a`` and ``b``, fitnesses shifted to be >= 0 for the blend. A network
    bred with itself is its mutant: splicing a network with itself gives the same network."""
    if a == b and isinstance(genome, NetworkGenome):
        return genome.mutate(members[a], rng)
    return genome.offspring(members[a], members[b], max(fitness[a] - lo, 0.0), max(fitness[b] - lo, 0.0), rng)


def spawn_amounts(shares: list[float], total: int, min_size: int) -> list[int]:
    """Split ``total`` members over species in proportion to ``shares``, each at least
    ``min_size`` (as far as ``total`` allows), by largest remainder; ties go to the older species."""
    n = len(shares)
    floor_each = min(min_size, total // max(n, 1))
    rest = total - floor_each * n
    weights = np.asarray(shares, dtype=np.float64)
    weights = weights / weights.sum() if weights.sum() > 0 else np.full(n, 1.0 / n)
    exact = weights * rest
    amounts = np.floor(exact).astype(int)
    order = sorted(range(n), key=lambda i: (-(exact[i] - amounts[i]), i))
    for i in order[: rest - int(amounts.sum())]:
        amounts[i] += 1
    return [int(a) + floor_each for a in amounts]


def reproduction_from_dict(d: dict | None, speciation: ReproductionSettings | None) -> Reproduction:
    """The built-in reproduction a checkpoint recorded (``d`` from :meth:`Reproduction.to_dict`).
    A run stored before reproduction was recorded (``d`` None) bred Loom's way without
    speciation, and by species as its ``speciation`` config says with it. Raises
    LoomConfigError for a kind that is not built in."""
    if d is None:
        return LoomReproduction() if speciation is None else SpeciesReproduction.from_config(speciation)
    kind = d.get("kind")
    if kind == LoomReproduction.kind:
        return LoomReproduction()
    if kind == SpeciesReproduction.kind:
        return SpeciesReproduction(d["elitism"], d["survival_threshold"], d["min_species_size"],
                                   stagnation_from_dict(d["stagnation"]))
    raise LoomConfigError(f"the run bred with a custom reproduction ({kind or 'unnamed'}): pass it to "
                          "resume(..., reproduction=...)")


def stagnation_from_dict(d: dict) -> Stagnation:
    """The built-in stagnation a checkpoint recorded (``d`` from :meth:`Stagnation.to_dict`)."""
    if d.get("kind") == Stagnation.kind:
        return Stagnation(d["max_stagnation"], d["species_elitism"])
    raise LoomConfigError(f"the run used a custom stagnation ({d.get('kind') or 'unnamed'}): pass its "
                          "reproduction to resume(..., reproduction=...)")
