"""The quant-recipe task: a language model's per-layer dtypes evolved by the same run as networks
(genome, checkpoints, resume), and what such a run refuses."""

from __future__ import annotations

import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.evolve import Evolution, NEATConfig, SpeciationConfig, get_task
from loomlab.core.evolve.llm.recipe_task import RecipeGenome, RecipeTask
from loomlab.core.workspace.store import Workspace

# one short probe keeps a generation to a few seconds on 2 cores
PARAMS = dict(probes=["The old lighthouse keeper climbed the spiral stairs and"], probe_tokens=12,
              dtypes=["float32", "float16", "int8"], mutation_rate=0.3, lam=0.5)


@pytest.fixture(scope="module")
def task():
    return get_task("quant-recipe", **PARAMS)


def test_params_are_validated_before_any_model_loads():
    for bad, word in [(dict(colour=1), "colour"), (dict(dtypes=["float32", "float99"]), "float99"),
                      (dict(lam=-1), "lam"), (dict(mutation_rate=1.5), "mutation_rate"),
                      (dict(probes=[]), "probes"), (dict(probe_tokens=0), "probe_tokens"),
                      (dict(model=""), "model")]:
        with pytest.raises(LoomConfigError, match=word):
            get_task("quant-recipe", **bad)
    task = get_task("quant-recipe", dtypes=["F16", "float32"])
    assert task.params["dtypes"] == ["float16", "float32"] and task._space is None
    assert task == RecipeTask(dtypes=["float16", "float32"]) and hash(task) == hash(RecipeTask(dtypes=["F16",
                                                                                                     "float32"]))


def test_a_run_evolves_recipes_and_fitness_is_kl_plus_bytes(task, tmp_path):
    with Workspace(tmp_path / "ws.sqlite3") as ws:
        run = Evolution(task, config=NEATConfig.default(1, seed=7), population=6, store=ws)
        assert isinstance(run.genome, RecipeGenome)
        first = list(run.members)
        space = task.space
        assert first[0] == space.uniform("float32") and all(len(m) == len(space) for m in first)
        run.run(1)
        # the formula, member by member: -KL - lam * bytes / bytes unmorphed
        for member, score in zip(first, task.last_scores, strict=True):
            assert score.bytes == space.recipe_bytes(member)
            assert score.fitness == pytest.approx(-score.kl_mean - 0.5 * score.bytes / space.bytes_unmorphed,
                                                  abs=1e-12)
        assert task.last_scores[0].kl_mean == pytest.approx(0.0, abs=1e-9)  # the model as loaded
        assert run.history[0].best == max(s.fitness for s in task.last_scores)
        assert all(set(m) <= set(space.dtypes) for m in run.members)


def test_a_resumed_recipe_run_continues_as_an_uninterrupted_one(task, tmp_path):
    config = NEATConfig.default(1, seed=11)
    straight = Evolution(task, config=config, population=5)
    straight.run(2)
    with Workspace(tmp_path / "ws.sqlite3") as ws:
        first = Evolution(task, config=config, population=5, store=ws)
        first.run(1)
        again = Evolution.resume(ws, first.run_id)
        assert isinstance(again.task, RecipeTask) and again.task == task
        again.run(1)
    assert again.members == straight.members
    assert [s.to_dict() for s in again.history] == [s.to_dict() for s in straight.history]
    assert again.best == straight.best and again.best_fitness == straight.best_fitness


class ElsewhereEvaluator:  # any evaluator that is not in-process (a cluster's)
    def evaluate(self, task, members, *, progress=None, cancel=None):
        raise AssertionError("never called")

    def close(self):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


def test_recipes_are_not_speciated_nor_sent_to_a_cluster(task):
    with pytest.raises(LoomConfigError, match="speciation"):
        Evolution(task, config=NEATConfig.default(1, seed=1), population=4, speciation=SpeciationConfig())
    with pytest.raises(LoomConfigError, match="in this process only"):
        Evolution(task, config=NEATConfig.default(1, seed=1), population=4, evaluator=ElsewhereEvaluator())


def test_a_generation_reports_each_recipe_and_stops_between_them(task, tmp_path):
    seen = []

    def progress(done, total):
        seen.append((done, total))

    run = Evolution(task, config=NEATConfig.default(1, seed=2), population=4)
    run.run(1, progress=progress)
    assert seen == [(0, 4), (1, 4), (2, 4), (3, 4), (4, 4)]
    with Workspace(tmp_path / "ws.sqlite3") as ws:
        run = Evolution(task, config=NEATConfig.default(1, seed=2), population=4, store=ws)
        before = list(run.members)
        done = []
        result = run.run(1, cancel=lambda: done[-1:] == [2], progress=lambda d, total: done.append(d))
        # asked to stop after the second recipe: no more recipes run, the generation is dropped
        # whole and the run keeps the members it started with
        assert done == [0, 1, 2] and result.status == "stopped" and result.generation == 0
        assert run.members == before
