"""Speciated XOR with the defaults: the species count adapts towards its target, and the XOR task
recommends Loom's NEAT settings restricted to Dense layers (tests/bench/bench_xor_success.py
measures the success rate over 10 seeds)."""

from __future__ import annotations

import dataclasses

import pytest

from loomlab.core.evolve.genetics.neat import NEATConfig, neat_mutate
from loomlab.core.evolve.search.run import Evolution, genome_width
from loomlab.core.evolve.search.speciation import Speciation, SpeciationConfig
from loomlab.core.evolve.search.tasks import get_task


def test_xor_recommends_loom_neat_with_dense_layers_only():
    task = get_task("xor")
    config = task.neat_config(seed=3)
    loom = NEATConfig.default(genome_width(task.seed_network()), seed=3)
    assert config == dataclasses.replace(loom, allowed_layer_types=(0,))  # 0: Dense
    # with Dense only, no mutation can change a layer's type or size (so no member breaks by it)
    net = task.seed_network()
    for seed in range(40):
        child = neat_mutate(net, config.with_seed(seed))
        assert [(layer.cfg.type, len(layer.weights)) for _, layer in child.layers()] == \
            [("Dense", 8), ("Dense", 4)]
    # the other tasks keep Loom's defaults
    sine = get_task("sine")
    assert sine.neat_config(seed=3) == NEATConfig.default(genome_width(sine.seed_network()), seed=3)


def test_speciated_xor_grows_species_towards_the_target():
    """Oracle: the XOR network has 2 layers, so NEAT's remote links (the only structural change
    the Dense-only config makes) come in 4 sets, and at the old fixed threshold (0.15) members
    only ever split by those: a real run of seed 1 stays at 3-4 species for 40 generations. The
    adapted threshold shrinks until weight differences split species too: the same run reaches
    15 species at generation 40 (threshold 0.033), in the 5-15 band the defaults aim at."""
    task = get_task("xor")
    run = Evolution(task, config=task.neat_config(1), population=150, speciation=SpeciationConfig())
    run.run(40)
    counts = [len(s.species) for s in run.history]
    assert max(counts[:20]) <= 4  # the threshold is still shrinking: only link sets split
    assert 5 <= counts[-1] <= 2 * SpeciationConfig().target_species
    assert run.speciation.threshold < SpeciationConfig().compatibility_threshold
    # fitness sharing still selects: the seed network's mutants start at 2.98
    assert run.best_fitness > 3.05


@pytest.mark.parametrize(("count", "factor"), [(10, 1.0), (30, 1.1), (3, 1 / 1.1)])
def test_the_threshold_steps_towards_the_target_species_count(count, factor):
    sp = Speciation(SpeciationConfig(compatibility_threshold=0.2, target_species=10, threshold_step=0.1))
    assert sp._next_threshold(count) == pytest.approx(0.2 * factor)
    fixed = Speciation(SpeciationConfig(compatibility_threshold=0.2, target_species=0))
    assert fixed._next_threshold(count) == 0.2


def test_the_threshold_stays_within_the_distance_range():
    cfg = SpeciationConfig(compatibility_threshold=2.9, structure_weight=1.0, weight_coefficient=2.0)
    sp = Speciation(cfg)
    assert sp._next_threshold(100) == 3.0  # the largest distance: everyone in one species
    sp.threshold = 0.0101
    assert sp._next_threshold(1) == 0.01
