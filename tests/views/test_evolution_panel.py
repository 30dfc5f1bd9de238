"""The Evolution panel: the form reaches the engine (the same run settings as ``loomlab evolve``),
the engine's reports reach the view (plots and table equal the run's history), a run from the
panel repeats the CLI's and the API's run exactly, pause/stop + resume continue the same history,
invalid input disables Start, the best network exports, and a quant-recipe run shows its Pareto
front and applies a recipe. Oracles: Evolution run directly through core, and ``loomlab evolve``."""

from __future__ import annotations

import dataclasses
import itertools
import time
from pathlib import Path

import numpy as np
import pyqtgraph as pg
import pytest

from loomlab.app.cli import main
from loomlab.core.evolve.search.live import KEEP_GENE, member_rows
from loomlab.core.evolve.search.run import Evolution
from loomlab.core.evolve.search.run_config import plan_from_dict
from loomlab.core.evolve.search.speciation import SpeciationConfig
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.io import load_network
from loomlab.core.io.checkpoint import checkpoint_bytes
from loomlab.core.io.loom_json import dumps
from loomlab.core.units import format_bytes
from loomlab.core.workspace.evolution_runs import EvolutionRuns
from loomlab.core.workspace.store import Workspace
from loomlab.views.evolution_panel import NO_MODEL, EvolutionPanel, pareto_front, species_stack
from loomlab.views.morph_panel import AS_LOADED

from .jobs import settle

TINY_LLAMA = Path(__file__).parents[1] / "data" / "tiny-hf" / "tiny-llama"


@pytest.fixture
def workspace(tmp_path):
    with Workspace(tmp_path / "ws.sqlite3") as ws:
        yield ws


@pytest.fixture
def panel(qtbot, runner, workspace):
    p = EvolutionPanel(runner, workspace)
    qtbot.addWidget(p)
    p.resize(1400, 900)
    p.show()
    yield p
    p.shutdown()


def dicts(history):
    return [s.to_dict() for s in history]


def api_run(generations, population, seed, threshold=None, task="xor"):
    """The oracle: the run straight through core, as the CLI builds it (the task's NEAT config)."""
    t = get_task(task)
    speciation = None if threshold is None else SpeciationConfig(compatibility_threshold=threshold)
    run = Evolution(t, config=t.neat_config(seed=seed), population=population, speciation=speciation)
    run.run(generations)
    return run


# ----- view edits reach the engine ---------------------------------------------------------------
def test_form_values_build_the_runs_config(qtbot, panel):
    panel.set_form(task="sine", population=24, generations=1, seed=7, speciation=True, threshold=0.3,
                   node_mutate_rate=0.25, weight_perturb_scale=0.1, scheduler="inprocess")
    plan = panel.run_plan()
    sine = get_task("sine")
    expected = dataclasses.replace(sine.neat_config(seed=7), node_mutate_rate=0.25, weight_perturb_scale=0.1)
    assert plan.task == sine and plan.neat == expected and plan.population == 24
    assert plan.speciation == SpeciationConfig(compatibility_threshold=0.3) and plan.scheduler is None
    # the same settings as a `loomlab evolve` TOML file's sections give the same plan
    assert plan_from_dict(panel.form_settings()) == plan
    assert panel.form_settings()["run"] == {"task": "sine", "population": 24, "generations": 1}
    panel.start()
    settle(qtbot, panel)
    # the run (in its own process) was built from the plan: its stored record is the plan's run's
    run = plan.evolution()
    assert run.config == expected and run.size == 24 and run.task == sine
    assert run.speciation.config == SpeciationConfig(compatibility_threshold=0.3)
    assert EvolutionRuns(panel.workspace).get(panel.run_id).config == run.describe()

    panel.set_form(speciation=False, scheduler="tcp://10.0.0.1:8786")
    assert panel.run_plan().speciation is None and panel.run_plan().scheduler == "tcp://10.0.0.1:8786"
    assert panel.address_edit.isEnabled()


@pytest.mark.parametrize("fields, message", [
    (dict(population="4x"), "population: '4x' is not a whole number"),
    (dict(population=1), "population must be an integer >= 2"),
    (dict(generations=-1), "generations must be an integer >= 0"),
    (dict(seed="abc"), "seed: 'abc' is not a whole number"),
    (dict(node_mutate_rate=1.5), "node_mutate_rate must lie in [0, 1]"),
    (dict(weight_perturb_rate="fast"), "weight perturb rate: 'fast' is not a number"),
    (dict(threshold=-1), "compatibility_threshold must be a number >= 0"),
    (dict(scheduler="tcp://"), "scheduler must be"),
    (dict(task="quant-recipe"), NO_MODEL),
])
def test_invalid_input_disables_start_with_a_message(qtbot, panel, fields, message):
    assert panel.start_button.isEnabled() and panel.message.text() == ""
    panel.set_form(**fields)
    assert message in panel.message.text()
    assert not panel.start_button.isEnabled()
    panel.start()  # refused
    assert not panel.is_busy()
    panel.set_form(task="xor", population=20, generations=3, seed=1, threshold=0.15, scheduler="inprocess",
                   node_mutate_rate=0.1, weight_perturb_rate=0.8)
    assert panel.start_button.isEnabled() and panel.message.text() == ""


def test_address_field_is_typed_into(qtbot, panel):
    panel.scheduler_box.setCurrentIndex(panel.scheduler_box.findData("address"))
    assert "Dask scheduler's address" in panel.message.text() and not panel.start_button.isEnabled()
    qtbot.keyClicks(panel.address_edit, "tcp://127.0.0.1:8786")
    assert panel.message.text() == "" and panel.start_button.isEnabled()
    assert panel.run_plan().scheduler == "tcp://127.0.0.1:8786"


# ----- the engine's reports reach the view --------------------------------------------------------
def test_an_xor_run_from_the_panel_is_the_clis_and_the_apis(qtbot, panel, tmp_path, capsys):
    panel.set_form(task="xor", population=20, generations=5, seed=5, speciation=True, threshold=0.5)
    bests = []
    panel.best_changed.connect(bests.append)
    panel.start()
    assert panel.is_busy() and panel.stop_button.isEnabled() and not panel.start_button.isEnabled()
    settle(qtbot, panel)

    (tmp_path / "run.toml").write_text('[run]\ntask = "xor"\npopulation = 20\ngenerations = 5\n'
                                       '[neat]\nseed = 5\n[speciation]\ncompatibility_threshold = 0.5\n')
    cli_ws = tmp_path / "cli.sqlite3"
    assert main(["evolve", str(tmp_path / "run.toml"), "--workspace", str(cli_ws)]) == 0
    capsys.readouterr()
    with Workspace(cli_ws) as ws:
        cli = EvolutionRuns(ws).latest_checkpoint(1)
    api = api_run(5, 20, 5, threshold=0.5)

    assert len(panel.history) == 5
    assert dicts(panel.history) == cli.state["history"] == dicts(api.history)
    assert EvolutionRuns(panel.workspace).latest_checkpoint(panel.run_id).members == cli.members
    assert cli.members == [checkpoint_bytes(m) for m in api.members]
    # plots: one point per generation of best, mean and worst
    for key, curve in panel.curves.items():
        x, y = curve.getData()
        assert list(x) == [1, 2, 3, 4, 5] and list(y) == [getattr(s, key) for s in api.history]
    # species stack: bands sum to the population every generation
    ids, tops = species_stack(panel.history)
    assert ids == sorted({i for s in api.history for i in s.species})
    assert list(tops[-1]) == [20.0] * 5
    drawn = [top.getData() for top, _ in panel.species_layers]  # one area per species, as stacked
    assert len(drawn) == len(ids) and all(list(x) == [1, 2, 3, 4, 5] for x, _ in drawn)
    np.testing.assert_array_equal([y for _, y in drawn], tops)
    # the table is the last generation, fittest first
    assert panel.table.rowCount() == 20 == len(panel.rows)
    fitness = [r.fitness for r in panel.rows]
    assert fitness == sorted(fitness, reverse=True)
    assert fitness[0] == api.history[-1].best and fitness[-1] == api.history[-1].worst
    assert {r.species for r in panel.rows} == set(api.history[-1].species)
    assert panel.table.item(0, 0).text() == "1" and panel.table.item(0, 3).text() == "Dense×2"
    assert panel.table.item(0, 4).text() == f"{panel.rows[0].parameters:,}"
    # the best network went out, and it is the API's
    assert bests and bests[-1] is panel.best
    assert panel.best_fitness == api.best_fitness and dumps(panel.best) == dumps(api.best)
    assert panel.runs_box.currentData() == panel.run_id and "finished" in panel.status.text()


def test_engine_reports_update_the_view_without_a_job(qtbot, panel):
    run = panel.fill_demo(generations=6, population=24, seed=2)
    assert not panel.is_busy()
    assert dicts(panel.history) == dicts(run.history) and len(run.history) == 6
    _, y = panel.curves["mean"].getData()
    assert list(y) == [s.mean for s in run.history]
    assert panel.best is run.best and panel.export_button.isEnabled()
    assert len(panel.rows) == 24 and panel.rows[0].fitness == run.history[-1].best
    assert panel.table.horizontalHeaderItem(4).text() == "Parameters"
    assert panel.table.item(0, 4).text() == f"{panel.rows[0].parameters:,}"
    # the species areas follow the history as it changes: fewer generations, other species
    panel.history = run.history[:2]
    panel._redraw()
    ids, tops = species_stack(panel.history)
    assert [top.getData()[1].tolist() for top, _ in panel.species_layers] == tops.tolist()
    fills = [i for i in panel.species_plot.getPlotItem().items if isinstance(i, pg.FillBetweenItem)]
    assert len(fills) == len(ids) == len(panel.species_layers)


def test_member_rows_rank_and_describe_members():
    task = get_task("xor")
    seed_net = task.seed_network()
    rows = member_rows([seed_net, seed_net, seed_net], [1.0, 3.0, 3.0], {0: 4, 1: 5})
    assert [(r.rank, r.index, r.species, r.fitness) for r in rows] == [(1, 1, 5, 3.0), (2, 2, None, 3.0),
                                                                       (3, 0, 4, 1.0)]
    assert rows[0].layer_types == "Dense×2" and rows[0].parameters == seed_net.parameter_count()


# ----- pause, stop, resume ------------------------------------------------------------------------
def test_pause_then_resume_continues_the_same_history(qtbot, panel, workspace):
    panel.set_form(task="xor", population=20, generations=5, seed=3, speciation=True, threshold=0.5)
    panel.start()
    panel.pause()  # stops after generation 1's checkpoint
    assert not panel.pause_button.isEnabled()
    settle(qtbot, panel)
    assert len(panel.history) == 1
    run_id = panel.run_id
    assert EvolutionRuns(workspace).get(run_id).status == "stopped" and "stopped at generation 1" in \
        panel.status.text()
    assert panel.runs_box.currentData() == run_id and panel.resume_button.isEnabled()

    panel.set_form(generations=4)
    panel.resume()
    assert panel.status.text() == f"resuming run {run_id} for 4 generations"  # not "stopped" any more
    settle(qtbot, panel)
    api = api_run(5, 20, 3, threshold=0.5)
    assert panel.run_id == run_id and len(EvolutionRuns(workspace).list()) == 1
    assert dicts(panel.history) == dicts(api.history)
    members = EvolutionRuns(workspace).latest_checkpoint(run_id).members
    assert members == [checkpoint_bytes(m) for m in api.members]
    assert dumps(panel.best) == dumps(api.best)


def test_stop_and_close_keep_the_last_checkpoint(qtbot, runner, workspace):
    panel = EvolutionPanel(runner, workspace, rate_hz=30)
    qtbot.addWidget(panel)
    panel.set_form(task="xor", population=20, generations=100000, seed=4, speciation=False)
    panel.start()
    qtbot.waitUntil(lambda: len(panel.history) >= 2, timeout=20000)
    panel.stop()
    settle(qtbot, panel)
    run_id = panel.run_id
    record = EvolutionRuns(workspace).get(run_id)
    assert record.status == "stopped" and record.generations >= 2
    assert [s["generation"] for s in EvolutionRuns(workspace).latest_checkpoint(run_id).state["history"]] == \
        list(range(1, record.generations + 1))

    panel.resume(run_id)  # 100000 more: closing the panel stops it
    qtbot.waitUntil(lambda: len(panel.history) >= record.generations + 1, timeout=20000)
    panel.shutdown()
    assert not panel.is_busy() and not panel.timer.isActive()
    done = EvolutionRuns(workspace).get(run_id).generations
    assert done > record.generations and EvolutionRuns(workspace).get(run_id).status == "stopped"
    api = Evolution(get_task("xor"), config=get_task("xor").neat_config(seed=4), population=20)
    api.run(done)
    state = EvolutionRuns(workspace).latest_checkpoint(run_id).state
    assert state["history"] == dicts(api.history)


def test_show_run_and_hidden_panel(qtbot, panel, workspace):
    panel.set_form(task="xor", population=20, generations=3, seed=6, speciation=False)
    panel.start()
    panel.set_shown(False)
    assert not panel.timer.isActive()
    settle(qtbot, panel)
    history = list(panel.history)  # the run's end drew it all, hidden or not
    assert len(history) == 3
    panel.set_shown(True)
    assert not panel.timer.isActive()  # nothing runs: nothing to redraw
    panel.fill_demo(generations=2, population=20)
    panel.show_run(panel.runs_box.currentData())
    assert dicts(panel.history) == dicts(history) and panel.rows == []
    assert dumps(panel.best) == dumps(api_run(3, 20, 6).best)
    panel.show_run(99)
    assert "no evolution run 99" in panel.status.text()


# ----- export -------------------------------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".json", ".loom"])
def test_export_best_loads_back_equal(qtbot, panel, tmp_path, suffix):
    assert not panel.export_button.isEnabled()
    panel.fill_demo(generations=3, population=20)
    path = tmp_path / f"best{suffix}"
    panel.export_best(str(path))
    assert dumps(load_network(path)) == dumps(panel.best)
    # an atomic save leaves no temporary file behind
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("best")] == [path.name]


# ----- the quant-recipe task ----------------------------------------------------------------------
class ByteTokenizer:
    """Enough of a tokenizer for a recipe's probes (the tiny test model ships none)."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 50 + 1 for c in text]

    def close(self):
        pass


@pytest.fixture(scope="module")
def tiny_model():
    from loomlab.core.llm.generate.textmodel import TextModel
    from loomlab.core.llm.model.loader import load_causal_lm

    return TextModel(load_causal_lm(TINY_LLAMA), ByteTokenizer(), None, name="tiny-llama")


def test_pareto_front_against_brute_force():
    points = [(x, y) for x, y in itertools.product([1, 2, 3, 5], [0.5, 0.1, 0.9, 0.1])][::3] + [(2, 0.05)]
    front = pareto_front(points)
    dominated = {i for i, p in enumerate(points) for q in points
                 if q != p and q[0] <= p[0] and q[1] <= p[1]}
    assert sorted(front) == sorted(set(range(len(points))) - dominated)
    assert [points[i][0] for i in front] == sorted(points[i][0] for i in front)


def test_a_recipe_run_shows_bytes_vs_kl_and_applies_a_recipe(qtbot, panel, tiny_model):
    panel.set_form(task="quant-recipe", population=8, generations=2, seed=1)
    assert NO_MODEL in panel.message.text()
    panel.set_model(tiny_model)
    assert panel.message.text() == "" and not panel.speciation_check.isEnabled()
    assert panel.run_plan().speciation is None  # recipes are not speciated
    panel.start()
    settle(qtbot, panel, timeout=60000)
    assert panel.status.text().startswith(f"run {panel.run_id} finished"), panel.status.text()
    assert panel.recipe_box.isVisibleTo(panel) and not panel.species_plot.isVisibleTo(panel)
    # the oracle: the same run through core, on the same loaded model
    plan = panel.run_plan()
    plan.task.use_model(tiny_model)
    api = Evolution(plan.task, config=plan.neat, population=8)
    api.run(2)
    assert dicts(panel.history) == dicts(api.history)
    scores = plan.task.last_scores
    assert [(r.parameters, r.kl) for r in sorted(panel.rows, key=lambda r: r.index)] == \
        [(s.bytes, s.kl_mean) for s in scores]
    # sizes in MiB on the scatter and in the table's "Weight size" column, as everywhere
    x, y = panel.recipe_points.getData()
    assert list(zip(x, y, strict=True)) == [(r.parameters / 2**20, r.kl) for r in panel.rows]
    assert panel.front == pareto_front([(r.parameters, r.kl) for r in panel.rows])
    fx, _ = panel.front_line.getData()
    assert list(fx) == [panel.rows[i].parameters / 2**20 for i in panel.front]
    assert panel.recipe_plot.getAxis("bottom").labelText == "weight size (MiB)"
    assert panel.table.horizontalHeaderItem(4).text() == "Weight size"
    assert panel.table.item(0, 4).text() == format_bytes(panel.rows[0].parameters)
    assert format_bytes(panel.rows[0].parameters).endswith("KiB")  # the tiny model's 100-odd KiB

    chosen = []
    panel.recipe_chosen.connect(chosen.append)
    assert panel.apply_button.isEnabled()
    panel.apply_recipe()  # nothing chosen: the fittest
    panel.select_row(panel.front[0])
    panel.apply_button.click()
    names = plan.task.space.names

    def as_morph_takes(recipe):  # the "keep" gene as each layer's format as loaded
        return {n: AS_LOADED if g == KEEP_GENE else g for n, g in zip(names, recipe, strict=True)}

    assert chosen == [as_morph_takes(panel.rows[0].recipe), as_morph_takes(panel.rows[panel.front[0]].recipe)]
    assert set(chosen[1].values()) <= {AS_LOADED, *plan.task.params["dtypes"]}
    assert not panel.export_button.isEnabled()  # a recipe is no network


def test_redraws_are_rate_limited_not_per_generation(qtbot, runner, monkeypatch):
    panel = EvolutionPanel(runner, rate_hz=4)
    qtbot.addWidget(panel)
    draws = []
    redraw = panel._redraw
    monkeypatch.setattr(panel, "_redraw", lambda: (draws.append(len(panel.history)), redraw()))
    panel.set_form(task="xor", population=20, generations=150, seed=8, speciation=False)
    began = time.monotonic()
    panel.start()
    settle(qtbot, panel, timeout=60000)
    elapsed = time.monotonic() - began
    assert len(panel.history) == 150 or panel.history[-1].best >= 3.9
    # a clear at the start, one per tick of a 4 Hz timer, one at the end
    assert len(draws) <= 2 + elapsed * 4 + 1, (len(draws), elapsed)
    assert draws[-1] == len(panel.history)
    panel.shutdown()
