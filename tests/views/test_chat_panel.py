"""The chat panel on the real SmolLM2 model: streamed greedy replies equal ``model.chat`` called
directly, every reply is in the workspace (also after reopening it), Stop keeps a partial reply,
branches from edits and regenerations, the conversation list, presets, the context bar, token
alternatives, copy and export."""

from __future__ import annotations

import json

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication, QTextCursor
from PySide6.QtWidgets import QApplication, QMessageBox, QStyle

from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.text.chat_template import encode_chat
from loomlab.core.workspace.chat import REGENERATE_SAMPLING, reply_summary
from loomlab.core.workspace.store import Workspace
from loomlab.views.chat_panel import COMPLETION_TAB, PRESETS, ChatPanel
from loomlab.views.workers import JobRunner

from .contrast import AA, contrast

SHORT = 8  # max tokens of most replies: enough to check the text, quick on two cores
TIMEOUT_MS = 60_000


@pytest.fixture(scope="module")
def model():
    with load_model("smollm2-135m") as m:
        yield m


@pytest.fixture
def workspace(tmp_path):
    with Workspace(tmp_path / "workspace.sqlite3") as ws:
        yield ws


@pytest.fixture
def panel(qtbot, workspace, model):
    runner = JobRunner()
    widget = ChatPanel(runner, workspace)
    qtbot.addWidget(widget)
    widget.resize(1200, 700)
    widget.show()
    widget.set_model(model)
    widget.sampling.spins["max_tokens"].setValue(SHORT)
    yield widget
    widget.shutdown()
    assert runner.shutdown()


def greedy(model, messages, max_tokens=SHORT):
    """The oracle: the model's own streamed greedy reply, with logprobs as the panel asks."""
    return list(model.chat(messages, temperature=0, max_tokens=max_tokens, logprobs=5))


def send_and_wait(qtbot, panel, text):
    with qtbot.waitSignal(panel.reply_finished, timeout=TIMEOUT_MS) as blocker:
        panel.send(text)
    return blocker.args[0]


def anchor_point(view, href: str) -> QPoint:
    """The middle of the text linked to ``href`` in a QTextBrowser, in viewport coordinates."""
    doc = view.document()
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fragment = it.fragment()
            if fragment.charFormat().anchorHref() == href:
                start, end = QTextCursor(doc), QTextCursor(doc)
                start.setPosition(fragment.position())
                end.setPosition(fragment.position() + fragment.length())
                view.setTextCursor(end)
                view.ensureCursorVisible()
                left, right = view.cursorRect(start), view.cursorRect(end)
                return QPoint((left.left() + right.left()) // 2, left.center().y())
            it += 1
        block = block.next()
    raise AssertionError(f"no link {href!r} in the view")


def fragments(view):
    doc = view.document()
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            yield it.fragment()
            it += 1
        block = block.next()


def token_format(view, href: str):
    return next(f.charFormat() for f in fragments(view) if f.charFormat().anchorHref() == href)


def fragment_colours(view) -> list:
    colours = {f.charFormat().foreground().color().name(): f.charFormat().foreground().color()
               for f in fragments(view) if f.text().strip()}
    return list(colours.values())


def titles(panel) -> list[str]:
    return [panel.conversations.item(i).text() for i in range(panel.conversations.count())]


def click_link(qtbot, view, href: str) -> None:
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=anchor_point(view, href))


def test_typed_message_streams_the_greedy_reply_and_survives_a_restart(qtbot, panel, model, workspace):
    prompt = "What is the capital of France?"
    expected = greedy(model, [{"role": "user", "content": prompt}])
    speeds = []
    panel.tokens_per_second.connect(speeds.append)
    qtbot.keyClicks(panel.input, prompt)
    with qtbot.waitSignal(panel.reply_finished, timeout=TIMEOUT_MS) as blocker:
        qtbot.mouseClick(panel.send_button, Qt.MouseButton.LeftButton)
    reply = blocker.args[0]

    text = "".join(r.text for r in expected)
    assert reply.content == text and reply.finish_reason == expected[-1].finish_reason
    assert reply.token_count == len(expected) and reply.ttft_s > 0
    assert speeds and speeds[-1] == reply.tokens_per_s
    assert text in panel.view.toPlainText() and f"{len(expected)} tokens" in panel.view.toPlainText()
    assert panel.input.toPlainText() == ""
    assert [c.title for c in workspace.list_conversations()] == [prompt]

    with Workspace(workspace.path) as reopened:
        conv, = reopened.list_conversations()
        stored = reopened.thread(conv.id)
        assert [(m.role, m.content) for m in stored] == [("user", prompt), ("assistant", text)]
        assert stored[1].finish_reason == reply.finish_reason and stored[1].token_count == len(expected)
        restarted = ChatPanel(JobRunner(), reopened)
        qtbot.addWidget(restarted)
        assert restarted.conversation_id == conv.id and text in restarted.view.toPlainText()


def test_stop_keeps_the_partial_reply_as_cancelled(qtbot, panel, model, workspace):
    prompt = "Write a long story about a dragon who learns to fly."
    panel.sampling.spins["max_tokens"].setValue(200)
    qtbot.keyClicks(panel.input, prompt)
    qtbot.mouseClick(panel.send_button, Qt.MouseButton.LeftButton)
    assert panel.generating and panel.stop_button.isEnabled() and not panel.send_button.isEnabled()
    # every token is in the database as soon as it arrives, before the reply ends
    qtbot.waitUntil(lambda: len(workspace.thread(panel.conversation_id)[-1].content) > 20, timeout=TIMEOUT_MS)
    with qtbot.waitSignal(panel.reply_finished, timeout=TIMEOUT_MS) as blocker:
        qtbot.mouseClick(panel.stop_button, Qt.MouseButton.LeftButton)
    reply = blocker.args[0]

    assert reply.finish_reason == "cancelled" and 0 < reply.token_count < 200
    assert workspace.get_message(reply.id).content == reply.content
    oracle = greedy(model, [{"role": "user", "content": prompt}], reply.token_count + 1)
    full = "".join(r.text for r in oracle)
    assert full.startswith(reply.content) and len(reply.content) > 20
    assert "finish: cancelled" in panel.view.toPlainText() and panel.send_button.isEnabled()


def test_shutdown_mid_reply_finishes_it_in_the_workspace(qtbot, panel, workspace):
    panel.sampling.spins["max_tokens"].setValue(200)
    panel.send("Tell me about the sea.")
    qtbot.waitUntil(lambda: workspace.thread(panel.conversation_id)[-1].content != "", timeout=TIMEOUT_MS)
    panel.shutdown()
    reply = workspace.thread(panel.conversation_id)[-1]
    assert reply.finish_reason == "cancelled" and reply.content and not panel.generating


def test_editing_a_past_message_branches_and_branches_can_be_switched(qtbot, panel, model, workspace):
    send_and_wait(qtbot, panel, "Hi")
    send_and_wait(qtbot, panel, "What is 2+2?")
    first = workspace.thread(panel.conversation_id)[0]

    click_link(qtbot, panel.view, f"edit:{first.id}")
    assert panel.input.toPlainText() == "Hi" and panel.edit_banner.isVisible()
    panel.input.clear()
    qtbot.keyClicks(panel.input, "Hello there")
    with qtbot.waitSignal(panel.reply_finished, timeout=TIMEOUT_MS) as blocker:
        qtbot.mouseClick(panel.send_button, Qt.MouseButton.LeftButton)

    thread = workspace.thread(panel.conversation_id)
    expected = "".join(r.text for r in greedy(model, [{"role": "user", "content": "Hello there"}]))
    assert [m.content for m in thread] == ["Hello there", expected] and blocker.args[0].id == thread[-1].id
    assert [m.content for m in workspace.branches(thread[0].id)] == ["Hi", "Hello there"]
    assert "2/2" in panel.view.toPlainText() and "What is 2+2?" not in panel.view.toPlainText()

    click_link(qtbot, panel.view, f"branch:{thread[0].id}:-1")  # back to the old branch, down to its leaf
    old = workspace.thread(panel.conversation_id)
    assert [m.content for m in old][::2] == ["Hi", "What is 2+2?"] and len(old) == 4
    assert "1/2" in panel.view.toPlainText() and "What is 2+2?" in panel.view.toPlainText()


def test_regenerate_adds_a_sampled_sibling_reply_with_its_seed(qtbot, panel, model, workspace):
    first = send_and_wait(qtbot, panel, "Hi")
    with qtbot.waitSignal(panel.reply_finished, timeout=TIMEOUT_MS) as blocker:
        qtbot.mouseClick(panel.regenerate_button, Qt.MouseButton.LeftButton)
    second = blocker.args[0]
    assert second.id != first.id and second.parent_id == first.parent_id
    assert [m.id for m in workspace.branches(second.id)] == [first.id, second.id]
    assert workspace.thread(panel.conversation_id)[-1].id == second.id
    # greedy would repeat the words: Regenerate samples, and its seed is shown and repeats it
    seed = second.extra["seed"]
    oracle = model.chat([{"role": "user", "content": "Hi"}], **REGENERATE_SAMPLING, seed=seed,
                        max_tokens=SHORT)
    assert second.content == "".join(r.text for r in oracle)
    assert f"seed {seed}" in panel.view.toPlainText() and f"seed {seed}" in panel.status.text()


def test_the_status_line_follows_the_branch_on_screen(qtbot, panel, workspace):
    first = send_and_wait(qtbot, panel, "Hi")
    with qtbot.waitSignal(panel.reply_finished, timeout=TIMEOUT_MS) as blocker:
        panel.regenerate()
    second = blocker.args[0]
    assert panel.status.text() == reply_summary(second)
    click_link(qtbot, panel.view, f"branch:{second.id}:-1")
    assert workspace.thread(panel.conversation_id)[-1].id == first.id
    assert panel.status.text() == reply_summary(first) != reply_summary(second)


def test_token_colours_have_a_legend_and_an_off_switch(qtbot, panel):
    reply = send_and_wait(qtbot, panel, "Hi")
    href = f"tok:{reply.id}:1"
    panel.side_tabs.setCurrentWidget(panel.alternatives.parentWidget())  # the Tokens tab
    assert panel.legend.isVisible() and "unlikely" in panel.legend.text()
    assert token_format(panel.view, href).background().style() != Qt.BrushStyle.NoBrush
    panel.colour_tokens.setChecked(False)
    assert token_format(panel.view, href).background().style() == Qt.BrushStyle.NoBrush


def test_the_transcript_follows_a_palette_change(qtbot, panel):
    from loomlab.views.theme import ThemeController, dark_palette

    send_and_wait(qtbot, panel, "Hi")
    theme = ThemeController(QApplication.instance(), "dark")
    try:
        qtbot.waitUntil(lambda: panel.palette().text().color() == dark_palette().text().color())
        text = panel.palette().text().color()
        base = panel.view.palette().base().color()
        colours = fragment_colours(panel.view)
        assert text in colours and contrast(text, base) >= AA
        assert all(contrast(c, base) >= AA for c in colours), colours
    finally:
        theme.set_choice("light")


def test_a_base_model_opens_on_completion_and_continues_text(qtbot, panel, model):
    gemma = load_model("gemma3-270m")
    try:
        panel.set_model(gemma)
        assert panel.tabs.currentIndex() == COMPLETION_TAB and panel.mode_notice.isVisible()
        assert "without a chat template" in panel.mode_notice.text() and not panel.send_button.isEnabled()
        assert "completion only" in panel.model_label.text()
        prompt = "The capital of France is"
        expected = "".join(r.text for r in gemma.generate(prompt, temperature=0, max_tokens=SHORT))
        panel.completion_box.setPlainText(prompt)
        with qtbot.waitSignal(panel.completion_finished, timeout=TIMEOUT_MS) as blocker:
            qtbot.mouseClick(panel.continue_button, Qt.MouseButton.LeftButton)
        assert panel.completion_box.toPlainText() == prompt + expected == prompt + blocker.args[0].text
        assert f"{SHORT} tokens" in panel.status.text()
    finally:
        panel.set_model(model)
        gemma.close()
    assert not panel.mode_notice.isVisible() and panel.send_button.isEnabled()


def test_conversation_list_creates_renames_deletes_and_searches(qtbot, panel, workspace, monkeypatch):
    qtbot.mouseClick(panel.new_button, Qt.MouseButton.LeftButton)
    qtbot.mouseClick(panel.new_button, Qt.MouseButton.LeftButton)
    assert panel.conversations.count() == 2 == len(workspace.list_conversations())

    # view -> model: renaming the list item renames the conversation
    item = panel.conversations.currentItem()
    item.setText("Pasta recipes")
    assert workspace.get(panel.conversation_id).title == "Pasta recipes"
    # model -> view
    other = next(c for c in workspace.list_conversations() if c.id != panel.conversation_id)
    panel.rename_conversation(other.id, "Travel plans")
    assert sorted(titles(panel)) == ["Pasta recipes", "Travel plans"]

    workspace.add_message(other.id, "user", "Which trains go to Lyon?")
    panel.refresh_conversations()
    qtbot.keyClicks(panel.search_box, "Lyon")
    assert titles(panel) == ["Travel plans"]
    panel.search_box.clear()
    assert panel.conversations.count() == 2

    pasta = panel.conversation_id
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.StandardButton.Yes)
    qtbot.mouseClick(panel.delete_button, Qt.MouseButton.LeftButton)
    assert [c.title for c in workspace.list_conversations()] == ["Travel plans"]
    assert panel.conversations.count() == 1 and panel.conversation_id != pasta


def test_presets_set_the_sampling_controls_and_are_stored(qtbot, panel, workspace):
    conv_id = panel.new_conversation()
    panel.sampling.preset.setCurrentText("Balanced")
    values = panel.sampling.values()
    assert all(values[k] == pytest.approx(v) for k, v in PRESETS["Balanced"].items())
    assert workspace.get(conv_id).sampling == values

    panel.sampling.spins["temperature"].setValue(0.3)  # a hand edit is no preset any more
    assert panel.sampling.preset.currentText() == "Custom"
    assert workspace.get(conv_id).sampling["temperature"] == pytest.approx(0.3)

    # model -> view: opening a conversation shows its stored sampling
    creative = workspace.create_conversation("c", sampling={**values, **PRESETS["Creative"], "seed": 7})
    panel.open_conversation(creative.id)
    assert panel.sampling.preset.currentText() == "Creative" and panel.sampling.values()["seed"] == 7


def test_context_bar_counts_the_thread_with_encode_chat(qtbot, panel, model, workspace):
    conv = workspace.create_conversation("ctx")
    workspace.add_message(conv.id, "user", "Name three colours.")
    workspace.add_message(conv.id, "assistant", "Red, green and blue.")
    panel.open_conversation(conv.id)
    qtbot.keyClicks(panel.system_prompt, "You are terse.")

    messages = [{"role": "system", "content": "You are terse."},
                {"role": "user", "content": "Name three colours."},
                {"role": "assistant", "content": "Red, green and blue."}]
    used = len(encode_chat(model.tokenizer, model.template, messages))
    assert panel.context_usage() == (used, model.net.args.context_length)
    assert panel.context_bar.value() == used and panel.context_bar.maximum() == model.net.args.context_length
    assert workspace.get(conv.id).system_prompt == "You are terse."

    panel.clear_model()
    assert panel.context_usage() == (0, 0) and not panel.send_button.isEnabled()


def test_clicking_a_token_shows_its_top_alternatives(qtbot, panel, model):
    expected = greedy(model, [{"role": "user", "content": "Hi"}])
    reply = send_and_wait(qtbot, panel, "Hi")
    click_link(qtbot, panel.view, f"tok:{reply.id}:2")
    record = expected[2]
    shown = panel.alternatives.rows()
    assert [i for i, _ in shown] == [i for i, _, _ in record.top]
    assert [lp for _, lp in shown] == pytest.approx([lp for _, _, lp in record.top], abs=1e-6)
    assert repr(model.tokenizer.decode([record.id])) in panel.token_label.text()


def test_copy_and_export_match_the_workspace(qtbot, panel, workspace, tmp_path):
    reply = send_and_wait(qtbot, panel, "Hi")
    click_link(qtbot, panel.view, f"copy:{reply.id}")
    assert QGuiApplication.clipboard().text() == reply.content

    panel.export_to(tmp_path / "chat.md", "markdown")
    panel.export_to(tmp_path / "chat.json", "json")
    assert (tmp_path / "chat.md").read_text("utf-8") == workspace.export_markdown(panel.conversation_id)
    exported = json.loads((tmp_path / "chat.json").read_text("utf-8"))
    assert exported == workspace.export_json(panel.conversation_id)


def test_a_new_chat_is_listed_when_its_first_message_is_sent(qtbot, panel):
    assert panel.conversations.count() == 0
    with qtbot.waitSignal(panel.reply_finished, timeout=60000):
        panel.send("Hi")
        assert panel.conversations.count() == 1  # before the reply
        assert panel.conversations.currentItem() is not None


def test_the_export_button_makes_room_for_its_menu_arrow(panel):
    button = panel.export_button
    style = button.style()
    needed = (button.fontMetrics().horizontalAdvance(button.text())
              + style.pixelMetric(QStyle.PixelMetric.PM_MenuButtonIndicator, None, button)
              + 2 * style.pixelMetric(QStyle.PixelMetric.PM_ButtonMargin, None, button))
    assert button.menu() is not None and button.width() >= needed
