"""An evolved quantization recipe handed to the Morph panel: chosen even when Morph was not shown
since the model loaded, its "keep" genes as each layer's format as loaded (never refused), and
problems summed up in one short status line; the population table names the keep gene so."""

from __future__ import annotations

from pathlib import Path

import pytest

from loomlab.core.evolve.search.live import KEEP_GENE, member_rows
from loomlab.core.llm.generate.textmodel import TextModel
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.morph import weighted_cells
from loomlab.views.morph_panel import AS_LOADED, DTYPE, LAYER, MorphPanel

TINY_LLAMA = Path(__file__).resolve().parents[1] / "data" / "tiny-hf" / "tiny-llama"


class ByteTokenizer:
    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 250 for c in text]

    def close(self):
        pass


@pytest.fixture
def hidden_morph(qtbot, runner):
    """A Morph panel behind another tab (the window reports it hidden), given a model meanwhile."""
    panel = MorphPanel(runner)
    qtbot.addWidget(panel)
    panel.show()
    panel.set_shown(False)
    net = load_causal_lm(TINY_LLAMA)
    panel.set_model(TextModel(net, ByteTokenizer(), None, name="tiny-llama"), probe_text="abc")
    assert panel.table.rowCount() == 0  # not filled while hidden
    yield panel, net
    panel.shutdown()
    net.close()


def test_a_recipe_reaches_a_morph_panel_not_shown_since_the_model_loaded(hidden_morph):
    panel, net = hidden_morph
    layers = [la for _, la in weighted_cells(net)]
    names = ["token_embd", "blk.0.ffn_gate/up/down", "blk.1.attn_q/k/v/output", "output_norm"]
    recipe = {names[0]: AS_LOADED, names[1]: "int8", names[2]: "float16", names[3]: AS_LOADED}
    assert panel.choose_recipe(recipe) == 4
    assert panel.table.rowCount() == len(layers)
    shown = {panel.table.item(k, LAYER).text(): panel.table.cellWidget(k, DTYPE).currentText()
             for k in range(panel.table.rowCount())}
    # the oracle: "as loaded" is each layer's own encoding, which a row always takes
    as_loaded = {panel.table.item(k, LAYER).text(): layers[k].weights.encoding(layers[k].cfg.dtype)
                 for k in range(len(layers))}
    assert {n: shown[n] for n in names} == {names[0]: as_loaded[names[0]], names[1]: "int8",
                                            names[2]: "float16", names[3]: as_loaded[names[3]]}
    assert panel.status.text() == "recipe: 4 layers chosen; press Apply to morph them"


def test_a_recipe_naming_many_unknown_layers_is_one_short_line(hidden_morph):
    panel, _ = hidden_morph
    recipe = {f"blk.{n}.nothing": "int8" for n in range(100)} | {"blk.0.ffn_gate/up/down": "int8"}
    assert panel.choose_recipe(recipe) == 1
    assert panel.status.text() == ("recipe: 1 layer chosen; press Apply to morph them (no layer named "
                                   "blk.0.nothing, blk.1.nothing, blk.10.nothing and 97 more)")


def test_the_population_table_names_the_keep_gene_as_loaded():
    rows = member_rows([(KEEP_GENE, "int8", KEEP_GENE), (KEEP_GENE,) * 3], [1.0, 2.0], {})
    assert [r.layer_types for r in rows] == ["as loaded×3", "as loaded×2 int8×1"]
    assert rows[1].recipe == (KEEP_GENE, "int8", KEEP_GENE)  # the genes themselves stay the run's
