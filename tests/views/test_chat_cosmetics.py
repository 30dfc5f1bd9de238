"""A chat reply's Markdown is rendered: code in a fixed font, bold, headings, the markers gone (no
model needed: the reply is read from the workspace)."""

from __future__ import annotations

from PySide6.QtGui import QFontDatabase, QTextCursor

from loomlab.views.chat_panel import ChatPanel
from loomlab.views.workers import JobRunner

from .test_chat_panel import workspace  # noqa: F401 - the fixture

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
