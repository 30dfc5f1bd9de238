"""The Topology view's first framing fills the view (to its margin) whatever the network and size,
and again after a resize until the user turns the camera; a click on a layer with weights picks it
even where a weightless layer's disc (a block's residual) lies over it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loomlab.core.llm.files import registry
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.views.topology_panel import FIT_MARGIN, PICK_MARGIN_PX, TopologyPanel

from .test_topology_panel import small_net

TINY_LLAMA = Path(__file__).resolve().parents[1] / "data" / "tiny-hf" / "tiny-llama"


@pytest.fixture(scope="module")
def tiny_llama():
    net = load_causal_lm(TINY_LLAMA)
    yield net
    net.close()


def shown_panel(qtbot, size: tuple[int, int]) -> TopologyPanel:
    panel = TopologyPanel()
    qtbot.addWidget(panel)
    panel.resize(*size)
    panel.show()
    qtbot.waitExposed(panel)
    qtbot.waitUntil(panel.view.isExposed)
    return panel


def discs(panel: TopologyPanel):
    """Each point's projected centre, radius and depth, and the view's size (the oracle: the
    view's own projection)."""
    topo, view = panel.topology, panel.view
    xy, depth, front = view.project(topo.positions)
    assert front.all()
    return xy, topo.sizes / 2 / view.pixelSize(topo.positions), depth, (view.width(), view.height())


def filled(panel: TopologyPanel) -> tuple[float, float, float, float]:
    """The points' extent as fractions of the view: (left, right, top, bottom)."""
    xy, r, _, (w, h) = discs(panel)
    return ((xy[:, 0] - r).min() / w, (xy[:, 0] + r).max() / w, (xy[:, 1] - r).min() / h,
            (xy[:, 1] + r).max() / h)


def assert_fills_the_view(panel: TopologyPanel) -> None:
    left, right, top, bottom = filled(panel)
    inner = 1 - 2 * FIT_MARGIN
    assert left >= FIT_MARGIN - 1e-3 and right <= 1 - FIT_MARGIN + 1e-3
    assert top >= FIT_MARGIN - 1e-3 and bottom <= 1 - FIT_MARGIN + 1e-3
    assert max(right - left, bottom - top) >= inner - 0.01, (left, right, top, bottom)


@pytest.mark.parametrize("size", [(500, 350), (1100, 500)])
def test_the_first_framing_fills_the_view(qtbot, tiny_llama, size):
    panel = shown_panel(qtbot, size)
    for net in (tiny_llama, small_net()):
        panel.set_network(net)
        assert_fills_the_view(panel)
    panel.shutdown()


def test_a_resize_frames_again_until_the_user_turns_the_camera(qtbot, tiny_llama):
    panel = shown_panel(qtbot, (600, 300))
    panel.set_network(tiny_llama)
    width = panel.view.width()
    panel.resize(1100, 600)  # the dock grew after the network arrived
    qtbot.waitUntil(lambda: panel.view.width() > width)
    qtbot.waitUntil(lambda: assert_fills_the_view(panel), timeout=2000)  # framed for the new size
    panel.view.steered.emit()  # a drag or the wheel
    distance, width = panel.view.cameraParams()["distance"], panel.view.width()
    panel.resize(600, 300)
    qtbot.waitUntil(lambda: panel.view.width() < width)
    assert panel.view.cameraParams()["distance"] == distance  # the user's view is left alone
    panel.shutdown()


def test_a_click_on_a_weighted_layer_under_a_weightless_disc_picks_the_weighted(qtbot):
    net = load_causal_lm(registry.fetch("smollm2-135m"))  # 30 blocks: at a docked size their discs overlap
    panel = shown_panel(qtbot, (600, 250))
    panel.set_network(net)
    xy, r, depth, _ = discs(panel)
    weighted = np.array([row.parameters > 0 for row in panel.topology.rows])
    contested = 0
    for i in np.flatnonzero(weighted):
        for dx, dy in ((0, 0), (0.5, 0), (-0.5, 0), (0, 0.5), (0, -0.5)):
            x, y = xy[i, 0] + dx * r[i], xy[i, 1] + dy * r[i]
            covering = np.hypot(xy[:, 0] - x, xy[:, 1] - y) <= r + PICK_MARGIN_PX
            over = covering & ~weighted & (depth < depth[i])
            if over.any():  # a weightless disc nearer the camera covers this pixel of layer i's disc
                contested += 1
                got = panel.pick(x, y)
                assert weighted[got], panel.topology.rows[got]
                assert got == min(np.flatnonzero(covering & weighted), key=lambda k: depth[k])
    assert contested > 0  # the case is real at this size
    panel.shutdown()
    net.close()
