"""Every panel as a person sees it in a 1280x800 and a 1600x1000 window with smollm2-135m loaded
and a reply on screen: a screenshot of each, the window the size asked for, every dock inside it,
nothing clipped, in the light and the dark palette, text legible."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
from PySide6.QtCore import QRect
from PySide6.QtWidgets import QAbstractSpinBox, QApplication

from loomlab.app.main_window import PANELS

from ..views.contrast import assert_legible, dark_theme
from ..views.panel_layout import assert_unclipped
from .test_main_window import assert_docks_fit, make_window

TIMEOUT_MS = 120_000


@pytest.fixture(scope="module")
def shown(tmp_path_factory):
    """Where the screenshots of both palettes go (one folder for the module, to look at)."""
    return tmp_path_factory.mktemp("screens")


def assert_spin_boxes_whole(panel) -> int:
    """A spin box at least as wide as its longest value needs (its size hint): no cut-off digits."""
    boxes = [b for b in panel.findChildren(QAbstractSpinBox) if b.isVisibleTo(panel)]
    for box in boxes:
        assert box.width() >= box.sizeHint().width(), \
            f"spin box {box.text()!r} is {box.width()} px wide, its text needs {box.sizeHint().width()}"
    return len(boxes)


def visible_rows(table) -> int:
    viewport = table.viewport().rect()
    return sum(viewport.contains(QRect(table.visualRect(table.model().index(r, 0))))
               for r in range(table.rowCount()))


def assert_fits_and_reads(win, name: str, size: tuple[int, int], palette: str) -> None:
    """The window is ``size``, its docks fit, and panel ``name`` shows its labels, buttons and
    spin boxes whole (and legible, in the dark palette)."""
    assert win.size().toTuple() == size
    assert_docks_fit(win)
    panel = win.panels[name]
    assert assert_unclipped(panel) > 0
    assert_spin_boxes_whole(panel)
    if palette == "dark":
        assert assert_legible(panel) > 0


@pytest.mark.parametrize("palette, size", [("light", (1280, 800)), ("dark", (1600, 1000))])
def test_every_panel_fits_and_reads(qtbot, tmp_path, shown, palette, size):
    win = make_window(qtbot, tmp_path, size)
    chat = win.panels["chat"]
    try:
        win.open_model("smollm2-135m")
        qtbot.waitUntil(lambda: chat.model is not None and not win.handing_over, timeout=TIMEOUT_MS)
        chat.sampling.spins["max_tokens"].setValue(8)
        with qtbot.waitSignal(chat.reply_finished, timeout=TIMEOUT_MS) as blocker:
            chat.send("Name three colours.")
        chat.show_token(blocker.args[0].id, 1)  # five alternatives in the table
        context = dark_theme(QApplication.instance()) if palette == "dark" else nullcontext()
        with context:
            for name in PANELS:
                win.docks[name].show()
                win.docks[name].raise_()
                qtbot.waitUntil(lambda n=name: win.panels[n].isVisible(), timeout=5000)
                # a panel brought to the front takes what came while it was behind a tab (a job's
                # result, new text) and lays itself out again: checked once that has settled
                qtbot.waitUntil(lambda n=name: assert_fits_and_reads(win, n, size, palette), timeout=5000)
                win.snapshot().save(str(shown / f"{palette}-{name}.png"))  # what was checked, to look at
        assert visible_rows(chat.alternatives) == 5
    finally:
        win.close()
