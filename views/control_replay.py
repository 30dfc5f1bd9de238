"""The replay of a control task's member: its episode played back frame by frame, beside the
observations it saw and the actions it took as traces with a cursor at the current step (beside,
not below: a docked panel has more width than height to give), and saved as a GIF or an MP4.

The episode is computed off the GUI thread (``task.episode(net, k)`` in a job; a member asked for
while one is computed waits, and only the latest one waiting is played). A classic-control frame
is drawn from the episode's state when its step is shown (:func:`~loomlab.core.evolve.control.
frames.state_frame`, ~2 ms); any other environment's episode is rendered by Gymnasium in the job,
and its frames kept. "Export replay…" writes the file (:func:`~loomlab.core.evolve.control.frames.
save_replay`) in a job; Cancel stops it between frames, leaving any file that was there.

:class:`BestMemberViews` holds the replay beside the network's graph (:mod:`.network_graph`), as
the Evolution panel shows a control run's best member.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QRectF, QSize, Qt, QTimer
from PySide6.QtGui import QImage, QPainter
from PySide6.QtWidgets import (
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QProgressBar,
    QPushButton,
    QSlider,
    QSpinBox,
    QSplitter,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from loomlab.core.evolve.control.control_task import ControlTask
from loomlab.core.evolve.control.frames import (
    DRAWN,
    REPLAY_SUFFIXES,
    episode_frames,
    replay_fps,
    save_replay,
    state_frame,
)
from loomlab.core.evolve.control.rollout import Episode
from loomlab.core.evolve.genetics.clone import clone_network
from loomlab.core.network import VolumetricNetwork

from .network_graph import NetworkGraph
from .workers import Job, JobRunner

FRAME_SIZE = (600, 400)  # the pictures' size, as a saved replay's: the view scales them to fit
EXPORT_FILTERS = "Animated GIF (*.gif);;MP4 video (*.mp4)"
TRACE_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
                 "#9c755f", "#bab0ac")
CURSOR_COLOUR = "#f0a030"
VIEW_SHARES = (2, 3)  # the picture's and the traces' widths
TRACE_SHARES = (3, 2)  # the observation plot's and the action plot's heights
LABEL_BACKING_ALPHA = 180  # a trace plot's name is written on its canvas colour, this opaque
WIDEST_STEP = "step 0000 / 0000 · return -0000.0"  # the step label keeps this width: the slider stays put


def frame_image(rgb: np.ndarray) -> QImage:
    """An ``H x W x 3`` uint8 picture as a QImage holding its own copy of the pixels."""
    rgb = np.ascontiguousarray(rgb, np.uint8)
    height, width, _ = rgb.shape
    return QImage(rgb.data, width, height, 3 * width, QImage.Format.Format_RGB888).copy()


class FrameView(QWidget):
    """Paints a picture scaled to fit the widget, keeping its proportions, centred."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.image: QImage | None = None
        self.setMinimumSize(72, 48)

    def set_image(self, image: QImage | None) -> None:
        self.image = image
        self.update()

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt's name
        return QSize(FRAME_SIZE[0] // 2, FRAME_SIZE[1] // 2)

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt's name
        if self.image is None:
            return
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.SmoothPixmapTransform)
        s = min(self.width() / self.image.width(), self.height() / self.image.height())
        w, h = self.image.width() * s, self.image.height() * s
        painter.drawImage(QRectF((self.width() - w) / 2, (self.height() - h) / 2, w, h), self.image)
        painter.end()


class ControlReplay(QWidget):
    """Plays a control episode back (see the module docstring): Play/Pause, a step back and
    forward, a slider over the states (``0`` the reset, ``len(episode)`` the last), the traces with
    a cursor that can be dragged, the evaluation episode to show, and "Export replay…".

    Args:
        runner: the window's job runner (the episode's and the export's jobs).
    """

    def __init__(self, runner: JobRunner, parent: QWidget | None = None):
        super().__init__(parent)
        self._runner = runner
        self.episode: Episode | None = None
        self.pictures: list[np.ndarray] = []  # an environment without drawn frames: its rendered ones
        self.step = 0  # the state shown: 0 .. len(episode)
        self.member: tuple[ControlTask, VolumetricNetwork] | None = None
        self._load: Job | None = None
        self._waiting: tuple[ControlTask, VolumetricNetwork, int] | None = None  # asked for during a load
        self._export: Job | None = None
        self._closed = False
        self.timer = QTimer(self)  # advances a step while playing
        self.timer.timeout.connect(self._advance)

        self.view = FrameView()
        self.play_button = QPushButton("Play")
        self.play_button.clicked.connect(self.toggle_play)
        self.back_button = QToolButton()  # a small button: its arrow needs no push button's width
        self.back_button.setText("◀")
        self.back_button.setToolTip("One step back")
        self.back_button.clicked.connect(lambda: self.step_by(-1))
        self.forward_button = QToolButton()
        self.forward_button.setText("▶")
        self.forward_button.setToolTip("One step forward")
        self.forward_button.clicked.connect(lambda: self.step_by(1))
        self.slider = QSlider(Qt.Orientation.Horizontal)
        self.slider.valueChanged.connect(self.set_step)
        self.episode_box = QSpinBox()
        self.episode_box.setPrefix("episode ")
        self.episode_box.setRange(1, 1)
        self.episode_box.setToolTip("Which of the task's evaluation episodes to play (their seeds in order)")
        self.episode_box.valueChanged.connect(self._episode_chosen)
        self.step_label = QLabel("")
        self.step_label.setMinimumWidth(self.step_label.fontMetrics().horizontalAdvance(WIDEST_STEP))
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.export_button = QPushButton("Export replay…")
        self.export_button.setToolTip("Save the episode as an animated GIF or an MP4 video")
        self.export_button.clicked.connect(self._ask_export)
        self.export_progress = QProgressBar()
        self.export_progress.setRange(0, 0)  # save_replay reports no steps: busy
        self.export_progress.setTextVisible(False)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_export)

        self.traces = pg.GraphicsLayoutWidget()
        self.traces.setMinimumSize(120, 48)
        self.observation_plot = self.traces.addPlot(row=0, col=0)
        self.action_plot = self.traces.addPlot(row=1, col=0)
        self.action_plot.setXLink(self.observation_plot)
        self.observation_plot.hideAxis("bottom")  # the same steps as the action plot's, below it
        for row, share in enumerate(TRACE_SHARES):
            self.traces.ci.layout.setRowStretchFactor(row, share)
        self.action_plot.setLabel("bottom", "step")
        self.observation_curves: list[pg.PlotDataItem] = []
        self.action_curves: list[pg.PlotDataItem] = []
        self.cursors = []
        colour = pg.mkColor(pg.getConfigOption("foreground"))  # on the plots' canvas, not the window's
        canvas = pg.mkColor(pg.getConfigOption("background"))
        canvas.setAlpha(LABEL_BACKING_ALPHA)  # the traces show through, dimmed
        for plot, title in ((self.observation_plot, "observation"), (self.action_plot, "action")):
            plot.setMenuEnabled(False)
            # the name in the plot's corner: a short plot has no height for a vertical axis title
            label = pg.TextItem(title, color=colour, anchor=(0, 0), fill=canvas)
            label.setParentItem(plot.getViewBox())
            cursor = pg.InfiniteLine(0, angle=90, movable=True, pen=pg.mkPen(CURSOR_COLOUR, width=2))
            cursor.sigDragged.connect(self._cursor_dragged)
            plot.addItem(cursor)
            self.cursors.append(cursor)

        # the picture beside the traces (a short dock has more width than height to give), the
        # controls in two rows under both
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.view)
        split.addWidget(self.traces)
        split.setChildrenCollapsible(False)
        split.setSizes([1000 * share for share in VIEW_SHARES])
        controls = QHBoxLayout()
        for w in (self.play_button, self.back_button, self.forward_button):
            controls.addWidget(w)
        controls.addWidget(self.slider, 1)
        controls.addWidget(self.step_label)
        info = QHBoxLayout()
        info.addWidget(self.episode_box)
        info.addWidget(self.status, 1)
        info.addWidget(self.export_progress)
        info.addWidget(self.cancel_button)
        info.addWidget(self.export_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(split, 1)
        layout.addLayout(controls)
        layout.addLayout(info)
        self._sync_controls()

    # ----- what is shown ---------------------------------------------------------------------------
    def show_member(self, task: ControlTask, net: VolumetricNetwork) -> None:
        """Play ``net``'s episode of ``task`` (the one the episode box names), computed in a job on
        a copy of ``net``: the window's other panels may watch ``net``, and the episode must not
        feed their observers."""
        self.member = task, clone_network(net)
        self.episode_box.blockSignals(True)
        self.episode_box.setRange(1, len(task.seeds()))
        self.episode_box.blockSignals(False)
        self._request(*self.member, self.episode_box.value() - 1)

    def set_episode(self, episode: Episode | None, pictures: list[np.ndarray] | None = None) -> None:
        """Show ``episode`` from its first state (``pictures``: its frames, for an environment
        without drawn ones; None: nothing)."""
        self.pause()
        self.episode, self.pictures = episode, list(pictures or [])
        steps = 0 if episode is None else len(episode)
        self.slider.blockSignals(True)
        self.slider.setRange(0, steps)
        self.slider.blockSignals(False)
        self._draw_traces()
        self.step = -1  # so that set_step draws step 0
        self.set_step(0)
        if episode is not None:
            self.timer.setInterval(round(1000 / replay_fps(episode.env_id)))
            self.status.setText(f"seed {episode.seed} · {steps} steps · return {episode.total:.6g}")
        self._sync_controls()

    def clear(self) -> None:
        """Show nothing (a new run): a member being computed is dropped."""
        self.member, self._waiting = None, None
        if self._load is not None:
            self._load.cancel()
        self.set_episode(None)
        self.status.setText("")

    def picture(self, step: int) -> np.ndarray:
        """The episode's picture at state ``step``, ``FRAME_SIZE``."""
        if self.pictures:
            return self.pictures[step]
        return state_frame(self.episode, step, *FRAME_SIZE)

    def set_step(self, step: int) -> None:
        """Show state ``step`` (clamped to the episode): the picture, the slider and the cursors."""
        steps = 0 if self.episode is None else len(self.episode)
        step = min(max(int(step), 0), steps)
        if step == self.step:
            return
        self.step = step
        self.view.set_image(None if self.episode is None else frame_image(self.picture(step)))
        self.slider.blockSignals(True)
        self.slider.setValue(step)
        self.slider.blockSignals(False)
        for cursor in self.cursors:
            cursor.setValue(step)
        if self.episode is None:
            self.step_label.setText("")
        else:
            done = float(np.sum(self.episode.rewards[:step]))
            self.step_label.setText(f"step {step} / {steps} · return {done:.4g}")
        self._sync_controls()

    def _draw_traces(self) -> None:
        e = self.episode
        observations = np.zeros((0, 0)) if e is None else e.observations
        actions = np.zeros((0, 0)) if e is None else np.asarray(e.actions, np.float64)
        if actions.ndim == 1:  # a discrete action per step
            actions = actions[:, None]
        x = np.arange(len(observations), dtype=np.float64)
        for plot, curves, values in ((self.observation_plot, self.observation_curves, observations),
                                     (self.action_plot, self.action_curves, actions)):
            while len(curves) > values.shape[1]:
                plot.removeItem(curves.pop())
            while len(curves) < values.shape[1]:
                colour = TRACE_COLOURS[len(curves) % len(TRACE_COLOURS)]
                curves.append(plot.plot([], [], pen=pg.mkPen(colour, width=1.5)))
            for curve, column in zip(curves, values.T, strict=True):
                curve.setData(x, column.astype(np.float64))
            plot.enableAutoRange()

    # ----- playing -----------------------------------------------------------------------------------
    def play(self) -> None:
        """Advance a step at the environment's frame rate until the end (from the start if at it)."""
        if self.episode is None or not len(self.episode):
            return
        if self.step >= len(self.episode):
            self.set_step(0)
        self.timer.start()
        self._sync_controls()

    def pause(self) -> None:
        self.timer.stop()
        self._sync_controls()

    def toggle_play(self) -> None:
        if self.timer.isActive():
            self.pause()
        else:
            self.play()

    def step_by(self, steps: int) -> None:
        """Pause and move ``steps`` states on (back, if negative)."""
        self.pause()
        self.set_step(self.step + steps)

    def _advance(self) -> None:
        self.set_step(self.step + 1)
        if self.episode is None or self.step >= len(self.episode):
            self.pause()

    def _cursor_dragged(self, cursor: pg.InfiniteLine) -> None:
        self.pause()
        self.set_step(round(cursor.value()))
        cursor.setValue(self.step)  # on a whole step, within the episode

    def hideEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self.pause()  # a hidden replay does not tick
        super().hideEvent(event)

    # ----- the episode's job -----------------------------------------------------------------------
    def _episode_chosen(self, number: int) -> None:
        if self.member is not None:
            self._request(*self.member, number - 1)

    def _request(self, task: ControlTask, net: VolumetricNetwork, k: int) -> None:
        if self._closed:
            return
        if self._load is not None:  # one episode at a time: the latest asked for follows
            self._waiting = task, net, k
            return
        render = task.environment.env_id not in DRAWN

        def work(job: Job) -> tuple[Episode, list[np.ndarray]]:
            episode = task.episode(net, k, render=render)
            return episode, episode_frames(episode, *FRAME_SIZE) if render else []

        self._load = self._runner.start(work, name="replay episode", on_success=lambda r: self._loaded(*r),
                                        on_failure=lambda m: self._loaded(None, message=m),
                                        on_cancel=lambda: self._loaded(None))
        self.status.setText(f"computing episode {k + 1} of the member…")
        self._sync_controls()

    def _loaded(self, episode: Episode | None, pictures: list[np.ndarray] | None = None,
                message: str = "") -> None:
        if self._closed:
            return
        self._load = None
        if episode is not None:
            self.set_episode(episode, pictures)
        elif message:
            self.status.setText(f"cannot replay the member: {message}")
        if self._waiting is not None:  # a newer member, or another of its episodes
            waiting, self._waiting = self._waiting, None
            self._request(*waiting)
        self._sync_controls()

    # ----- export ----------------------------------------------------------------------------------
    def _ask_export(self) -> None:
        path, chosen = QFileDialog.getSaveFileName(self, "Export replay", "replay.gif", EXPORT_FILTERS)
        if path:
            if Path(path).suffix.lower() not in REPLAY_SUFFIXES:  # the chosen filter's
                path += ".mp4" if "mp4" in chosen else ".gif"
            self.export(path)

    def export(self, path: str | os.PathLike) -> None:
        """Save the episode shown to ``path`` (``.gif`` or ``.mp4``) in a job at the environment's
        frame rate; the status line says where it went or why not."""
        episode = self.episode
        if episode is None or self._export is not None:
            return
        path = Path(path)
        if path.suffix.lower() not in REPLAY_SUFFIXES:
            self.status.setText(f"not exported: a replay is saved as {' or '.join(REPLAY_SUFFIXES)}")
            return

        def work(job: Job) -> Path:  # a cancel stops it between frames and leaves the old file
            return save_replay(episode, path, cancel=job.is_cancelled)

        self._export = self._runner.start(work, name="export replay",
                                          on_success=lambda p: self._exported(f"saved {p}"),
                                          on_failure=lambda m: self._exported(f"export failed: {m}"),
                                          on_cancel=lambda: self._exported("export cancelled"))
        self.status.setText(f"exporting the replay to {path}…")
        self._sync_controls()

    def cancel_export(self) -> None:
        """Stop the export: what it writes is discarded."""
        if self._export is not None:
            self._export.cancel()

    def _exported(self, message: str) -> None:
        if self._closed:
            return
        self._export = None
        self.status.setText(message)
        self._sync_controls()

    # ----- state -------------------------------------------------------------------------------------
    def is_busy(self) -> bool:
        """An episode is being computed or a replay saved."""
        return self._load is not None or self._export is not None

    def shutdown(self) -> None:
        """Stop playing and join the jobs."""
        self._closed = True
        self.timer.stop()
        for job in (self._load, self._export):
            if job is not None:
                job.stop()
        self._load = self._export = None

    def _sync_controls(self) -> None:
        steps = 0 if self.episode is None else len(self.episode)
        playing = self.timer.isActive()
        self.play_button.setText("Pause" if playing else "Play")
        self.play_button.setEnabled(steps > 0)
        self.back_button.setEnabled(self.step > 0)
        self.forward_button.setEnabled(self.step < steps)
        self.slider.setEnabled(steps > 0)
        self.export_button.setEnabled(self.episode is not None and self._export is None)
        self.episode_box.setEnabled(self.member is not None)
        for w in (self.export_progress, self.cancel_button):
            w.setVisible(self._export is not None)


class BestMemberViews(QTabWidget):
    """A control run's member as two tabs: its replay (:class:`ControlReplay`) and its network's
    graph (:class:`~.network_graph.NetworkGraph`)."""

    def __init__(self, runner: JobRunner, parent: QWidget | None = None):
        super().__init__(parent)
        self.replay = ControlReplay(runner)
        self.graph = NetworkGraph()
        self.addTab(self.replay, "Replay")
        self.addTab(self.graph, "Network graph")

    def show_member(self, task: ControlTask, net: VolumetricNetwork) -> None:
        """Draw ``net`` and play its episode of ``task``."""
        self.graph.set_network(net)
        self.replay.show_member(task, net)

    def clear(self) -> None:
        self.graph.set_network(None)
        self.replay.clear()

    def is_busy(self) -> bool:
        return self.replay.is_busy()

    def shutdown(self) -> None:
        self.replay.shutdown()


__all__ = ["BestMemberViews", "ControlReplay", "FrameView", "frame_image"]
