"""Chat panel details: a reply's Markdown is rendered (code in a fixed font, markers gone), a chat
is listed as soon as its first message is sent, and the Export button leaves room for its arrow."""

from __future__ import annotations

from PySide6.QtGui import QFontDatabase, QTextCursor
from PySide6.QtWidgets import QStyle

from loomlab.views.chat_panel import ChatPanel
from loomlab.views.workers import JobRunner

from .test_chat_panel import model, panel, send_and_wait, workspace  # noqa: F401 - fixtures

REPLY = "## Steps\nRun **this** first:\n```python\nprint('hi')\n```\nthen `ls` and go."


def test_a_stored_reply_is_rendered_as_markdown(qtbot, workspace):  # noqa: F811
    conv = workspace.create_conversation("markdown")
    workspace.add_message(conv.id, "user", "How?")
    workspace.add_message(conv.id, "assistant", REPLY)
    runner = JobRunner()
    chat = ChatPanel(runner, workspace)
    qtbot.addWidget(chat)
    chat.open_conversation(conv.id)
    text = chat.view.toPlainText()
    assert "Steps\nRun this first:\nprint('hi')\nthen ls and go." in text
    assert "**" not in text and "```" not in text and "`" not in text

    def char_format_at(snippet: str):
        cursor = QTextCursor(chat.view.document())
        cursor.setPosition(text.index(snippet) + 1)
        return cursor.charFormat()

    fixed = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()
    assert char_format_at("print('hi')").fontFamilies() == [fixed] == char_format_at("ls and").fontFamilies()
    assert char_format_at("this first").fontWeight() > char_format_at("Run").fontWeight()
    assert char_format_at("Steps").fontPointSize() > char_format_at("Run").fontPointSize()
    assert runner.shutdown()


def test_a_new_chat_is_listed_when_its_first_message_is_sent(qtbot, panel):  # noqa: F811
    assert panel.conversations.count() == 0
    with qtbot.waitSignal(panel.reply_finished, timeout=60000):
        panel.send("Hi")
        assert panel.conversations.count() == 1  # before the reply
        assert panel.conversations.currentItem() is not None


def test_the_export_button_makes_room_for_its_menu_arrow(panel):  # noqa: F811
    button = panel.export_button
    style = button.style()
    needed = (button.fontMetrics().horizontalAdvance(button.text())
              + style.pixelMetric(QStyle.PixelMetric.PM_MenuButtonIndicator, None, button)
              + 2 * style.pixelMetric(QStyle.PixelMetric.PM_ButtonMargin, None, button))
    assert button.menu() is not None and button.width() >= needed
