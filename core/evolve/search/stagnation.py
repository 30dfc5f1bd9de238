"""Stagnation: which species of a speciated run have stopped improving and die out.

neat-python's ``DefaultStagnation`` as a component of a run: a species whose best fitness has
not risen for ``max_stagnation`` generations is removed, except the ``species_elitism`` species
with the best fitness ever (so a run never loses every species). A species' record (its best
fitness and the generation it last improved) lives on the :class:`~.species.Species` itself,
so a checkpoint of the species is a checkpoint of stagnation too.

Reproduction asks stagnation once a generation (:meth:`Stagnation.update`), before it shares
out offspring; :class:`~.reproduction.SpeciesReproduction` takes one at construction, as
neat-python's reproduction does.
"""

from __future__ import annotations

from ...errors import LoomConfigError
from .species import Species


class Stagnation:
    """Removes species that have not improved for ``max_stagnation`` generations, keeping the
    ``species_elitism`` best (by their best fitness ever)."""

    kind = "default"  # what a checkpoint records to rebuild it (see :meth:`to_dict`)

    def __init__(self, max_stagnation: int = 15, species_elitism: int = 2):
        for name, value, low in (("max_stagnation", max_stagnation, 1),
                                 ("species_elitism", species_elitism, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise LoomConfigError(f"stagnation {name} must be an integer >= {low}, got {value!r}")
        self.max_stagnation, self.species_elitism = max_stagnation, species_elitism

    def update(self, species: list[Species], fitness: list[float], generation: int) -> list[Species]:
        """Record each species' best fitness this generation (``fitness`` is per member, indexed
        as ``Species.members``); return the species that live on, in their order."""
        for sp in species:
            best = max(fitness[i] for i in sp.members)
            if best > sp.best_fitness:
                sp.best_fitness, sp.last_improved = best, generation
        by_fitness = sorted(species, key=lambda sp: -sp.best_fitness)
        protected = {sp.id for sp in by_fitness[:self.species_elitism]}
        return [sp for sp in species
                if sp.id in protected or generation - sp.last_improved < self.max_stagnation]

    def to_dict(self) -> dict:
        """Its kind and settings: what :func:`.reproduction.stagnation_from_dict` rebuilds."""
        return {"kind": self.kind, "max_stagnation": self.max_stagnation,
                "species_elitism": self.species_elitism}
