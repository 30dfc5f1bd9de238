"""The main window's first layout as a screenshot sees it: one tab bar a tab group, none over the
status bar.

Tabified before the first layout, the bottom row left Qt a stale tab bar of its first pair, shown
at (0, 774) and only scheduled for deletion: at 1280x800 it covered the status bar. An event loop
deletes it on its first turn, so a window driven by ``processEvents`` alone, as ``loomlab
--screenshot`` drives it, kept it; qtbot's waits run deferred deletions and never saw it. Here the
window is shown and settled with ``processEvents`` only.
"""

from __future__ import annotations

import time

import pytest
from PySide6.QtCore import QRect, QSettings
from PySide6.QtWidgets import QApplication, QTabBar, QWidget

from loomlab.app.main_window import MainWindow

from .test_main_window import TAB_GROUPS, tab_bars


def shown_without_an_event_loop(qtbot, tmp_path, size: tuple[int, int]) -> MainWindow:
    """A main window on fresh settings, asked for ``size``, shown and laid out by processing
    events only (no nested event loop, so no deferred deletion runs)."""
    settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    win = MainWindow(workspace_path=tmp_path / "workspace.sqlite3", settings=settings,
                     model_folders=[str(tmp_path / "models")])
    qtbot.addWidget(win)
    win.resize(*size)
    win.show()
    deadline = time.monotonic() + 5
    while not win.laid_out and time.monotonic() < deadline:
        QApplication.processEvents()
        time.sleep(0.01)
    for _ in range(20):  # the repaints and layouts that follow the docks' sizing
        QApplication.processEvents()
        time.sleep(0.01)
    assert win.laid_out
    return win


def global_rect(widget: QWidget) -> QRect:
    return QRect(widget.mapToGlobal(widget.rect().topLeft()), widget.size())


@pytest.mark.parametrize("size", [(1280, 800), (1600, 1000)])
def test_the_first_layout_shows_one_tab_bar_a_group_and_none_over_the_status_bar(qtbot, tmp_path, size):
    win = shown_without_an_event_loop(qtbot, tmp_path, size)
    try:
        status = global_rect(win.statusBar())
        over = [[bar.tabText(i) for i in range(bar.count())] for bar in win.findChildren(QTabBar)
                if bar.isVisible() and global_rect(bar).intersects(status)]
        assert over == [], f"tab bars drawn over the status bar at {status.getRect()}: {over}"
        assert tab_bars(win) == TAB_GROUPS
    finally:
        win.close()
