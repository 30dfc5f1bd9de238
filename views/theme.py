"""Light and dark palettes that follow the system's colour scheme, or a fixed choice.

Qt follows the desktop's scheme by itself only where its platform theme reports one (GNOME, KDE,
macOS, Windows) and even then only for native styles; under plain X11 or Xvfb it reports
``Unknown`` and stays light. :class:`ThemeController` applies a Fusion palette of its own for the
resolved scheme, and applies it again whenever the system's scheme changes while the choice is
"system". The plots and the 3-D view keep their dark canvases in both (as napari's and
TensorBoard's do): only the widgets around them change.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication

THEMES = ("system", "light", "dark")

# (role, colour) of the dark palette; the disabled group dims text (below)
_DARK = {
    QPalette.ColorRole.Window: "#2b2d31",
    QPalette.ColorRole.WindowText: "#e3e5e8",
    QPalette.ColorRole.Base: "#1e1f22",
    QPalette.ColorRole.AlternateBase: "#26282c",
    QPalette.ColorRole.ToolTipBase: "#1e1f22",
    QPalette.ColorRole.ToolTipText: "#e3e5e8",
    QPalette.ColorRole.PlaceholderText: "#8a8f98",
    QPalette.ColorRole.Text: "#e3e5e8",
    QPalette.ColorRole.Button: "#313338",
    QPalette.ColorRole.ButtonText: "#e3e5e8",
    QPalette.ColorRole.BrightText: "#ff6b6b",
    QPalette.ColorRole.Light: "#4a4d55",
    QPalette.ColorRole.Midlight: "#3c3f45",
    QPalette.ColorRole.Mid: "#2f3136",
    QPalette.ColorRole.Dark: "#18191c",
    QPalette.ColorRole.Shadow: "#000000",
    QPalette.ColorRole.Highlight: "#3d7bd9",
    QPalette.ColorRole.HighlightedText: "#ffffff",
    QPalette.ColorRole.Link: "#6ea8fe",
    QPalette.ColorRole.LinkVisited: "#b197fc",
}
_DARK_DISABLED_TEXT = "#6d717a"
# Error text by the window's lightness: the light theme's red is unreadable on a dark window.
ERROR_ON_LIGHT, ERROR_ON_DARK = QColor("#c92a2a"), QColor("#ff8787")


def dark_palette() -> QPalette:
    palette = QPalette()
    for role, colour in _DARK.items():
        palette.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.WindowText, QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText):
        palette.setColor(QPalette.ColorGroup.Disabled, role, QColor(_DARK_DISABLED_TEXT))
    return palette


def error_colour(palette: QPalette) -> QColor:
    """The red for error text on ``palette``'s window (:data:`ERROR_ON_DARK` on a dark one)."""
    return ERROR_ON_DARK if palette.color(QPalette.ColorRole.Window).lightness() < 128 else ERROR_ON_LIGHT


def resolve(choice: str, system: Qt.ColorScheme) -> str:
    """The scheme to show ("light" or "dark") for a choice from :data:`THEMES`."""
    if choice not in THEMES:
        raise ValueError(f"theme must be one of {', '.join(THEMES)}, got {choice!r}")
    if choice != "system":
        return choice
    return "dark" if system == Qt.ColorScheme.Dark else "light"  # Unknown: Qt's own default


class ThemeController(QObject):
    """Keeps the application's palette on the chosen theme (see the module's docstring).

    ``applied`` is emitted with "light" or "dark" each time a palette is applied.
    """

    applied = Signal(str)

    def __init__(self, app: QApplication, choice: str = "system", parent: QObject | None = None):
        super().__init__(parent)
        self._app = app
        self._choice = "system"
        self.scheme = ""
        app.styleHints().colorSchemeChanged.connect(self._system_changed)
        self.set_choice(choice)

    @property
    def choice(self) -> str:
        return self._choice

    def set_choice(self, choice: str) -> None:
        self._apply(resolve(choice, self._app.styleHints().colorScheme()))
        self._choice = choice

    def _system_changed(self, scheme: Qt.ColorScheme) -> None:
        if self._choice == "system":
            self._apply(resolve("system", scheme))

    def _apply(self, scheme: str) -> None:
        app = self._app
        if app.style().name().lower() != "fusion":  # the one style that draws any palette faithfully
            app.setStyle("Fusion")
        app.setPalette(dark_palette() if scheme == "dark" else app.style().standardPalette())
        self.scheme = scheme
        self.applied.emit(scheme)
