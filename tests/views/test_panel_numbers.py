"""The numbers panels show about one network agree: its parts (cells, blocks, layers, weighted
layers) in the same words in Topology, Morph and Models, sizes in one unit, and a change in size
said as what it is (a morph that makes the network larger "grew")."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import Qt

from loomlab.core import VolumetricNetwork, make_layer
from loomlab.core.layer_names import model_parts
from loomlab.views.morph_panel import DTYPE, MorphPanel
from loomlab.views.topology_panel import TopologyPanel

from .jobs import choose, settle


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
    panel = MorphPanel(runner)
    qtbot.addWidget(panel)
    panel.resize(900, 520)
    panel.show()
    yield panel
    panel.shutdown()


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
