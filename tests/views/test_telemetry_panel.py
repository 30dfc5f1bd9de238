"""Telemetry panel: the heatmap shows exactly the core's LayerStats, the controls pick what it
shows, redraws are rate-limited, and nothing is left attached or running afterwards."""

from __future__ import annotations

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt

from loomlab.core import CallbackObserver, LayerStats, VolumetricNetwork, make_layer
from loomlab.core.layer_names import layer_label
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.model.moe_layer import LLMMixtureOfExperts
from loomlab.core.train import TrainConfig, train
from loomlab.views.telemetry_panel import TelemetryPanel
from loomlab.views.workers import JobRunner

from ..core.llm.model.test_architectures import TINY
from .contrast import assert_legible, dark_theme
from .panel_layout import DOCKED, assert_axes_legible, assert_tick_labels_apart, assert_unclipped

HISTORY = 8
# the oracle's formula for each statistic of a LayerStats
STATISTICS = {
    "mean": lambda s: s.avg,
    "std": lambda s: s.std,
    "max": lambda s: s.max,
    "active fraction": lambda s: s.active / s.total,
}


def small_net() -> VolumetricNetwork:
    """Four grid layers, one a Parallel container with two children: six heatmap rows."""
    rng = np.random.default_rng(1)
    net = VolumetricNetwork(1, 1, 2, 2)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=5, output_height=6, activation="ReLU", rng=rng,
                                 init_scale=0.8)
    net[0, 0, 0, 1] = make_layer("Parallel", combine_mode="add", children=[
        make_layer("Dense", input_height=6, output_height=6, activation="Tanh", rng=rng, init_scale=0.8),
        make_layer("Residual")])
    net[0, 0, 1, 0] = make_layer("Dense", input_height=6, output_height=6, activation="Sigmoid", rng=rng)
    net[0, 0, 1, 1] = make_layer("Dense", input_height=6, output_height=3, rng=rng)
    return net


@pytest.fixture
def panel(qtbot):
    panel = TelemetryPanel(history=HISTORY, sample_hz=None)  # every pass, as the oracle sees them
    qtbot.addWidget(panel)
    panel.resize(900, 500)
    panel.show()
    yield panel
    panel.shutdown()


class Oracle:
    """An independent observer: every event's stats by direction, in arrival order."""

    def __init__(self, net):
        self.events = {"forward": [], "backward": []}
        self.observer = net.attach(CallbackObserver(lambda e: self.events[e.type].append(e)))

    def expected(self, keys, direction: str, statistic: str) -> np.ndarray:
        """The heatmap the events should produce: one column per step, newest last."""
        steps = sorted({e.step_count for e in self.events[direction]})[-HISTORY:]
        out = np.full((len(keys), HISTORY), np.nan, np.float32)
        for e in self.events[direction]:
            if e.step_count in steps:
                row = keys.index((e.z, e.y, e.x, e.l, e.path))
                out[row, HISTORY - len(steps) + steps.index(e.step_count)] = STATISTICS[statistic](e.stats)
        return out


def run_steps(net, n: int, seed: int = 0) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``n`` training steps (forward and backward); returns each step's input, output and gradient."""
    rng = np.random.default_rng(seed)
    io = []
    for i in range(n):
        x = rng.standard_normal((3, 5)).astype(np.float32) * (1 + i)
        y = net.forward(x, train=True)
        grad = rng.standard_normal(y.shape).astype(np.float32)
        net.backward(grad)
        io.append((x, y, grad))
    return io


def wait_for_tick(qtbot, panel) -> None:
    with qtbot.waitSignal(panel.timer.timeout, timeout=2000):
        pass


def run_watched(qtbot, panel, steps: int):
    """A fresh small net shown in ``panel`` and an oracle on it, after ``steps`` training steps and
    one panel tick; returns (net, oracle, each step's input, output and gradient)."""
    net = small_net()
    panel.set_network(net)
    oracle = Oracle(net)
    io = run_steps(net, steps)
    wait_for_tick(qtbot, panel)
    return net, oracle, io


def test_rows_are_every_layer_in_traversal_order(panel):
    net = small_net()
    panel.set_network(net)
    assert panel.layer_keys() == [(r.z, r.y, r.x, r.l, r.path) for r in net.blueprint()]
    assert panel.layer_keys()[2] == (0, 0, 0, 1, "parallel_branches[0]")
    assert panel.layer_list.count() == 6 and np.isnan(panel.heatmap_values()).all()


def test_forward_and_backward_fill_the_heatmap_with_the_cores_stats(qtbot, panel):
    _, oracle, io = run_watched(qtbot, panel, 5)
    keys = panel.layer_keys()
    # the oracle's own numbers are LayerStats.of on the tensors: every grid layer's output,
    # recomputed by an unobserved twin of the network, and the gradient reaching the last layer
    by_step = {(e.type, e.step_count, (e.z, e.y, e.x, e.l, e.path)): e.stats
               for events in oracle.events.values() for e in events}
    twin = small_net()
    first = oracle.events["forward"][0].step_count
    for step, (x, _, _) in enumerate(io, start=first):
        for (coord, _), out in zip(twin.layers(), twin.trace(x).outputs, strict=True):
            assert by_step["forward", step, (*coord, "")] == LayerStats.of(out)
    # backward events carry the step count after their forward pass
    assert by_step["backward", first + len(io), (0, 0, 1, 1, "")] == LayerStats.of(io[-1][2])
    for direction in ("forward", "backward"):
        panel.direction_box.setCurrentText(direction)
        for statistic in STATISTICS:
            panel.statistic_box.setCurrentText(statistic)
            expected = oracle.expected(keys, direction, statistic)
            np.testing.assert_array_equal(panel.heatmap_values(), expected)
            np.testing.assert_array_equal(panel.image.image, expected)
    assert np.isnan(panel.heatmap_values()[:, :HISTORY - 5]).all()
    assert not np.isnan(panel.heatmap_values()[:, HISTORY - 5:]).any()


def test_the_heatmap_scrolls_to_the_last_steps(qtbot, panel):
    net, oracle, _ = run_watched(qtbot, panel, 3)
    run_steps(net, HISTORY + 2, seed=7)  # more steps than the heatmap holds, in one tick
    wait_for_tick(qtbot, panel)
    np.testing.assert_array_equal(panel.heatmap_values(),
                                  oracle.expected(panel.layer_keys(), "forward", "mean"))


def test_the_statistic_box_switches_the_image(qtbot, panel):
    _, oracle, _ = run_watched(qtbot, panel, 3)
    keys = panel.layer_keys()
    np.testing.assert_array_equal(panel.image.image, oracle.expected(keys, "forward", "mean"))
    panel.statistic_box.setFocus()
    qtbot.keyClick(panel.statistic_box, Qt.Key.Key_Down)  # mean -> std, as a user would
    assert panel.statistic() == "std"
    np.testing.assert_array_equal(panel.image.image, oracle.expected(keys, "forward", "std"))
    panel.statistic_box.setCurrentText("active fraction")
    np.testing.assert_array_equal(panel.image.image, oracle.expected(keys, "forward", "active fraction"))


def click_row(qtbot, panel, row: int) -> None:
    vb = panel.heatmap.getPlotItem().getViewBox()
    at = panel.heatmap.mapFromScene(vb.mapViewToScene(QPointF(-2.0, row + 0.5)))
    qtbot.mouseClick(panel.heatmap.viewport(), Qt.MouseButton.LeftButton, pos=at)


def test_clicking_a_heatmap_row_selects_that_layer_and_shows_its_stats(qtbot, panel):
    _, oracle, _ = run_watched(qtbot, panel, 4)
    key = panel.layer_keys()[2]
    with qtbot.waitSignal(panel.layer_selected) as selected:
        click_row(qtbot, panel, 2)
    assert selected.args == [key] and panel.selected_key == key
    assert panel.layer_list.currentRow() == 2 and "parallel_branches[0]" in panel.layer_title.text()
    last = [e.stats for e in oracle.events["forward"] if (e.z, e.y, e.x, e.l, e.path) == key][-1]
    assert panel.latest_stats(key) == last
    shown = {name: label.text() for name, label in panel.stats_labels.items()}
    assert shown == {"avg": f"{last.avg:.6g}", "std": f"{last.std:.6g}", "min": f"{last.min:.6g}",
                     "max": f"{last.max:.6g}", "active": f"{last.active}/{last.total}"}
    # the histogram counts the row's recent means
    edges, counts = panel.histogram_curve.getData()
    recent = np.float32([e.stats.avg for e in oracle.events["forward"]
                         if (e.z, e.y, e.x, e.l, e.path) == key])
    assert counts.sum() == 4 and edges[0] <= recent.min() and recent.max() <= edges[-1]
    np.testing.assert_array_equal(counts, np.histogram(recent, bins=edges)[0])


def test_picking_from_the_list_selects_and_follows_the_direction(qtbot, panel):
    _, oracle, _ = run_watched(qtbot, panel, 2)
    item = panel.layer_list.item(4)
    rect = panel.layer_list.visualItemRect(item)
    qtbot.mouseClick(panel.layer_list.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    key = panel.layer_keys()[4]
    assert panel.selected_key == key and panel.row_marker.getRegion() == (4, 5)
    panel.direction_box.setCurrentText("backward")
    grad = [e.stats for e in oracle.events["backward"] if (e.z, e.y, e.x, e.l, e.path) == key][-1]
    assert panel.stats_labels["max"].text() == f"{grad.max:.6g}"


def test_redraws_at_most_once_per_tick_while_a_worker_floods_events(qtbot, panel, monkeypatch):
    net = small_net()
    panel.set_network(net)
    draws, ticks = [], []
    original = panel.image.setImage
    monkeypatch.setattr(panel.image, "setImage", lambda *a, **k: (draws.append(1), original(*a, **k)))
    panel.timer.timeout.connect(lambda: ticks.append(1))
    # ten ticks a second: at the default rate (1 Hz) the five waited for below take the whole
    # 5 s the wait allows, and the test failed about one run in three
    panel.timer.setInterval(100)
    runner = JobRunner()
    steps = []

    def flood(job):
        x = np.ones((3, 5), np.float32)
        while not job.is_cancelled() and len(steps) < 3000:
            net.forward(x)
            steps.append(1)

    runner.start(flood, name="flood")
    qtbot.waitUntil(lambda: len(ticks) >= 5, timeout=5000)
    assert runner.shutdown(5000)
    assert len(steps) > 2 * len(ticks)  # events did arrive faster than the timer
    assert 1 <= len(draws) <= len(ticks)
    panel.shutdown()
    assert len(draws) <= len(ticks)


def test_shutdown_stops_the_timer_and_detaches(qtbot, panel):
    first, second = small_net(), small_net()
    panel.set_network(first)
    assert panel.timer.isActive() and len(first.observers) == 1
    panel.set_network(second)
    assert first.observers == [] and len(second.observers) == 1
    run_steps(first, 1)  # the old network no longer reaches the panel
    wait_for_tick(qtbot, panel)
    assert np.isnan(panel.heatmap_values()).all()
    panel.set_network(None)
    assert second.observers == [] and not panel.timer.isActive() and panel.layer_list.count() == 0
    panel.set_network(second)
    panel.shutdown()
    assert not panel.timer.isActive() and second.observers == []


def test_off_screen_the_panel_neither_watches_nor_refreshes(qtbot, panel):
    net = small_net()
    panel.set_network(net)
    panel.set_shown(False)  # its dock went behind another dock's tab
    assert net.observers == [] and not panel.timer.isActive()
    run_steps(net, 2)  # passes meanwhile reach nobody
    panel.set_network(net)  # a network set while off screen is not watched either
    assert net.observers == [] and not panel.timer.isActive()
    panel.set_shown(True)
    assert len(net.observers) == 1 and panel.timer.isActive()
    run_steps(net, 1)
    wait_for_tick(qtbot, panel)
    assert np.isfinite(panel.heatmap_values()[:, -1]).all()  # the pass after it came back
    assert np.isnan(panel.heatmap_values()[:, :-1]).all()  # none from while it was away
    panel.shutdown()


def test_sampled_passes_fill_consecutive_columns(qtbot):
    """With ``sample_hz`` the panel records whole passes at that rate, one heatmap column each."""
    clock = iter(np.arange(1, 100) * 0.125)  # each pass starts 0.125 s after the one before
    panel = TelemetryPanel(history=HISTORY, sample_hz=2.5, clock=lambda: next(clock))
    qtbot.addWidget(panel)
    _, oracle, _ = run_watched(qtbot, panel, 8)
    # the first pass in each 0.4 s slot of the clock: at 0.125, 0.5 and 0.875 s
    sampled = [e for e in oracle.events["forward"] if e.step_count in (0, 3, 6)]
    expected = np.full((6, HISTORY), np.nan, np.float32)
    keys = panel.layer_keys()
    for e in sampled:
        column = HISTORY - 3 + (0, 3, 6).index(e.step_count)
        expected[keys.index((e.z, e.y, e.x, e.l, e.path)), column] = e.stats.avg
    np.testing.assert_array_equal(panel.heatmap_values(), expected)
    panel.shutdown()


def test_sample_rate_is_validated(qtbot):
    with pytest.raises(ValueError, match="sample_hz"):
        TelemetryPanel(sample_hz=0)


def test_rate_is_at_most_30_hz(qtbot):
    with pytest.raises(ValueError):
        TelemetryPanel(rate_hz=60)


# ----- linking with other panels -----------------------------------------------------------------
def test_a_linked_selection_selects_without_echo(qtbot, panel):
    _, oracle, _ = run_watched(qtbot, panel, 3)
    key = (0, 0, 1, 0, "")
    with qtbot.assertNotEmitted(panel.layer_selected):
        panel.select_layer_key(key)
    row = panel.layer_keys().index(key)
    assert panel.selected_key == key and panel.layer_list.currentRow() == row
    assert panel.row_marker.getRegion() == (row, row + 1)
    last = [e.stats for e in oracle.events["forward"] if (e.z, e.y, e.x, e.l, e.path) == key][-1]
    assert panel.stats_labels["avg"].text() == f"{last.avg:.6g}"
    with qtbot.assertNotEmitted(panel.layer_selected):
        panel.select_layer_key((5, 5, 5, 5, ""))  # not in this network: nothing selected
    assert panel.selected_key is None and panel.layer_list.currentRow() == -1
    with qtbot.waitSignal(panel.layer_selected) as picked:  # the user's pick is told
        panel.layer_list.setCurrentRow(row)
    assert picked.args == [key]


# ----- training: the backward direction ----------------------------------------------------------
def test_training_with_core_train_fills_the_backward_heatmap(qtbot, panel):
    net = small_net()
    panel.set_network(net)
    oracle = Oracle(net)
    rng = np.random.default_rng(3)
    batches = [(rng.standard_normal((4, 5), np.float32), rng.standard_normal((4, 3), np.float32))
               for _ in range(2)]
    runner = JobRunner()
    runner.start(lambda job: train(net, batches, TrainConfig(epochs=3, learning_rate=0.05)), name="train")
    qtbot.waitUntil(lambda: not runner.active, timeout=10000)
    assert runner.shutdown()
    wait_for_tick(qtbot, panel)
    assert len({e.step_count for e in oracle.events["backward"]}) == 6  # one backward pass per batch
    panel.direction_box.setCurrentText("backward")
    for statistic in STATISTICS:
        panel.statistic_box.setCurrentText(statistic)
        np.testing.assert_array_equal(panel.heatmap_values(),
                                      oracle.expected(panel.layer_keys(), "backward", statistic))
    assert np.isfinite(panel.heatmap_values()[:, -6:]).all()
    key = (0, 0, 1, 1, "")  # the last layer: its backward input is the loss's gradient
    last = [e.stats for e in oracle.events["backward"] if (e.z, e.y, e.x, e.l, e.path) == key][-1]
    assert panel.latest_stats(key, "backward") == last


# ----- names and layout --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm():
    from loomlab.core.llm.files import registry

    net = load_causal_lm(registry.fetch("smollm2-135m"))
    yield net
    net.close()


def test_a_language_models_rows_carry_its_tensor_names(qtbot, panel, smollm):
    panel.set_network(smollm)
    keys = panel.layer_keys()
    assert [panel.layer_list.item(i).text() for i in range(len(keys))] == \
           [f"{i} {layer_label(smollm, k)}" for i, k in enumerate(keys)]
    row = keys.index((0, 0, 10, 0, "sequential_layers[0].sequential_layers[1]"))
    assert panel.layer_list.item(row).text() == f"{row} blk.9.attn_q/k/v/output"
    panel.set_network(None)
    assert smollm.observers == []


def test_docked_at_the_bottom_of_a_1600x1000_window_nothing_is_clipped(qtbot, smollm):
    panel = TelemetryPanel(sample_hz=None)
    qtbot.addWidget(panel)
    panel.resize(*DOCKED)
    panel.show()
    qtbot.waitExposed(panel)
    panel.set_network(smollm)
    smollm.step(np.array([[1, 9690, 28]]))
    smollm.step(np.array([[260]]))
    wait_for_tick(qtbot, panel)
    panel.layer_list.setCurrentRow(85)
    assert panel.minimumSizeHint().height() <= DOCKED[1]
    assert_unclipped(panel)
    rows = panel.layer_list.viewport().height() / panel.layer_list.sizeHintForRow(0)
    assert rows >= 10, f"the layer list shows {rows:.1f} rows"
    for axis in ("bottom", "left"):
        assert_tick_labels_apart(panel.histogram.getAxis(axis))
    panel.grab().save("/tmp/telemetry_docked.png")
    panel.shutdown()


def test_legible_in_the_dark_theme(qtbot, qapp, panel):
    with dark_theme(qapp):
        run_watched(qtbot, panel, 2)
        panel.layer_list.setCurrentRow(1)
        assert assert_legible(panel) >= 10
        for plot in (panel.heatmap, panel.histogram):
            assert_axes_legible(plot)


def test_a_mixture_of_experts_shows_the_tokens_routed_to_each_expert(qtbot, panel):
    """The load bars of a MoE layer (and of each of its experts) are the tokens its router sent to
    each expert in the pass: every token to 2 of 4 experts."""
    net = load_causal_lm(TINY / "tiny-qwen3moe")
    panel.set_network(net)
    ids = np.array([[1, 17, 42, 99, 3, 250, 7, 7, 7, 128, 64, 5]])
    net.forward(ids)
    wait_for_tick(qtbot, panel)
    for moe in (la for la in net.all_layers() if isinstance(la, LLMMixtureOfExperts)):
        key = (*moe.coords, moe.path)
        load = panel.expert_load(key)
        np.testing.assert_array_equal(load, moe.last_load)
        assert load.sum() == ids.size * moe.k
        np.testing.assert_array_equal(panel.expert_load((*moe.coords, moe.children[1].path)), load)
        panel.select_layer_key(key)
        assert panel.load_plot.isVisible()
        np.testing.assert_array_equal(panel.load_bars.opts["height"], load)
    assert panel.expert_load((0, 0, 0, 0, "")) is None
    panel.select_layer_key((0, 0, 0, 0, ""))
    assert not panel.load_plot.isVisible()
