"""Loom's NEAT population (``NEATPopulation``, spec §7.6): elitist truncation selection, children
spliced from two elites by fitness and then mutated, every draw from one Go generator
(:class:`~.reproduction.LoomReproduction` breeds).

This is the Loom-exact evolution loop: given the same seed network, config and fitnesses, the
members equal Loom's. Speciation, stagnation and checkpoints are the job of :mod:`.run`.
"""

from __future__ import annotations

import math
import reprlib
from collections.abc import Sequence

from ...errors import LoomConfigError
from ...network import VolumetricNetwork
from ..genetics.genome import Genome, NetworkGenome
from ..genetics.gorand import GoRand
from ..genetics.neat import NEATConfig
from .reproduction import LoomReproduction, elite_count


def check_population_size(size) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise LoomConfigError(f"a population needs a size >= 1, got {reprlib.repr(size)}")


class NEATPopulation:
    """``size`` mutants of ``seed_net``, evolved one generation per :meth:`evolve`.

    Attributes:
        members: the current networks (after :meth:`evolve`, the elites first, best first).
        fitness: the fitnesses last given to :meth:`evolve`, sorted best first (zeros before).
    """

    def __init__(self, seed_net: VolumetricNetwork | None, size: int, config: NEATConfig, *,
                 genome: Genome | None = None):
        check_population_size(size)
        if not isinstance(config, NEATConfig):
            raise LoomConfigError(f"a population needs a NEATConfig, got {type(config).__name__}")
        self.config = config
        self.size = size
        # Loom's population is of networks; another genome (its members, its offspring) takes
        # the same selection and the same draws
        self.genome = genome if genome is not None else NetworkGenome(seed_net, config)
        self.rng = GoRand(config.seed)
        self.members = self.genome.initial(size, self.rng)
        self.fitness = [0.0] * size

    @classmethod
    def restore(cls, members: list, config: NEATConfig, rng: GoRand, fitness: list[float], *,
                genome: Genome | None = None) -> NEATPopulation:
        """A population in a saved state (its members, generator and last fitnesses)."""
        out = cls.__new__(cls)
        out.config, out.size, out.rng = config, len(members), rng
        out.genome = genome if genome is not None else NetworkGenome(None, config)
        out.members, out.fitness = list(members), list(fitness)
        return out

    @property
    def elite_count(self) -> int:
        return elite_count(self.size)

    def evolve(self, fitnesses: Sequence[float]) -> None:
        """Rank the members by ``fitnesses`` (one per member, in order; higher is better) and
        replace all but the best quarter by mutated children of two of them."""
        fit = self._checked(fitnesses)
        self.members = LoomReproduction().reproduce(self.members, fit, 0, self.rng, self.genome)
        self.fitness = sorted(fit, reverse=True)

    def best(self):
        """The best member of the last evaluation (the first elite)."""
        return self.members[0]

    @property
    def best_fitness(self) -> float:
        return self.fitness[0]

    def summary(self, generation: int) -> str:
        """Loom's one-line report of the last evaluation."""
        f = self.fitness
        return (f"Gen {generation} | best={f[0]:.4f}  avg={sum(f) / len(f):.4f}  "
                f"worst={f[-1]:.4f}  pop={self.size}")

    def _checked(self, fitnesses: Sequence[float]) -> list[float]:
        fit = list(fitnesses)
        if len(fit) != self.size:
            raise LoomConfigError(f"evolve needs {self.size} fitnesses (one per member), got {len(fit)}")
        for i, f in enumerate(fit):
            if isinstance(f, bool) or not isinstance(f, (int, float)) or not math.isfinite(f):
                raise LoomConfigError(f"fitness {i} must be a finite number, got {f!r}")
        return [float(f) for f in fit]
