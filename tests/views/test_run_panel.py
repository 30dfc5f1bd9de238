"""The Run panel: setting a network fills the panel (a language model is refused); Run gives the
engine's own forward output; Train gives core's training run. Oracles: a twin network built from
the same seed, run or trained directly through core (run_inputs, train_tasks, train)."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

from loomlab.core import CallbackObserver, VolumetricNetwork, make_layer
from loomlab.core.io.loom_json import read_network
from loomlab.core.run_inputs import fit_input, golden_probe, random_input
from loomlab.core.train import TrainConfig, train
from loomlab.core.train_tasks import make_task
from loomlab.views.run_panel import LANGUAGE_MODEL_NOTICE, MAX_EPOCHS, RunPanel, describe_output
from loomlab.views.telemetry_panel import TelemetryPanel
from loomlab.views.theme import dark_palette
from tests.core.goldens import goldens

from .contrast import AA, assert_legible, contrast, dark_theme
from .jobs import choose, settle
from .panel_layout import on_screen

TINY_LLAMA = Path(__file__).parents[1] / "data" / "tiny-hf" / "tiny-llama"


def mlp(n_in: int = 2, n_hidden: int = 8, n_out: int = 1, seed: int = 0) -> VolumetricNetwork:
    rng = np.random.default_rng(seed)
    net = VolumetricNetwork(1, 1, 2, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=n_in, output_height=n_hidden, activation="Tanh",
                                 rng=rng)
    net[0, 0, 1, 0] = make_layer("Dense", input_height=n_hidden, output_height=n_out, activation="Linear",
                                 rng=rng)
    return net


def masters(net: VolumetricNetwork) -> list[np.ndarray]:
    return [la.weights.master.copy() for la in net.weighted_layers()]


@pytest.fixture
def panel(qtbot, runner):
    with on_screen(qtbot, RunPanel(runner), 1000, 560) as p:
        yield p


def shown(qtbot, panel, net):
    panel.set_network(net)
    settle(qtbot, panel)  # the task is chosen in a job


def set_training(qtbot, panel, *, epochs, lr, optimizer="sgd", loss="mse"):
    """Fill the training settings the way a person does: type into the boxes."""
    for box, value in ((panel.epochs_box, str(epochs)), (panel.lr_box, f"{lr:.5f}")):
        box.lineEdit().selectAll()
        qtbot.keyClicks(box, value)
        box.interpretText()
    assert panel.epochs_box.value() == epochs and panel.lr_box.value() == pytest.approx(lr)
    choose(qtbot, panel.optimizer_box, optimizer)
    choose(qtbot, panel.loss_box, loss)


# ----- model -> view -------------------------------------------------------------------------------

def test_setting_a_network_shows_what_it_reads_and_its_task(qtbot, panel):
    net = mlp(2, 8, 1)
    shown(qtbot, panel, net)
    assert "reads [batch, 2]" in panel.title.text()
    assert f"{net.parameter_count():,} parameters" in panel.title.text()
    assert panel.task_name == "xor" and "XOR" in panel.task_label.text()
    assert panel.run_button.isEnabled() and panel.train_button.isEnabled()
    assert not panel.stop_button.isEnabled()

    shown(qtbot, panel, mlp(1, 4, 1))
    assert panel.task_name == "sine" and "reads [batch, 1]" in panel.title.text()
    shown(qtbot, panel, mlp(5, 4, 3))
    assert panel.task_name == "linear-map" and "linear map" in panel.task_label.text()

    panel.set_network(None)
    assert panel.network is None and panel.title.text() == "No network"
    assert not panel.run_button.isEnabled() and not panel.train_button.isEnabled()


def test_a_language_model_is_refused(qtbot, panel):
    from loomlab.core.llm.model.loader import load_causal_lm

    lm = load_causal_lm(TINY_LLAMA)
    shown(qtbot, panel, mlp())
    panel.set_network(lm)
    assert LANGUAGE_MODEL_NOTICE in panel.title.text()
    assert panel.network is None and not panel.is_busy()
    for button in (panel.run_button, panel.train_button, panel.browse_button):
        assert not button.isEnabled()
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)  # disabled: nothing starts
    assert not panel.is_busy() and panel.last_output is None

    shown(qtbot, panel, mlp())
    panel.set_network(SimpleNamespace(net=lm))  # a loaded TextModel holds its network as .net
    assert LANGUAGE_MODEL_NOTICE in panel.title.text() and panel.network is None
    with pytest.raises(TypeError, match="expected a VolumetricNetwork or None, got str"):
        panel.set_network("net.json")


def test_a_network_without_an_input_size_says_so(qtbot, panel):
    net = VolumetricNetwork(1, 1, 1, 1)
    net[0, 0, 0, 0] = make_layer("Softmax")
    panel.set_network(net)
    assert "cannot tell what input this network reads" in panel.title.text()
    assert not panel.run_button.isEnabled() and not panel.is_busy()


# ----- view -> model: forward ----------------------------------------------------------------------

@pytest.mark.parametrize(("source", "make_input"), [
    ("Golden-style probe", lambda net, seed, batch: golden_probe(net, batch)),
    ("Random (seeded)", lambda net, seed, batch: random_input(net, seed, batch)),
])
def test_run_gives_the_networks_own_forward_output(qtbot, panel, source, make_input):
    net, twin = mlp(6, 8, 3), mlp(6, 8, 3)
    shown(qtbot, panel, net)
    choose(qtbot, panel.source_box, source)
    panel.seed_box.setValue(11)
    panel.batch_box.setValue(3)
    with qtbot.waitSignal(panel.ran, timeout=20000) as ran:
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    x = make_input(twin, 11, 3)
    expected = twin.forward(x)
    np.testing.assert_array_equal(panel.last_input, x)
    np.testing.assert_array_equal(ran.args[0], expected)
    assert panel.output_view.toPlainText() == describe_output(x, expected)


def test_the_golden_probe_of_a_golden_network_gives_loom_s_output(qtbot, panel):
    case = goldens()["forward"][0]  # the first case: its input is the first draw of the stream
    shown(qtbot, panel, read_network(case["network"]))
    panel.batch_box.setValue(case["input_shape"][0])
    with qtbot.waitSignal(panel.ran, timeout=20000) as ran:
        qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    np.testing.assert_allclose(ran.args[0].ravel(), case["output"], rtol=1e-5, atol=1e-6)


def test_describe_output_lists_shape_first_values_and_statistics():
    y = np.array([[1.0, -2.0, 3.0], [np.nan, 5.0, 0.5]], np.float32)
    text = describe_output(np.zeros((2, 4), np.float32), y)
    finite = np.array([1.0, -2.0, 3.0, 5.0, 0.5])
    assert text.splitlines() == [
        "input shape  [2, 4]", "output shape [2, 3] (float32)", "first values [1, -2, 3, nan, 5, 0.5]",
        f"min -2 · max 5 · mean {finite.mean():.6g} · std {finite.std():.6g}",
        "1 of 6 values are NaN or infinite"]


def test_run_from_a_file_gives_the_forward_output_of_its_values(qtbot, panel, tmp_path):
    net, twin = mlp(6, 8, 3), mlp(6, 8, 3)
    values = np.random.default_rng(2).standard_normal(12)
    np.save(tmp_path / "x.npy", values)
    shown(qtbot, panel, net)
    with qtbot.waitSignal(panel.ran, timeout=20000) as ran:
        panel.run_from_file(str(tmp_path / "x.npy"))
    x = fit_input(twin, values)
    assert x.shape == (2, 6)
    np.testing.assert_array_equal(ran.args[0], twin.forward(x))
    assert panel.source_box.currentData() == "file" and not panel.batch_box.isEnabled()


@pytest.mark.parametrize(("write", "message"), [
    (lambda p: np.save(p, np.array([{"w": 1}], dtype=object), allow_pickle=True), "pickled Python objects"),
    (lambda p: p.write_bytes(pickle.dumps(np.zeros(6))), "pickled Python objects"),
    (lambda p: np.save(p, np.zeros((2, 5))), r"does not fit this network, which reads \[batch, 6\]"),
    (lambda p: np.save(p, np.array(["1", "2"])), "must hold numbers"),
])
def test_a_bad_input_file_gives_one_message_and_no_output(qtbot, panel, tmp_path, write, message):
    path = tmp_path / "bad.npy"
    write(path)
    shown(qtbot, panel, mlp(6, 8, 3))
    outputs = []
    panel.ran.connect(outputs.append)
    panel.run_from_file(str(path))
    settle(qtbot, panel)
    assert re.search(message, panel.status.text()), panel.status.text()
    assert panel.status.text().startswith("run failed: ") and outputs == [] and panel.last_output is None
    assert panel.run_button.isEnabled()


def test_run_with_no_file_chosen_asks_for_one(qtbot, panel):
    shown(qtbot, panel, mlp())
    choose(qtbot, panel.source_box, "File (.npy / .json)")
    qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
    assert panel.status.text() == "Choose an input file first." and not panel.is_busy()


# ----- view -> model: training ---------------------------------------------------------------------

@pytest.mark.parametrize(("shape", "optimizer", "lr"), [((2, 8, 1), "sgd", 0.2), ((6, 8, 3), "adamw", 0.01)])
def test_training_gives_cores_losses_and_trains_the_network_in_place(qtbot, panel, shape, optimizer, lr):
    net, twin = mlp(*shape), mlp(*shape)
    epochs, seed = 30, 4
    shown(qtbot, panel, net)
    panel.seed_box.setValue(seed)
    set_training(qtbot, panel, epochs=epochs, lr=lr, optimizer=optimizer)
    with qtbot.waitSignal(panel.trained, timeout=30000) as trained:
        qtbot.mouseClick(panel.train_button, Qt.MouseButton.LeftButton)
    settle(qtbot, panel)
    expected = train(twin, make_task(twin, seed).batches,
                     TrainConfig(epochs=epochs, learning_rate=lr, optimizer=optimizer))
    assert len(panel.losses) == epochs and panel.losses == list(expected) == trained.args[0]
    assert panel.losses[-1] < panel.losses[0]
    xs, ys = panel.loss_curve.getData()
    np.testing.assert_array_equal(xs, np.arange(epochs))
    np.testing.assert_array_equal(ys, expected)
    for a, b in zip(masters(net), masters(twin), strict=True):
        np.testing.assert_array_equal(a, b)
    assert panel.status.text() == f"trained {epochs} epochs · loss {expected[0]:.4g} → {expected[-1]:.4g}"


def test_stop_cancels_within_an_epoch(qtbot, panel):
    net, twin = mlp(2, 8, 1), mlp(2, 8, 1)  # XOR: one batch per epoch, so every epoch is whole
    shown(qtbot, panel, net)
    set_training(qtbot, panel, epochs=MAX_EPOCHS, lr=0.05)
    qtbot.mouseClick(panel.train_button, Qt.MouseButton.LeftButton)
    assert panel.stop_button.isEnabled() and not panel.train_button.isEnabled()
    qtbot.waitUntil(lambda: len(panel.losses) >= 3, timeout=20000)  # the curve follows while training
    assert panel.is_busy()
    qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
    done_at_stop = panel.epochs_done
    settle(qtbot, panel)
    assert done_at_stop <= len(panel.losses) <= done_at_stop + 1  # the epoch under way, no more
    assert panel.status.text() == f"stopped after {len(panel.losses)} epochs"
    config = TrainConfig(epochs=len(panel.losses), learning_rate=0.05)
    expected = train(twin, make_task(twin, 0).batches, config)
    assert panel.losses == list(expected)
    for a, b in zip(masters(net), masters(twin), strict=True):
        np.testing.assert_array_equal(a, b)
    assert not panel.plot_timer.isActive() and panel.train_button.isEnabled()


def test_an_impossible_loss_for_the_task_gives_one_message(qtbot, panel):
    net = mlp(2, 8, 1)
    before = masters(net)
    shown(qtbot, panel, net)
    set_training(qtbot, panel, epochs=5, lr=0.1, loss="crossentropy")
    qtbot.mouseClick(panel.train_button, Qt.MouseButton.LeftButton)
    settle(qtbot, panel)
    assert "crossentropy needs at least 2 outputs per row" in panel.status.text()
    assert panel.losses == [] and not panel.plot_timer.isActive()
    for a, b in zip(masters(net), before, strict=True):
        np.testing.assert_array_equal(a, b)


def test_telemetry_sees_forward_and_backward_passes_of_training(qtbot, panel):
    net = mlp(2, 8, 1)
    events = []
    net.attach(CallbackObserver(events.append))
    telemetry = TelemetryPanel(sample_hz=None)
    qtbot.addWidget(telemetry)
    telemetry.set_network(net)
    try:
        shown(qtbot, panel, net)
        set_training(qtbot, panel, epochs=7, lr=0.1)
        with qtbot.waitSignal(panel.trained, timeout=30000):
            qtbot.mouseClick(panel.train_button, Qt.MouseButton.LeftButton)
        settle(qtbot, panel)
        backward = [e for e in events if e.type == "backward"]
        assert len(backward) == 7 * 1 * 2  # epochs x batches x layers
        for key in telemetry.layer_keys():
            last = [e for e in backward if (e.z, e.y, e.x, e.l, e.path) == key][-1]
            qtbot.waitUntil(lambda k=key, s=last.stats: telemetry.latest_stats(k, "backward") == s,
                            timeout=5000)
            assert telemetry.latest_stats(key, "forward") is not None
    finally:
        telemetry.shutdown()


def test_a_new_network_during_training_stops_it_and_takes_the_new_one(qtbot, panel):
    first, second = mlp(2, 8, 1), mlp(1, 4, 1)
    shown(qtbot, panel, first)
    set_training(qtbot, panel, epochs=MAX_EPOCHS, lr=0.05)
    trained = []
    panel.trained.connect(trained.append)
    qtbot.mouseClick(panel.train_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.epochs_done >= 2, timeout=20000)
    panel.set_network(second)
    assert panel.losses == [] and panel.epochs_done == 0 and not panel.plot_timer.isActive()
    settle(qtbot, panel)
    assert panel.network is second and panel.task_name == "sine" and trained == []


# ----- dark theme ------------------------------------------------------------------------------------

def rendered_contrast(widget) -> float:
    """Contrast between a rendered widget's background (its commonest colour) and its text (the
    colour farthest from it): what is on screen, beside the palette roles assert_legible checks."""
    image = widget.grab().toImage()
    counts: dict[int, int] = {}
    for y in range(image.height()):
        for x in range(image.width()):
            rgb = image.pixel(x, y) & 0xFFFFFF
            counts[rgb] = counts.get(rgb, 0) + 1
    background = QColor(max(counts, key=counts.get))
    return max(contrast(background, QColor(rgb)) for rgb in counts)


def test_every_text_is_legible_in_the_dark_palette(qtbot, panel):
    with dark_theme(QApplication.instance()):
        shown(qtbot, panel, mlp(6, 8, 3))
        with qtbot.waitSignal(panel.ran, timeout=20000):
            qtbot.mouseClick(panel.run_button, Qt.MouseButton.LeftButton)
        settle(qtbot, panel)
        window = QPalette.ColorRole.Window
        assert panel.palette().color(window) == dark_palette().color(window)
        assert assert_legible(panel) >= 20
        for widget in (panel.title, panel.task_label, panel.status, panel.output_view):
            assert rendered_contrast(widget) >= AA, type(widget).__name__
