"""The Morph panel: the table follows the network, choices in the table morph the network in a job,
and the measures equal core's numbers (morph.layer_report, morph_probe) computed directly; the
output drift equals `loomlab net morph-report`'s; sorting, naming, linking, layout and contrast."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from PySide6.QtCore import Qt

from loomlab.app.cli import main as cli_main
from loomlab.core import VolumetricNetwork, load_network, make_layer
from loomlab.core.layer_names import layer_label
from loomlab.core.llm.files import registry
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.model.moe_layer import LLMMixtureOfExperts
from loomlab.core.morph import layer_report, morph_layer, probe_input, report, weighted_cells
from loomlab.core.morph_probe import compare, llm_probe, net_drift, net_outputs
from loomlab.views import morph_panel
from loomlab.views.morph_panel import (
    BYTES,
    CELL,
    COLUMNS,
    COSINE,
    DTYPE,
    LAYER,
    PARAMS,
    REL_ERROR,
    REL_MSE,
    TYPE,
    MorphPanel,
)

from ..core.llm.model.test_architectures import TINY
from .contrast import assert_legible, dark_theme
from .jobs import choose, settle
from .panel_layout import on_screen

GOLDENS = Path(__file__).resolve().parent.parent / "data" / "loom-goldens-seed1.json"

USER = Qt.ItemDataRole.UserRole


def small_net(seed: int = 0, blocks: int = 1) -> VolumetricNetwork:
    """Dense layers in grid cells and inside a Sequential, so nested rows are covered."""
    rng = np.random.default_rng(seed)

    def dense(i, o):
        return make_layer("Dense", input_height=i, output_height=o, activation="Tanh", rng=rng,
                          init_scale=0.5)

    net = VolumetricNetwork(1, 1, 2 + blocks, 1)
    net[0, 0, 0, 0] = dense(6, 8)
    for b in range(blocks):
        net[0, 0, 1 + b, 0] = make_layer("Sequential", children=[dense(8, 8), make_layer("Residual"),
                                                                 dense(8, 8)])
    net[0, 0, 1 + blocks, 0] = dense(8, 3)
    return net


@pytest.fixture
def panel(qtbot, runner):
    with on_screen(qtbot, MorphPanel(runner), 900, 520) as p:
        yield p


def cell(panel, row, col):
    return panel.table.item(row, col).data(USER)


def assert_row_is(panel, row, r):
    net = panel._net
    coord = net.coord(r.index)
    assert cell(panel, row, CELL) == coord
    assert panel.table.item(row, CELL).text() == "({}, {}, {}, {})".format(*coord)
    assert panel.table.item(row, LAYER).text() == layer_label(net, (*coord, r.path))
    assert panel.table.item(row, TYPE).text() == r.type
    assert panel.table.cellWidget(row, DTYPE).currentText() == r.dtype
    assert cell(panel, row, PARAMS) == r.parameters and cell(panel, row, BYTES) == r.native_bytes
    assert cell(panel, row, REL_ERROR) == pytest.approx(r.rel_error, abs=1e-12)
    assert cell(panel, row, REL_MSE) == pytest.approx(r.rel_error ** 2, abs=1e-12)
    assert cell(panel, row, COSINE) == pytest.approx(r.cosine, abs=1e-12)


# ----- model -> view ----------------------------------------------------------------------------------
def test_the_table_shows_core_reports_and_follows_morphs_made_elsewhere(qtbot, panel):
    net = small_net()
    panel.set_network(net)
    settle(qtbot, panel)
    expected = report(net)
    assert panel.table.rowCount() == len(expected) == 4
    for row, r in enumerate(expected):
        assert_row_is(panel, row, r)
    assert panel.table.item(1, LAYER).text() == "Dense (0,0,1,0) sequential_layers[0]"

    morph_layer(net, 0, "int8")
    with qtbot.waitSignal(panel.reported, timeout=10000):
        panel.refresh()
    assert_row_is(panel, 0, layer_report(net.cells[0], 0))
    assert cell(panel, 0, REL_ERROR) > 0 and cell(panel, 0, BYTES) == net.cells[0].weights.nbytes("int8")
    assert not panel.apply_button.isEnabled()  # showing the model's dtype is not a pending choice
    assert panel.revert_button.isEnabled()


def test_a_panel_off_screen_waits_until_shown(qtbot, panel, runner):
    """Behind another dock's tab (``set_shown(False)``) the panel neither fills its table nor runs
    jobs; once on screen it shows the latest network and measures it."""
    first, net = small_net(), small_net(seed=1)
    panel.set_shown(False)
    panel.set_network(first)
    panel.set_network(net)  # only the latest is shown later
    qtbot.wait(50)
    assert panel.table.rowCount() == 0 and not runner.active
    panel.set_shown(True)
    settle(qtbot, panel)
    assert panel.table.rowCount() == 4
    for row, r in enumerate(report(net)):
        assert_row_is(panel, row, r)
    panel.set_shown(False)
    panel.refresh()  # queued while off screen
    qtbot.wait(50)
    assert panel.is_busy() and not runner.active
    panel.set_shown(True)
    settle(qtbot, panel)


# ----- view -> model ------------------------------------------------------------------------------------
def test_choosing_a_dtype_in_one_row_and_applying_morphs_exactly_that_layer(qtbot, panel):
    net, twin = small_net(), small_net()
    probe = probe_input(twin)
    panel.set_network(net)
    settle(qtbot, panel)

    choose(qtbot, panel.table.cellWidget(2, DTYPE), "int8")
    assert net.cells[1].children[2].cfg.dtype == "float32"  # nothing changes before Apply
    assert panel.apply_button.isEnabled()
    with qtbot.waitSignal(panel.measured, timeout=10000) as measured, \
            qtbot.waitSignal(panel.morphed, timeout=10000) as morphed:
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    assert [la.cfg.dtype for _, la in weighted_cells(net)] == ["float32", "float32", "int8", "float32"]
    layer = net.cells[1].children[2]
    expected = layer_report(layer, 1)
    assert morphed.args[0] == [expected]
    assert_row_is(panel, 2, expected)
    m = measured.args[0]
    assert m["bytes_saved"] == m["bytes_original"] - m["bytes_now"] == 8 * 8 * 3
    assert m["bytes_now"] == net.memory_bytes()
    assert m["output_drift"] == net_drift(net_outputs(twin, probe), net, probe) and m["output_drift"] > 0
    assert m["rel_mse_max"] == pytest.approx(expected.rel_error ** 2)
    assert "saved 192 B" in panel.memory_label.text()


def test_a_recipe_chooses_the_named_layers_and_apply_morphs_them(qtbot, panel):
    net = small_net()
    panel.set_network(net)
    settle(qtbot, panel)
    names = [panel.table.item(r, LAYER).text() for r in range(panel.table.rowCount())]
    recipe = {names[0]: "int8", names[2]: "float16", "no such layer": "int8"}
    assert panel.choose_recipe(recipe) == 2
    assert "no layer named no such layer" in panel.status.text()
    assert [la.cfg.dtype for _, la in weighted_cells(net)] == ["float32"] * 4  # chosen, not applied
    with qtbot.waitSignal(panel.morphed, timeout=10000):
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    by_name = dict(zip(names, [la.cfg.dtype for _, la in weighted_cells(net)], strict=True))
    assert by_name == {n: recipe.get(n, "float32") for n in names}


def test_all_layers_to_int4_then_revert_restores_identical_outputs(qtbot, panel):
    net = small_net()
    x = probe_input(net)
    y0 = net.forward(x).copy()
    panel.set_network(net)
    settle(qtbot, panel)

    choose(qtbot, panel.all_combo, "int4")
    assert {panel.table.cellWidget(i, DTYPE).currentText() for i in range(4)} == {"int4"}
    with qtbot.waitSignal(panel.measured, timeout=10000) as measured:
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    assert {la.cfg.dtype for _, la in weighted_cells(net)} == {"int4"}
    y = net.forward(x).astype(np.float64)
    by_hand = np.linalg.norm(y - y0) / np.linalg.norm(y0.astype(np.float64))
    assert measured.args[0]["output_drift"] == pytest.approx(by_hand, rel=1e-12)
    assert not np.array_equal(net.forward(x), y0)
    for row, r in enumerate(report(net)):
        assert_row_is(panel, row, r)

    with qtbot.waitSignal(panel.measured, timeout=10000) as measured:
        qtbot.mouseClick(panel.revert_button, Qt.MouseButton.LeftButton)
    assert {la.cfg.dtype for _, la in weighted_cells(net)} == {"float32"}
    assert np.array_equal(net.forward(x), y0)
    assert measured.args[0]["output_drift"] == 0.0 and measured.args[0]["bytes_saved"] == 0
    assert not panel.revert_button.isEnabled()


def test_cancel_stops_between_layers_and_the_table_shows_where_the_net_is(qtbot, panel, monkeypatch):
    def slow(layer, index, dtype):
        time.sleep(0.05)
        return morph_sublayer(layer, index, dtype)

    morph_sublayer = morph_panel.morph_sublayer
    monkeypatch.setattr(morph_panel, "morph_sublayer", slow)
    net = small_net(blocks=10)
    panel.set_network(net)
    settle(qtbot, panel)
    measured = []
    panel.measured.connect(measured.append)
    panel.set_all_dtype("int8")
    panel.apply()
    qtbot.waitUntil(lambda: net.cells[0].cfg.dtype == "int8", timeout=5000)
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    settle(qtbot, panel)
    dtypes_now = [la.cfg.dtype for _, la in weighted_cells(net)]
    assert 0 < dtypes_now.count("int8") < len(dtypes_now) and measured == []
    assert [panel.table.cellWidget(i, DTYPE).currentText() for i in range(len(dtypes_now))] == dtypes_now
    assert "cancelled" in panel.status.text()


def test_save_as_writes_a_loom_checkpoint_of_the_morphed_network(qtbot, panel, tmp_path):
    net = small_net()
    panel.set_network(net)
    settle(qtbot, panel)
    choose(qtbot, panel.table.cellWidget(0, DTYPE), "fp8e4m3")
    qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    settle(qtbot, panel)
    path = str(tmp_path / "morphed.loom")
    with qtbot.waitSignal(panel.saved, timeout=10000):
        panel.save_as(path)
    loaded = load_network(path)
    x = probe_input(net)
    assert loaded.cells[0].cfg.dtype == "fp8e4m3"
    np.testing.assert_array_equal(loaded.forward(x), net.forward(x))


# ----- a real language model ------------------------------------------------------------------------
def test_morphing_one_mlp_of_smollm2_drifts_its_predictions_and_revert_undoes_it(qtbot, panel, tmp_path):
    from loomlab.core.llm.generate.textmodel import load_model

    text = "The quick brown fox jumps over the lazy dog while the cat sleeps."
    with load_model("smollm2-135m") as model:
        reference = llm_probe(model, text, max_tokens=16)
        panel.set_model(model, probe_text=text, max_probe_tokens=16)
        settle(qtbot, panel, 60000)
        assert panel.probe_label.text().endswith(f"“{text}” — {reference.ids.size} tokens")  # all of it
        assert panel.table.item(0, LAYER).text() == "token_embd"
        assert f"{model.net.parameter_count():,} parameters" in panel.title.text()
        assert panel.table.rowCount() == len(weighted_cells(model.net)) == 123
        row = next(i for i in range(123) if cell(panel, i, CELL) == (0, 0, 3, 0) and
                   panel.table.item(i, TYPE).text() == "SwiGLU")
        block = panel.table.item(row, LAYER).text().removesuffix(".ffn_gate/up/down")  # blk.2
        mine = {f"{block}.ffn_{p}.weight" for p in ("gate", "up", "down")}
        choose(qtbot, panel.table.cellWidget(row, DTYPE), "int8")
        with qtbot.waitSignal(panel.measured, timeout=60000) as measured:
            qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
        m = measured.args[0]
        mlp = model.net.cells[3].children[2].children[1]
        assert mlp.type_name == "SwiGLU" and mlp.cfg.dtype == "int8"
        assert_row_is(panel, row, layer_report(mlp, 3))
        assert m["kl_mean"] > 0 and 0 < m["top1_agreement"] <= 1
        direct = compare(reference, llm_probe(model, text, max_tokens=16))
        assert {k: m[k] for k in direct} == pytest.approx(direct, rel=1e-9)
        # the file's Q4_1 blocks of the MLP (gguf-py's reading) against one int8 byte a weight
        file = GGUFReader(registry.fetch("smollm2-135m"))
        q4_1 = sum(int(t.n_bytes) for t in file.tensors if t.name in mine)
        assert m["bytes_saved"] == q4_1 - mlp.weights.nbytes("int8") < 0  # int8 is larger than Q4_1
        out = tmp_path / "out.gguf"
        panel.export_gguf(str(out))  # GGUF has no int8 with Loom's per-layer scale
        refused = f"not exported: cannot export as GGUF: {block}.ffn_gate/up/down is int8"
        assert panel.status.text().startswith(refused) and not out.exists()

        with qtbot.waitSignal(panel.measured, timeout=60000) as measured:
            qtbot.mouseClick(panel.revert_button, Qt.MouseButton.LeftButton)
        m = measured.args[0]
        assert mlp.cfg.dtype == "float32"
        assert (m["kl_mean"], m["kl_max"], m["top1_agreement"]) == (0.0, 0.0, 1.0)

        # Q8_0 for that MLP, then the model exported as llama.cpp would read it
        choose(qtbot, panel.table.cellWidget(row, DTYPE), "Q8_0")
        with qtbot.waitSignal(panel.measured, timeout=60000):
            qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
        assert panel.export_button.isEnabled()
        with qtbot.waitSignal(panel.saved, timeout=60000) as saved:
            panel.export_gguf(str(out))
        assert saved.args == [str(out)] and panel.status.text().startswith(f"saved {out} (")
        types = {t.name: t.tensor_type.name for t in GGUFReader(out).tensors}
        source = {t.name: t.tensor_type.name for t in file.tensors}
        assert {name: types[name] for name in mine} == dict.fromkeys(mine, "Q8_0")
        assert {k: v for k, v in types.items() if k not in mine} == \
            {k: v for k, v in source.items() if k not in mine}
        panel.shutdown()


# ----- one drift with the CLI -------------------------------------------------------------------------
@pytest.mark.parametrize("case", ["transformer_block", "grid_2x1x2"])
def test_output_drift_is_the_number_net_morph_report_prints(qtbot, panel, tmp_path, capsys, case):
    network = next(c for c in json.loads(GOLDENS.read_text())["forward"] if c["name"] == case)["network"]
    path = tmp_path / "net.json"
    path.write_text(json.dumps(network))
    assert cli_main(["net", "morph-report", str(path), "--json"]) == 0
    cli = {row["dtype"]: row["output_drift"] for row in json.loads(capsys.readouterr().out)["rows"]}

    net = load_network(path)
    panel.set_network(net)
    settle(qtbot, panel)
    probe = probe_input(net)
    assert "shape " + "×".join(map(str, probe.shape)) in panel.probe_label.text()
    panel.set_all_dtype("int8")
    with qtbot.waitSignal(panel.measured, timeout=10000) as measured:
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    drift = measured.args[0]["output_drift"]
    assert drift == pytest.approx(cli["int8"], rel=1e-12) and drift > 1e-3  # relative: reads as drift
    assert f"{cli['int8']:.3e} relative" in panel.drift_label.text()


# ----- sorting, naming ----------------------------------------------------------------------------------
def varied_net() -> VolumetricNetwork:
    """Layers whose parameter counts sort differently as text ("1,200" < "48") and as numbers."""
    rng = np.random.default_rng(3)
    sizes = [(6, 8), (8, 150), (150, 8), (8, 30), (30, 40), (40, 3)]
    net = VolumetricNetwork(1, 1, len(sizes), 1)
    for x, (i, o) in enumerate(sizes):
        net[0, 0, x, 0] = make_layer("Dense", input_height=i, output_height=o, activation="Tanh", rng=rng)
    return net


def test_every_column_sorts_both_ways_numbers_as_numbers_and_combos_follow_their_rows(qtbot, panel):
    net = varied_net()
    morph_layer(net, 1, "int4")
    morph_layer(net, 4, "fp8e4m3")
    panel.set_network(net)
    settle(qtbot, panel)
    n = panel.table.rowCount()
    layers = {(0, 0, x, 0): net.cells[x] for x in range(n)}
    sort_keys = {CELL: lambda r: cell(panel, r, CELL), LAYER: lambda r: panel.table.item(r, LAYER).text(),
                 TYPE: lambda r: panel.table.item(r, TYPE).text(),
                 DTYPE: lambda r: panel.table.cellWidget(r, DTYPE).currentText(),
                 **{c: (lambda r, c=c: cell(panel, r, c))
                    for c in (PARAMS, BYTES, REL_ERROR, REL_MSE, COSINE)}}
    assert set(sort_keys) == set(range(len(COLUMNS)))
    for col, key in sort_keys.items():
        for order in (Qt.SortOrder.AscendingOrder, Qt.SortOrder.DescendingOrder):
            panel.table.horizontalHeader().setSortIndicator(col, order)  # a click on the header
            got = [key(r) for r in range(n)]
            assert got == sorted(got, reverse=order == Qt.SortOrder.DescendingOrder), (COLUMNS[col], got)
            for r in range(n):  # each row still shows its own layer, its combo included
                layer = layers[cell(panel, r, CELL)]
                assert panel.table.cellWidget(r, DTYPE).currentText() == layer.cfg.dtype
                assert cell(panel, r, PARAMS) == len(layer.weights)
    panel.table.horizontalHeader().setSortIndicator(PARAMS, Qt.SortOrder.AscendingOrder)
    shown = [panel.table.item(r, PARAMS).text() for r in range(n)]
    assert shown == ["48", "120", "240", "1,200", "1,200", "1,200"] != sorted(shown)


def test_worst_layer_is_named_with_its_cell(qtbot, panel):
    net = varied_net()
    panel.set_network(net)
    settle(qtbot, panel)
    panel.table.sortItems(PARAMS, Qt.SortOrder.DescendingOrder)  # sorted, a choice still hits its layer
    row = next(r for r in range(panel.table.rowCount()) if cell(panel, r, CELL) == (0, 0, 2, 0))
    choose(qtbot, panel.table.cellWidget(row, DTYPE), "int2")
    with qtbot.waitSignal(panel.measured, timeout=10000) as measured:
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    assert [la.cfg.dtype for la in net.cells] == ["float32"] * 2 + ["int2"] + ["float32"] * 3
    assert measured.args[0]["worst_layer"] == (0, 0, 2, 0, "")
    assert panel.error_label.text().startswith(f"{layer_label(net, (0, 0, 2, 0, ''))} (0, 0, 2, 0) (int2)")
    assert f"{layer_report(net.cells[2], 2).rel_error ** 2:.3e}" in panel.error_label.text()


# ----- linking with other panels ------------------------------------------------------------------------
def test_a_row_the_user_selects_is_announced_and_a_key_from_elsewhere_is_selected_quietly(qtbot, panel):
    net = small_net()
    panel.set_network(net)
    settle(qtbot, panel)
    heard = []
    panel.layer_selected.connect(heard.append)
    panel.table.sortItems(PARAMS, Qt.SortOrder.AscendingOrder)
    row = next(r for r in range(4) if cell(panel, r, CELL) == (0, 0, 1, 0)
               and panel.table.item(r, LAYER).text().endswith("sequential_layers[2]"))
    rect = panel.table.visualItemRect(panel.table.item(row, TYPE))
    qtbot.mouseClick(panel.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert heard == [(0, 0, 1, 0, "sequential_layers[2]")]
    panel.table.sortItems(CELL, Qt.SortOrder.DescendingOrder)  # a re-sort is no new selection
    assert heard == [(0, 0, 1, 0, "sequential_layers[2]")]

    assert panel.select_layer_key((0, 0, 0, 0, ""))
    assert panel.selected_layer_key() == (0, 0, 0, 0, "") and len(heard) == 1  # no echo
    assert panel.table.currentRow() == panel.table.row(panel.table.selectedItems()[0])
    assert not panel.select_layer_key((0, 0, 1, 0, "sequential_layers[1]"))  # a Residual: no weights
    assert panel.selected_layer_key() is None and len(heard) == 1
    panel.select_layer_key((0, 0, 2, 0, ""))
    rect = panel.table.visualItemRect(panel.table.item(panel.table.currentRow(), TYPE))
    qtbot.mouseClick(panel.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert len(heard) == 1  # clicking the row already shown as selected announces nothing new


# ----- layout and legibility ------------------------------------------------------------------------------
def test_docked_at_the_bottom_the_table_shows_many_rows_across_its_width_and_nothing_is_clipped(qtbot, panel):
    panel.resize(1600, 350)  # the Morph dock at the bottom of a 1600x1000 window
    panel.set_network(small_net(blocks=10))
    settle(qtbot, panel)
    table, header = panel.table, panel.table.horizontalHeader()
    assert table.rowCount() == 22
    visible = sum(1 for r in range(table.rowCount())
                  if 0 <= table.rowViewportPosition(r) and
                  table.rowViewportPosition(r) + table.rowHeight(r) <= table.viewport().height())
    assert visible >= 8
    assert header.length() >= table.viewport().width() - 1  # no empty band on the right
    for col in range(len(COLUMNS)):
        if col != LAYER:
            assert header.sectionSize(col) >= max(header.sectionSizeFromContents(col).width(),
                                                  table.sizeHintForColumn(col)), COLUMNS[col]
    assert header.sectionSize(LAYER) >= table.sizeHintForColumn(LAYER)
    _assert_nothing_clipped(panel)


def _assert_nothing_clipped(panel):
    from PySide6.QtWidgets import QAbstractButton, QComboBox, QLabel

    for w in panel.findChildren(QAbstractButton) + panel.findChildren(QLabel) + [panel.all_combo]:
        if w.isVisibleTo(panel) and w.parent() is not panel.table.viewport() \
                and not panel.table.isAncestorOf(w):
            assert w.visibleRegion().boundingRect() == w.rect(), (type(w).__name__, w.text()
                                                                   if hasattr(w, "text") else "")
            assert w.width() >= w.minimumSizeHint().width()
            if isinstance(w, QLabel) and not w.wordWrap():
                assert w.width() >= w.sizeHint().width(), w.text()
        assert not isinstance(w, QComboBox) or w.width() >= w.minimumSizeHint().width()


def test_legible_in_the_dark_theme(qtbot, qapp, runner):
    with dark_theme(qapp):
        panel = MorphPanel(runner)
        qtbot.addWidget(panel)
        panel.resize(1600, 350)
        panel.show()
        net = small_net()
        morph_layer(net, 0, "int8")  # a tinted row
        panel.set_network(net)
        settle(qtbot, panel)
        panel.set_all_dtype("int4")
        with qtbot.waitSignal(panel.measured, timeout=10000):
            panel.apply()
        assert panel.table.item(0, TYPE).background().style() != Qt.BrushStyle.NoBrush
        assert assert_legible(panel) >= 4 * len(COLUMNS) + 10
        panel.shutdown()


def test_one_expert_of_a_mixture_of_experts_morphs_alone(qtbot, panel):
    """The table lists each expert and the router as rows named by their tensors; choosing a dtype
    in one expert's row and applying morphs exactly that expert."""
    net = load_causal_lm(TINY / "tiny-mixtral")
    panel.set_network(net)
    settle(qtbot, panel)
    labels = [panel.table.item(r, LAYER).text() for r in range(panel.table.rowCount())]
    assert "blk.2.ffn_gate_inp" in labels
    row = labels.index("blk.2.ffn_gate_exps/up_exps/down_exps[1]")
    moe = next(la for la in net.cells[3].walk() if isinstance(la, LLMMixtureOfExperts))
    choose(qtbot, panel.table.cellWidget(row, DTYPE), "int8")
    with qtbot.waitSignal(panel.morphed, timeout=20000) as morphed:
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    settle(qtbot, panel)
    assert morphed.args[0] == [layer_report(moe.children[1], 3)]
    assert [la.cfg.dtype for _, la in weighted_cells(net) if la.cfg.dtype != "float32"] == ["int8"]
    assert moe.children[1].cfg.dtype == "int8"
