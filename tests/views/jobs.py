"""Driving a panel's jobs and controls as a person would, for the panel tests."""

from __future__ import annotations


def settle(qtbot, panel, timeout=20000) -> None:
    """Wait until ``panel`` (anything with ``is_busy()``) has no job running."""
    qtbot.waitUntil(lambda: not panel.is_busy(), timeout=timeout)


def choose(qtbot, combo, text: str) -> None:
    """Pick ``text`` the way a person does with the keyboard: focus the combo and type it."""
    combo.setFocus()
    qtbot.keyClicks(combo, text)
    assert combo.currentText() == text
