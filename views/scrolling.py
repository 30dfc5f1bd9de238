"""Forms that scroll: a panel in a short dock keeps its plots and tables and lets a form scroll,
rather than demand the height the form needs (the docks of one column add their minimum heights
up, and the window cannot be made shorter than their sum)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtWidgets import QFrame, QLayout, QScrollArea, QStyle, QWidget

QWIDGETSIZE_MAX = 2**24 - 1  # Qt's "no maximum"


class FormScroller(QScrollArea):
    """A frameless scroll area that scrolls its content vertically only.

    The content is kept at least as tall as its width needs: a word-wrapped label's height depends
    on its width, which a layout's minimum height does not count, so without this a short dock
    squeezed such a label to one line instead of scrolling."""

    def __init__(self, content: QWidget, parent: QWidget | None = None):
        super().__init__(parent, widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setWidget(content)
        bar = self.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, self)
        self.setMinimumWidth(content.minimumSizeHint().width() + bar)
        if content.maximumWidth() < QWIDGETSIZE_MAX:  # no wider than the content may be
            self.setMaximumWidth(content.maximumWidth() + bar)
        content.installEventFilter(self)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:  # noqa: N802 - Qt's name
        if watched is self.widget() and event.type() in (QEvent.Type.Resize, QEvent.Type.LayoutRequest):
            self._fit_height()
        return super().eventFilter(watched, event)

    def _fit_height(self) -> None:
        content = self.widget()
        if content.hasHeightForWidth():
            need = max(content.heightForWidth(content.width()), content.minimumSizeHint().height())
            if need != content.minimumHeight():
                content.setMinimumHeight(need)


def scrolling(content: QWidget | QLayout) -> FormScroller:
    """``content`` (a widget, or a layout such as a form) in a :class:`FormScroller`: as wide as
    the content needs (with room for the scroll bar), as short as the dock makes it."""
    if isinstance(content, QLayout):
        holder = QWidget()
        holder.setLayout(content)
        content = holder
    return FormScroller(content)
