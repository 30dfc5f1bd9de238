"""Frames and replays of control episodes (core/evolve/control/frames.py).

The oracle of a drawn frame is Gymnasium's own ``render()`` of the same state (pygame, when it is
installed): every pixel of each picture has, within one pixel in the other, a pixel of nearly
the same colour, so each object is where Gymnasium puts it, of its size and colour, to a pixel.
A saved replay is read back by imageio (Pillow's GIF decoder, ffmpeg's H.264 one): the frames,
their count, size and timing are the ones drawn.
"""

from __future__ import annotations

import functools
import sys

import numpy as np
import pytest

from loomlab.core.errors import LoomCancelled, LoomConfigError
from loomlab.core.evolve.control import frames as frames_module
from loomlab.core.evolve.control.frames import DRAWN, episode_frames, frame, replay_fps, save_replay
from loomlab.core.evolve.control.rollout import Episode
from loomlab.core.evolve.search.tasks import get_task

pytest.importorskip("gymnasium")
iio = pytest.importorskip("imageio.v3")
Image = pytest.importorskip("PIL.Image")

TASKS = {"cartpole": "CartPole-v1", "acrobot": "Acrobot-v1", "mountaincar": "MountainCar-v0",
         "mountaincar-continuous": "MountainCarContinuous-v0", "pendulum": "Pendulum-v1"}
#: how far apart two colours may be and still be "the same" next to an anti-aliased edge: pygame
#: blends its edges, Pillow does not
COLOUR_TOLERANCE = 128


@functools.cache
def episode(name: str, steps: int, render: bool = False) -> Episode:
    """The seed network's first evaluation episode of task ``name``, at most ``steps`` steps."""
    task = get_task(name, max_steps=steps)
    return task.episode(task.seed_network(), render=render)


def unmatched(a: np.ndarray, b: np.ndarray, tol: int = COLOUR_TOLERANCE) -> int:
    """How many pixels of ``a`` have no pixel of ``b`` within one pixel (the 3 x 3 around it)
    whose colour is within ``tol`` in every channel; only the box around what is not white in
    either is looked at (all white elsewhere)."""
    drawn = (a != 255).any(-1) | (b != 255).any(-1)
    if not drawn.any():
        return 0
    rows, cols = np.flatnonzero(drawn.any(1)), np.flatnonzero(drawn.any(0))
    y0, y1 = max(rows[0] - 2, 0), rows[-1] + 3
    x0, x1 = max(cols[0] - 2, 0), cols[-1] + 3
    a, b = a[y0:y1, x0:x1], b[y0:y1, x0:x1]
    h, w = a.shape[:2]
    padded = np.pad(b, ((1, 1), (1, 1), (0, 0)), constant_values=255)
    near = np.zeros((h, w), bool)
    for dy in range(3):
        for dx in range(3):
            other = padded[dy:dy + h, dx:dx + w]
            near |= (np.maximum(a, other) - np.minimum(a, other)).max(-1) <= tol
    return int((~near).sum())


def fitted(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """Gymnasium's frame scaled to fit ``width`` x ``height`` and centred on white."""
    h, w = image.shape[:2]
    s = min(width / w, height / h)
    size = (round(w * s), round(h * s))
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    canvas.paste(Image.fromarray(image).resize(size, Image.Resampling.LANCZOS),
                 ((width - size[0]) // 2, (height - size[1]) // 2))
    return np.asarray(canvas)


@pytest.mark.parametrize("name", sorted(TASKS))
def test_drawn_frames_match_gymnasiums_render(name):
    pytest.importorskip("pygame")
    ep = episode(name, 100, render=True)  # the frames Gymnasium rendered at each state
    assert ep.env_id == TASKS[name] and len(ep.frames) == len(ep.states) == len(ep) + 1
    h, w = ep.frames[0].shape[:2]
    ours = episode_frames(ep, w, h)
    assert len(ours) == len(ep.states)
    for t in np.linspace(0, len(ep), 6).round().astype(int):
        theirs = ep.frames[t]
        assert ours[t].shape == theirs.shape and ours[t].dtype == np.uint8
        assert (ours[t] != 255).any(-1).sum() > 500  # something is drawn
        assert unmatched(ours[t], theirs) == 0, t
        assert unmatched(theirs, ours[t]) == 0, t
    # the default 600 x 400: the square screens of Acrobot and Pendulum scaled to 400 x 400, centred
    for t in (0, len(ep)):
        action = None if t == 0 else ep.actions[t - 1]
        ours = frame(ep.env_id, ep.states[t], action=action)
        theirs = fitted(ep.frames[t], 600, 400)
        assert ours.shape == (400, 600, 3)
        assert unmatched(ours, theirs) <= 10 and unmatched(theirs, ours) <= 10, t


def test_a_moved_object_is_seen():
    """The oracle's power: a cart one world step (a few pixels) aside fails it."""
    state = np.array([0.1, 0.0, 0.05, 0.0])
    a = frame("CartPole-v1", state)
    b = frame("CartPole-v1", state + [0.03, 0, 0, 0])  # 3.75 pixels to the right
    assert unmatched(a, b) > 50 and unmatched(b, a) > 50
    c = frame("CartPole-v1", state + [0, 0, 0.05, 0])  # the pole turned by 0.05 radian
    assert unmatched(a, c) > 50


def test_pendulum_shows_the_torque_that_led_to_the_state():
    state = np.array([0.5, 0.0])
    still = frame("Pendulum-v1", state)
    left, right = frame("Pendulum-v1", state, action=[-1.5]), frame("Pendulum-v1", state, action=[1.5])
    assert unmatched(left, still) > 200 and unmatched(right, left) > 200
    np.testing.assert_array_equal(right, frame("Pendulum-v1", state, action=np.float32([1.5])))


def test_replay_fps_is_the_environments_render_fps():
    assert {env_id: replay_fps(env_id) for env_id in DRAWN} == {
        "CartPole-v1": 50, "Acrobot-v1": 15, "MountainCar-v0": 30, "MountainCarContinuous-v0": 30,
        "Pendulum-v1": 30}


def runs(frames: list[np.ndarray]) -> list[tuple[np.ndarray, int]]:
    """Consecutive identical frames as ``(frame, how many)``: what a GIF keeps of them."""
    out: list[tuple[np.ndarray, int]] = []
    for f in frames:
        if out and np.array_equal(out[-1][0], f):
            out[-1] = (f, out[-1][1] + 1)
        else:
            out.append((f, 1))
    return out


@pytest.mark.parametrize("name", ["cartpole", "pendulum"])
def test_gif_reads_back_as_the_drawn_frames(tmp_path, name):
    ep = episode(name, 60)
    path = save_replay(ep, tmp_path / f"{name}.gif")
    assert path == tmp_path / f"{name}.gif" and sorted(tmp_path.iterdir()) == [path]
    drawn = episode_frames(ep)
    assert len(drawn) == len(ep) + 1
    expected = runs(drawn)
    read = iio.imread(path, index=None)
    assert read.shape == (len(expected), 400, 600, 3)
    delay = {"cartpole": 20, "pendulum": 30}[name]  # ms: 50 fps; 30 fps, 33 ms rounded to hundredths
    durations = [iio.immeta(path, index=i)["duration"] for i in range(len(read))]
    assert durations == [delay * n for _, n in expected]
    assert sum(durations) == delay * (len(ep) + 1)  # every state shown for its time
    np.testing.assert_array_equal(read[0], drawn[0])  # a drawn frame's few colours: exact palette
    for got, (want, _) in zip(read, expected, strict=True):
        diff = np.abs(got.astype(int) - want.astype(int))
        assert diff.mean() < 0.5 and diff.max() <= 48  # the palette's nearest colours


def test_gif_fps_and_its_ceiling(tmp_path):
    ep = episode("cartpole", 60)
    slow = save_replay(ep, tmp_path / "slow.gif", fps=10)
    fast = save_replay(ep, tmp_path / "fast.gif", fps=200)
    n = runs(episode_frames(ep))[1][1]
    assert iio.immeta(slow, index=1)["duration"] == 100 * n
    assert iio.immeta(fast, index=1)["duration"] == 20 * n  # 50 fps at most


def test_mp4_reads_back_as_the_drawn_frames(tmp_path):
    pytest.importorskip("imageio_ffmpeg")
    ep = episode("cartpole", 60)
    path = save_replay(ep, tmp_path / "cartpole.MP4")
    assert sorted(tmp_path.iterdir()) == [path]
    read = iio.imread(path, index=None, plugin="FFMPEG")
    assert read.shape == (len(ep) + 1, 400, 600, 3)
    assert iio.immeta(path, plugin="FFMPEG")["fps"] == 50
    drawn = episode_frames(ep)
    for t in (0, len(ep) // 2, len(ep)):
        diff = np.abs(read[t].astype(int) - drawn[t].astype(int))
        assert diff.mean() < 1.0 and np.percentile(diff, 99.5) < 40  # H.264's loss, at the edges
    odd = save_replay(ep, tmp_path / "odd.mp4", fps=25, width=301, height=201)
    assert iio.immeta(odd, plugin="FFMPEG")["size"] == (302, 202)  # yuv420p: even sizes


def test_rendered_frames_for_other_ids_are_fitted(tmp_path):
    """An id without drawn frames shows Gymnasium's frames, scaled to fit and centred on black."""
    rng = np.random.default_rng(3)
    rendered = [rng.integers(0, 256, (256, 256, 3), np.uint8) for _ in range(3)]
    ep = Episode("FrozenLake-v1", 0, np.zeros((2, 16), np.float32), np.zeros(2, np.int64), np.zeros(2),
                 np.zeros((3, 0)), np.zeros((2, 4), np.float32), rendered)
    same = episode_frames(ep, 256, 256)
    assert all(np.array_equal(a, b) for a, b in zip(same, rendered, strict=True))
    wide = episode_frames(ep, 600, 400)
    assert len(wide) == 3 and wide[0].shape == (400, 600, 3)
    assert not wide[0][:, :100].any() and not wide[0][:, 500:].any()  # black beside the square
    want = np.asarray(Image.fromarray(rendered[0]).resize((400, 400), Image.Resampling.LANCZOS))
    np.testing.assert_array_equal(wide[0][:, 100:500], want)
    path = save_replay(ep, tmp_path / "lake.gif", fps=4)
    assert iio.imread(path, index=None).shape == (3, 400, 600, 3)


def test_an_episode_without_frames_is_an_error(tmp_path):
    ep = Episode("FrozenLake-v1", 0, np.zeros((2, 16), np.float32), np.zeros(2, np.int64), np.zeros(2),
                 np.zeros((3, 0)), np.zeros((2, 4), np.float32))
    with pytest.raises(LoomConfigError, match="FrozenLake-v1 has no drawn frames and the episode was not"):
        episode_frames(ep)
    with pytest.raises(LoomConfigError, match="not rendered"):
        save_replay(ep, tmp_path / "lake.gif", fps=4)
    with pytest.raises(LoomConfigError, match="FrozenLake-v1 has no drawn frames"):
        frame("FrozenLake-v1", np.zeros(1))
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kwargs, match", [
    ({"path": "replay.png"}, r"\.gif or \.mp4, not 'replay\.png'"),
    ({"path": "replay"}, r"\.gif or \.mp4"),
    ({"fps": 0}, "fps must be a positive number"),
    ({"fps": float("nan")}, "fps must be a positive number"),
    ({"fps": True}, "fps must be a positive number"),
    ({"width": 0}, "width must be a positive integer"),
    ({"height": 2.5}, "height must be a positive integer"),
])
def test_bad_arguments_are_errors(tmp_path, kwargs, match):
    ep = episode("cartpole", 60)
    args = {"path": "replay.gif", **kwargs}
    with pytest.raises(LoomConfigError, match=match):
        save_replay(ep, tmp_path / args.pop("path"), **args)
    assert list(tmp_path.iterdir()) == []


def test_mp4_without_imageio_ffmpeg_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "imageio_ffmpeg", None)  # its import fails
    with pytest.raises(LoomConfigError, match=r"pip install imageio-ffmpeg \(or pip install 'loomlab\["):
        save_replay(episode("cartpole", 60), tmp_path / "replay.mp4")
    assert list(tmp_path.iterdir()) == []


def test_a_failed_save_leaves_the_old_file(tmp_path, monkeypatch):
    ep = episode("cartpole", 60)
    path = tmp_path / "replay.gif"
    path.write_bytes(b"the old replay")
    drawn = 0

    def failing(*args, **kwargs):
        nonlocal drawn
        drawn += 1
        if drawn == 20:
            raise RuntimeError("the disk is full")
        return frame(*args, **kwargs)

    monkeypatch.setattr(frames_module, "frame", failing)
    with pytest.raises(RuntimeError, match="the disk is full"):
        save_replay(ep, path)
    assert drawn == 20 and sorted(tmp_path.iterdir()) == [path] and path.read_bytes() == b"the old replay"
    monkeypatch.undo()
    save_replay(ep, path)  # a whole save replaces it
    assert sorted(tmp_path.iterdir()) == [path] and iio.imread(path, index=0).shape == (400, 600, 3)


def test_a_cancelled_save_stops_between_frames_and_leaves_the_old_file(tmp_path):
    ep = episode("cartpole", 60)
    path = tmp_path / "replay.gif"
    path.write_bytes(b"the old replay")
    asked = []
    with pytest.raises(LoomCancelled):
        save_replay(ep, path, cancel=lambda: asked.append(1) or len(asked) > 12)
    assert len(asked) == 13  # once before each frame drawn: the palette's samples, then the frames
    assert sorted(tmp_path.iterdir()) == [path] and path.read_bytes() == b"the old replay"
