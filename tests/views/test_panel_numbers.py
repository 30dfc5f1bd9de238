"""The numbers panels show about one network agree: its parts (cells, blocks, layers, weighted
layers) in the same words in Topology, Morph and Models, sizes in one unit, and a change in size
said as what it is (a morph that makes the network larger "grew")."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PySide6.QtCore import Qt

from loomlab.core import VolumetricNetwork, make_layer
from loomlab.core.layer_names import model_parts
from loomlab.core.llm.generate.textmodel import TextModel
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.morph import weighted_cells
from loomlab.views.morph_panel import DTYPE, LAYER, MorphPanel
from loomlab.views.topology_panel import TopologyPanel

from .jobs import choose, settle
from .panel_layout import on_screen

TINY_LLAMA = Path(__file__).resolve().parent.parent / "data" / "tiny-hf" / "tiny-llama"


def small_net(cells: int = 3) -> VolumetricNetwork:
    rng = np.random.default_rng(0)
    net = VolumetricNetwork(1, 1, cells, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=8, output_height=8, rng=rng)
    for x in range(1, cells - 1):
        net[0, 0, x, 0] = make_layer("Sequential", children=[
            make_layer("Dense", input_height=8, output_height=8, rng=rng), make_layer("Residual")])
    net[0, 0, cells - 1, 0] = make_layer("Dense", input_height=8, output_height=2, rng=rng)
    return net


@pytest.fixture
def morph(qtbot, runner):
    with on_screen(qtbot, MorphPanel(runner), 900, 520) as panel:
        yield panel


def test_topology_and_morph_name_the_parts_alike_and_follow_the_network(qtbot, morph):
    topology = TopologyPanel()
    qtbot.addWidget(topology)
    for net, words in ((small_net(3), "3 cells · 5 layers, 3 weighted"),
                       (small_net(5), "5 cells · 11 layers, 5 weighted")):
        assert str(model_parts(net)) == words  # by hand: a Sequential and its 2 children, 1 weighted
        topology.set_network(net)
        morph.set_network(net)
        settle(qtbot, morph)
        assert topology.summary.text().startswith(f"{words} · grid 1×1×")
        assert f"</b> · {words} · " in morph.title.text()


def test_a_morph_that_makes_the_network_larger_says_it_grew(qtbot, morph):
    net = small_net()
    before = net.memory_bytes()
    morph.set_network(net)
    settle(qtbot, morph)
    choose(qtbot, morph.table.cellWidget(0, DTYPE), "float64")
    with qtbot.waitSignal(morph.measured, timeout=10000) as measured:
        qtbot.mouseClick(morph.apply_button, Qt.MouseButton.LeftButton)
    grown = 8 * 8 * 4  # the first Dense's 64 weights from 4 to 8 bytes each
    assert measured.args[0]["bytes_now"] == net.memory_bytes() == before + grown
    assert morph.memory_label.text() == f"{before} B → {before + grown} B " \
                                        f"(grew by {grown} B (+{grown / before:.1%}))"


class ByteTokenizer:
    """One token a character: enough for a probe (the tiny model ships no tokenizer)."""

    def encode(self, text, add_special_tokens=True):
        return [ord(c) % 250 for c in text]

    def close(self):
        pass


def test_a_language_models_drift_is_called_a_quick_check_of_its_size_against_the_file(qtbot, morph):
    net = load_causal_lm(TINY_LLAMA)
    model = TextModel(net, ByteTokenizer(), None, name="tiny-llama")
    try:
        morph.set_model(model, probe_text="abcdefghij")
        settle(qtbot, morph, 60000)
        # the oracle: the formats of the layers as the file holds them (a GGUF's would be Q4_1 ...)
        formats = ", ".join(sorted({la.weights.encoding(la.cfg.dtype) for _, la in weighted_cells(net)}))
        loaded = f"the weights as loaded ({formats})"
        names = [morph.table.item(k, LAYER).text() for k in range(morph.table.rowCount())]
        row = names.index("blk.0.ffn_gate/up/down")
        choose(qtbot, morph.table.cellWidget(row, DTYPE), "int8")
        with qtbot.waitSignal(morph.measured, timeout=60000) as measured:
            qtbot.mouseClick(morph.apply_button, Qt.MouseButton.LeftButton)
        assert measured.args[0]["probe_tokens"] == 10
        assert morph.drift_label.text().startswith("quick check on 10 tokens: KL mean ")
        assert "quant-report" in morph.drift_label.toolTip()
        worst = morph.error_label.text()
        assert worst.startswith("blk.0.ffn_gate/up/down ") and worst.endswith(f"against {loaded}")
        with qtbot.waitSignal(morph.measured, timeout=60000):
            qtbot.mouseClick(morph.revert_button, Qt.MouseButton.LeftButton)
        assert morph.error_label.text() == f"none: every layer's weights equal {loaded}"
    finally:
        morph.shutdown()
        net.close()
