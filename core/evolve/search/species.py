"""A species of a speciated run, and what reproduction reads of a run's species.

The three components of a speciated run share this: :class:`~.speciation.Speciation` groups
members into species, :class:`~.stagnation.Stagnation` keeps each species' record (its best
fitness and the generation it last improved) and removes the stale ones, and
:class:`~.reproduction.SpeciesReproduction` breeds within the species that live on. It sits
below all three, so none of them imports another to know what a species is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

from ...io.checkpoint import checkpoint_bytes, checkpoint_from_bytes
from ...network import VolumetricNetwork


@dataclass
class Species:
    id: int
    representative: VolumetricNetwork
    members: list[int]  # indices into the current members
    created: int
    last_improved: int
    best_fitness: float = -math.inf

    def to_state(self) -> dict:
        return {"id": self.id, "representative": checkpoint_bytes(self.representative).hex(),
                "members": self.members, "created": self.created, "last_improved": self.last_improved,
                "best_fitness": None if math.isinf(self.best_fitness) else self.best_fitness}

    @classmethod
    def from_state(cls, d: dict) -> Species:
        best = d["best_fitness"]
        return cls(d["id"], checkpoint_from_bytes(bytes.fromhex(d["representative"])), list(d["members"]),
                   d["created"], d["last_improved"], -math.inf if best is None else best)


class SpeciesSet(Protocol):
    """A run's species as reproduction sees them (:class:`~.speciation.Speciation` is one): this
    generation's groups, which reproduction replaces with those that stagnation keeps."""

    species: list[Species]
