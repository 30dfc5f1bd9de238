"""Pictures of a control episode: one frame per state, and the replay saved as an animated GIF or
an MP4.

The five classic-control environments with batched dynamics (:mod:`.dynamics`) are drawn here
from their states with Pillow, a transcription of each environment's own ``render()`` (its
pygame drawing, world-to-screen scales and colours, read from an instance of the environment), so
a replay needs neither pygame nor a second run of the episode, and a frame matches Gymnasium's
picture of the same state to a pixel (pygame's anti-aliased edges aside;
tests/core/evolve/control/test_frames.py compares them). Any other environment shows the
``rgb_array`` frames Gymnasium rendered while the episode ran (``ControlTask.episode(net,
render=True)``).

A frame is ``width`` x ``height`` whatever the environment's own screen size: the picture is
scaled to fit, keeping its proportions, and centred (white around a drawn frame, black around a
rendered one).

A replay is written a frame at a time as it is drawn, so a long episode is never in memory as
RGB: a GIF through Pillow in one palette for the whole replay (a per-frame median cut, what
imageio's GIF writer asks Pillow for, takes several times as long), an MP4 through
imageio-ffmpeg's frame stream. Pillow and imageio-ffmpeg come with the ``control`` extra (``pip install
'loomlab[control]'``); each is imported on first use.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from ...cancel import Cancel, as_cancel_check
from ...errors import LoomCancelled, LoomConfigError
from ...io.atomic import replacing
from .environments import make
from .rollout import Episode

#: the file types :func:`save_replay` writes
REPLAY_SUFFIXES = (".gif", ".mp4")
#: a GIF's fastest frame rate: its delays are hundredths of a second, and most viewers play a
#: delay under two of them as ten
GIF_MAX_FPS = 50
#: how many frames, evenly spread over a replay, a GIF's palette is chosen from
PALETTE_SAMPLES = 8
#: how many of a GIF's commonest colours its palette keeps exactly when it has more than 256
PALETTE_EXACT = 32
#: how many times finer an anti-aliased line is drawn before it is averaged down
SUPERSAMPLE = 4
_INSTALL = "pip install 'loomlab[control]'"
_WHITE = (255, 255, 255)
_BLACK = (0, 0, 0)


def episode_frames(episode: Episode, width: int = 600, height: int = 400) -> list[np.ndarray]:
    """The episode as pictures, ``width`` x ``height`` RGB uint8, one per state (``T + 1``): drawn
    from ``episode.states`` for a classic-control id, else its rendered ``frames`` (a
    :class:`LoomConfigError` when it has none)."""
    count, at = _frames(episode, width, height)
    return [at(i) for i in range(count)]


def frame(env_id: str, state: np.ndarray, width: int = 600, height: int = 400,
          action: Any = None) -> np.ndarray:
    """One classic-control state drawn as Gymnasium draws it, ``width`` x ``height`` RGB uint8.

    ``action`` is the step's action that led to ``state``: Pendulum shows its torque as an arrow
    (none after a reset, ``action=None``); the other environments ignore it."""
    draw = DRAWN.get(env_id)
    if draw is None:
        raise LoomConfigError(f"{env_id} has no drawn frames; ids with them: {', '.join(DRAWN)}")
    _check_size(width, height)
    return np.array(draw(_env(env_id), np.asarray(state, np.float64), action, width, height).image)


def state_frame(episode: Episode, step: int, width: int = 600, height: int = 400) -> np.ndarray:
    """State ``step`` of a classic-control episode drawn (:func:`frame`), with the action that led
    to it (none to the first)."""
    action = episode.actions[step - 1] if step > 0 else None
    return frame(episode.env_id, episode.states[step], width, height, action)


def replay_fps(env_id: str) -> float:
    """The environment's own frame rate (its class's ``metadata["render_fps"]``; 30 if it has none)."""
    return float(_env(env_id).metadata.get("render_fps") or 30)


def save_replay(episode: Episode, path: str | os.PathLike, fps: float | None = None, *,
                width: int = 600, height: int = 400, cancel: Cancel = None) -> Path:
    """Write the episode's frames (:func:`episode_frames`) to ``path`` as an animated GIF (``.gif``)
    or an H.264 MP4 (``.mp4``, which needs imageio-ffmpeg) at ``fps`` frames a second, and return
    the path. ``fps`` defaults to the environment's own rate (:func:`replay_fps`); a GIF plays at
    most :data:`GIF_MAX_FPS`, and merges consecutive identical frames into one shown for their
    summed time.

    The file is replaced atomically (:func:`~loomlab.core.io.atomic.replacing`), so an
    interrupted save, or one ``cancel`` stops (it is asked before each frame: a
    :class:`LoomCancelled`), leaves the old file or the new one, never a part."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in REPLAY_SUFFIXES:
        raise LoomConfigError(f"a replay is saved as {' or '.join(REPLAY_SUFFIXES)}, not {path.name!r}")
    if fps is None:
        fps = replay_fps(episode.env_id)
    if isinstance(fps, bool) or not isinstance(fps, numbers.Real) or not math.isfinite(fps) or fps <= 0:
        raise LoomConfigError(f"a replay's fps must be a positive number, got {fps!r}")
    write = _write_gif if suffix == ".gif" else _write_mp4
    count, draw = _frames(episode, width, height)
    stop = as_cancel_check(cancel)

    def at(i: int) -> np.ndarray:
        if stop():
            raise LoomCancelled(f"the replay {path.name} was cancelled")
        return draw(i)

    with replacing(path) as f:
        write(f, count, at, fps, width, height)
    return path


def _frames(episode: Episode, width: int, height: int) -> tuple[int, Callable[[int], np.ndarray]]:
    """How many frames the episode has, and the function that draws (or fits) the ``i``-th: a
    replay draws each as it writes it."""
    _check_size(width, height)
    if episode.env_id in DRAWN:
        return len(episode.states), lambda i: state_frame(episode, i, width, height)
    if not episode.frames:
        raise LoomConfigError(f"{episode.env_id} has no drawn frames and the episode was not rendered: "
                              "record it with render=True to replay it")
    return len(episode.frames), lambda i: _fit(episode.frames[i], width, height)


def _write_gif(f: BinaryIO, count: int, at: Callable[[int], np.ndarray], fps: float, width: int,
               height: int) -> None:
    """A looping GIF of the ``count`` frames ``at(i)`` in one palette (:class:`_Palette`)."""
    picks = np.linspace(0, count - 1, min(count, PALETTE_SAMPLES)).round().astype(int)
    palette = _Palette(np.concatenate([at(i) for i in picks]))
    frames = (palette.image(at(i)) for i in range(count))
    delay = max(100 // GIF_MAX_FPS, round(100 / fps))  # hundredths of a second
    next(frames).save(f, format="GIF", save_all=True, append_images=frames, duration=10 * delay, loop=0)


class _Palette:
    """A GIF palette chosen from ``sample`` frames (RGB), and frames put in it. The palette is the
    sample's colours if they are 256 or fewer (a drawn frame's flat fills and edges), else its
    :data:`PALETTE_EXACT` commonest (the background and the fills) and the median cut of the rest.
    A colour of the palette stays itself; Pillow maps any other to a near one. (Pillow's mapping
    alone is not exact: it caches a colour's choice for its neighbours, and white can come out
    grey.)"""

    def __init__(self, sample: np.ndarray):
        Image, _ = _pillow()
        colours, counts = np.unique(_packed(sample), return_counts=True)
        if len(colours) > 256:
            common = colours[np.argsort(counts, kind="stable")[::-1][:PALETTE_EXACT]]
            cut = Image.fromarray(sample).quantize(256 - PALETTE_EXACT, method=Image.Quantize.MEDIANCUT)
            cut_rgb = np.frombuffer(bytes(cut.getpalette()), np.uint8).reshape(-1, 3)[:256 - PALETTE_EXACT]
            colours = np.concatenate([common, _packed(cut_rgb)])
        self.rgb = np.stack([colours >> 16, (colours >> 8) & 255, colours & 255], axis=-1).astype(np.uint8)
        self.keys, self.index = np.unique(colours, return_index=True)  # sorted, and where in the palette
        self.pillow = Image.new("P", (1, 1))
        self.pillow.putpalette(self.rgb.tobytes())

    def image(self, frame: np.ndarray):
        """``frame`` as a ``P`` image in the palette."""
        Image, _ = _pillow()
        near = Image.fromarray(frame).quantize(palette=self.pillow, dither=Image.Dither.NONE)
        packed = _packed(frame)
        at = np.minimum(np.searchsorted(self.keys, packed), len(self.keys) - 1)
        exact = self.keys[at] == packed
        image = Image.fromarray(np.where(exact, self.index[at], np.asarray(near)).astype(np.uint8), "P")
        image.putpalette(self.rgb.tobytes())
        return image


def _packed(rgb: np.ndarray) -> np.ndarray:
    """Each RGB colour as one integer ``0xRRGGBB``."""
    rgb = rgb.astype(np.uint32)
    return (rgb[..., 0] << 16) | (rgb[..., 1] << 8) | rgb[..., 2]


def _write_mp4(f: BinaryIO, count: int, at: Callable[[int], np.ndarray], fps: float, width: int,
               height: int) -> None:
    """An H.264 MP4 of the ``count`` frames ``at(i)`` through imageio-ffmpeg's frame stream
    (yuv420p: an odd size is scaled up to the next even one). ffmpeg writes a path of its own (an
    MP4's index goes at its start once all frames are in), copied into ``f`` at the end."""
    ffmpeg = _imageio_ffmpeg()
    with tempfile.TemporaryDirectory(prefix="loomlab-replay-") as scratch:
        out = Path(scratch) / "replay.mp4"
        stream = ffmpeg.write_frames(str(out), (width, height), fps=fps, codec="libx264",
                                     macro_block_size=2, ffmpeg_log_level="error")
        stream.send(None)  # starts ffmpeg
        try:
            for i in range(count):
                stream.send(at(i))
        finally:
            stream.close()
        with out.open("rb") as written:
            shutil.copyfileobj(written, f)


class _Canvas:
    """A ``width`` x ``height`` RGB image that takes coordinates of the environment's own pygame
    surface (``native`` pixels, y up: Gymnasium flips the surface vertically at the end), scaled
    to fit and centred; white, or a copy of ``base`` (what does not move, drawn once)."""

    def __init__(self, native: tuple[int, int], width: int, height: int, base=None):
        Image, ImageDraw = _pillow()
        w0, self.h0 = native
        self.s = min(width / w0, height / self.h0)
        self.ox, self.oy = (width - w0 * self.s) / 2, (height - self.h0 * self.s) / 2
        self.image = Image.new("RGB", (width, height), _WHITE) if base is None else base.copy()
        self.draw = ImageDraw.Draw(self.image)

    def point(self, x: float, y: float) -> tuple[float, float]:
        """A surface point in the image: Pillow fills the pixels its coordinates floor to, and
        pygame the ones they truncate to; a hair under the flipped ``y`` keeps a whole-pixel edge
        on its pixel."""
        return self.ox + self.s * x, self.oy + self.s * (self.h0 - y) - 1e-6

    def pixel(self, px: float, py: float) -> tuple[float, float]:
        """The centre of surface pixel ``(px, py)`` in image coordinates (a pixel's own index at
        the scale of 1)."""
        return self.ox + self.s * (px + 0.5) - 0.5, self.oy + self.s * (self.h0 - py - 0.5) - 0.5

    def polygon(self, points, color) -> None:
        self.draw.polygon([self.point(x, y) for x, y in points], fill=color)

    def circle(self, cx: int, cy: int, r: int, color) -> None:
        """pygame's ``filled_circle``: the pixels within ``r`` of pixel ``(cx, cy)``."""
        x, y = self.pixel(cx, cy)
        half = self.s * (r + 0.5) - 0.5  # from the centre pixel to the outermost ones
        self.draw.ellipse((x - half, y - half, x + half, y + half), fill=color)

    def line(self, points, color) -> None:
        """pygame's ``draw.line``: a one-pixel line (scaled) through surface points."""
        self.draw.line([self.point(x, y) for x, y in points], fill=color, width=max(1, round(self.s)))

    def pixel_line(self, start: tuple[int, int], end: tuple[int, int], color) -> None:
        """pygame's ``hline``/``vline``: the pixels from ``start`` to ``end`` inclusive."""
        self.draw.line([self.pixel(*start), self.pixel(*end)], fill=color, width=max(1, round(self.s)))


def _rotated(points, angle: float, dx: float, dy: float) -> list[tuple[float, float]]:
    """``points`` turned by ``angle`` (radians, counter-clockwise: pygame's ``rotate_rad``), then
    moved by ``(dx, dy)``."""
    c, s = math.cos(angle), math.sin(angle)
    return [(x * c - y * s + dx, x * s + y * c + dy) for x, y in points]


def _box(left: float, right: float, top: float, bottom: float) -> list[tuple[float, float]]:
    """A rectangle's corners in the order Gymnasium's renders list them."""
    return [(left, bottom), (left, top), (right, top), (right, bottom)]


def _cartpole(e, state, action, width, height) -> _Canvas:
    """``CartPoleEnv.render``: the cart on its track and the pole on its axle."""
    canvas = _Canvas((e.screen_width, e.screen_height), width, height)
    scale = e.screen_width / (e.x_threshold * 2)
    polewidth, polelen = 10.0, scale * (2 * e.length)
    cartwidth, cartheight = 50.0, 30.0
    axleoffset = cartheight / 4.0
    cartx, carty = state[0] * scale + e.screen_width / 2.0, 100  # the cart's middle, its top
    canvas.polygon([(x + cartx, y + carty) for x, y in
                    _box(-cartwidth / 2, cartwidth / 2, cartheight / 2, -cartheight / 2)], _BLACK)
    pole = _box(-polewidth / 2, polewidth / 2, polelen - polewidth / 2, -polewidth / 2)
    canvas.polygon(_rotated(pole, -state[2], cartx, carty + axleoffset), (202, 152, 101))
    canvas.circle(int(cartx), int(carty + axleoffset), int(polewidth / 2), (129, 132, 203))
    canvas.pixel_line((0, carty), (e.screen_width, carty), _BLACK)
    return canvas


def _acrobot(e, state, action, width, height) -> _Canvas:
    """``AcrobotEnv.render``: the two links from the fixed pivot, their joints, the goal line."""
    size = e.SCREEN_DIM
    canvas = _Canvas((size, size), width, height)
    scale = size / ((e.LINK_LENGTH_1 + e.LINK_LENGTH_2 + 0.2) * 2)
    offset = size / 2
    s0, s1 = state[0], state[1]
    joints = [(0.0, 0.0), (e.LINK_LENGTH_1 * math.sin(s0) * scale, -e.LINK_LENGTH_1 * math.cos(s0) * scale)]
    thetas = [s0 - math.pi / 2, s0 + s1 - math.pi / 2]
    lengths = [e.LINK_LENGTH_1 * scale, e.LINK_LENGTH_2 * scale]
    goal = 1 * scale + offset  # the height the free end must pass
    canvas.line([(-2.2 * scale + offset, goal), (2.2 * scale + offset, goal)], _BLACK)
    for (x, y), th, length in zip(joints, thetas, lengths, strict=True):
        x, y = x + offset, y + offset
        canvas.polygon(_rotated(_box(0, length, 0.1 * scale, -0.1 * scale), th, x, y), (0, 204, 204))
        canvas.circle(int(x), int(y), int(0.1 * scale), (204, 204, 0))
    return canvas


def _mountain_height(xs):
    """The track's height at ``xs`` (``MountainCarEnv._height``, the same in the continuous one)."""
    return np.sin(3 * xs) * 0.45 + 0.55


def _mountain_car(e, state, action, width, height) -> _Canvas:
    """``MountainCarEnv.render`` (and ``Continuous_MountainCarEnv``'s, the same): the track, the
    car tilted to its slope with its two wheels, and the goal's flag."""
    track = _track(e.min_position, e.max_position, e.screen_width, e.screen_height, width, height)
    canvas = _Canvas((e.screen_width, e.screen_height), width, height, track)
    scale = e.screen_width / (e.max_position - e.min_position)
    carwidth, carheight, clearance = 40, 20, 10
    pos = float(state[0])
    tilt = math.cos(3 * pos)
    carx, cary = (pos - e.min_position) * scale, clearance + _mountain_height(pos) * scale
    canvas.polygon(_rotated(_box(-carwidth / 2, carwidth / 2, carheight, 0), tilt, carx, cary), _BLACK)
    for x, y in _rotated([(carwidth / 4, 0), (-carwidth / 4, 0)], tilt, carx, cary):
        canvas.circle(int(x), int(y), int(carheight / 2.5), (128, 128, 128))
    flagx = int((e.goal_position - e.min_position) * scale)
    flagy1 = int(_mountain_height(e.goal_position) * scale)
    flagy2 = flagy1 + 50
    canvas.pixel_line((flagx, flagy1), (flagx, flagy2), _BLACK)
    canvas.polygon([(flagx, flagy2), (flagx, flagy2 - 10), (flagx + 25, flagy2 - 5)], (204, 204, 0))
    return canvas


@functools.lru_cache(maxsize=8)
def _track(min_position: float, max_position: float, w0: int, h0: int, width: int, height: int):
    """The mountain's outline, black on white and anti-aliased (pygame's ``aalines`` through 100
    points): drawn :data:`SUPERSAMPLE` times finer and averaged down, once per size."""
    Image, ImageDraw = _pillow()
    canvas, k = _Canvas((w0, h0), width, height), SUPERSAMPLE
    scale = w0 / (max_position - min_position)
    xs = np.linspace(min_position, max_position, 100)
    centres = [canvas.pixel(x, y) for x, y in zip((xs - min_position) * scale, _mountain_height(xs) * scale,
                                                  strict=True)]
    mask = Image.new("L", (width * k, height * k), 0)
    ImageDraw.Draw(mask).line([(k * x + k / 2, k * y + k / 2) for x, y in centres], fill=255,
                              width=max(1, round(k * canvas.s)))
    canvas.image.paste(_BLACK, None, mask.reduce(k))
    return canvas.image


def _pendulum(e, state, action, width, height) -> _Canvas:
    """``PendulumEnv.render``: the rod from its axle, and the last torque as a curved arrow sized by
    its magnitude, mirrored for a positive one."""
    size = e.screen_dim
    canvas = _Canvas((size, size), width, height)
    scale = size / (2.2 * 2)
    offset = size // 2
    rod_length, rod_width = 1 * scale, 0.2 * scale
    angle = state[0] + math.pi / 2
    rod = _box(0, rod_length, rod_width / 2, -rod_width / 2)
    red = (204, 77, 77)
    canvas.polygon(_rotated(rod, angle, offset, offset), red)
    canvas.circle(offset, offset, int(rod_width / 2), red)
    (endx, endy), = _rotated([(rod_length, 0)], angle, offset, offset)
    canvas.circle(int(endx), int(endy), int(rod_width / 2), red)
    if action is not None:
        u = float(np.asarray(action, np.float64).reshape(-1)[0])
        side = int(scale * abs(u) / 2)  # pygame's smoothscale takes the size truncated
        shown = round(side * canvas.s)
        if shown > 0:
            arrow = _arrow(shown, u > 0)
            # pygame blits it centred on the axle, then flips the whole surface
            x, y = canvas.point(offset - side // 2, offset - side // 2 + side)
            canvas.image.paste(arrow, (round(x), round(y)), arrow)
    canvas.circle(offset, offset, int(0.05 * scale), _BLACK)
    return canvas


@functools.lru_cache(maxsize=256)
def _arrow(side: int, mirrored: bool):
    """Gymnasium's torque arrow (``classic_control/assets/clockwise.png``, RGBA) ``side`` pixels
    square, ``mirrored`` left to right (a positive torque)."""
    from importlib.resources import files

    Image, _ = _pillow()
    with (files("gymnasium.envs.classic_control") / "assets" / "clockwise.png").open("rb") as f:
        arrow = Image.open(f).convert("RGBA").resize((side, side), Image.Resampling.LANCZOS)
    return arrow.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if mirrored else arrow


#: how each classic-control id is drawn: ``(env, state, action, width, height) -> canvas``
DRAWN: dict[str, Callable[..., _Canvas]] = {
    "CartPole-v1": _cartpole, "Acrobot-v1": _acrobot, "MountainCar-v0": _mountain_car,
    "MountainCarContinuous-v0": _mountain_car, "Pendulum-v1": _pendulum}


@functools.cache
def _env(env_id: str):
    """The unwrapped environment of ``env_id``, for its constants and metadata (closed at once: it
    is never reset or stepped)."""
    env = make(env_id)
    env.close()
    return env.unwrapped


def _fit(image: np.ndarray, width: int, height: int) -> np.ndarray:
    """A rendered frame scaled to fit ``width`` x ``height`` with its proportions, centred on black."""
    image = np.ascontiguousarray(np.asarray(image, np.uint8)[..., :3])
    h, w = image.shape[:2]
    if (w, h) == (width, height):
        return image
    Image, _ = _pillow()
    s = min(width / w, height / h)
    size = (max(1, round(w * s)), max(1, round(h * s)))
    canvas = Image.new("RGB", (width, height), _BLACK)
    canvas.paste(Image.fromarray(image).resize(size, Image.Resampling.LANCZOS),
                 ((width - size[0]) // 2, (height - size[1]) // 2))
    return np.array(canvas)


def _check_size(width: int, height: int) -> None:
    """A :class:`LoomConfigError` unless a frame's size is two positive integers."""
    for name, v in (("width", width), ("height", height)):
        if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
            raise LoomConfigError(f"a frame's {name} must be a positive integer, got {v!r}")


def _pillow():
    """Pillow's ``Image`` and ``ImageDraw``, or a :class:`LoomConfigError` saying how to install them."""
    try:
        from PIL import Image, ImageDraw
    except ImportError:
        raise LoomConfigError(f"frames are drawn with Pillow: {_INSTALL}") from None
    return Image, ImageDraw


def _imageio_ffmpeg():
    """The ``imageio_ffmpeg`` module (ffmpeg, bundled), or a :class:`LoomConfigError` saying how to
    install it."""
    try:
        import imageio_ffmpeg
    except ImportError:
        raise LoomConfigError("an MP4 replay needs imageio-ffmpeg: pip install imageio-ffmpeg "
                              f"(or {_INSTALL})") from None
    return imageio_ffmpeg
