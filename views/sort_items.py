"""Tables of rows: cells that sort by a value, not by their text (numbers as numbers: "10" after
"9"), and the read-only table of rows the panels list things in."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractItemView, QTableWidget, QTableWidgetItem

SORT_ROLE = Qt.ItemDataRole.UserRole + 1  # what a column sorts by: numbers, not their text


class SortItem(QTableWidgetItem):
    """A cell that sorts by its :data:`SORT_ROLE` value; cells still waiting for one sort last."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        a, b = self.data(SORT_ROLE), other.data(SORT_ROLE)
        if a is None or b is None:
            return a is not None and b is None
        return a < b


def row_table(columns) -> QTableWidget:
    """A read-only table with ``columns``, one row selected at a time, no row numbers."""
    table = QTableWidget(0, len(columns))
    table.setHorizontalHeaderLabels(list(columns))
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
    table.verticalHeader().setVisible(False)
    return table
