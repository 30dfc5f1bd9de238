"""Forms that scroll: a panel in a short dock keeps its plots and tables and lets a form scroll,
rather than demand the height the form needs (the docks of one column add their minimum heights
up, and the window cannot be made shorter than their sum)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLayout, QScrollArea, QStyle, QWidget

QWIDGETSIZE_MAX = 2**24 - 1  # Qt's "no maximum"


def scrolling(content: QWidget | QLayout) -> QScrollArea:
    """``content`` (a widget, or a layout such as a form) in a frameless scroll area that scrolls
    vertically only: as wide as the content needs (with room for the scroll bar), as short as the
    dock makes it."""
    if isinstance(content, QLayout):
        holder = QWidget()
        holder.setLayout(content)
        content = holder
    area = QScrollArea(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
    area.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    area.setWidget(content)
    bar = area.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, area)
    area.setMinimumWidth(content.minimumSizeHint().width() + bar)
    if content.maximumWidth() < QWIDGETSIZE_MAX:  # no wider than the content may be
        area.setMaximumWidth(content.maximumWidth() + bar)
    return area
