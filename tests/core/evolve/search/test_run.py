"""Evolution runs: Loom's population inside a run, speciation, reporters, and checkpoints that
resume exactly."""

from __future__ import annotations

import io
import math
import sqlite3

import numpy as np
import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.evolve.genetics.clone import clone_network
from loomlab.core.evolve.genetics.genome import NetworkGenome
from loomlab.core.evolve.genetics.gorand import GoRand
from loomlab.core.evolve.genetics.neat import NEATConfig
from loomlab.core.evolve.search.population import NEATPopulation
from loomlab.core.evolve.search.reporters import (
    ConsoleReporter,
    GenerationStats,
    Reporter,
    StatisticsReporter,
)
from loomlab.core.evolve.search.reproduction import SpeciesReproduction, spawn_amounts
from loomlab.core.evolve.search.run import Evolution
from loomlab.core.evolve.search.speciation import Speciation, SpeciationConfig, genome_distance
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.io.checkpoint import checkpoint_bytes
from loomlab.core.workspace.evolution_runs import EvolutionRuns
from loomlab.core.workspace.store import Workspace, WorkspaceError

CONFIG = NEATConfig.default(4, seed=7)


def member_bytes(evolution: Evolution) -> list[bytes]:
    return [checkpoint_bytes(m) for m in evolution.members]


def test_a_run_without_speciation_is_loom_population():
    task = get_task("xor")
    run = Evolution(task, config=CONFIG, population=12)
    pop = NEATPopulation(task.seed_network(), 12, CONFIG)
    assert [checkpoint_bytes(m) for m in pop.members] == member_bytes(run)
    run.run(3)
    for _ in range(3):
        pop.evolve(task.evaluate(pop.members))
    assert [checkpoint_bytes(m) for m in pop.members] == member_bytes(run)
    assert run.history[-1].best == pop.best_fitness


@pytest.mark.parametrize("speciation", [None, SpeciationConfig()], ids=["loom", "speciated"])
def test_resume_continues_exactly(tmp_path, speciation):
    task = get_task("xor")
    with Workspace(tmp_path / "straight.sqlite3") as ws:
        straight = Evolution(task, config=CONFIG, population=24, speciation=speciation, store=ws)
        straight.run(6)
        expected = member_bytes(straight), [s.to_dict() for s in straight.history], straight.best_fitness
    with Workspace(tmp_path / "resumed.sqlite3") as ws:
        first = Evolution(task, config=CONFIG, population=24, speciation=speciation, store=ws)
        first.run(3)
        run_id = first.run_id
    with Workspace(tmp_path / "resumed.sqlite3") as ws:  # a new process would open it like this
        again = Evolution.resume(ws, run_id)
        assert again.generation == 3
        again.run(3)
        assert (member_bytes(again), [s.to_dict() for s in again.history], again.best_fitness) == expected
        record = EvolutionRuns(ws).get(run_id)
        assert (record.generations, record.status, record.task) == (6, "finished", "xor")


def test_a_checkpoint_is_all_or_nothing(tmp_path):
    with Workspace(tmp_path / "ws.sqlite3") as ws:
        run = Evolution(get_task("xor"), config=CONFIG, population=8, store=ws)
        run.run(2)
        runs = EvolutionRuns(ws)
        before = runs.latest_checkpoint(run.run_id)
        # a write that fails part way (the second member is not bytes) replaces nothing
        with pytest.raises(TypeError):
            runs.save_checkpoint(run.run_id, 2, {"generation": 2}, [b"member", None])
    with Workspace(tmp_path / "ws.sqlite3") as ws:
        after = EvolutionRuns(ws).latest_checkpoint(run.run_id)
        assert (after.generation, after.state) == (before.generation, before.state)
        assert after.members == before.members
        assert len(after.members) == 8


def test_reporters_hear_every_generation_and_the_solution():
    calls = []

    class Recorder(Reporter):
        def start_generation(self, g):
            calls.append(("start", g))

        def post_evaluate(self, g, fitness):
            calls.append(("evaluated", g, len(fitness)))

        def end_generation(self, stats, population):
            calls.append(("end", stats.generation, population))

        def found_solution(self, g, fitness):
            calls.append(("solved", g))

    stats, out = StatisticsReporter(), io.StringIO()
    task = get_task("xor")
    run = Evolution(task, config=CONFIG, population=10, reporters=[Recorder(), stats, ConsoleReporter(out)])
    result = run.run(2)
    assert calls == [("start", 1), ("evaluated", 1, 10), ("end", 1, 10),
                     ("start", 2), ("evaluated", 2, 10), ("end", 2, 10)]
    assert not result.solved and result.status == "finished"
    # the statistics are the fitness figures of each evaluated generation
    fitness = task.evaluate(Evolution(task, config=CONFIG, population=10).members)
    first = stats.history[0]
    assert (first.best, first.worst) == (max(fitness), min(fitness))
    assert first.mean == pytest.approx(np.mean(fitness)) and first.std == pytest.approx(np.std(fitness))
    assert out.getvalue().splitlines()[0] == first.summary(10)
    # a target already reached stops the run after one generation
    calls.clear()
    solved = Evolution(task, config=CONFIG, population=10, reporters=[Recorder()]).run(5, until=-1.0)
    assert solved.solved and solved.generation == 1 and calls[-1] == ("solved", 1)


def test_cancel_stops_before_the_next_generation(tmp_path):
    with Workspace(tmp_path / "ws.sqlite3") as ws:
        run = Evolution(get_task("xor"), config=CONFIG, population=8, store=ws)
        seen = []
        result = run.run(10, cancel=lambda: len(run.history) >= 2 or seen.append(1))
        assert (result.status, result.generation) == ("stopped", 2)
        assert EvolutionRuns(ws).get(run.run_id).status == "stopped"


def test_genome_distance_follows_structure_and_weights():
    cfg = SpeciationConfig(structure_weight=1.0, weight_coefficient=2.0)
    task = get_task("xor")
    a = task.seed_network()
    assert genome_distance(a, a, cfg) == pytest.approx(0, abs=1e-6)
    b = clone_network(a)
    rng = np.random.default_rng(2)
    for _, layer in b.layers():
        noise = rng.normal(0, 0.3, len(layer.weights)).astype(np.float32)
        layer.weights.master = layer.weights.master + noise
    # the oracle: 2 x the mean over layers of (1 - cosine) / 2, the cosine computed plainly
    drift = [(1 - float(np.dot(x.weights.master, y.weights.master)
                        / np.linalg.norm(x.weights.master) / np.linalg.norm(y.weights.master))) / 2
             for (_, x), (_, y) in zip(a.layers(), b.layers(), strict=True)]
    assert genome_distance(a, b, cfg) == pytest.approx(2.0 * np.mean(drift), abs=1e-6)
    other = get_task("xor", hidden=5).seed_network()  # every layer a different weight count
    assert genome_distance(a, other, cfg) == 1.0


def test_speciation_splits_distant_members_and_shares_offspring():
    task = get_task("xor")
    near = [task.seed_network() for _ in range(3)]
    far = [get_task("xor", hidden=6).seed_network() for _ in range(3)]
    cfg = SpeciationConfig(compatibility_threshold=0.5)
    sp = Speciation(cfg)
    sp.speciate(near + far, 1)
    assert sorted(sp.sizes().values()) == [3, 3]
    assert {tuple(s.members) for s in sp.species} == {(0, 1, 2), (3, 4, 5)}
    children = SpeciesReproduction.from_config(cfg).reproduce(
        near + far, [1.0, 1.0, 1.0, 3.0, 3.0, 2.0], 1, GoRand(1), NetworkGenome(None, CONFIG), sp)
    assert len(children) == 6 and children[0] is far[0]  # the best member goes on unchanged


def test_spawn_amounts_are_proportional_and_complete():
    assert spawn_amounts([1.0, 1.0], 10, 2) == [5, 5]
    # 2 each, then 6 split 4.5 / 1.5: floors 4 / 1, the last one to the older of the tied remainders
    assert spawn_amounts([3.0, 1.0], 10, 2) == [7, 3]
    assert sum(spawn_amounts([0.2, 0.5, 0.0], 17, 2)) == 17
    assert spawn_amounts([0.0, 0.0], 5, 1) == [3, 2]


def test_generation_stats_round_trip():
    s = GenerationStats.of(4, [1.0, 2.0, 4.0], {1: 2, 3: 1})
    assert (s.best, s.worst, s.mean) == (4.0, 1.0, 7 / 3) and s.std == pytest.approx(math.sqrt(14 / 9))
    assert GenerationStats.from_dict(s.to_dict()) == s
    assert s.summary(3) == "Gen 4 | best=4.0000  avg=2.3333  worst=1.0000  pop=3  species=2"


def test_bad_settings_are_refused(tmp_path):
    with pytest.raises(LoomConfigError, match="survival_threshold"):
        SpeciationConfig(survival_threshold=0)
    with pytest.raises(LoomConfigError, match="generations"):
        Evolution(get_task("xor"), config=CONFIG, population=4).run(-1)
    with pytest.raises(LoomConfigError, match="needs a task"):
        Evolution("xor")
    with Workspace(tmp_path / "ws.sqlite3") as ws:
        with pytest.raises(WorkspaceError, match="no evolution run 99"):
            Evolution.resume(ws, 99)
    db = sqlite3.connect(tmp_path / "ws.sqlite3")
    assert db.execute("SELECT COUNT(*) FROM evolution_runs").fetchone() == (0,)
