"""Speciation for evolution runs, as neat-python does it, with a genome distance built on DNA.

Members are grouped into species by distance to each species' representative. What the species
are then used for is other components' work: :class:`~.reproduction.SpeciesReproduction` gives
each species offspring in proportion to its mean fitness (fitness sharing: a big species does not
crowd out a new one) and breeds within it, and :class:`~.stagnation.Stagnation` removes species
that stopped improving. :class:`SpeciationConfig` holds the settings of all three, as one
section of a run's configuration; each component checks its own, and the config asks them when
it is made (those two know nothing of speciation: what a species is lives in :mod:`.species`).

Genome distance of networks A and B (grid positions aligned, as DNA does)::

    structure_weight * differing / compared + weight_coefficient * mean((1 - cosine) / 2)

where ``differing`` counts positions held by one network only, or with another layer type or
weight count, plus remote links present in one only; ``cosine`` is the DNA overlap of the other
positions (dequantized weights, so a dtype change alone is a small distance).

The compatibility threshold adapts (a dynamic threshold, as MultiNEAT's ``DynamicCompatibility``):
after each grouping it is multiplied by ``1 + threshold_step`` when there are more than
``target_species`` species and divided by it when there are fewer, within [0.01, the largest
distance]. A fixed threshold has no good default, because the distance's scale depends on the
genome: structure moves in steps of ``1 / compared`` (a third or a half for a two-layer network,
where any structural difference then splits a species), while NEAT's weight perturbations
(Loom's: 0.05 per weight) move the weight term by a few thousandths a generation. At the old
fixed 0.15, XOR (2 layers, population 150) with its task's NEAT config (Dense only) stayed at
the 4 species of its 4 remote-link sets; with Loom's default NEAT config, whose type mutations
break about a fifth of the children (a re-initialised layer does not fit XOR's 2 inputs and 1
output), it ran to one species per member within 20 generations, each kept alive by
``min_species_size``, so hardly any offspring came from fit parents. (The adapted threshold
reins that in after about 40 generations, but with such broken members the count swings
between a few and 30 species: evolve XOR with the task's config.) ``target_species`` 10 of a
population of 150 leaves about 15 members a species for ``survival_threshold`` to pick parents
from; ``threshold_step`` 0.1 moves the threshold by a factor of ~2.6 in 10 generations, fast
against ``max_stagnation`` (15) and slow enough not to overshoot far. ``target_species = 0``
keeps ``compatibility_threshold`` fixed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ...errors import LoomConfigError
from ...network import VolumetricNetwork
from ..genetics.dna import DNA, LayerSignature, cosine_similarity, extract_dna
from ..genetics.values import check_number
from .reproduction import SpeciesReproduction
from .species import Species

THRESHOLD_FLOOR = 0.01  # the lowest the adapted compatibility threshold goes


@dataclass(frozen=True)
class SpeciationConfig:
    """Settings of speciation, species reproduction and stagnation (neat-python's names where
    it has them): ``max_stagnation`` and ``species_elitism`` configure the run's
    :class:`~.stagnation.Stagnation`, ``elitism``, ``survival_threshold`` and ``min_species_size``
    its :class:`~.reproduction.SpeciesReproduction`.

    ``compatibility_threshold`` is where the threshold starts (and stays, with
    ``target_species = 0``); see the module's docstring for how it adapts.
    """

    compatibility_threshold: float = 0.15
    structure_weight: float = 1.0
    weight_coefficient: float = 2.0
    target_species: int = 10
    threshold_step: float = 0.1
    max_stagnation: int = 15
    species_elitism: int = 2
    elitism: int = 1
    survival_threshold: float = 0.2
    min_species_size: int = 2

    def __post_init__(self):
        for name in ("compatibility_threshold", "structure_weight", "weight_coefficient", "threshold_step"):
            if check_number(f"speciation {name}", getattr(self, name)) < 0:
                raise LoomConfigError(f"speciation {name} must be a number >= 0, got {getattr(self, name)!r}")
        v = self.target_species
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise LoomConfigError(f"speciation target_species must be an integer >= 0, got {v!r}")
        if self.threshold_step >= 1:
            raise LoomConfigError(f"speciation threshold_step must lie in [0, 1), got {self.threshold_step}")
        SpeciesReproduction.from_config(self)  # reproduction and stagnation check their own settings

    def to_dict(self) -> dict:
        return asdict(self)


def genome_distance(a: VolumetricNetwork, b: VolumetricNetwork, config: SpeciationConfig,
                    dna_a: DNA | None = None, dna_b: DNA | None = None) -> float:
    """The distance of the module's docstring (0 for identical networks)."""
    return _distance(_Traits.of(a, dna_a), _Traits.of(b, dna_b), config)


@dataclass(frozen=True)
class _Traits:
    """What the distance reads of a network, taken once: its DNA by position, its remote links."""

    sigs: dict[str, LayerSignature]
    links: frozenset

    @classmethod
    def of(cls, net: VolumetricNetwork, dna: DNA | None = None) -> _Traits:
        dna = dna if dna is not None else extract_dna(net, dequantized=True)
        links = frozenset((coord, child.cfg.target) for coord, layer in net.layers()
                          for child in layer.children if child.cfg.is_remote_link)
        return cls({s.key: s for s in dna}, links)


def _distance(a: _Traits, b: _Traits, config: SpeciationConfig) -> float:
    differing, drift = 0, []
    keys = a.sigs.keys() | b.sigs.keys()
    for key in keys:
        sa, sb = a.sigs.get(key), b.sigs.get(key)
        if sa is None or sb is None or sa.layer_type != sb.layer_type or sa.weights.size != sb.weights.size:
            differing += 1
        else:
            drift.append((1.0 - cosine_similarity(sa, sb, across_dtypes=True)) / 2)
    differing += len(a.links ^ b.links)
    compared = len(keys) + len(a.links | b.links)
    structure = differing / compared if compared else 0.0
    weights = sum(drift) / len(drift) if drift else 0.0
    return config.structure_weight * structure + config.weight_coefficient * weights


class Speciation:
    """The species of a run: grouping members, the adaptive threshold (see the module's docstring)."""

    def __init__(self, config: SpeciationConfig | None = None):
        self.config = config or SpeciationConfig()
        self.species: list[Species] = []
        self.next_id = 1
        self.threshold = self.config.compatibility_threshold  # moves towards target_species
        self._genomes: dict[int, _Traits] = {}  # species id -> its representative's, this generation

    # ----- grouping ----------------------------------------------------------------------------
    def speciate(self, members: list[VolumetricNetwork], generation: int) -> None:
        """Put every member into the species of the first representative within the threshold
        (a new species when none is); representatives move to their closest new member; then
        the threshold takes one step towards ``target_species``."""
        cfg, threshold = self.config, self.threshold
        genomes = [_Traits.of(m) for m in members]
        reps: dict[int, _Traits] = {}  # species id -> its representative's genome
        unplaced = list(range(len(members)))
        for sp in self.species:  # each species keeps the member closest to its old representative
            sp.members = []
            if not unplaced:
                continue
            rep = self._genomes.get(sp.id) or _Traits.of(sp.representative)
            dist = [_distance(rep, genomes[i], cfg) for i in unplaced]
            j = int(np.argmin(dist))
            if dist[j] < threshold:
                i = unplaced.pop(j)
                sp.representative, sp.members, reps[sp.id] = members[i], [i], genomes[i]
        placed = [sp for sp in self.species if sp.members]
        for i in unplaced:
            for sp in placed:
                if _distance(reps[sp.id], genomes[i], cfg) < threshold:
                    sp.members.append(i)
                    break
            else:
                sp = Species(self.next_id, members[i], [i], generation, generation)
                self.species.append(sp)
                placed.append(sp)
                reps[sp.id] = genomes[i]
                self.next_id += 1
        self.species = [sp for sp in self.species if sp.members]
        self._genomes = reps
        self.threshold = self._next_threshold(len(self.species))

    def _next_threshold(self, count: int) -> float:
        cfg = self.config
        if not cfg.target_species or count == cfg.target_species:
            return self.threshold
        factor = 1 + cfg.threshold_step
        t = self.threshold * factor if count > cfg.target_species else self.threshold / factor
        # above the largest possible distance every member is in one species: no use going on
        return min(max(t, THRESHOLD_FLOOR), cfg.structure_weight + cfg.weight_coefficient)

    # ----- checkpoints ---------------------------------------------------------------------------
    def to_state(self) -> dict:
        return {"next_id": self.next_id, "threshold": self.threshold,
                "species": [sp.to_state() for sp in self.species]}

    def restore(self, state: dict) -> None:
        self.next_id = state["next_id"]
        # a checkpoint from before the threshold adapted holds none: it was the configured one
        self.threshold = state.get("threshold", self.config.compatibility_threshold)
        self.species = [Species.from_state(d) for d in state["species"]]
        self._genomes = {}

    def sizes(self) -> dict[int, int]:
        return {sp.id: len(sp.members) for sp in self.species}

