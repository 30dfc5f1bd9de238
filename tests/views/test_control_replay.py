"""The control replay (views/control_replay.py): a member's episode computed off the GUI thread,
its picture at each step, the observation and action traces with their cursors, Play / Pause /
step / slider / dragging a cursor, the evaluation episode chosen, and Export replay (GIF) with
cancel; and a cartpole run in the Evolution panel replaying its best member. Oracles:
``task.episode(net)``, ``task.evaluate`` and ``frames.frame`` / ``frames.episode_frames``."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from PySide6.QtGui import QImage
from PySide6.QtWidgets import QApplication, QFileDialog

from loomlab.core.evolve.control.frames import GIF_MAX_FPS, episode_frames, frame, replay_fps
from loomlab.core.evolve.genetics.neat import neat_mutate
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.workspace.store import Workspace
from loomlab.views.control_replay import FRAME_SIZE, BestMemberViews, ControlReplay
from loomlab.views.evolution_panel import EvolutionPanel

from .jobs import choose, settle
from .panel_layout import DOCKED, assert_unclipped

STEPS = 30  # a short episode: the GIF takes ~40 ms a frame to write


@pytest.fixture(scope="module")
def task():
    return get_task("cartpole", max_steps=STEPS, episodes=2)


@pytest.fixture
def replay(qtbot, runner):
    r = ControlReplay(runner)
    qtbot.addWidget(r)
    r.resize(900, 300)
    r.show()
    yield r
    r.shutdown()


def pixels(image: QImage) -> np.ndarray:
    """A QImage's pixels as H x W x 3 uint8."""
    image = image.convertToFormat(QImage.Format.Format_RGB888)
    h, w = image.height(), image.width()
    rows = np.frombuffer(image.constBits(), np.uint8).reshape(h, image.bytesPerLine())
    return rows[:, : 3 * w].reshape(h, w, 3).copy()


def assert_same_episode(a, b) -> None:
    assert (a.env_id, a.seed) == (b.env_id, b.seed)
    for field in ("observations", "actions", "rewards", "states", "outputs"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)


def shown(qtbot, replay, task, net):
    replay.show_member(task, net)
    assert replay.is_busy()
    settle(qtbot, replay)
    return replay.episode


def test_the_member_is_played_frame_by_frame_with_its_traces(qtbot, replay, task):
    net = task.seed_network()
    episode = shown(qtbot, replay, task, net)
    assert_same_episode(episode, task.episode(net))
    steps = len(episode)
    assert steps == STEPS and replay.step == 0 and replay.slider.maximum() == steps
    assert replay.status.text() == f"seed 0 · {steps} steps · return {episode.total:.6g}"
    for k in (0, 1, 17, steps):
        replay.set_step(k)
        assert replay.slider.value() == k and [c.value() for c in replay.cursors] == [k, k]
        np.testing.assert_array_equal(pixels(replay.view.image), frame("CartPole-v1", episode.states[k]))
        assert replay.step_label.text() == f"step {k} / {steps} · return {episode.rewards[:k].sum():.4g}"
    assert pixels(replay.view.image).shape == (FRAME_SIZE[1], FRAME_SIZE[0], 3)
    # the traces: every observation and the action, per step
    assert len(replay.observation_curves) == 4 and len(replay.action_curves) == 1
    for i, curve in enumerate(replay.observation_curves):
        x, y = curve.getData()
        np.testing.assert_array_equal(x, np.arange(steps))
        np.testing.assert_array_equal(y, episode.observations[:, i])
    np.testing.assert_array_equal(replay.action_curves[0].getData()[1], episode.actions)
    # view edits reach the replay: the slider and a cursor dragged (to a whole step)
    replay.slider.setValue(5)
    assert replay.step == 5
    np.testing.assert_array_equal(pixels(replay.view.image), frame("CartPole-v1", episode.states[5]))
    cursor = replay.cursors[1]
    cursor.setValue(11.4)
    cursor.sigDragged.emit(cursor)
    assert replay.step == 11 and replay.slider.value() == 11
    assert [c.value() for c in replay.cursors] == [11, 11]


def test_play_advances_to_the_end_and_stops_and_step_moves_one(qtbot, replay, task):
    episode = shown(qtbot, replay, task, task.seed_network())
    steps = len(episode)
    assert replay.timer.interval() == round(1000 / replay_fps("CartPole-v1"))
    assert not replay.back_button.isEnabled()
    replay.forward_button.click()
    assert replay.step == 1
    replay.forward_button.click()
    replay.back_button.click()
    assert replay.step == 1
    replay.play_button.click()
    assert replay.timer.isActive() and replay.play_button.text() == "Pause"
    seen = []
    replay.slider.valueChanged.connect(seen.append)  # the slider follows without telling the replay back
    qtbot.waitUntil(lambda: replay.step >= 4, timeout=5000)
    replay.play_button.click()  # pause
    assert not replay.timer.isActive() and replay.play_button.text() == "Play"
    paused = replay.step
    qtbot.wait(100)
    assert replay.step == paused
    replay.play_button.click()
    qtbot.waitUntil(lambda: not replay.timer.isActive(), timeout=5000)
    assert replay.step == steps and replay.play_button.text() == "Play"
    assert not replay.forward_button.isEnabled()
    np.testing.assert_array_equal(pixels(replay.view.image), frame("CartPole-v1", episode.states[steps]))
    replay.step_by(1)  # past the end: stays
    assert replay.step == steps
    replay.play()  # from the end: starts again
    assert replay.step == 0 and replay.timer.isActive()
    replay.step_by(1)  # a step pauses
    assert replay.step == 1 and not replay.timer.isActive()


def test_export_writes_a_gif_of_every_state(qtbot, replay, task, tmp_path, monkeypatch):
    episode = shown(qtbot, replay, task, task.seed_network())
    path = tmp_path / "cartpole.gif"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(tmp_path / "cartpole"), ""))
    replay.export_button.click()
    assert replay.is_busy() and replay.export_progress.isVisibleTo(replay)
    assert not replay.export_button.isEnabled()
    settle(qtbot, replay)
    assert replay.status.text() == f"saved {path}"
    assert not replay.export_progress.isVisibleTo(replay) and replay.export_button.isEnabled()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cartpole.gif"]  # no scratch file left
    # one frame per state; the GIF keeps a run of identical pictures as one frame shown that long
    pictures = episode_frames(episode)
    assert len(pictures) == len(episode) + 1
    runs = 1 + sum(not np.array_equal(a, b) for a, b in zip(pictures, pictures[1:], strict=False))
    delay = 10 * max(100 // GIF_MAX_FPS, round(100 / replay_fps("CartPole-v1")))  # ms
    with Image.open(path) as gif:
        durations = []
        for i in range(gif.n_frames):
            gif.seek(i)
            durations.append(gif.info["duration"])
        assert gif.size == FRAME_SIZE
    assert len(durations) == runs and sum(durations) == (len(episode) + 1) * delay


def test_a_cancelled_export_leaves_the_file_that_was_there(qtbot, replay, task, tmp_path):
    shown(qtbot, replay, task, task.seed_network())
    path = tmp_path / "replay.gif"
    path.write_bytes(b"old")
    replay.export(path)
    assert replay.cancel_button.isVisibleTo(replay)
    replay.cancel_button.click()
    settle(qtbot, replay)
    assert replay.status.text() == "export cancelled"
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["replay.gif"]
    replay.export(tmp_path / "replay.txt")
    assert not replay.is_busy() and replay.status.text() == "not exported: a replay is saved as .gif or .mp4"


def test_the_latest_member_and_the_chosen_episode_are_played(qtbot, replay, task):
    first = task.seed_network()
    second = neat_mutate(first, task.neat_config(seed=9))
    replay.show_member(task, first)
    replay.show_member(task, second)  # while the first is computed: it waits, and is played after
    settle(qtbot, replay)
    assert_same_episode(replay.episode, task.episode(second))
    assert replay.episode_box.maximum() == 2 and replay.episode_box.isEnabled()
    replay.episode_box.setValue(2)
    settle(qtbot, replay)
    assert_same_episode(replay.episode, task.episode(second, 1))
    assert replay.episode.seed == 1
    replay.clear()
    assert replay.episode is None and replay.view.image is None and replay.observation_curves == []
    assert not replay.play_button.isEnabled() and not replay.export_button.isEnabled()


def test_the_best_member_views_show_the_replay_and_the_graph(qtbot, runner, task):
    views = BestMemberViews(runner)
    qtbot.addWidget(views)
    views.resize(900, 300)
    views.show()
    try:
        net = task.seed_network()
        views.show_member(task, net)
        settle(qtbot, views)
        assert_same_episode(views.replay.episode, task.episode(net))
        assert len(views.graph.graph.edges) == 24
        assert [views.tabText(i) for i in range(views.count())] == ["Replay", "Network graph"]
    finally:
        views.shutdown()


@pytest.fixture
def panel(qtbot, runner, tmp_path):
    """An Evolution panel on a workspace of its own, at a docked panel's size."""
    with Workspace(tmp_path / "ws.sqlite3") as workspace:
        p = EvolutionPanel(runner, workspace)
        qtbot.addWidget(p)
        p.resize(1280, 520)
        p.show()
        yield p
        p.shutdown()


def test_a_cartpole_run_in_the_panel_replays_its_best_member(qtbot, panel):
    views = panel.member_views
    assert not views.isVisibleTo(panel)  # an XOR run's panel, as before
    choose(qtbot, panel.task_box, "cartpole")
    panel.set_form(population=6, generations=2, seed=3, scheduler="inprocess")
    assert panel.message.text() == "" and panel.run_plan().task == get_task("cartpole")
    panel.start()
    settle(qtbot, panel, timeout=60000)
    assert panel.status.text().startswith("run 1 finished at generation 2"), panel.status.text()
    assert views.isVisibleTo(panel) and len(panel.history) == 2 and len(panel.rows) == 6
    settle(qtbot, views)
    best = panel.best
    assert_same_episode(views.replay.episode, get_task("cartpole").episode(best))
    assert views.replay.episode.total == pytest.approx(
        get_task("cartpole", episodes=1).evaluate([best])[0])
    weights = [layer.weights.master for _, layer in best.layers() if not layer.cfg.is_disabled]
    assert len(views.graph.graph.edges) == sum(np.count_nonzero(w) for w in weights)
    # the replay and the graph fit a docked panel of a 1280x800 window, nothing cut off
    need = panel.minimumSizeHint()
    assert need.width() <= 1280 and need.height() <= DOCKED[1], need
    for tab in range(views.count()):
        views.setCurrentIndex(tab)
        assert assert_unclipped(panel) > 0
    # a past run picked from the list shows its best member the same way
    panel.show_run(panel.run_id)
    settle(qtbot, views)
    assert_same_episode(views.replay.episode, get_task("cartpole").episode(panel.best))


def test_the_gym_task_takes_its_environment_and_episodes_from_the_form(qtbot, panel):
    """Any Gymnasium id through the form: the Environment row shows for gym only, a wrong id is
    the form's message (Start off), and a FrozenLake run replays its best member's episode with
    Gymnasium's own rendered frames."""
    choose(qtbot, panel.task_box, "cartpole")
    assert not panel.env_edit.isVisibleTo(panel) and panel.episodes_edit.isVisibleTo(panel)
    qtbot.wait(QApplication.keyboardInputInterval() + 100)  # a new search, not "cartpolegym"
    choose(qtbot, panel.task_box, "gym")
    assert panel.env_edit.isVisibleTo(panel)
    panel.set_form(env="NoSuchEnv-v9", population=4, generations=1, seed=2, scheduler="inprocess")
    assert "'NoSuchEnv-v9' is not a Gymnasium environment" in panel.message.text()
    assert not panel.start_button.isEnabled()
    panel.set_form(env="FrozenLake-v1", episodes=2)
    assert panel.message.text() == "" and panel.start_button.isEnabled()
    assert panel.form_settings()["task"] == {"episodes": 2, "env": "FrozenLake-v1"}
    task = get_task("gym", env="FrozenLake-v1", episodes=2)
    assert panel.run_plan().task == task
    panel.start()
    settle(qtbot, panel, timeout=60000)
    assert panel.status.text().startswith("run 1 finished at generation 1"), panel.status.text()
    settle(qtbot, panel.member_views)
    episode = panel.member_views.replay.episode
    assert_same_episode(episode, task.episode(panel.best))
    assert len(episode.frames) == len(episode) + 1  # Gymnasium's rgb_array frames
