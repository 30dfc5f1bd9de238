"""The Morph panel: the table follows the network, choices in the table morph the network in a job,
and the measures equal core's numbers (morph.layer_report, morph_probe) computed directly."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import Qt

from loomlab.core import VolumetricNetwork, load_network, make_layer
from loomlab.core.morph import layer_report, morph_layer, probe_input, report, weighted_cells
from loomlab.core.morph_probe import compare, llm_probe, net_drift, net_outputs
from loomlab.views import morph_panel
from loomlab.views.morph_panel import (
    BYTES,
    CELL,
    COSINE,
    DTYPE,
    PARAMS,
    PATH,
    REL_ERROR,
    REL_MSE,
    TYPE,
    MorphPanel,
)
from loomlab.views.workers import JobRunner

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
def runner():
    r = JobRunner()
    yield r
    assert r.shutdown()


@pytest.fixture
def panel(qtbot, runner):
    p = MorphPanel(runner)
    qtbot.addWidget(p)
    p.resize(900, 520)
    p.show()
    yield p
    p.shutdown()


def settle(qtbot, panel, timeout=20000):
    qtbot.waitUntil(lambda: not panel.is_busy(), timeout=timeout)


def cell(panel, row, col):
    return panel.table.item(row, col).data(USER)


def choose(qtbot, combo, dtype):
    """Pick ``dtype`` the way a person does with the keyboard: focus the combo and type its name."""
    combo.setFocus()
    qtbot.keyClicks(combo, dtype)
    assert combo.currentText() == dtype


def assert_row_is(panel, row, r):
    assert cell(panel, row, CELL) == r.index and cell(panel, row, PATH) == r.path
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
    assert panel.table.item(1, PATH).text() == "seq[0]"

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
    assert m["mse"] == net_drift(net_outputs(twin, probe), net, probe) and m["mse"] > 0
    assert m["rel_mse_max"] == pytest.approx(expected.rel_error ** 2)
    assert "saved 192 B" in panel.memory_label.text()


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
    assert measured.args[0]["mse"] == pytest.approx(np.mean((net.forward(x) - y0.astype(np.float64)) ** 2))
    assert not np.array_equal(net.forward(x), y0)
    for row, r in enumerate(report(net)):
        assert_row_is(panel, row, r)

    with qtbot.waitSignal(panel.measured, timeout=10000) as measured:
        qtbot.mouseClick(panel.revert_button, Qt.MouseButton.LeftButton)
    assert {la.cfg.dtype for _, la in weighted_cells(net)} == {"float32"}
    assert np.array_equal(net.forward(x), y0)
    assert measured.args[0]["mse"] == 0.0 and measured.args[0]["bytes_saved"] == 0
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
def test_morphing_one_mlp_of_smollm2_drifts_its_predictions_and_revert_undoes_it(qtbot, panel):
    from loomlab.core.llm.textmodel import load_model

    text = "The quick brown fox jumps over the lazy dog while the cat sleeps."
    with load_model("smollm2-135m") as model:
        reference = llm_probe(model, text, max_tokens=16)
        panel.set_model(model, probe_text=text, max_probe_tokens=16)
        settle(qtbot, panel, 60000)
        assert panel.table.rowCount() == len(weighted_cells(model.net)) == 123
        row = next(i for i in range(123) if cell(panel, i, CELL) == 3 and
                   panel.table.item(i, TYPE).text() == "SwiGLU")
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
        assert m["bytes_saved"] == mlp.weights.nbytes("float32") - mlp.weights.nbytes("int8")

        with qtbot.waitSignal(panel.measured, timeout=60000) as measured:
            qtbot.mouseClick(panel.revert_button, Qt.MouseButton.LeftButton)
        m = measured.args[0]
        assert mlp.cfg.dtype == "float32"
        assert (m["kl_mean"], m["kl_max"], m["top1_agreement"]) == (0.0, 0.0, 1.0)
        panel.shutdown()
