"""Layout checks for docked panels: widgets at least their minimum size, plot tick labels apart
and legible on the plot's own canvas."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from contextlib import contextmanager

import pyqtgraph as pg
from PySide6.QtGui import QColor, QImage, QPainter
from PySide6.QtWidgets import QAbstractButton, QComboBox, QLabel, QWidget

from .contrast import AA, contrast

# What a panel in the bottom row of a 1600x1000 main window gets (tests/app/test_main_window.py
# measures it)
DOCKED = (1600, 235)


def assert_unclipped(panel: QWidget) -> int:
    """Every visible label, button and combo box of ``panel`` has at least the size its text
    needs (a word-wrapped label: the height its text needs at its width); returns how many."""
    checked = 0
    for w in panel.findChildren(QWidget):
        if not w.isVisibleTo(panel) or not isinstance(w, QLabel | QAbstractButton | QComboBox):
            continue
        if isinstance(w, QLabel) and w.wordWrap():
            need_w, need_h = w.minimumSizeHint().width(), w.heightForWidth(w.width())
        else:
            need_w, need_h = w.minimumSizeHint().width(), w.minimumSizeHint().height()
        text = getattr(w, "text", w.metaObject().className)()
        assert w.width() >= need_w and w.height() >= need_h, \
            f"{type(w).__name__} {text!r} is {w.width()}x{w.height()}, needs {need_w}x{need_h}"
        checked += 1
    return checked


def drawn_tick_labels(axis: pg.AxisItem) -> list:
    """What the axis draws as tick labels: ``(rect, flags, text)`` each."""
    image = QImage(8, 8, QImage.Format.Format_ARGB32)  # held: a painter on a freed image crashes
    painter = QPainter(image)
    try:
        specs = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return specs[2] if specs else []


def assert_tick_labels_apart(axis: pg.AxisItem) -> None:
    """The axis draws at least two tick labels, none running into another or out of the axis."""
    texts = drawn_tick_labels(axis)
    assert len(texts) >= 2, f"{axis.orientation} axis shows {[t for _, _, t in texts]}"
    for (a, _, ta), (b, _, tb) in itertools.combinations(texts, 2):
        assert not a.intersects(b), f"{axis.orientation} labels {ta!r} and {tb!r} overlap"
    bounds = axis.boundingRect()
    for rect, _, text in texts:
        assert bounds.contains(rect), f"{axis.orientation} label {text!r} sticks out of its axis"


def assert_axes_legible(plot: pg.PlotWidget) -> None:
    """Tick and axis-label text of the plot's left and bottom axes against its canvas."""
    canvas = plot.backgroundBrush().color()
    for name in ("left", "bottom"):
        axis = plot.getAxis(name)
        # the axis title is HTML whose colour pyqtgraph writes into labelStyle
        style = axis.labelStyle
        title = QColor(style["color"]) if "color" in style else axis.label.defaultTextColor()
        for colour in (axis.textPen().color(), title):
            assert contrast(colour, canvas) >= AA, f"{name} axis text {colour.name()} on {canvas.name()}"


@contextmanager
def on_screen(qtbot, panel: QWidget, width: int, height: int) -> Iterator[QWidget]:
    """``panel`` shown at ``width`` x ``height`` for a test, and shut down after it."""
    qtbot.addWidget(panel)
    panel.resize(width, height)
    panel.show()
    yield panel
    panel.shutdown()
