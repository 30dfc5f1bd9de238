"""Forms that scroll in a short dock instead of squeezing what they hold."""

from __future__ import annotations

from PySide6.QtWidgets import QFormLayout, QLabel, QLineEdit, QPushButton, QVBoxLayout, QWidget

from loomlab.views.scrolling import scrolling

from .panel_layout import assert_unclipped

LONG = " ".join(["a word-wrapped label whose text needs several lines at this width"] * 4)


def test_a_wrapped_label_keeps_its_lines_and_the_form_scrolls(qtbot):
    """A short area scrolls: a wrapped label gets the height its text needs at its width (a layout's
    minimum height does not count it, and a plain scroll area squeezed it to one line)."""
    column = QVBoxLayout()
    label = QLabel(LONG, wordWrap=True)
    column.addWidget(label)
    column.addWidget(QPushButton("Apply"))
    host = QWidget()
    QVBoxLayout(host).addWidget(area := scrolling(column))
    qtbot.addWidget(host)
    host.resize(260, 60)
    host.show()
    qtbot.waitExposed(host)
    qtbot.waitUntil(lambda: label.height() >= label.heightForWidth(label.width()), timeout=2000)
    assert label.height() > 2 * label.fontMetrics().height()  # several lines, not one
    assert area.verticalScrollBar().maximum() > 0  # the rest is a scroll away
    assert assert_unclipped(area.widget()) == 2


def test_a_form_is_never_narrower_than_it_needs(qtbot):
    """It scrolls vertically only, so it asks for the content's width (and the scroll bar's)."""
    form = QFormLayout()
    form.addRow("A long field label", QLineEdit())
    area = scrolling(form)
    qtbot.addWidget(area)
    need = area.widget().minimumSizeHint().width() + area.verticalScrollBar().sizeHint().width()
    assert area.minimumWidth() >= need
    area.resize(10, 100)
    area.show()
    qtbot.waitExposed(area)
    assert area.viewport().width() >= area.widget().minimumSizeHint().width()
