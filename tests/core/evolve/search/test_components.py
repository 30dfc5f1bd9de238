"""Reproduction and stagnation as components of a run, injected as neat-python injects them:
the defaults are the runs of before (Loom's population; species reproduction from the
speciation settings), and what is injected is what breeds, is checkpointed and resumes."""

from __future__ import annotations

import json
import sqlite3

import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.evolve import LoomReproduction, Reproduction, SpeciesReproduction, Stagnation
from loomlab.core.evolve.genetics.neat import NEATConfig
from loomlab.core.evolve.search.run import Evolution
from loomlab.core.evolve.search.speciation import SpeciationConfig
from loomlab.core.evolve.search.species import Species
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.io.checkpoint import checkpoint_bytes
from loomlab.core.workspace.store import Workspace

CONFIG = NEATConfig.default(4, seed=11)
SPECIATED = SpeciationConfig(compatibility_threshold=0.1, target_species=0)


def member_bytes(run: Evolution) -> list[bytes]:
    return [checkpoint_bytes(m) for m in run.members]


def species(sid: int, members: list[int], last_improved: int, best: float) -> Species:
    return Species(sid, get_task("xor").seed_network(), members, 0, last_improved, best)


# ----- stagnation on its own: the rule, species by species ---------------------------------------
def test_stagnation_removes_species_that_stopped_improving():
    # species 1 improves now (2.0 > 1.0); 2 last improved at 5 and is at its best; 3 last improved
    # at 6; the generation is 9 and species live while 9 - last_improved < 3
    group = [species(1, [0, 1], 2, 1.0), species(2, [2], 5, 4.0), species(3, [3, 4], 6, 0.5)]
    fitness = [2.0, 0.0, 3.0, 0.4, 0.1]
    alive = Stagnation(max_stagnation=3, species_elitism=0).update(group, fitness, 9)
    assert [sp.id for sp in alive] == [1]
    assert (group[0].best_fitness, group[0].last_improved) == (2.0, 9)
    assert (group[1].best_fitness, group[1].last_improved) == (4.0, 5)  # 3.0 is no improvement


def test_stagnation_keeps_the_best_species_however_stale():
    group = [species(1, [0], 0, 1.0), species(2, [1], 0, 5.0), species(3, [2], 0, 3.0)]
    alive = Stagnation(max_stagnation=2, species_elitism=2).update(group, [0.5, 0.5, 0.5], 10)
    assert [sp.id for sp in alive] == [2, 3]  # in the species' order, the two best ever


def test_bad_stagnation_and_reproduction_settings_are_refused():
    with pytest.raises(LoomConfigError, match="max_stagnation"):
        Stagnation(max_stagnation=0)
    with pytest.raises(LoomConfigError, match="species_elitism"):
        Stagnation(species_elitism=-1)
    with pytest.raises(LoomConfigError, match="survival_threshold"):
        SpeciesReproduction(survival_threshold=1.5)
    with pytest.raises(LoomConfigError, match="elitism"):
        SpeciesReproduction(elitism=True)
    with pytest.raises(LoomConfigError, match="stagnation"):
        SpeciesReproduction(stagnation="often")
    with pytest.raises(LoomConfigError, match="min_species_size"):
        SpeciationConfig(min_species_size=0)  # the config checks what its components take


# ----- the defaults are the components spelled out -----------------------------------------------
def test_default_components_spelled_out_give_the_same_run():
    task = get_task("xor")
    loom = Evolution(task, config=CONFIG, population=16)
    explicit = Evolution(task, config=CONFIG, population=16, reproduction=LoomReproduction())
    speciated = Evolution(task, config=CONFIG, population=16, speciation=SPECIATED)
    spelled = Evolution(task, config=CONFIG, population=16, speciation=SPECIATED,
                        reproduction=SpeciesReproduction(
                            SPECIATED.elitism, SPECIATED.survival_threshold, SPECIATED.min_species_size,
                            Stagnation(SPECIATED.max_stagnation, SPECIATED.species_elitism)))
    for run in (loom, explicit, speciated, spelled):
        run.run(4)
    assert member_bytes(loom) == member_bytes(explicit)
    assert member_bytes(speciated) == member_bytes(spelled)
    assert member_bytes(loom) != member_bytes(speciated)


# ----- injected components are the ones that act -------------------------------------------------
class RecordingStagnation(Stagnation):
    """The default rule, recording what it was asked and what it answered."""

    def __init__(self, *args):
        super().__init__(*args)
        self.calls = []

    def update(self, species, fitness, generation):
        alive = super().update(species, fitness, generation)
        self.calls.append((generation, [sp.id for sp in species], [sp.id for sp in alive], list(fitness)))
        return alive


def test_an_injected_stagnation_decides_which_species_live():
    stagnation = RecordingStagnation(1, 1)  # a species must improve every generation
    run = Evolution(get_task("xor"), config=CONFIG, population=20, speciation=SPECIATED,
                    stagnation=stagnation)
    run.run(5)
    assert [g for g, *_ in stagnation.calls] == [1, 2, 3, 4, 5]
    assert [h.best for h in run.history] == [max(f) for *_, f in stagnation.calls]
    generation, _, alive, _ = stagnation.calls[-1]
    assert [sp.id for sp in run.speciation.species] == alive  # reproduction bred these only
    # with max_stagnation 1, a live species improved this generation or is the elite one
    for sp in run.speciation.species:
        assert sp.last_improved == generation or sp.best_fitness == max(s.best_fitness
                                                                        for s in run.speciation.species)
    # the default stagnation (15 generations) removes no species this early: the runs differ
    default = Evolution(get_task("xor"), config=CONFIG, population=20, speciation=SPECIATED)
    default.run(5)
    assert member_bytes(default) != member_bytes(run)


class Truncation(Reproduction):
    """A custom reproduction: the best half go on, each bred with the next best for the rest."""

    kind = "truncation-test"

    def __init__(self):
        self.generations = []

    def reproduce(self, members, fitness, generation, rng, genome, species):
        self.generations.append(generation)
        order = sorted(range(len(members)), key=lambda i: (-fitness[i], i))
        half = order[: max(1, len(order) // 2)]
        children = [members[i] for i in half]
        k = 0
        while len(children) < len(members):
            a, b = half[k % len(half)], half[(k + 1) % len(half)]
            children.append(genome.offspring(members[a], members[b], fitness[a], fitness[b], rng))
            k += 1
        return children


def test_a_custom_reproduction_breeds_checkpoints_and_resumes(tmp_path):
    task = get_task("xor")
    with Workspace(tmp_path / "straight.sqlite3") as ws:
        straight = Evolution(task, config=CONFIG, population=12, reproduction=Truncation(), store=ws)
        straight.run(4)
        assert straight.reproduction.generations == [1, 2, 3, 4]
        expected = member_bytes(straight), [s.to_dict() for s in straight.history]
    with Workspace(tmp_path / "resumed.sqlite3") as ws:
        first = Evolution(task, config=CONFIG, population=12, reproduction=Truncation(), store=ws)
        first.run(2)
        run_id = first.run_id
    with Workspace(tmp_path / "resumed.sqlite3") as ws:
        with pytest.raises(LoomConfigError, match="custom reproduction.*truncation-test"):
            Evolution.resume(ws, run_id)
        again = Evolution.resume(ws, run_id, reproduction=Truncation())
        again.run(2)
        assert (member_bytes(again), [s.to_dict() for s in again.history]) == expected


@pytest.mark.parametrize("speciation", [None, SPECIATED], ids=["loom", "speciated"])
def test_a_run_stored_before_reproduction_was_recorded_resumes(tmp_path, speciation):
    task = get_task("xor")
    path = tmp_path / "ws.sqlite3"
    with Workspace(path) as ws:
        straight = Evolution(task, config=CONFIG, population=12, speciation=speciation, store=ws)
        straight.run(4)
        expected = member_bytes(straight)
        first = Evolution(task, config=CONFIG, population=12, speciation=speciation, store=ws)
        first.run(2)
        run_id = first.run_id
    with sqlite3.connect(path) as db:  # the record as earlier versions wrote it
        row = db.execute("SELECT config_json FROM evolution_runs WHERE id = ?", (run_id,)).fetchone()
        config = json.loads(row[0])
        del config["reproduction"]
        db.execute("UPDATE evolution_runs SET config_json = ? WHERE id = ?", (json.dumps(config), run_id))
    db.close()
    with Workspace(path) as ws:
        again = Evolution.resume(ws, run_id)
        again.run(2)
        assert member_bytes(again) == expected


def test_component_combinations_that_cannot_work_are_refused():
    task = get_task("xor")
    with pytest.raises(LoomConfigError, match="needs speciation"):
        Evolution(task, config=CONFIG, population=8, stagnation=Stagnation())
    with pytest.raises(LoomConfigError, match="breeds within species"):
        Evolution(task, config=CONFIG, population=8, reproduction=SpeciesReproduction())
    with pytest.raises(LoomConfigError, match="brings its own stagnation"):
        Evolution(task, config=CONFIG, population=8, speciation=SPECIATED,
                  reproduction=SpeciesReproduction(), stagnation=Stagnation())
    with pytest.raises(LoomConfigError, match="must be a Reproduction"):
        Evolution(task, config=CONFIG, population=8, reproduction="loom")
    with pytest.raises(LoomConfigError, match="must be a Stagnation"):
        Evolution(task, config=CONFIG, population=8, speciation=SPECIATED, stagnation=3)


def test_species_reproduction_outside_a_speciated_run_is_refused():
    task = get_task("xor")
    run = Evolution(task, config=CONFIG, population=4)
    with pytest.raises(LoomConfigError, match="needs a run with speciation"):
        SpeciesReproduction().reproduce(run.members, [1.0, 2.0, 3.0, 4.0], 1, run.population.rng,
                                        run.genome, None)


def test_loom_reproduction_keeps_the_best_quarter_best_first():
    task = get_task("xor")
    run = Evolution(task, config=CONFIG, population=8)
    members = list(run.members)
    fitness = [0.5, 3.0, 1.0, 3.0, 0.0, 2.0, 1.5, 0.25]
    children = LoomReproduction().reproduce(members, fitness, 1, run.population.rng, run.genome, None)
    # a quarter of 8 is 2: the two 3.0s in their order (a stable sort), then 6 new children
    assert children[:2] == [members[1], members[3]]
    assert len(children) == 8 and not any(c is m for c in children[2:] for m in members)
