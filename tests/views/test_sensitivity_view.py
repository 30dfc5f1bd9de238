"""The Morph panel's Sensitivity tab and its JSON recipes.

Oracles: a finished measurement shows the numbers of ``measure_drift(..., per_layer=True)`` called
directly with the same model, recipe, probe and context, and the rows ``loomlab quant-report
--per-layer --json`` prints for the recipe the panel saved; a saved recipe is what
``resolve_recipe`` reads back to the plan the combos show; a bad recipe's message is the engine's own.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt
from PySide6.QtWidgets import QFileDialog

from loomlab.app.cli import main as cli_main
from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.quality.drift import (
    DriftReport,
    LayerDrift,
    default_probe,
    drift_stats,
    measure_drift,
    resolve_recipe,
    weighted_layers,
)
from loomlab.views.morph_panel import DTYPE, LAYER, MorphPanel
from loomlab.views.sensitivity_view import (
    COLUMNS,
    FORMAT,
    KL_MAX,
    KL_MEAN,
    KL_P99,
    PPL_DIFF,
    PPL_RATIO,
    RANK,
    RMS_DP,
    SAME_TOP,
)
from loomlab.views.sensitivity_view import LAYER as S_LAYER

from .jobs import settle
from .panel_layout import on_screen
from .test_morph_panel import _assert_nothing_clipped, small_net

CTX = 128  # 4 chunks of the short probe: a layer costs ~1 s
USER = Qt.ItemDataRole.UserRole


@pytest.fixture
def panel(qtbot, runner):
    with on_screen(qtbot, MorphPanel(runner), 1200, 600) as p:
        yield p


@pytest.fixture(scope="module")
def probe():
    return "\n\n".join(default_probe().split("\n\n")[:5])  # >= 512 tokens, as test_drift.py


def combos(panel) -> dict[str, str]:
    return {panel.table.item(r, LAYER).text(): panel.table.cellWidget(r, DTYPE).currentText()
            for r in range(panel.table.rowCount())}


def shown_rows(view) -> list[dict]:
    """The Sensitivity table in rank order: each row's data (UserRole) by column name."""
    rows = [{COLUMNS[c]: view.table.item(r, c).data(USER) for c in range(len(COLUMNS))}
            for r in range(view.table.rowCount())]
    return sorted(rows, key=lambda row: row["Rank"])


def own_state(model):
    return [(la.layer.weights, la.layer.cfg.dtype) for la in weighted_layers(model.net)]


# ----- a measurement on SmolLM2 --------------------------------------------------------------------
def test_a_measurement_shows_what_measure_drift_and_quant_report_give_for_the_same_inputs(
        qtbot, panel, smollm2, probe, tmp_path, capsys, monkeypatch):
    panel.set_model(smollm2)
    settle(qtbot, panel, 120000)
    view = panel.sensitivity
    before = own_state(smollm2)
    assert not view.measure_button.isEnabled()  # no format chosen yet: nothing to measure
    chosen = {"blk.0.attn_q/k/v/output": "Q4_0", "blk.0.ffn_gate/up/down": "Q4_0",
              "blk.7.ffn_gate/up/down": "int8"}
    panel.choose_recipe(chosen)
    view.set_probe(probe, CTX)
    view.filter_edit.setText("blk.0.*")  # only the first block's two layers
    qtbot.mouseClick(panel.tabs.tabBar(), Qt.MouseButton.LeftButton,
                     pos=panel.tabs.tabBar().tabRect(1).center())
    assert panel.tabs.currentWidget() is view
    progress = []
    panel._runner.changed.connect(lambda: [job.progress.connect(lambda *a: progress.append(a))
                                           for job in panel._runner.active])
    qtbot.mouseClick(view.measure_button, Qt.MouseButton.LeftButton)
    assert panel.is_busy() and not view.measure_button.isEnabled()
    settle(qtbot, panel, 120000)

    measured = {k: v for k, v in chosen.items() if k.startswith("blk.0.")}
    oracle = measure_drift(smollm2, measured, probe, ctx=CTX, per_layer=True)
    rows = shown_rows(view)
    assert [(r["Layer"], r["Format"]) for r in rows] == [(la.name, la.format) for la in oracle.layers]
    numbers = (KL_MEAN, KL_P99, KL_MAX, SAME_TOP, PPL_RATIO, PPL_DIFF, RMS_DP)
    for row, la in zip(rows, oracle.layers, strict=True):
        s = la.stats
        assert [row[COLUMNS[c]] for c in numbers] == pytest.approx(
            [s.kl_mean, s.kl_p99, s.kl_max, s.same_top, s.ppl_ratio, s.ppl_diff, s.rms_dp], rel=1e-9)
    heights = view.bars.opts["height"]
    assert list(heights) == pytest.approx([la.stats.kl_mean for la in oracle.layers], rel=1e-9)
    assert list(heights) == sorted(heights, reverse=True)  # worst first
    assert f"same top {100 * oracle.stats.same_top:.2f}%" in view.summary.text()
    assert progress and progress[-1][1:] == (2 * 4 + 2 * 4,) * 2  # every forward pass, to the last
    assert oracle.layers[0].name in panel.status.text()
    assert own_state(smollm2) == before
    assert {row.current for row in panel._rows} == {"Q4_1", "Q8_0", "F32"}  # measured, not morphed

    # the same layers in a recipe saved by the panel, through the command: the same numbers, printed so
    view.filter_edit.clear()
    panel.choose_recipe({"blk.7.ffn_gate/up/down": "Q4_1"})  # back to the file's: not in the recipe
    path, probe_file = tmp_path / "recipe", tmp_path / "probe.txt"
    probe_file.write_text(probe, "utf-8")
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(path), ""))
    qtbot.mouseClick(panel.save_recipe_button, Qt.MouseButton.LeftButton)
    saved = tmp_path / "recipe.json"
    assert json.loads(saved.read_text()) == measured
    capsys.readouterr()
    assert cli_main(["quant-report", "smollm2-135m", "--recipe", str(saved), "--probe", str(probe_file),
                     "--ctx", str(CTX), "--per-layer", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)["per_layer"]
    assert [(r["Layer"], r["Format"]) for r in rows] == [(la["layer"], la["format"]) for la in cli]
    for la in cli:
        texts = [view.table.item(view._table_row(la["layer"]), c).text() for c in (KL_MEAN, KL_P99, SAME_TOP)]
        assert texts == [f"{la['kl_mean']:.6f}", f"{la['kl_p99']:.6f}", f"{la['same_top_percent']:.2f}%"]
    panel.shutdown()


def test_cancel_stops_a_measurement_and_leaves_the_model_as_it_was(qtbot, panel, runner, smollm2, probe):
    panel.set_model(smollm2)
    settle(qtbot, panel, 120000)
    before = own_state(smollm2)
    panel.set_all_dtype("Q4_0")
    panel.sensitivity.set_probe(probe, CTX)
    panel.measure_sensitivity()
    qtbot.waitUntil(lambda: panel.status.text().startswith("sensitivity: "), timeout=60000)
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    settle(qtbot, panel, 30000)
    # the panel is idle once it has taken the job's end; the runner forgets the job when its
    # thread has finished, a moment later on a busy machine
    qtbot.waitUntil(lambda: runner.active == [], timeout=10000)
    assert panel.status.text() == "sensitivity cancelled"
    assert panel.sensitivity.table.rowCount() == 0
    assert own_state(smollm2) == before
    assert panel.sensitivity.measure_button.isEnabled()  # the choices still wait: measure again
    panel.shutdown()


def test_a_loom_network_has_no_sensitivity_to_measure(qtbot, panel):
    panel.set_network(small_net())
    settle(qtbot, panel)
    panel.set_all_dtype("int8")
    assert not panel.sensitivity.measure_button.isEnabled()
    assert "language model" in panel.sensitivity.measure_button.toolTip()
    panel.measure_sensitivity()
    assert not panel.is_busy() and "language model" in panel.status.text()


# ----- linking: a row or bar chosen selects the layer --------------------------------------------
def fake_report(names: list[str]) -> DriftReport:
    """A per-layer report over ``names`` (statistics of random logits: any numbers will do here)."""
    rng = np.random.default_rng(0)
    layers = []
    for i, name in enumerate(names):
        base = rng.normal(size=(40, 12))
        stats = drift_stats(base, base + rng.normal(scale=0.05 * (i + 1), size=base.shape),
                            rng.integers(0, 12, 40))
        layers.append(LayerDrift(i, name, "int8", 1000 + i, stats))
    layers.sort(key=lambda la: -la.stats.kl_mean)
    return DriftReport("net", dict.fromkeys(names, "int8"), len(names), 512, CTX, 4, 2000, 1000,
                       layers[0].stats, tuple(layers), 1.5)


def click_bar(qtbot, view, index: int) -> None:
    vb = view.chart.getPlotItem().getViewBox()
    height = view.bars.opts["height"][index]
    at = view.chart.mapFromScene(vb.mapViewToScene(QPointF(index + 1, height / 2)))  # bar k at rank k
    qtbot.mouseClick(view.chart.viewport(), Qt.MouseButton.LeftButton, pos=at)


def test_clicking_a_row_or_a_bar_selects_that_layer_in_the_morph_table_and_announces_it(qtbot, panel):
    panel.set_network(small_net(blocks=2))
    settle(qtbot, panel)
    view = panel.sensitivity
    names = [row.name for row in panel._rows]
    report = fake_report(names)
    view.show_report(report)
    panel.tabs.setCurrentWidget(view)
    heard = []
    panel.layer_selected.connect(heard.append)
    key_of = {row.name: row.key for row in panel._rows}

    third = report.layers[2].name
    row = view._table_row(third)
    rect = view.table.visualItemRect(view.table.item(row, S_LAYER))
    qtbot.mouseClick(view.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert heard == [key_of[third]] and panel.selected_layer_key() == key_of[third]

    qtbot.waitUntil(lambda: view.chart.getPlotItem().getViewBox().viewRange()[0][1] > len(names))
    click_bar(qtbot, view, 0)
    worst = report.layers[0].name
    assert heard[-1] == key_of[worst] and panel.selected_layer_key() == key_of[worst]
    assert view.table.item(view.table.selectionModel().selectedRows()[0].row(), S_LAYER).text() == worst
    brushes = [b.color().getRgb() for b in view.bars.opts["brushes"]]
    assert brushes[0] != brushes[1] == brushes[2]  # the chosen bar stands out

    # the other way: a layer selected in the Morph table (or another panel) shows in the tab
    panel.select_layer_key(key_of[third])
    assert view.table.item(view.table.selectionModel().selectedRows()[0].row(), S_LAYER).text() == third
    assert len(heard) == 2  # and is not echoed back


def test_the_sensitivity_table_sorts_by_any_column_numbers_as_numbers(qtbot, panel):
    panel.set_network(small_net(blocks=5))
    settle(qtbot, panel)
    view = panel.sensitivity
    report = fake_report([row.name for row in panel._rows])
    view.show_report(report)
    assert [view.table.item(r, S_LAYER).text() for r in range(view.table.rowCount())] == \
        [la.name for la in report.layers]
    for col in (RANK, KL_MEAN, SAME_TOP, PPL_RATIO, FORMAT):
        for order in (Qt.SortOrder.AscendingOrder, Qt.SortOrder.DescendingOrder):
            view.table.sortByColumn(col, order)
            values = [view.table.item(r, col).data(USER) for r in range(view.table.rowCount())]
            assert values == sorted(values, reverse=order == Qt.SortOrder.DescendingOrder), COLUMNS[col]
    assert view._table_row(report.layers[0].name) is not None


# ----- recipes --------------------------------------------------------------------------------------
def test_save_writes_what_the_combos_say_and_resolve_recipe_reads_it_back_to_the_same_plan(
        qtbot, panel, tmp_path):
    net = small_net(blocks=2)
    panel.set_network(net)
    settle(qtbot, panel)
    names = [row.name for row in panel._rows]
    panel.choose_recipe({names[0]: "int8", names[3]: "float16"})
    panel.apply()
    settle(qtbot, panel)
    panel.choose_recipe({names[3]: "int4", names[4]: "fp8e4m3", names[0]: "float32"})  # pending, over applied
    path = tmp_path / "r.json"
    panel.save_recipe(str(path))
    # every row whose combo differs from the layer as loaded; names[0] went back to float32
    shown = combos(panel)
    assert json.loads(path.read_text()) == {n: f for n, f in shown.items() if f != "float32"} == \
        {names[3]: "int4", names[4]: "fp8e4m3"}
    assert f"saved a recipe of 2 layers to {path}" == panel.status.text()
    fresh = small_net(blocks=2)  # the same network as loaded: the recipe is the plan the combos show
    plan = {k: shown[n] for k, n in enumerate(names) if shown[n] != "float32"}
    assert resolve_recipe(fresh, str(path)) == plan


def test_load_chooses_the_files_formats_and_morphs_nothing_until_apply(qtbot, panel, tmp_path, monkeypatch):
    net = small_net(blocks=2)
    panel.set_network(net)
    settle(qtbot, panel)
    names = [row.name for row in panel._rows]
    panel.choose_recipe({names[1]: "int2"})  # a pending choice the recipe replaces
    path = tmp_path / "r.json"
    path.write_text(json.dumps({names[0]: "int8", "2": "float16", "*": "float32"}))  # a name, a position
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    qtbot.mouseClick(panel.load_recipe_button, Qt.MouseButton.LeftButton)
    assert combos(panel) == {n: {0: "int8", 2: "float16"}.get(k, "float32") for k, n in enumerate(names)}
    assert all(row.current == "float32" for row in panel._rows)  # nothing morphed
    assert panel.apply_button.isEnabled() and "2 layers chosen" in panel.status.text()


def test_a_language_models_recipe_of_block_formats_saves_and_loads_back(qtbot, panel, smollm2, tmp_path,
                                                                         monkeypatch):
    panel.set_model(smollm2)
    settle(qtbot, panel, 120000)
    chosen = {"token_embd": "Q5_0", "blk.0.ffn_gate/up/down": "Q8_0", "blk.3.attn_q/k/v/output": "int8",
              "blk.29.ffn_norm": "float16"}
    assert panel.choose_recipe(chosen) == 4
    path = tmp_path / "smollm2.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(path), ""))
    qtbot.mouseClick(panel.save_recipe_button, Qt.MouseButton.LeftButton)
    assert json.loads(path.read_text()) == chosen
    names = [la.name for la in weighted_layers(smollm2.net)]
    assert {names[i]: f for i, f in resolve_recipe(smollm2.net, str(path)).items()} == chosen

    loaded_as = {row.name: row.current for row in panel._rows}
    panel.set_all_dtype("Q4_0")  # pending choices the recipe replaces
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    qtbot.mouseClick(panel.load_recipe_button, Qt.MouseButton.LeftButton)
    assert combos(panel) == {**loaded_as, **chosen}
    assert {row.current for row in panel._rows} == {"Q4_1", "Q8_0", "F32"}  # nothing morphed


@pytest.mark.parametrize("text", ["{not json", '{"no.such.layer": "int8"}', '{"0": "int7"}', '["int8"]'])
def test_a_bad_recipe_file_is_reported_with_the_engines_message_and_changes_nothing(qtbot, panel, tmp_path,
                                                                                   text):
    net = small_net()
    panel.set_network(net)
    settle(qtbot, panel)
    panel.set_all_dtype("int4")
    before = combos(panel)
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(LoomConfigError) as engine:
        resolve_recipe(net, str(path))
    assert panel.load_recipe(str(path)) == 0
    assert panel.status.text() == f"recipe not loaded: {engine.value}"
    assert combos(panel) == before
    assert panel.load_recipe(str(tmp_path / "missing.json")) == 0
    assert panel.status.text().startswith("recipe not loaded: cannot read the recipe file")


def test_a_failed_save_leaves_no_file_and_says_why(qtbot, panel, tmp_path):
    panel.set_network(small_net())
    settle(qtbot, panel)
    path = tmp_path / "no-such-folder" / "r.json"
    panel.save_recipe(str(path))
    assert not path.parent.exists() and panel.status.text().startswith(f"cannot save the recipe to {path}")


# ----- layout -----------------------------------------------------------------------------------------
def test_docked_at_the_bottom_the_sensitivity_tab_shows_table_and_chart_unclipped(qtbot, panel, tmp_path):
    panel.resize(1600, 350)  # the Morph dock at the bottom of a 1600x1000 window
    panel.set_network(small_net(blocks=10))
    settle(qtbot, panel)
    view = panel.sensitivity
    view.show_report(fake_report([row.name for row in panel._rows]))
    panel.tabs.setCurrentWidget(view)
    qtbot.waitUntil(lambda: view.table.isVisible())
    _assert_nothing_clipped(panel)
    table = view.table
    visible = sum(1 for r in range(table.rowCount())
                  if 0 <= table.rowViewportPosition(r)
                  and table.rowViewportPosition(r) + table.rowHeight(r) <= table.viewport().height())
    assert visible >= 5
    header = view.table.horizontalHeader()
    for col in range(len(COLUMNS)):
        if col != S_LAYER:
            assert header.sectionSize(col) >= header.sectionSizeFromContents(col).width(), COLUMNS[col]
    assert view.chart.width() >= 300 and view.chart.height() >= 120
    panel.grab().save(str(tmp_path / "sensitivity.png"))
