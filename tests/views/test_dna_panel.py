"""The DNA panel: comparisons shown equal core's (compare_dna, the sketches) computed directly, the
form's settings reach splice / merge_models (children equal to direct calls, byte for byte), cancel,
bad input as one message, and the Topology panel's logic-shift arrows."""

from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt
from safetensors.numpy import load_file, save_file

from loomlab.core import VolumetricNetwork, make_layer, save_network
from loomlab.core.evolve import NEATConfig, get_task, neat_mutate
from loomlab.core.evolve.genetics.clone import clone_network
from loomlab.core.evolve.genetics.dna import compare_dna
from loomlab.core.evolve.genetics.splicing import SpliceConfig, splice
from loomlab.core.evolve.llm.dna_table import model_report
from loomlab.core.evolve.llm.sketch import compare_models
from loomlab.core.io.loom_json import dumps
from loomlab.core.llm.quality.merge import merge_models
from loomlab.core.morph import morph_layer
from loomlab.views import dna_panel
from loomlab.views.dna_panel import LAYER, OVERLAP, POSITION, DNAPanel

from .jobs import choose, settle
from .panel_layout import assert_tick_labels_apart, drawn_tick_labels, on_screen

USER = Qt.ItemDataRole.UserRole
TINY = Path(__file__).resolve().parents[1] / "data" / "tiny-hf"
CLICK = Qt.MouseButton.LeftButton


def xor_pair(seed: int = 3) -> tuple[VolumetricNetwork, VolumetricNetwork]:
    net = get_task("xor").seed_network()
    return net, neat_mutate(net, NEATConfig(seed=seed, weight_perturb_scale=0.5))


def swapped_pair() -> tuple[VolumetricNetwork, VolumetricNetwork]:
    """Four 8x8 Dense layers and a copy with the first two swapped: two logic shifts."""
    rng = np.random.default_rng(5)
    a = VolumetricNetwork(1, 1, 2, 2)
    for coord in ((0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 0, 1, 1)):
        a[coord] = make_layer("Dense", input_height=8, output_height=8, activation="Tanh", rng=rng)
    b = clone_network(a)
    first, second = b[0, 0, 0, 0], b[0, 0, 0, 1]
    b[0, 0, 0, 0], b[0, 0, 0, 1] = second, first
    return a, b


def variant(tmp_path: Path, seed: int, name: str = "tiny-llama", scale: float = 0.05) -> Path:
    """A copy of a tiny HF checkpoint with every tensor nudged by seeded noise."""
    folder = tmp_path / f"{name}-{seed}"
    shutil.copytree(TINY / name, folder)
    weights = load_file(str(TINY / name / "model.safetensors"))
    rng = np.random.default_rng(seed)
    nudged = {k: (v + scale * v.std() * rng.standard_normal(v.shape)).astype(v.dtype)
              for k, v in weights.items()}
    save_file(nudged, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def panel(qtbot, runner):
    with on_screen(qtbot, DNAPanel(runner), 1100, 800) as p:
        yield p


def column(table, col: int) -> list:
    return [table.item(r, col).data(USER) for r in range(table.rowCount())]


def compare(qtbot, panel, timeout=20000):
    with qtbot.waitSignal(panel.compared, timeout=timeout) as done:
        qtbot.mouseClick(panel.compare_button, CLICK)
    settle(qtbot, panel, timeout)
    return done.args[0]


def status_text(panel) -> str:
    return panel.status.text()


# ----- engine -> view ---------------------------------------------------------------------------------
def test_comparing_two_networks_shows_compare_dna(qtbot, panel):
    a, b = xor_pair()
    panel.set_pair(a, b, ("seed", "mutant"))
    compare(qtbot, panel)
    direct = compare_dna(a, b)
    assert column(panel.table, POSITION) == list(direct.layer_overlaps)
    assert column(panel.table, OVERLAP) == list(direct.layer_overlaps.values())
    assert column(panel.table, LAYER) == ["Dense", "Dense"]
    assert f"{direct.overall_overlap:.6f}" in panel.overall_label.text()
    # one heatmap row per grid cell, one column per layer slot: XOR's grid is 1x1x1x2
    assert panel.heatmap_values.tolist() == [list(direct.layer_overlaps.values())]
    assert np.array_equal(panel.image.image, panel.heatmap_values)
    assert panel.shifts_table.rowCount() == len(direct.logic_shifts) == 0


def test_logic_shifts_are_tabled_announced_and_drawn_as_arrows_in_the_topology(qtbot, panel, runner):
    from loomlab.views.topology_panel import TopologyPanel

    a, b = swapped_pair()
    panel.set_pair(a, b)
    with qtbot.waitSignal(panel.logic_shifts_changed, timeout=20000) as announced:
        qtbot.mouseClick(panel.compare_button, CLICK)
    settle(qtbot, panel)
    direct = compare_dna(a, b)
    expected = [(s.source_pos, s.target_pos, s.overlap) for s in direct.logic_shifts]
    assert [(s, t) for s, t, _ in expected] == [("0,0,0,0", "0,0,0,1"), ("0,0,0,1", "0,0,0,0")]
    assert announced.args[0] == expected
    shown = list(zip(column(panel.shifts_table, 0), column(panel.shifts_table, 1),
                     column(panel.shifts_table, 2), strict=True))
    assert shown == expected
    assert direct.layer_overlaps["0,0,1,0"] == pytest.approx(1.0, abs=1e-6)
    assert column(panel.table, OVERLAP) == list(direct.layer_overlaps.values())

    topology = TopologyPanel(runner=runner)
    qtbot.addWidget(topology)
    topology.resize(800, 500)
    topology.show()
    qtbot.waitExposed(topology)
    topology.set_network(a)
    panel.logic_shifts_changed.connect(topology.show_logic_shifts)
    panel.logic_shifts_changed.emit(announced.args[0])
    keys, positions = topology.topology.keys, topology.topology.positions
    first, second = (positions[keys[(0, 0, 0, l, "")]].tolist() for l in (0, 1))  # noqa: E741
    assert [(s.tolist(), t.tolist(), o) for s, t, o in topology.shift_arrows] == [
        (first, second, expected[0][2]), (second, first, expected[1][2])]
    lines = topology.shift_lines.pos
    assert topology.shift_lines.visible() and len(lines) == 16  # 4 strokes an arrow, 2 points a stroke
    assert lines[3].tolist() == positions[keys[(0, 0, 0, 1, "")]].tolist()  # the arc ends at the target
    # positions this network lacks are skipped; a new network clears the arrows
    assert topology.show_logic_shifts([("0,0,0,0", "5,5,5,5", 0.9), ((0, 0, 1, 0), (0, 0, 1, 1), 0.95)]) == 1
    topology.set_network(b)
    assert topology.shift_arrows == [] and not topology.shift_lines.visible()
    topology.shutdown()


def test_across_dtypes_reaches_compare_dna(qtbot, panel):
    a = get_task("xor").seed_network()
    b = clone_network(a)
    for index in range(len(list(b.layers()))):
        morph_layer(b, index, "int8")
    panel.set_pair(a, b, ("float32", "int8"))
    compare(qtbot, panel)
    assert column(panel.table, OVERLAP) == list(compare_dna(a, b).layer_overlaps.values()) == [0.0, 0.0]
    panel.across_dtypes.setChecked(True)
    compare(qtbot, panel)
    across = compare_dna(a, b, across_dtypes=True)
    assert column(panel.table, OVERLAP) == list(across.layer_overlaps.values())
    assert min(across.layer_overlaps.values()) > 0.99


def test_the_overlap_column_sorts_as_numbers(qtbot, panel):
    a, b = swapped_pair()
    b[0, 0, 1, 1].weights.master = b[0, 0, 1, 1].weights.master * -1  # an overlap of -1
    panel.set_pair(a, b)
    compare(qtbot, panel)
    header = panel.table.horizontalHeader()
    panel.table.sortItems(OVERLAP, Qt.SortOrder.AscendingOrder)
    values = column(panel.table, OVERLAP)
    assert values == sorted(values) and values[0] == pytest.approx(-1.0, abs=1e-6)
    panel.table.sortItems(OVERLAP, Qt.SortOrder.DescendingOrder)
    assert column(panel.table, OVERLAP) == sorted(values, reverse=True)
    assert header.isSortIndicatorShown() or panel.table.isSortingEnabled()
    # a row keeps its position and name together whatever the order
    direct = compare_dna(a, b).layer_overlaps
    pairs = zip(column(panel.table, POSITION), column(panel.table, OVERLAP), strict=True)
    assert dict(pairs) == direct


def test_networks_picked_as_files(qtbot, panel, tmp_path):
    a, b = xor_pair()
    save_network(a, tmp_path / "a.json")
    save_network(b, tmp_path / "b.loom")
    panel.picker_a.set_text(str(tmp_path / "a.json"))
    panel.picker_b.set_text(str(tmp_path / "b.loom"))
    compare(qtbot, panel)
    assert column(panel.table, OVERLAP) == list(compare_dna(a, b).layer_overlaps.values())


def test_show_example_fills_the_panel_at_once(qtbot, panel):
    a, b = DNAPanel.example_pair()
    panel.show_example(a, b, ("XOR seed", "mutant"))
    assert not panel.is_busy()
    assert column(panel.table, OVERLAP) == list(compare_dna(a, b).layer_overlaps.values())
    assert panel.heatmap_values.shape == (1, 2)
    assert "Overall overlap" in panel.overall_label.text()


# ----- view -> engine ---------------------------------------------------------------------------------
@pytest.mark.parametrize("mode", ["blend", "point", "uniform"])
def test_splice_with_the_forms_settings_equals_splice_called_directly(qtbot, panel, mode):
    a, b = xor_pair()
    panel.set_pair(a, b, ("seed", "mutant"))
    choose(qtbot, panel.mode_box, mode)
    panel.alpha_box.setValue(0.3)
    panel.split_box.setValue(0.25)
    panel.seed_box.setValue(42)
    if mode == "uniform":
        panel.fitness_a_box.setValue(3.0)
        panel.fitness_b_box.setValue(1.0)
    with qtbot.waitSignal(panel.child_ready, timeout=20000) as ready:
        qtbot.mouseClick(panel.splice_button, CLICK)
    settle(qtbot, panel)
    child, name = ready.args
    fitness = (3.0, 1.0) if mode == "uniform" else (0.0, 0.0)
    config = SpliceConfig(mode=mode, blend_alpha=0.3, split_ratio=0.25, seed=42, fitness_a=fitness[0],
                          fitness_b=fitness[1])
    assert panel.splice_config() == config
    direct = splice(a, b, config).child
    assert dumps(child) == dumps(direct)
    assert dumps(child) != dumps(a) and dumps(child) != dumps(b)
    assert name == f"seed × mutant ({mode})"


def test_merge_writes_the_folder_merge_models_writes(qtbot, panel, tmp_path):
    a, b = variant(tmp_path, 1), variant(tmp_path, 2)
    panel.picker_a.set_text(str(a))
    panel.picker_b.set_text(str(b))
    choose(qtbot, panel.method_box, "slerp")
    panel.t_edit.setText("0.2, 0.9")
    panel.out_edit.setText(str(tmp_path / "merged"))
    with qtbot.waitSignal(panel.child_ready, timeout=30000) as ready:
        qtbot.mouseClick(panel.merge_button, CLICK)
    settle(qtbot, panel)
    path, name = ready.args
    assert path == str(tmp_path / "merged") and name == f"{a.name} + {b.name} (slerp)"
    direct = merge_models(a, b, tmp_path / "direct", method="slerp", t=[0.2, 0.9])
    assert (Path(path) / "model.safetensors").read_bytes() == (direct / "model.safetensors").read_bytes()


def test_task_arithmetic_takes_a_base_and_weights(qtbot, panel, tmp_path):
    a, b = variant(tmp_path, 1), variant(tmp_path, 2)
    panel.set_pair(str(a), str(b))
    choose(qtbot, panel.method_box, "task")
    assert not panel.t_edit.isEnabled() and panel.base_edit.isEnabled()
    panel.out_edit.setText(str(tmp_path / "merged"))
    qtbot.mouseClick(panel.merge_button, CLICK)
    assert "needs a base" in status_text(panel) and not panel.is_busy()
    panel.base_edit.setText(str(TINY / "tiny-llama"))
    panel.weights_edit.setText("0.5, 1.5")
    with qtbot.waitSignal(panel.child_ready, timeout=30000):
        qtbot.mouseClick(panel.merge_button, CLICK)
    settle(qtbot, panel)
    direct = merge_models(a, b, tmp_path / "direct", method="task", base=TINY / "tiny-llama",
                          weights=[0.5, 1.5])
    merged = tmp_path / "merged" / "model.safetensors"
    assert merged.read_bytes() == (direct / "model.safetensors").read_bytes()


# ----- language models --------------------------------------------------------------------------------
def test_two_language_models_compare_by_sketch_with_progress_per_layer(qtbot, panel, tmp_path):
    a, b = TINY / "tiny-llama", variant(tmp_path, 3, scale=0.5)
    panel.set_pair(str(a), str(b), ("tiny", "nudged"))
    stages = []
    show = panel._on_progress
    panel._on_progress = lambda stage, d, t: (stages.append((stage, d, t)), show(stage, d, t))
    with qtbot.waitSignal(panel.compared, timeout=30000) as done:
        qtbot.mouseClick(panel.compare_button, CLICK)
    settle(qtbot, panel)
    report = done.args[0]
    direct = compare_models(str(a), str(b))
    assert report.comparison == direct
    rows = model_report(str(a), str(b)).rows
    assert column(panel.table, OVERLAP) == [r.overlap for r in rows]
    assert column(panel.table, LAYER) == [r.name for r in rows]
    cells = {r.key: r.overlap for r in rows if not r.path}
    assert cells == direct.layer_overlaps  # whole blocks and top-level layers are compare_models'
    # blocks down, sub-layers across
    assert panel.heatmap_values.shape == (3, 4)
    subs = [r.overlap for r in rows if r.path]
    assert panel.heatmap_values.ravel().tolist() == subs
    # per weighted layer: 3 blocks x 4 sub-layers, the embedding, the final norm and the head
    assert ("sketch A", 15, 15) in stages and ("sketch B", 15, 15) in stages
    assert 0.5 < direct.overall_overlap < 1.0
    assert not panel.splice_button.isEnabled() and panel.merge_button.isEnabled()


def test_cancel_stops_a_comparison_between_layers(qtbot, panel, monkeypatch, tmp_path):
    started, release = threading.Event(), threading.Event()
    real = dna_panel.model_report

    def slow(a, b, *, progress, cancel):
        def report(stage, done, total):
            started.set()
            while not cancel() and not release.wait(0.01):
                pass
            progress(stage, done, total)

        return real(a, b, progress=report, cancel=cancel)

    monkeypatch.setattr(dna_panel, "model_report", slow)
    panel.set_pair(str(TINY / "tiny-llama"), str(TINY / "tiny-llama"))
    qtbot.mouseClick(panel.compare_button, CLICK)
    assert started.wait(10) and panel.is_busy() and panel.cancel_button.isEnabled()
    with qtbot.assertNotEmitted(panel.compared):
        qtbot.mouseClick(panel.cancel_button, CLICK)
        settle(qtbot, panel)
    release.set()
    assert "compare cancelled" in status_text(panel)
    assert panel.report is None and panel.table.rowCount() == 0
    assert panel.compare_button.isEnabled() and not panel.cancel_button.isEnabled()


# ----- bad input ----------------------------------------------------------------------------------------
def test_bad_input_gives_one_message_and_no_crash(qtbot, panel, tmp_path):
    messages = []
    panel.failed.connect(messages.append)

    qtbot.mouseClick(panel.compare_button, CLICK)  # nothing picked
    assert messages[-1] == "pick two networks or two language models (A and B)"

    bad = tmp_path / "bad.json"
    bad.write_text("{ not json")
    a, _ = xor_pair()
    panel.set_pair(a, str(bad), ("seed", "bad.json"))
    with qtbot.waitSignal(panel.failed, timeout=20000):
        qtbot.mouseClick(panel.compare_button, CLICK)
    settle(qtbot, panel)
    assert messages[-1].startswith("compare failed: ") and "Traceback" not in messages[-1]
    assert "compare failed" in status_text(panel) and panel.report is None

    panel.set_pair(a, str(TINY / "tiny-llama"), ("seed", "tiny-llama"))
    qtbot.mouseClick(panel.compare_button, CLICK)
    assert messages[-1] == "A is a network and B a language model: pick two networks or two language models"
    qtbot.mouseClick(panel.splice_button, CLICK)
    assert not panel.is_busy() and len(messages) == 4

    panel.set_pair(str(TINY / "tiny-llama"), str(tmp_path / "no-such-model"))
    with qtbot.waitSignal(panel.failed, timeout=20000):
        qtbot.mouseClick(panel.compare_button, CLICK)
    settle(qtbot, panel)
    assert messages[-1].startswith("compare failed: ")

    # models of different shapes cannot be merged: merge_models' reason, before anything is written
    panel.set_pair(str(TINY / "tiny-llama"), str(TINY / "tiny-gemma3"))
    panel.out_edit.setText(str(tmp_path / "merged"))
    panel.t_edit.setText("half")
    qtbot.mouseClick(panel.merge_button, CLICK)
    assert messages[-1] == "t takes numbers separated by commas, got 'half'"
    panel.t_edit.setText("0.5")
    with qtbot.waitSignal(panel.failed, timeout=20000):
        qtbot.mouseClick(panel.merge_button, CLICK)
    settle(qtbot, panel)
    assert messages[-1].startswith("merge failed: ") and not (tmp_path / "merged").exists()

    a, b = xor_pair()
    panel.set_pair(a, b)
    assert not panel.merge_button.isEnabled() and panel.splice_button.isEnabled()
    panel.merge()
    assert messages[-1] == "merge takes two language models; splice two networks instead"


def test_smollm2_and_its_morphed_copy(qtbot, panel):
    """The loaded model and a copy with one MLP morphed to int8: every layer overlaps 1 but that
    MLP, which stays close (compared across dtypes); the cells are compare_models' numbers."""
    from loomlab.core.llm.generate.textmodel import load_model
    from loomlab.core.morph import morph_sublayer

    with load_model("smollm2-135m") as model, load_model("smollm2-135m") as copy:
        mlp = copy.net.cells[3].children[2].children[1]
        assert mlp.type_name == "SwiGLU"
        morph_sublayer(mlp, 3, "int8")
        panel.set_pair(model, copy, ("smollm2", "smollm2 int8 MLP"))
        assert panel.merge_button.isEnabled() and not panel.splice_button.isEnabled()
        report = compare(qtbot, panel, timeout=60000)
        assert report.comparison == compare_models(model, copy)
        assert panel.heatmap_values.shape == (30, 4)
        changed = panel.heatmap_values[2, 3]  # block 2 (grid cell 3), ffn_gate/up/down
        assert 0.99 < changed < 0.9999, changed
        others = np.delete(panel.heatmap_values.ravel(), 2 * 4 + 3)
        assert np.all(others == 1.0)  # untouched layers: identical sketches score exactly 1


# ----- colours scaled to the data, labels that do not overprint -----------------------------------------
def test_a_model_against_its_morphed_copy_colours_the_morphed_layer_apart(qtbot, panel):
    from loomlab.core.llm.model.loader import load_causal_lm
    from loomlab.core.morph import morph_sublayer

    a, b = load_causal_lm(TINY / "tiny-llama"), load_causal_lm(TINY / "tiny-llama")
    try:
        morph_sublayer(b.cells[2].children[2].children[1], 2, "int8")  # block 1's MLP
        panel.set_pair(a, b)
        compare(qtbot, panel)
        values = panel.heatmap_values[np.isfinite(panel.heatmap_values)]
        lowest = values.min()
        assert 0.99 < lowest < 1 and np.count_nonzero(values < 1) == 1  # the rest exactly 1
        # the colour scale spans the data, so that one cell is at the bottom of it, the rest at the top
        assert tuple(panel.image.levels) == (lowest, 1.0) == tuple(panel.colorbar.levels())
    finally:
        a.close()
        b.close()


def test_many_rows_are_labelled_every_few_rows_without_overprinting(qtbot, panel):
    rng = np.random.default_rng(2)
    a = VolumetricNetwork(1, 30, 1, 1)
    for y in range(30):
        a[0, y, 0, 0] = make_layer("Dense", input_height=4, output_height=4, rng=rng)
    b = clone_network(a)
    morph_layer(b, 3, "float16")
    panel.resize(900, 420)  # docked: the heatmap a couple of hundred pixels tall
    qtbot.wait(50)
    panel.set_pair(a, b)
    panel.across_dtypes.setChecked(True)
    compare(qtbot, panel)
    assert panel.heatmap_values.shape == (30, 1)
    qtbot.wait(50)  # the axes follow the new range
    axis = panel.heatmap.getPlotItem().getAxis("left")
    step = dna_panel.row_label_step(30, panel.heatmap.getPlotItem().getViewBox().height())
    assert step > 1  # 30 labels would not fit
    assert [text for *_, text in drawn_tick_labels(axis)] == [f"0,{y},0" for y in range(0, 30, step)]
    assert_tick_labels_apart(axis)
