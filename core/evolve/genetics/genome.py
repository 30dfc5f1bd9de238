"""What the members of an evolution run are, and how they are made, bred and stored.

A :class:`Genome` is neat-python's "genome type" as a component of a run: the first population,
the child of two parents, and the bytes a checkpoint keeps. The rest of a run (reproduction,
speciation, evaluation, checkpoints) asks the genome and never looks inside a member, so the
same loop evolves networks (:class:`NetworkGenome`, Loom's NEAT) or anything else with a
genome (a language model's quantization recipe, :mod:`.llm.recipe_task`).

Randomness: every draw comes from the run's Go generator, passed in; a genome draws nothing of
its own. :class:`NetworkGenome` draws exactly what Loom's ``NEATPopulation`` draws (one ``Int63``
per mutation, as the mutation's own seed), so a run without speciation stays Loom-exact.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from ...io.checkpoint import checkpoint_bytes, checkpoint_from_bytes
from ...network import VolumetricNetwork
from .gorand import GoRand
from .neat import NEATConfig, neat_mutate
from .splicing import SpliceConfig, splice


class Genome(ABC):
    """How a run makes, breeds and stores members (see the module docstring)."""

    #: what evaluators receive as members: "network" (a VolumetricNetwork, which any evaluator
    #: can ship as bytes) or another kind, which only in-process evaluation takes
    member_kind: str = "network"

    @abstractmethod
    def initial(self, size: int, rng: GoRand) -> list[Any]:
        """The first population, ``size`` members."""

    @abstractmethod
    def offspring(self, a: Any, b: Any, fitness_a: float, fitness_b: float, rng: GoRand) -> Any:
        """A child of ``a`` and ``b`` (crossover weighted by their fitness, then mutation)."""

    @abstractmethod
    def encode(self, member: Any) -> bytes:
        """The bytes a checkpoint stores for ``member``."""

    @abstractmethod
    def decode(self, data: bytes) -> Any:
        """The member :meth:`encode` stored as ``data``."""


class NetworkGenome(Genome):
    """Networks evolved as Loom does: mutants of ``seed`` by NEAT mutation (``config``), children
    blended from two parents by fitness (Loom's splice, ``blend`` mode) and then mutated.

    ``precision`` is set on decoded members: Loom JSON and ``.loom`` bytes do not carry it.
    """

    def __init__(self, seed: VolumetricNetwork | None, config: NEATConfig, precision: str = "loom"):
        self.seed, self.config, self.precision = seed, config, precision

    def initial(self, size: int, rng: GoRand) -> list[VolumetricNetwork]:
        if self.seed is None:
            raise ValueError("a NetworkGenome restored from a checkpoint has no seed network to start from")
        return [self.mutate(self.seed, rng) for _ in range(size)]

    def mutate(self, net: VolumetricNetwork, rng: GoRand) -> VolumetricNetwork:
        """Loom's NEAT mutation of ``net``, seeded by one draw of ``rng``."""
        return neat_mutate(net, self.config.with_seed(rng.int63()))

    def offspring(self, a, b, fitness_a, fitness_b, rng):
        child = splice(a, b, SpliceConfig(fitness_a=fitness_a, fitness_b=fitness_b)).child
        return self.mutate(child, rng)

    def encode(self, member: VolumetricNetwork) -> bytes:
        return checkpoint_bytes(member)

    def decode(self, data: bytes) -> VolumetricNetwork:
        net = checkpoint_from_bytes(data)
        net.precision = self.precision
        return net
