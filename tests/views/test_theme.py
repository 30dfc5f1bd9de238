"""Light and dark palettes: the choice wins over the system's scheme, "system" follows it live."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication

from loomlab.views.theme import ThemeController, dark_palette, resolve


def window_lightness() -> int:
    return QApplication.instance().palette().color(QPalette.ColorRole.Window).lightness()


def text_lightness() -> int:
    return QApplication.instance().palette().color(QPalette.ColorRole.Text).lightness()


@pytest.fixture
def app(qapp):
    saved = qapp.palette()
    yield qapp
    qapp.setPalette(saved)


@pytest.mark.parametrize(("choice", "system", "expected"), [
    ("system", Qt.ColorScheme.Dark, "dark"), ("system", Qt.ColorScheme.Light, "light"),
    ("system", Qt.ColorScheme.Unknown, "light"), ("light", Qt.ColorScheme.Dark, "light"),
    ("dark", Qt.ColorScheme.Light, "dark"),
])
def test_resolve(choice, system, expected):
    assert resolve(choice, system) == expected


def test_an_unknown_theme_is_refused():
    with pytest.raises(ValueError, match="theme must be one of system, light, dark"):
        resolve("sepia", Qt.ColorScheme.Light)


def test_dark_palette_is_readable():
    p = dark_palette()
    for background, foreground in ((QPalette.ColorRole.Window, QPalette.ColorRole.WindowText),
                                   (QPalette.ColorRole.Base, QPalette.ColorRole.Text),
                                   (QPalette.ColorRole.Button, QPalette.ColorRole.ButtonText)):
        assert p.color(foreground).lightness() - p.color(background).lightness() > 150


def test_system_choice_follows_the_scheme_as_it_changes(app):
    controller = ThemeController(app, "system")
    seen = []
    controller.applied.connect(seen.append)
    hints = app.styleHints()
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Dark)  # what Qt emits when the desktop switches
    assert controller.scheme == "dark" and window_lightness() < 80 and text_lightness() > 200
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert controller.scheme == "light" and window_lightness() > 200 and text_lightness() < 80
    assert seen == ["dark", "light"]
    controller.set_choice("dark")  # a fixed choice ignores the system from now on
    hints.colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert controller.scheme == "dark" and window_lightness() < 80
    assert app.style().name().lower() == "fusion"
    controller.deleteLater()
