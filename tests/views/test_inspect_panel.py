"""The Inspect panel: each view shows the numbers core.inspect's headless API returns for the same
sequence, position and target (smollm2-135m, a 5-token prompt); using the views changes what is
computed; the model's changes reach the views; jobs are cancelled and joined; exports hold the
numbers shown; the panel fits a docked 1280x800 window."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
from PySide6.QtCore import Qt

from loomlab.core.inspect import Ablation, Inspector
from loomlab.views import inspect_export as export
from loomlab.views.inspect_panel import InspectPanel
from loomlab.views.inspect_views import TOP_BARS, mosaic, shown_token

from .jobs import settle
from .panel_layout import assert_unclipped

PROMPT = "The capital of France is"
CORRUPTED = "The capital of Italy is"
# what the panel gets docked behind the Chat tab of a 1280x800 window
DOCKED_1280 = (940, 470)


@pytest.fixture(scope="module")
def ins(smollm2):
    return Inspector(smollm2)


@pytest.fixture
def panel(qtbot, runner, smollm2):
    """The panel shown with smollm2, the prompt tokenised and its attention computed."""
    p = InspectPanel(runner)
    qtbot.addWidget(p)
    p.resize(1200, 640)
    p.show()
    p.set_model(smollm2)
    qtbot.waitUntil(lambda: p.result("attention") is not None, timeout=30000)
    yield p
    p.shutdown()


def shown(qtbot, panel, view: str):
    """Bring ``view`` to the front and wait for the result it computes by itself."""
    panel.show_view(view)
    qtbot.waitUntil(lambda: panel.result(view) is not None, timeout=30000)
    settle(qtbot, panel)
    return panel.result(view)


def test_the_prompt_shows_as_token_chips_and_a_click_selects_a_position(qtbot, panel, ins):
    ids = ins.prompt_ids(PROMPT)
    assert panel.tokens == ids
    assert [c.text() for c in panel.strip.chips] == [shown_token(t) for t in ins.token_texts(ids)]
    assert panel.position == len(ids) - 1 and panel.strip.selected() == len(ids) - 1
    qtbot.mouseClick(panel.strip.chips[1], Qt.MouseButton.LeftButton)
    assert panel.position == 1
    qtbot.waitUntil(lambda: panel.result("attention") is not None, timeout=30000)
    assert panel.attention_view.attending.values().shape == (30, 9)
    assert "position 1" in panel.attention_view.attending.getPlotItem().titleLabel.text


def test_attention_shows_the_api_patterns_and_a_thumbnail_click_its_head(qtbot, panel, ins):
    ids = ins.prompt_ids(PROMPT)
    settle(qtbot, panel)
    patterns = ins.patterns(ids)
    thumbnails = patterns.thumbnails()
    view = panel.attention_view
    assert np.array_equal(view.thumbnails.values(), mosaic(thumbnails), equal_nan=True)
    assert np.array_equal(view.thumbnail(3, 2), thumbnails[3, 2])
    n = thumbnails.shape[2]
    view.thumbnails.cell_clicked.emit(3 * (n + 1) + 1, 2 * (n + 1) + 1)  # a click inside L3 H2's thumbnail
    qtbot.waitUntil(lambda: panel.result("attention") is not None, timeout=30000)
    assert np.array_equal(view.pattern.values(), patterns.head(3, 2))
    assert view.pattern.getPlotItem().titleLabel.text == "layer 3 head 2"
    assert np.allclose(view.attending.values(), patterns.attending_to(len(ids) - 1))
    rows, _ = panel.export_rows("attention")
    pattern = [r for r in rows if r["what"] == "pattern"]
    assert len(pattern) == len(ids) * (len(ids) + 1) // 2
    assert pattern[-1]["weight"] == pytest.approx(float(patterns.head(3, 2)[-1, -1]))


def test_the_logit_lens_table_shows_the_api_lens_and_a_typed_target(qtbot, panel, ins):
    ids = ins.prompt_ids(PROMPT)
    table = panel.lens_view
    lens = shown(qtbot, panel, "lens")
    expected = ins.lens(ids, target=ins.attribution(ids).token)  # the model's top prediction at the end
    assert lens.target == expected.target == ins.token_id(" Paris")
    assert table.rowCount() == 31 and table.columnCount() == len(ids)
    assert [table.verticalHeaderItem(j).text() for j in range(31)] == expected.row_names
    for j in (0, 15, 30):
        for t in range(len(ids)):
            text, p = table.cell(j, t)
            assert text == shown_token(ins.token_texts([int(expected.top_ids[j, t, 0])])[0])
            assert p == pytest.approx(float(expected.top_probs[j, t, 0]), abs=1e-6)
    tip = table.item(30, len(ids) - 1).toolTip()
    assert f"probability {expected.target_probs[30, -1]:.4f}, rank 0" in tip
    # a typed target: the lens of that token
    panel.set_target_text(" London")
    qtbot.waitUntil(lambda: panel.result("lens") is not None, timeout=30000)
    settle(qtbot, panel)
    london = ins.lens(ids, target=ins.token_id(" London"))
    assert panel.result("lens").target == london.target
    assert np.allclose(panel.result("lens").target_probs, london.target_probs)
    assert f"probability {london.target_probs[30, -1]:.4f}, rank {london.target_ranks[30, -1]}" in \
        table.item(30, len(ids) - 1).toolTip()
    # a target that is not one token is refused, saying so
    panel.set_target_text(" Parisians and")
    qtbot.waitUntil(lambda: "not one" in panel.status.text(), timeout=30000)
    assert panel.result("lens") is None


def test_attribution_bars_are_the_api_shares_and_a_click_selects_the_layer(qtbot, panel, ins, smollm2):
    ids = ins.prompt_ids(PROMPT)
    panel.select_position(3)  # " France": the target is the model's prediction after it
    attribution = shown(qtbot, panel, "attribution")
    expected = ins.attribution(ids, None, 3)
    assert attribution.position == 3 and attribution.token == expected.token
    bars = panel.attribution_view.heights()
    top = expected.components()[:TOP_BARS]
    assert [b[0] for b in bars] == [export.component_label(*c[:3]) for c in top]
    assert np.allclose([b[1] for b in bars], [c[3] for c in top], atol=1e-5)
    # a bar of a head selects its block's attention layer; of an MLP, its MLP layer (block i is cell i + 1)
    picked = []
    panel.layer_selected.connect(picked.append)
    head = next(i for i, c in enumerate(top) if c[0] == "head")
    kind, layer, _, _ = top[head]
    panel.attribution_view.choose(head)
    block = smollm2.net.cells[layer + 1]
    attention = block.children[0].children[1]
    assert picked == [(*smollm2.net.coord(layer + 1), attention.path)]
    assert picked[0] == (*attention.coords, attention.path)
    panel.select_layer_key(None)
    panel.select_layer_key((*smollm2.net.coord(layer + 1), ""))  # another panel's selection
    assert panel.attribution_view._highlight == layer


def test_ticking_a_head_ablates_that_head_and_shows_both_continuations(qtbot, panel, ins):
    ids = ins.prompt_ids(PROMPT)
    panel.show_view("ablation")
    view = panel.ablation_view
    view.new_tokens.setValue(3)
    view.tick(3, 2)
    view.tick(5, "mlp")
    assert view.ablations() == [Ablation("head", 3, 2, "zero"), Ablation("mlp", 5, None, "zero")]
    view.mode_box.setCurrentText("mean")
    qtbot.mouseClick(view.rerun_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.result("ablation") is not None, timeout=30000)
    settle(qtbot, panel)
    result = panel.result("ablation")
    assert result.ablations == (Ablation("head", 3, 2, "mean"), Ablation("mlp", 5, None, "mean"))
    expected = ins.ablation(ids, result.ablations, new_tokens=3)
    assert (result.greedy_before, result.greedy_after) == (expected.greedy_before, expected.greedy_after)
    assert result.logprob_after == pytest.approx(expected.logprob_after, abs=1e-6)
    assert f"{expected.logprob_before:.4f} → {expected.logprob_after:.4f}" in view.logprob_label.text()
    before = "".join(ins.token_texts(expected.greedy_before))
    assert before.replace("\n", "↵") in view.before_label.text().replace("&#x27;", "'")
    # disabling is a block's: the API's refusal is shown
    view.clear_ticks()
    view.tick(2, "block")
    view.mode_box.setCurrentText("disable")
    panel.compute("ablation")
    qtbot.waitUntil(lambda: panel.result("ablation") is not None, timeout=30000)
    assert panel.result("ablation").ablations == (Ablation("block", 2, None, "disable"),)


def test_patching_shows_the_api_grid_and_refuses_a_corrupted_prompt_of_another_length(qtbot, panel, ins):
    ids = ins.prompt_ids(PROMPT)
    panel.show_view("patching")
    view = panel.patching_view
    view.corrupted_edit.setText(CORRUPTED + " a")
    qtbot.mouseClick(view.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "equally long" in view.error_label.text(), timeout=30000)
    assert "6 tokens" in view.error_label.text() and panel.result("patching") is None
    view.corrupted_edit.setText(CORRUPTED)
    panel.compute("patching")
    qtbot.waitUntil(lambda: panel.result("patching") is not None, timeout=60000)
    settle(qtbot, panel)
    assert view.error_label.text() == ""
    expected = ins.patching(ids, ins.prompt_ids(CORRUPTED))
    grid = panel.result("patching")
    assert (grid.answer, grid.wrong) == (expected.answer, expected.wrong)
    assert np.allclose(view.heatmap.values(), expected.restored, atol=1e-4)
    assert "' Paris' vs ' Rome'" in view.summary_label.text()
    rows = export.patching_rows(grid, ins.token_texts(ids))
    assert len(rows) == 30 * len(ids) and rows[0]["restored share"] == pytest.approx(expected.restored[0, 0])


def test_cancel_stops_a_patching_grid(qtbot, panel):
    panel.show_view("patching")
    panel.patching_view.corrupted_edit.setText(CORRUPTED)
    panel.patching_view.site_box.setCurrentText("z")
    panel.compute("patching")
    qtbot.waitUntil(lambda: panel.progress.isVisible() and "patching" in panel.status.text(), timeout=30000)
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    settle(qtbot, panel)
    assert panel.status.text() == "cancelled" and panel.result("patching") is None


def test_the_models_changes_reach_the_views(qtbot, panel, ins, smollm2):
    ids = ins.prompt_ids(PROMPT)
    before = shown(qtbot, panel, "lens")
    switch = smollm2.net.cells[1 + 20].cfg  # block 20, as Loom's is_disabled switches it off
    switch.is_disabled = True
    try:
        panel.refresh()
        qtbot.waitUntil(lambda: panel.result("lens") is not None, timeout=30000)
        settle(qtbot, panel)
        changed = ins.lens(ids, target=panel.target)
    finally:
        switch.is_disabled = False
    assert not np.allclose(changed.top_probs, before.top_probs)
    assert np.allclose(panel.result("lens").top_probs, changed.top_probs)
    assert panel.lens_view.cell(30, 4)[1] == pytest.approx(float(changed.top_probs[30, 4, 0]), abs=1e-6)
    panel.clear_model()
    assert panel.tokens == [] and panel.lens_view.rowCount() == 0 and not panel.prompt_edit.isEnabled()


def test_chat_turns_are_offered_and_read_as_the_model_read_them(qtbot, panel, ins):
    chat = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
            {"role": "user", "content": "Capital of France?"}, {"role": "assistant", "content": "Paris."}]
    panel.set_conversation_source(lambda: chat)
    panel.pull_conversation()
    assert [panel.source_box.itemText(i) for i in range(panel.source_box.count())] == \
        ["Prompt", "Turn 1: Hi", "Turn 2: Capital of France?"]
    panel.use_turn(0)
    qtbot.waitUntil(lambda: panel.tokens == ins.chat_ids(chat[:2]), timeout=30000)
    assert panel.source_box.currentIndex() == 1
    panel.source_box.activated.emit(2)  # as picking it in the list does
    qtbot.waitUntil(lambda: panel.tokens == ins.chat_ids(chat), timeout=30000)
    qtbot.waitUntil(lambda: panel.result("attention") is not None, timeout=30000)
    settle(qtbot, panel)


def test_exports_hold_the_numbers_shown(qtbot, panel, ins, tmp_path):
    lens = shown(qtbot, panel, "lens")
    texts = ins.token_texts(ins.prompt_ids(PROMPT))
    panel.export_csv(str(tmp_path / "lens.csv"))
    panel.export_json(str(tmp_path / "lens.json"))
    panel.export_png(str(tmp_path / "lens.png"))
    with open(tmp_path / "lens.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 31 * len(texts)
    last = rows[-1]
    assert (last["layer"], int(last["position"])) == ("block 29", len(texts) - 1)
    assert float(last["probability"]) == pytest.approx(float(lens.top_probs[30, -1, 0]), rel=1e-6)
    doc = json.loads((tmp_path / "lens.json").read_text())
    assert doc["view"] == "lens" and doc["inputs"]["token texts"] == texts
    assert doc["rows"][0]["top token"] == ins.token_texts([int(lens.top_ids[0, 0, 0])])[0]
    assert (tmp_path / "lens.png").stat().st_size > 1000
    attribution = shown(qtbot, panel, "attribution")
    rows = export.attribution_rows(attribution)
    assert sum(r["share"] for r in rows) == pytest.approx(attribution.logit, rel=1e-3)
    assert rows[0]["component"] == panel.attribution_view.heights()[0][0]


def test_export_rows_are_plain_numbers(ins):
    """The pure functions behind CSV and JSON, on a made-up ablation and patching grid."""
    from loomlab.core.inspect import AblationResult, PatchGrid

    name = {1: "a", 2: "b", 3: "c"}.get
    result = AblationResult((Ablation("head", 0, 1),), [1, 2], 3, -1.0, -2.5, [1, 2], [1, 3])
    assert export.ablation_rows(result, name) == [{"step": 0, "before": "a", "after": "a", "changed": False},
                                                  {"step": 1, "before": "b", "after": "c", "changed": True}]
    assert export.ablation_summary(result, name)["logprob delta"] == -1.5
    grid = PatchGrid("z", [1, 2], [1, 3], 2, 3, 4.0, 0.0, np.array([[2.0, 4.0]]))
    rows = export.patching_rows(grid, ["a", "b"])
    assert [(r["head"], r["restored share"]) for r in rows] == [(0, 0.5), (1, 1.0)]
    flat = PatchGrid("resid_pre", [1], [1], 2, 3, 1.0, 1.0, np.array([[1.0]]))
    assert export.patching_rows(flat, ["a"])[0]["restored share"] is None  # nothing to restore: no NaN
    doc = json.loads(export.to_json("patching", {}, export.patching_rows(flat, ["a"])))
    assert doc["rows"][0]["token"] == "a"
    assert export.to_csv([{"x": 1, "y": "a,b"}]) == 'x,y\n1,"a,b"\n'


def test_the_panel_fits_a_docked_1280x800_window(qtbot, panel):
    panel.resize(*DOCKED_1280)
    need = panel.minimumSizeHint()
    assert need.width() <= DOCKED_1280[0] and need.height() <= DOCKED_1280[1]
    for view in ("ablation", "patching"):
        panel.show_view(view)
        qtbot.wait(50)
        assert assert_unclipped(panel) > 10
