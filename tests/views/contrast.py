"""Legibility under the dark palette: WCAG 2 contrast of the palette roles a widget draws its text
with, for every text-bearing widget of a panel (and an item view's cells, with their own brushes)."""

from __future__ import annotations

from contextlib import contextmanager

from PySide6.QtCore import QAbstractListModel, Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractItemView,
    QApplication,
    QComboBox,
    QGroupBox,
    QLabel,
    QLineEdit,
    QTextEdit,
    QWidget,
)

from loomlab.views.theme import ThemeController

AA = 4.5  # WCAG 2 level AA for normal text


def luminance(c: QColor) -> float:
    """WCAG relative luminance of an sRGB colour."""
    def lin(v: float) -> float:
        return v / 12.92 if v <= 0.04045 else ((v + 0.055) / 1.055) ** 2.4
    return 0.2126 * lin(c.redF()) + 0.7152 * lin(c.greenF()) + 0.0722 * lin(c.blueF())


def contrast(a: QColor, b: QColor) -> float:
    hi, lo = sorted((luminance(a), luminance(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


def over(top: QColor, bottom: QColor) -> QColor:
    """``top`` (maybe translucent) painted on opaque ``bottom``."""
    a = top.alphaF()
    return QColor.fromRgbF(*(a * t + (1 - a) * u for t, u in
                             zip((top.redF(), top.greenF(), top.blueF()),
                                 (bottom.redF(), bottom.greenF(), bottom.blueF()), strict=True)))


@contextmanager
def dark_theme(app: QApplication):
    """The application in the dark theme for the block; its palette is restored afterwards."""
    saved = app.palette()
    controller = ThemeController(app, "dark")
    try:
        yield
    finally:
        controller.deleteLater()
        app.setPalette(saved)


def _has_text(w: QWidget) -> bool:
    if isinstance(w, QLabel | QAbstractButton | QLineEdit):
        return bool(w.text())
    return isinstance(w, QComboBox | QGroupBox | QTextEdit)


def assert_legible(panel: QWidget) -> int:
    """Every visible, enabled text-bearing widget of ``panel`` meets :data:`AA` with the palette
    roles it is drawn with (no style sheet may override them); returns how many were checked."""
    checked = 0
    for w in [panel, *panel.findChildren(QWidget)]:
        if not w.isVisibleTo(panel) or not w.isEnabled():
            continue  # WCAG exempts disabled controls
        assert not w.styleSheet(), f"{w!r} styles its colours past the palette: {w.styleSheet()}"
        if isinstance(w, QAbstractItemView):
            checked += _assert_cells_legible(w)
        if not _has_text(w):
            continue
        p = w.palette()
        fg, bg = p.color(w.foregroundRole()), p.color(w.backgroundRole())
        ratio = contrast(fg, bg)
        assert ratio >= AA, f"{type(w).__name__} {getattr(w, 'text', lambda: '')()!r}: {ratio:.2f}"
        checked += 1
    return checked


def _assert_cells_legible(view: QAbstractItemView) -> int:
    model, p = view.model(), view.palette()
    text = p.color(p.ColorRole.Text)
    checked = 0
    # a list model has one column, and PySide6 keeps its columnCount private
    columns = 1 if isinstance(model, QAbstractListModel) else model.columnCount()
    for r in range(model.rowCount()):
        alternate = view.alternatingRowColors() and r % 2
        base = p.color(p.ColorRole.AlternateBase if alternate else p.ColorRole.Base)
        for c in range(columns):
            index = model.index(r, c)
            if not index.data():
                continue
            fg = index.data(Qt.ItemDataRole.ForegroundRole)
            bg = index.data(Qt.ItemDataRole.BackgroundRole)
            fg = fg.color() if fg is not None and fg.style() != Qt.BrushStyle.NoBrush else text
            bg = over(bg.color(), base) if bg is not None and bg.style() != Qt.BrushStyle.NoBrush else base
            ratio = contrast(fg, bg)
            assert ratio >= AA, f"cell ({r}, {c}) {index.data()!r}: {ratio:.2f}"
            checked += 1
    return checked
