"""Topology and Telemetry sample the same passes of a running network, so the same layer shows the
same statistics in both; Telemetry says its columns are sampled passes, labels its colour bar and
shows a hint, not empty axes, before anything ran."""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core import CallbackObserver, VolumetricNetwork, make_layer
from loomlab.core.observe import LIVE_SAMPLE_HZ
from loomlab.views.telemetry_panel import EMPTY_HINT, TelemetryPanel
from loomlab.views.topology_panel import TopologyPanel


def small_net() -> VolumetricNetwork:
    rng = np.random.default_rng(3)
    net = VolumetricNetwork(1, 1, 2, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=4, output_height=4, activation="Tanh", rng=rng)
    net[0, 0, 1, 0] = make_layer("Dense", input_height=4, output_height=2, rng=rng)
    return net


@pytest.fixture
def panels(qtbot):
    now = [0.0]
    clock = lambda: now[0]  # noqa: E731 - one clock for both panels, as the window has
    topology = TopologyPanel(clock=clock)
    telemetry = TelemetryPanel(rate_hz=30, clock=clock)
    for panel in (topology, telemetry):
        qtbot.addWidget(panel)
        panel.resize(800, 400)
        panel.show()
    yield topology, telemetry, now
    topology.shutdown()
    telemetry.shutdown()


def test_both_panels_show_the_same_last_sampled_pass_of_a_layer(qtbot, panels):
    topology, telemetry, now = panels
    net = small_net()
    every = []
    net.attach(CallbackObserver(lambda e: every.append(e) if e.type == "forward" else None))
    for panel in (topology, telemetry):
        panel.set_network(net)
    key = (0, 0, 0, 0, "")
    topology.select_layer_key(key)
    telemetry.select_layer_key(key)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    for k in range(12):  # a pass every 0.1 s: more than either panel samples
        now[0] = k / 10
        net.forward(x * (k + 1))
    qtbot.waitUntil(lambda: telemetry.latest_stats(key) is not None and "step" in
                    topology.inspector.fields["Last stats"].text(), timeout=5000)
    qtbot.wait(300)  # both refreshed after the last pass
    shown = telemetry.latest_stats(key)
    last = next(e for e in reversed(every) if e.stats == shown and (e.z, e.y, e.x, e.l, e.path) == key)
    assert last.step_count < 11  # the oracle: the last pass was not sampled (two a second more than 5)
    text = topology.inspector.fields["Last stats"].text()
    assert f"avg {shown.avg:.4g}" in text and text.endswith(f"(step {last.step_count})")
    assert telemetry.stats_labels["avg"].text() == f"{shown.avg:.6g}"


def test_telemetry_labels_its_columns_and_colour_bar_and_hints_when_empty(qtbot, panels):
    _, telemetry, now = panels
    plot = telemetry.heatmap.getPlotItem()
    assert telemetry.empty_hint.isVisible() and telemetry.empty_hint.toPlainText() == EMPTY_HINT
    assert not plot.getAxis("left").isVisible() and not telemetry.colorbar.isVisible()
    net = small_net()
    telemetry.set_network(net)
    assert telemetry.empty_hint.isVisible()  # a network, but no pass yet
    net.forward(np.ones((1, 4), np.float32))
    qtbot.waitUntil(lambda: not telemetry.empty_hint.isVisible(), timeout=5000)
    assert plot.getAxis("left").isVisible() and telemetry.colorbar.isVisible()
    label = f"sampled pass (0 = latest; at most {LIVE_SAMPLE_HZ:g} a second)"
    assert plot.getAxis("bottom").labelText == label
    assert telemetry.colorbar.getAxis("left").labelText == "mean (forward)"
    telemetry.statistic_box.setCurrentText("std")
    assert telemetry.colorbar.getAxis("left").labelText == "std (forward)"
    assert telemetry.histogram_title.text() == "last 128 sampled passes"


def test_a_language_models_heatmap_names_its_blocks_as_every_panel_does(qtbot, panels):
    from loomlab.core.llm.files import registry
    from loomlab.core.llm.model.loader import load_causal_lm

    _, telemetry, _ = panels
    net = load_causal_lm(registry.fetch("smollm2-135m"))  # 273 rows: too many to name each
    try:
        telemetry.set_network(net)
        keys = telemetry.layer_keys()
        # the oracle: block N is the grid cell after the embedding, (0, 0, N + 1, 0), every third one
        expected = [(keys.index((0, 0, n + 1, 0, "")) + 0.5, f"block {n}") for n in range(0, 30, 3)]
        assert telemetry.heatmap.getPlotItem().getAxis("left")._tickLevels == [expected]
        assert telemetry.layer_list.item(keys.index((0, 0, 11, 0, ""))).text().endswith(" block 10")
    finally:
        telemetry.set_network(None)
        net.close()
