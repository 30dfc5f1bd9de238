"""The chat panel: conversations from the workspace database, streamed replies, branches, and a
completion mode for base models.

A :class:`ChatPanel` is handed a :class:`~loomlab.views.workers.JobRunner` and a
:class:`~loomlab.core.workspace.store.Workspace`; :meth:`ChatPanel.set_model` gives it a loaded
:class:`~loomlab.core.llm.generate.textmodel.TextModel`. What a chat does — the conversation, the request,
storing each token and finishing the reply with its metrics — is a Qt-free
:class:`~loomlab.core.workspace.chat.ChatSession` (``loomlab chat`` uses the same one). The panel
streams a session's :class:`~loomlab.core.workspace.chat.Reply` in a job and only draws: a timer
(one frame, ~30 Hz) draws the tokens that arrived since the last frame, so the generating thread
sends no event per token and the GUI thread does one small piece of work a frame.

The thread is drawn into a ``QTextBrowser`` with a ``QTextCursor``; each generated token is a
link (``tok:<message>:<position>``) so a click shows its top alternatives, and links in the
message headers edit a message, copy it, or step between sibling branches. A finished reply is
then formatted as its Markdown says (:mod:`loomlab.core.workspace.markdown`: code in a fixed
font, bold, headings), over its token links; a streaming one is drawn plain, which is cheap.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QEvent, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QColor,
    QFont,
    QFontDatabase,
    QGuiApplication,
    QKeyEvent,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from loomlab.core.errors import LoomError
from loomlab.core.io.atomic import write_atomic
from loomlab.core.llm.generate.decoding import TokenRecord
from loomlab.core.llm.generate.textmodel import TextModel
from loomlab.core.workspace.chat import NEW_TITLE, ChatSession, Reply, reply_summary
from loomlab.core.workspace.markdown import CODE, CODE_BLOCK, HEADING, markup
from loomlab.core.workspace.store import Message, Workspace

from .activations import ActivationsBox
from .scrolling import scrolling
from .workers import Job, JobRunner

TOP_ALTERNATIVES = 5  # logprobs asked of the model per token
KEPT_REPLIES = 32  # replies whose TokenRecords stay in memory for the alternatives view
# The streamed text reaches the view once a frame, 10 times a second (a few tokens a frame, as
# chat apps stream). Each frame holds the GUI thread for the insert and the reply paragraph's
# new layout, and on 2 cores that time is taken from one of the decoding kernels' two threads,
# which stalls both at the next barrier: 20 frames a second cost 2-3% of the decode rate
# (bench_gui_chat: window/`loomlab bench` 0.886-0.889 at 50 ms, 0.906-0.912 at 100 ms).
FRAME_MS = 100
# The live speed estimate is re-sent at most this often: a figure changing 30 times a second is
# unreadable, and each change repaints the status bar (~0.6 ms of the GUI thread, which the
# decoding threads pay for on a small machine). The final figure is always sent.
SPEED_EVERY_S = 0.25
COMPLETION_TAB = 1
SHUTDOWN_WAIT_S = 10.0  # a reply finishes in the store right after its job ends
HEADING_SCALE = 1.2  # a Markdown heading in a reply: bold, this much larger
ROLE_NAMES = {"user": "You", "assistant": "Assistant", "system": "System", "tool": "Tool"}

#: Named sampling presets; they set only the knobs they name (max tokens and seed stay).
PRESETS: dict[str, dict] = {
    "Precise": {"temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0},
    "Balanced": {"temperature": 0.7, "top_k": 0, "top_p": 0.9, "min_p": 0.0, "repetition_penalty": 1.0},
    "Creative": {"temperature": 1.0, "top_k": 0, "top_p": 0.95, "min_p": 0.0, "repetition_penalty": 1.0},
}
CUSTOM = "Custom"


# -- sampling controls ----------------------------------------------------------------------------

class SamplingControls(QWidget):
    """Spin boxes for the sampling knobs and a preset chooser; ``values()`` are ``chat`` kwargs."""

    changed = Signal()

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        self.preset = QComboBox()
        self.preset.addItems([CUSTOM, *PRESETS])
        self.spins: dict[str, QSpinBox | QDoubleSpinBox] = {
            "temperature": _double(0.0, 2.0, 0.05, 0.0),
            "top_k": _int(0, 1000, 0, "off"),
            "top_p": _double(0.01, 1.0, 0.05, 1.0),
            "min_p": _double(0.0, 0.99, 0.01, 0.0, "off"),
            "repetition_penalty": _double(0.5, 2.0, 0.05, 1.0),
            "max_tokens": _int(1, 1 << 20, 256),
            "seed": _int(-1, 2**31 - 1, -1, "random"),
        }
        form = QFormLayout(self)
        form.setContentsMargins(0, 0, 0, 0)
        form.addRow("Preset", self.preset)
        labels = {"top_k": "Top-k", "top_p": "Top-p", "min_p": "Min-p",
                  "repetition_penalty": "Repetition penalty", "max_tokens": "Max tokens"}
        for name, spin in self.spins.items():
            form.addRow(labels.get(name, name.capitalize()), spin)
            spin.valueChanged.connect(self._edited)
        self.preset.currentTextChanged.connect(self.apply_preset)
        self.apply_preset("Precise")

    def values(self) -> dict:
        """The knobs as keyword arguments of ``TextModel.chat``."""
        out = {name: spin.value() for name, spin in self.spins.items()}
        out["seed"] = None if out["seed"] < 0 else out["seed"]
        return out

    def set_values(self, values: dict) -> None:
        """Show stored values (unknown keys ignored) without announcing a change."""
        with _blocked(self.preset, *self.spins.values()):
            for name, value in values.items():
                if name in self.spins:
                    self.spins[name].setValue(-1 if value is None and name == "seed" else value)
            self.preset.setCurrentText(self._matching_preset())

    def apply_preset(self, name: str) -> None:
        if name not in PRESETS:
            return
        with _blocked(self.preset, *self.spins.values()):
            for knob, value in PRESETS[name].items():
                self.spins[knob].setValue(value)
            self.preset.setCurrentText(name)
        self.changed.emit()

    def set_max_tokens_limit(self, limit: int) -> None:
        self.spins["max_tokens"].setMaximum(max(1, limit))

    def _edited(self) -> None:
        with _blocked(self.preset):
            self.preset.setCurrentText(self._matching_preset())
        self.changed.emit()

    def _matching_preset(self) -> str:
        values = self.values()
        for name, preset in PRESETS.items():
            if all(math.isclose(values[k], v, abs_tol=1e-9) for k, v in preset.items()):
                return name
        return CUSTOM


def _double(low: float, high: float, step: float, value: float, special: str = "") -> QDoubleSpinBox:
    spin = QDoubleSpinBox()
    spin.setRange(low, high)
    spin.setSingleStep(step)
    spin.setDecimals(2)
    spin.setValue(value)
    spin.setSpecialValueText(special)
    return spin


def _int(low: int, high: int, value: int, special: str = "") -> QSpinBox:
    spin = QSpinBox()
    spin.setRange(low, high)
    spin.setValue(value)
    spin.setSpecialValueText(special)
    return spin


class _blocked:
    """Block the signals of some widgets while the panel writes into them (no echo)."""

    def __init__(self, *widgets):
        self.widgets = widgets

    def __enter__(self):
        self.previous = [w.blockSignals(True) for w in self.widgets]

    def __exit__(self, *exc):
        for w, before in zip(self.widgets, self.previous, strict=True):
            w.blockSignals(before)


# -- small widgets ----------------------------------------------------------------------------------

class _InputBox(QPlainTextEdit):
    """Enter sends, Shift+Enter starts a new line."""

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class AlternativesTable(QTableWidget):
    """The clicked token's top alternatives: token text, probability, log-probability."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(0, 3, parent)
        self.setHorizontalHeaderLabels(["token", "probability", "logprob"])
        self.verticalHeader().hide()
        header = self.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in (1, 2):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.setWordWrap(False)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)

    def show_record(self, record: TokenRecord, label) -> None:
        """One row per alternative, best first; ``label(id, raw_text)`` is what a row shows.
        Each row keeps the token id and logprob as item data (Qt.UserRole)."""
        top = record.top or []
        self.setRowCount(len(top))
        for row, (token_id, raw, logprob) in enumerate(top):
            cells = (QTableWidgetItem(label(token_id, raw)), QTableWidgetItem(f"{math.exp(logprob):.4f}"),
                     QTableWidgetItem(f"{logprob:.3f}"))
            cells[0].setData(Qt.ItemDataRole.UserRole, token_id)
            cells[2].setData(Qt.ItemDataRole.UserRole, logprob)
            if token_id == record.id:
                for cell in cells:
                    cell.setFont(_bold())
            for col, cell in enumerate(cells):
                self.setItem(row, col, cell)

    def rows(self) -> list[tuple[int, float]]:
        """(token id, logprob) of every row, as shown."""
        role = Qt.ItemDataRole.UserRole
        return [(self.item(r, 0).data(role), self.item(r, 2).data(role)) for r in range(self.rowCount())]


def _bold() -> QFont:
    font = QFont()
    font.setBold(True)
    return font


# -- the panel -------------------------------------------------------------------------------------

@dataclass
class _Stream:
    """The reply on screen while it is generated: the session's Reply, what is drawn of it, and
    the job that streams it."""

    reply: Reply
    job: Job | None = None
    shown: int = 0  # records already drawn
    first_token_at: float = 0.0
    speed_sent_at: float = 0.0  # when the live estimate was last sent
    completion: bool = False  # continues the completion box instead of the chat thread


class ChatPanel(QWidget):
    """Chat with the loaded model; conversations live in ``workspace`` (through a
    :class:`~loomlab.core.workspace.chat.ChatSession`, which ``loomlab chat`` uses too).

    Signals:
        activations_changed(str): the user switched the model's activations ("int8", "float32").
        reply_finished(Message): a stored chat reply ended (any finish reason).
        completion_finished(Reply): a completion (Completion tab) ended.
        tokens_per_second(float): a live estimate while a reply streams, the final figure at its end.
    """

    activations_changed = Signal(str)
    reply_finished = Signal(object)
    completion_finished = Signal(object)
    tokens_per_second = Signal(float)

    def __init__(self, runner: JobRunner, workspace: Workspace, parent: QWidget | None = None):
        super().__init__(parent)
        self.runner = runner
        self.workspace = workspace
        self.session = ChatSession(workspace, logprobs=TOP_ALTERNATIVES)
        self._stream: _Stream | None = None
        self._stream_cursor: QTextCursor | None = None  # where the streaming reply's next token goes
        self._stream_position: int | None = None
        self._records: OrderedDict[int, list[TokenRecord]] = OrderedDict()
        self._editing: int | None = None  # the past message the input box is rewriting
        self._context_used = 0
        self._shut_down = False  # the workspace may be closed from then on: draw nothing more
        # the streamed text reaches the view once a frame: no event per token crosses threads
        self._frame_timer = QTimer(self)
        self._frame_timer.setInterval(FRAME_MS)
        self._frame_timer.timeout.connect(self._draw_new_tokens)
        self._build()
        self.refresh_conversations()
        first = self.conversations.item(0)
        if first is not None:
            self.open_conversation(first.data(Qt.ItemDataRole.UserRole))
        self._update_actions()
        self._update_context()

    # ----- layout --------------------------------------------------------------------------------
    def _build(self) -> None:
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(self._build_conversation_side())
        splitter.addWidget(self._build_middle())
        splitter.addWidget(self._build_settings_side())
        for column, stretch in enumerate((0, 1, 0)):  # the transcript takes what the window adds
            splitter.setStretchFactor(column, stretch)
        splitter.setSizes([160, 640, 300])
        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addWidget(splitter)

    def _build_conversation_side(self) -> QWidget:
        self.search_box = QLineEdit(placeholderText="Search chats")
        self.search_box.setClearButtonEnabled(True)
        self.search_box.textChanged.connect(self.refresh_conversations)
        self.conversations = QListWidget()
        self.conversations.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.conversations.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.conversations.currentItemChanged.connect(self._on_current_item)
        self.conversations.itemChanged.connect(self._on_item_renamed)
        self.new_button = QPushButton("New")
        self.new_button.clicked.connect(lambda: self.new_conversation())
        self.rename_button = QPushButton("Rename")
        self.rename_button.clicked.connect(self._rename_current)
        self.delete_button = QPushButton("Delete")
        self.delete_button.clicked.connect(self._confirm_delete)
        buttons = QHBoxLayout()
        for b in (self.new_button, self.rename_button, self.delete_button):
            buttons.addWidget(b)
        return _column(self.search_box, self.conversations, buttons)

    def _build_middle(self) -> QWidget:
        self.model_label = QLabel()
        self.mode_notice = QLabel()
        self.mode_notice.setWordWrap(True)
        self.mode_notice.hide()
        self.tabs = QTabWidget()
        self.tabs.addTab(self._build_chat_tab(), "Chat")
        self.tabs.addTab(self._build_completion_tab(), "Completion")
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        self.status = QLabel()
        self.status.setWordWrap(True)
        bottom = QHBoxLayout()
        bottom.addWidget(self.status, 1)
        bottom.addWidget(self.stop_button)
        return _column(self.model_label, self.mode_notice, self.tabs, bottom)

    def _build_chat_tab(self) -> QWidget:
        self.view = QTextBrowser()
        self.view.setOpenLinks(False)
        self.view.document().setUndoRedoEnabled(False)
        self.view.anchorClicked.connect(self._on_link)
        self.edit_banner = QLabel("Editing a past message: Send makes a new branch (the old one stays).")
        self.edit_banner.setWordWrap(True)
        self.cancel_edit_button = QPushButton("Cancel edit")
        self.cancel_edit_button.clicked.connect(self.cancel_edit)
        banner = QHBoxLayout()
        banner.addWidget(self.edit_banner, 1)
        banner.addWidget(self.cancel_edit_button)
        self.input = _InputBox(placeholderText="Type a message (Enter sends, Shift+Enter for a new line)")
        self.input.setMaximumHeight(90)
        self.input.submitted.connect(self._send_clicked)
        self.send_button = QPushButton("Send")
        self.send_button.clicked.connect(self._send_clicked)
        self.regenerate_button = QPushButton("Regenerate")
        self.regenerate_button.setToolTip("Another reply to the last message, sampled (greedy decoding would "
                                          "repeat the same words); its seed is shown under it")
        self.regenerate_button.clicked.connect(self.regenerate)
        self.copy_button = QPushButton("Copy chat")
        self.copy_button.clicked.connect(self.copy_conversation)
        # a push button with a menu makes room for its arrow (a tool button's text ran into it)
        self.export_button = QPushButton("Export")
        menu = QMenu(self.export_button)
        menu.addAction("Markdown…", lambda: self._choose_export("markdown"))
        menu.addAction("JSON…", lambda: self._choose_export("json"))
        self.export_button.setMenu(menu)
        actions = QHBoxLayout()
        for b in (self.send_button, self.regenerate_button):
            actions.addWidget(b)
        actions.addStretch(1)
        actions.addWidget(self.copy_button)
        actions.addWidget(self.export_button)
        self.context_bar = QProgressBar()
        self.context_bar.setTextVisible(True)
        self._show_edit_banner(False)
        return _column(self.view, banner, self.input, actions, self.context_bar)

    def _build_completion_tab(self) -> QWidget:
        self.completion_box = QPlainTextEdit(placeholderText="Write the beginning of a text; Continue lets "
                                             "the model write on (plain text, no chat template).")
        self.continue_button = QPushButton("Continue")
        self.continue_button.clicked.connect(lambda: self.complete(self.completion_box.toPlainText()))
        actions = QHBoxLayout()
        actions.addWidget(self.continue_button)
        actions.addStretch(1)
        return _column(self.completion_box, actions)

    def _build_settings_side(self) -> QWidget:
        self.system_prompt = QPlainTextEdit(placeholderText="System prompt (optional)")
        self.system_prompt.setMaximumHeight(80)
        self.system_prompt.textChanged.connect(self._on_system_prompt)
        self.sampling = SamplingControls()
        self.sampling.changed.connect(self._on_sampling)
        # the model's own setting, not the conversation's: kept out of the stored sampling values
        self.activations_box = ActivationsBox()
        self.activations_box.setToolTip(f"{self.activations_box.toolTip()} A switch applies from the next "
                                        "reply, here and in the Server panel.")
        self.activations_box.mode_chosen.connect(self._on_activations)
        model_form = QFormLayout()
        model_form.setContentsMargins(0, 0, 0, 0)
        model_form.addRow("Activations", self.activations_box)
        model_form.addRow(QLabel("int8: fast, as llama.cpp computes; float32: exact, as transformers "
                                 "computes.", wordWrap=True))
        self.colour_tokens = QCheckBox("Colour tokens by probability")
        self.colour_tokens.setChecked(True)
        self.colour_tokens.toggled.connect(lambda _on: self._render())
        self.legend = _HeatLegend()
        self.token_label = QLabel("Click a token of a reply to see its alternatives.")
        self.token_label.setWordWrap(True)
        self.alternatives = AlternativesTable()
        tokens = _column(self.colour_tokens, self.legend, self.token_label, self.alternatives)
        # two tabs rather than one tall column: in a window of 1000 px the column squeezed the
        # sampling form and left the alternatives table three rows
        self.side_tabs = QTabWidget()
        settings = _column(_group("System prompt", self.system_prompt), _group("Sampling", self.sampling),
                           _group("Model", _column(model_form)), stretch=True)
        self.side_tabs.addTab(scrolling(settings), "Settings")
        self.side_tabs.addTab(tokens, "Tokens")
        self.side_tabs.setMinimumWidth(self.side_tabs.sizeHint().width())
        return self.side_tabs

    # ----- model -------------------------------------------------------------------------------
    def set_model(self, model: TextModel) -> None:
        """Chat with ``model`` from now on (a reply streaming from another model goes on). A model
        without a chat template opens on the Completion tab, with a notice saying why."""
        self.session.set_model(model)
        self.sampling.set_max_tokens_limit(model.context_length)
        self.show_activations()
        if model.supports_chat:
            self.mode_notice.hide()
        else:
            self.mode_notice.setText(
                f"<b>{html.escape(model.name)}</b> is a base model without a chat template: it continues "
                "text rather than answering messages. Use the Completion tab.")
            self.mode_notice.show()
            self.tabs.setCurrentIndex(COMPLETION_TAB)
        self._update_actions()
        self._update_context()

    def clear_model(self) -> None:
        """Forget the model (it is being unloaded): a streaming reply is stopped."""
        self.stop()
        self.session.set_model(None)
        self.mode_notice.hide()
        self._update_actions()
        self._update_context()

    @property
    def model(self) -> TextModel | None:
        return self.session.model

    def show_activations(self) -> None:
        """Show the model's activations again (switched elsewhere: the Server panel)."""
        if self.model is not None:
            self.activations_box.set_mode(self.model.activations)

    def _on_activations(self, mode: str) -> None:
        if self.model is not None:
            self.model.activations = mode  # read as the next generation starts
            self.activations_changed.emit(mode)

    @property
    def generating(self) -> bool:
        return self._stream is not None

    # ----- conversations -------------------------------------------------------------------------
    @property
    def conversation_id(self) -> int | None:
        return self.session.conversation_id

    def refresh_conversations(self) -> None:
        """Fill the list from the workspace (matches of the search box only), keeping the selection."""
        with _blocked(self.conversations):
            self.conversations.clear()
            for conv in self.workspace.list_conversations(search=self.search_box.text() or None):
                item = QListWidgetItem(conv.title)
                item.setData(Qt.ItemDataRole.UserRole, conv.id)
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(conv.updated))
                item.setToolTip(f"{conv.model or 'no model'} · {when}")
                item.setFlags(item.flags() | Qt.ItemFlag.ItemIsEditable)
                self.conversations.addItem(item)
                if conv.id == self.conversation_id:
                    self.conversations.setCurrentItem(item)

    def new_conversation(self, title: str = NEW_TITLE) -> int:
        """Create an empty conversation with the current system prompt and sampling, and open it."""
        self.session.set_system_prompt(self.system_prompt.toPlainText())
        self.session.set_sampling(self.sampling.values())
        conv = self.session.new(title)
        self.open_conversation(conv.id)
        return conv.id

    def open_conversation(self, conv_id: int) -> None:
        if self.generating and conv_id != self.conversation_id:
            self._say("A reply is streaming: stop it before switching chats.")
            self.refresh_conversations()
            return
        conv = self.session.open(conv_id)
        self.cancel_edit()
        with _blocked(self.system_prompt):
            self.system_prompt.setPlainText(conv.system_prompt)
        self.sampling.set_values(conv.sampling)
        self.refresh_conversations()
        self._render()

    def rename_conversation(self, conv_id: int, title: str) -> None:
        self.workspace.rename(conv_id, title)
        self.refresh_conversations()

    def delete_conversation(self, conv_id: int) -> None:
        if self.generating and conv_id == self.conversation_id:
            self._say("Stop the streaming reply before deleting its chat.")
            return
        self.workspace.delete(conv_id)
        if conv_id == self.conversation_id:
            self.session.close_conversation()
        self.refresh_conversations()
        first = self.conversations.item(0)
        if self.conversation_id is None and first is not None:
            self.open_conversation(first.data(Qt.ItemDataRole.UserRole))
        else:
            self._render()

    def _on_current_item(self, item: QListWidgetItem | None, _previous=None) -> None:
        if item is not None and item.data(Qt.ItemDataRole.UserRole) != self.conversation_id:
            self.open_conversation(item.data(Qt.ItemDataRole.UserRole))

    def _on_item_renamed(self, item: QListWidgetItem) -> None:
        title = item.text().strip()
        conv_id = item.data(Qt.ItemDataRole.UserRole)
        if title:
            self.rename_conversation(conv_id, title)
        else:
            self.refresh_conversations()  # an empty title is refused: show the old one again

    def _rename_current(self) -> None:
        item = self.conversations.currentItem()
        if item is not None:
            self.conversations.editItem(item)

    def _confirm_delete(self) -> None:
        item = self.conversations.currentItem()
        if item is None:
            return
        answer = QMessageBox.question(self, "Delete chat", f"Delete “{item.text()}” and all its messages?")
        if answer == QMessageBox.StandardButton.Yes:
            self.delete_conversation(item.data(Qt.ItemDataRole.UserRole))

    def _on_system_prompt(self) -> None:
        self.session.set_system_prompt(self.system_prompt.toPlainText())
        self._update_context()

    def _on_sampling(self) -> None:
        self.session.set_sampling(self.sampling.values())

    # ----- sending, stopping, regenerating, editing ---------------------------------------------
    def send(self, text: str) -> None:
        """Add ``text`` as a user message under the active leaf and stream the reply."""
        if text.strip():
            self._start(lambda: self.session.send(text))

    def regenerate(self) -> None:
        """Another reply, a sibling of the current one, to the thread's last user message; it
        samples (see :meth:`ChatSession.regenerate`) and its seed is shown under it."""
        if self.conversation_id is not None:
            self._start(self.session.regenerate)

    def edit_message(self, message_id: int, text: str) -> None:
        """Replace a past message by a new sibling branch with ``text``; a user message is resent."""
        if not text.strip() or not self._can_generate():
            return
        self.cancel_edit()
        self._start(lambda: self.session.edit(message_id, text))

    def complete(self, text: str) -> None:
        """Let the model continue ``text`` in the Completion tab (plain text, no chat template)."""
        if text:
            self._start(lambda: self.session.complete(text), completion=True)

    def stop(self) -> None:
        """Cancel the streaming reply; the model stops within one token and the reply is kept."""
        if self._stream is not None:
            self._stream.reply.cancel()

    def begin_edit(self, message_id: int) -> None:
        """Put a past message into the input box; Send then makes a new branch from it."""
        if self.generating:
            return
        self._editing = message_id
        self.input.setPlainText(self.workspace.get_message(message_id).content)
        self.input.setFocus()
        self._show_edit_banner(True)

    def cancel_edit(self) -> None:
        self._editing = None
        self._show_edit_banner(False)

    def show_branch(self, message_id: int) -> None:
        """Show the thread through ``message_id`` (down to its newest leaf)."""
        if self.generating or self.conversation_id is None:
            return
        self.session.show_branch(message_id)
        self._render()

    def _send_clicked(self) -> None:
        text = self.input.toPlainText()
        if not text.strip() or not self._can_generate():
            return
        self.input.clear()
        if self._editing is not None:
            self.edit_message(self._editing, text)
        else:
            self.send(text)

    def _can_generate(self) -> bool:
        if self.model is None:
            self._say("Load a model first (Models panel).")
            return False
        if self.generating:
            self._say("A reply is still streaming: wait or press Stop.")
            return False
        return True

    def _start(self, make_reply, completion: bool = False) -> None:
        """Make a reply with the session (stored and validated in this thread: it is quick) and
        start the job that streams it."""
        if not self._can_generate():
            return
        try:
            reply = make_reply()
        except LoomError as exc:
            self._say(str(exc))
            self._render()
            return
        if reply is None:  # an edited assistant message: nothing to generate
            self._render()
            return
        self._stream = stream = _Stream(reply, completion=completion)
        if reply.message_id is not None:
            self._keep_records(reply.message_id, reply.records)

        def work(job: Job) -> None:
            for _record in reply.stream(cancel=job.is_cancelled):
                pass

        stream.job = self.runner.start(work, name="chat", on_success=self._on_done, on_cancel=self._on_done,
                                       on_failure=self._on_done)
        self._frame_timer.start()
        self._say(f"Generating with {reply.model.name}…" + (f" (seed {reply.seed})" if reply.seed is not None
                                                             else ""))
        self._update_actions()
        if not completion:
            self.refresh_conversations()  # a chat this message started is listed now, not after the reply
            self._render()

    def _draw_new_tokens(self) -> None:
        """Once a frame: draw the tokens that arrived since the last frame."""
        stream = self._stream
        if stream is None:
            return
        records = stream.reply.records
        count = len(records)  # the worker only appends, so the first `count` are complete
        if count == stream.shown:
            return
        if not stream.first_token_at:
            stream.first_token_at = time.perf_counter()
        if stream.completion:
            cursor = self.completion_box.textCursor()
            cursor.movePosition(QTextCursor.MoveOperation.End)
            cursor.insertText("".join(r.text for r in records[stream.shown:count]))
        elif self._stream_cursor is not None:
            bar = self.view.verticalScrollBar()
            at_bottom = bar.value() >= bar.maximum() - 4
            # one edit block: the document is laid out once per frame, not once per token
            self._stream_cursor.beginEditBlock()
            self._insert_tokens(self._stream_cursor, stream.reply.message_id, stream.shown,
                                records[stream.shown:count])
            self._stream_cursor.endEditBlock()
            if at_bottom:
                bar.setValue(bar.maximum())
        stream.shown = count
        tokens = stream.reply.generated_tokens
        now = time.perf_counter()
        elapsed = now - stream.first_token_at
        if tokens > 1 and elapsed > 0 and now - stream.speed_sent_at >= SPEED_EVERY_S:
            stream.speed_sent_at = now
            self.tokens_per_second.emit((tokens - 1) / elapsed)

    def _on_done(self, _result=None) -> None:
        stream = self._stream
        if stream is None:
            return
        self._draw_new_tokens()
        self._stream = None
        self._frame_timer.stop()
        reply = stream.reply
        self._update_actions()
        self._say(f"Error: {reply.error}" if reply.error else reply.summary())
        if stream.completion:
            self.completion_finished.emit(reply)
        else:
            if reply.conversation_id == self.conversation_id:
                self._render()
            self.refresh_conversations()
            self.reply_finished.emit(reply.message)
        if reply.metrics.generated_tokens > 0:  # the figure the reply stores and shows
            self.tokens_per_second.emit(reply.metrics.decode_tokens_per_s)

    def _keep_records(self, message_id: int, records: list[TokenRecord]) -> None:
        self._records[message_id] = records
        while len(self._records) > KEPT_REPLIES:
            self._records.popitem(last=False)

    # ----- token alternatives --------------------------------------------------------------------
    def show_token(self, message_id: int, position: int) -> None:
        """Show the alternatives of the ``position``-th token of a reply generated in this session."""
        record = self._records[message_id][position]
        p = math.exp(record.logprob) if record.logprob is not None else float("nan")
        self.token_label.setText(f"Token {record.index + 1} of reply {message_id}: "
                                 f"{self._token_text(record.id, record.text)}  (p = {p:.4f})")
        self.alternatives.show_record(record, self._token_text)
        self.side_tabs.setCurrentWidget(self.alternatives.parentWidget())

    def _token_text(self, token_id: int, text: str) -> str:
        if self.model is not None and token_id >= 0:
            text = self.model.token_text(token_id)
        return repr(text)

    # ----- copy and export -----------------------------------------------------------------------
    def copy_message(self, message_id: int) -> None:
        QGuiApplication.clipboard().setText(self.workspace.get_message(message_id).content)
        self._say("Message copied.")

    def copy_conversation(self) -> None:
        if self.conversation_id is not None:
            QGuiApplication.clipboard().setText(self.workspace.export_markdown(self.conversation_id))
            self._say("Chat copied as Markdown.")

    def export_to(self, path: str | Path, fmt: str) -> None:
        """Write the open conversation's active thread as ``"markdown"`` or ``"json"`` (atomically)."""
        if self.conversation_id is None:
            raise LoomError("no conversation is open")
        if fmt == "markdown":
            text = self.workspace.export_markdown(self.conversation_id)
        elif fmt == "json":
            text = json.dumps(self.workspace.export_json(self.conversation_id), indent=2,
                              ensure_ascii=False) + "\n"
        else:
            raise LoomError(f"export format must be 'markdown' or 'json', got {fmt!r}")
        write_atomic(path, text.encode("utf-8"))

    def _choose_export(self, fmt: str) -> None:
        if self.conversation_id is None:
            return
        suffix, kind = (".md", "Markdown (*.md)") if fmt == "markdown" else (".json", "JSON (*.json)")
        title = self.workspace.get(self.conversation_id).title
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", _file_stem(title) + suffix, kind)
        if path:
            try:
                self.export_to(path, fmt)
                self._say(f"Exported to {path}")
            except (LoomError, OSError) as exc:
                self._say(f"Export failed: {exc}")

    # ----- context usage -------------------------------------------------------------------------
    def context_usage(self) -> tuple[int, int]:
        """(prompt tokens of the current thread, context length); (0, 0) without a model."""
        return (self._context_used, self.model.context_length) if self.model is not None else (0, 0)

    def _update_context(self) -> None:
        if self.model is None:
            self._context_used = 0
            self.context_bar.setRange(0, 1)
            self.context_bar.setValue(0)
            self.context_bar.setFormat("Context: no model loaded")
            return
        try:
            used, total = self.session.context_usage()
        except LoomError as exc:
            self.context_bar.setFormat(f"Context: cannot render the chat template ({exc})")
            return
        self._context_used = used
        self.context_bar.setRange(0, total)
        self.context_bar.setValue(min(used, total))
        self.context_bar.setFormat(f"Context: {used} / {total} tokens ({100 * used / total:.1f}%)")

    # ----- drawing the thread --------------------------------------------------------------------
    def changeEvent(self, event: QEvent) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and not self._shut_down:
            self._render()  # the transcript's colours were taken from the palette when drawn

    def _render(self) -> None:
        """Redraw the active thread (the streaming reply's tokens continue from ``_stream_cursor``)
        and the status line (the shown thread's last reply)."""
        doc = self.view.document()
        doc.clear()
        self._stream_cursor = None
        cursor = QTextCursor(doc)
        thread = self.session.thread()
        if not thread:
            hint = ("Send a message to start." if self.model is not None
                    else "Load a model in the Models panel, then type a message.")
            cursor.insertText(hint, self._format(muted=True))
        self._stream_position = None
        for i, message in enumerate(thread):
            self._insert_message(cursor, message, first=i == 0)
        stream = self._stream
        if stream is not None and not stream.completion and self._stream_position is not None:
            # the streaming reply is the thread's last message, so nothing after its text moves
            self._stream_cursor = QTextCursor(doc)
            self._stream_cursor.setPosition(self._stream_position)
        elif not self.generating:
            self._say(self.session.status_line())
        self.view.verticalScrollBar().setValue(self.view.verticalScrollBar().maximum())
        self._update_actions()
        self._update_context()

    def _insert_message(self, cursor: QTextCursor, message: Message, first: bool) -> None:
        header = QTextBlockFormat()
        header.setTopMargin(0 if first else 14)
        if not first:
            cursor.insertBlock(header)
        else:
            cursor.setBlockFormat(header)
        cursor.insertText(ROLE_NAMES.get(message.role, message.role), self._format(bold=True))
        self._insert_header_links(cursor, message)
        body = QTextBlockFormat()
        body.setTopMargin(3)
        if message.role == "user":
            tint = QColor(self.palette().highlight().color())
            tint.setAlpha(40)
            body.setBackground(tint)
        cursor.insertBlock(body)
        start = cursor.position()
        stream = self._stream
        streaming = stream is not None and stream.reply.message_id == message.id
        records = self._records.get(message.id)
        if streaming:
            records = stream.reply.records[:]  # a snapshot: the worker appends meanwhile
            stream.shown = len(records)
        if records is not None and (streaming or "".join(r.text for r in records) == message.content):
            self._insert_tokens(cursor, message.id, 0, records)
        else:
            cursor.insertText(message.content, self._format())
        if streaming:
            self._stream_position = cursor.position()
        elif message.role == "assistant":
            self._format_markdown(start, message.content)
        if message.role == "assistant":
            cursor.insertBlock(QTextBlockFormat())
            footer = "generating…" if streaming else reply_summary(message)
            cursor.insertText(footer, self._format(muted=True, small=True))

    def _format_markdown(self, start: int, text: str) -> None:
        """Format a finished reply drawn from ``start`` as its Markdown says, over its tokens (their
        links stay), and remove the markers; a streaming reply is drawn plain, which is cheap."""
        doc = self.view.document()
        marks = markup(text)
        for span in marks.spans:
            cursor = QTextCursor(doc)
            cursor.setPosition(start + span.start)
            cursor.setPosition(start + span.end, QTextCursor.MoveMode.KeepAnchor)
            cursor.mergeCharFormat(self._markdown_format(span.kind))
        for a, b in reversed(marks.markers):  # from the end: earlier offsets stay where they were
            cursor = QTextCursor(doc)
            cursor.setPosition(start + a)
            cursor.setPosition(start + b, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()

    def _markdown_format(self, kind: str) -> QTextCharFormat:
        fmt = QTextCharFormat()
        if kind in (CODE, CODE_BLOCK):
            fmt.setFontFamilies([QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont).family()])
            fmt.setBackground(self.palette().alternateBase())
        else:
            fmt.setFontWeight(QFont.Weight.Bold)
            if kind == HEADING:
                fmt.setFontPointSize(self.font().pointSizeF() * HEADING_SCALE)
        return fmt

    def _insert_header_links(self, cursor: QTextCursor, message: Message) -> None:
        cursor.insertText("   ", self._format())
        siblings = self.workspace.branches(message.id)
        if len(siblings) > 1:
            where = [s.id for s in siblings].index(message.id)
            cursor.insertText("‹", self._link(f"branch:{message.id}:-1"))
            cursor.insertText(f" {where + 1}/{len(siblings)} ", self._format(muted=True, small=True))
            cursor.insertText("›", self._link(f"branch:{message.id}:1"))
            cursor.insertText("   ", self._format())
        if message.role == "user":
            cursor.insertText("edit", self._link(f"edit:{message.id}"))
            cursor.insertText("  ", self._format())
        cursor.insertText("copy", self._link(f"copy:{message.id}"))

    def _insert_tokens(self, cursor: QTextCursor, message_id: int, first: int,
                       records: list[TokenRecord]) -> None:
        """Insert a message's tokens ``first, first + 1, ...``: each a link to its alternatives,
        coloured by its probability when asked (plain text for a token without alternatives).
        This is the GUI's costliest work per streamed token, done while the decoding thread
        waits for the GIL: the base format and the colour switch are read once per call."""
        base = self._format()
        colour = self.colour_tokens.isChecked()
        for position, record in enumerate(records, first):
            if not record.text:
                continue
            if record.top is None:
                cursor.insertText(record.text, base)
                continue
            p = math.exp(record.logprob)
            fmt = QTextCharFormat(base)
            fmt.setAnchor(True)
            fmt.setAnchorHref(f"tok:{message_id}:{position}")
            fmt.setToolTip(f"p = {p:.3f} (click for alternatives)")
            if colour:
                # unlikely tokens get a warmer background: the reply reads as a confidence map
                fmt.setBackground(heat_colour(p))
            cursor.insertText(record.text, fmt)

    def _format(self, bold: bool = False, muted: bool = False, small: bool = False) -> QTextCharFormat:
        fmt = QTextCharFormat()
        palette = self.palette()
        fmt.setForeground(palette.placeholderText().color() if muted else palette.text().color())
        if bold:
            fmt.setFontWeight(QFont.Weight.Bold)
        if small:
            fmt.setFontPointSize(max(6.0, self.font().pointSizeF() - 1))
        return fmt

    def _link(self, href: str) -> QTextCharFormat:
        fmt = self._format(small=True)
        fmt.setAnchor(True)
        fmt.setAnchorHref(href)
        fmt.setForeground(self.palette().link().color())
        return fmt

    def _on_link(self, url: QUrl) -> None:
        kind, _, rest = url.toString().partition(":")
        args = [int(a) for a in rest.split(":")]
        if kind == "tok" and args[0] in self._records:
            self.show_token(*args)
        elif kind == "edit":
            self.begin_edit(args[0])
        elif kind == "copy":
            self.copy_message(args[0])
        elif kind == "branch" and not self.generating:
            self.session.step_branch(*args)
            self._render()

    # ----- state of the controls -----------------------------------------------------------------
    def _update_actions(self) -> None:
        model = self.model
        idle, ready = not self.generating, model is not None and not self.generating
        chat_ready = ready and model.supports_chat
        self.send_button.setEnabled(chat_ready)
        self.continue_button.setEnabled(ready)
        self.stop_button.setEnabled(not idle)
        self.regenerate_button.setEnabled(chat_ready and self.conversation_id is not None)
        # one reply streams at a time, into the open chat: leaving or changing it waits for the end
        for w in (self.conversations, self.new_button, self.rename_button, self.delete_button,
                  self.search_box):
            w.setEnabled(idle)
        has_chat = self.conversation_id is not None
        self.copy_button.setEnabled(has_chat)
        self.export_button.setEnabled(has_chat)
        self.activations_box.setEnabled(ready)  # a reply keeps the mode it started with
        if model is None:
            self.model_label.setText("No model loaded")
        else:
            mode = "chat" if model.supports_chat else "completion only"
            self.model_label.setText(f"Model: <b>{html.escape(model.name)}</b> ({mode})")

    def _show_edit_banner(self, visible: bool) -> None:
        self.edit_banner.setVisible(visible)
        self.cancel_edit_button.setVisible(visible)

    def _say(self, text: str) -> None:
        self.status.setText(text)

    # ----- shutdown ------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop a streaming reply and wait for its job (the session stores what was generated as
        "cancelled"); stop the frame timer."""
        self._shut_down = True
        stream = self._stream
        if stream is not None:
            stream.reply.cancel()
            if stream.job is not None:
                stream.job.wait()
            stream.reply.wait(SHUTDOWN_WAIT_S)
            self._on_done()
        self._frame_timer.stop()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)


def heat_colour(p: float) -> QColor:
    """The background of a token of probability ``p``: clear when certain, orange when unlikely."""
    heat = QColor(255, 140, 0)
    heat.setAlpha(int(150 * (1.0 - p)))
    return heat


class _HeatLegend(QLabel):
    """What the token colours mean: a strip from a likely token (clear) to an unlikely one."""

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent)
        cells = "".join(f'<td style="background-color: {_css(heat_colour(p))}">&nbsp;&nbsp;&nbsp;</td>'
                        for p in (1.0, 0.75, 0.5, 0.25, 0.0))
        self.setText(f'<table cellspacing="0"><tr><td>likely&nbsp;</td>{cells}<td>&nbsp;unlikely</td>'
                     "</tr></table>")
        self.setToolTip("A token's background shows how likely the model found it: the more orange, "
                        "the less likely.")


def _css(colour: QColor) -> str:
    return f"rgba({colour.red()}, {colour.green()}, {colour.blue()}, {colour.alpha()})"


# -- helpers -------------------------------------------------------------------------------------

def _column(*parts, stretch: bool = False) -> QWidget:
    """``parts`` stacked; with ``stretch`` they keep their heights and the space left goes below."""
    widget = QWidget()
    layout = QVBoxLayout(widget)
    layout.setContentsMargins(0, 0, 0, 0)
    for part in parts:
        if isinstance(part, QWidget):
            layout.addWidget(part)
        else:
            layout.addLayout(part)
    if stretch:
        layout.addStretch(1)
    return widget


def _group(title: str, content: QWidget) -> QGroupBox:
    box = QGroupBox(title)
    layout = QVBoxLayout(box)
    layout.addWidget(content)
    return box


def _file_stem(title: str) -> str:
    keep = "".join(c if c.isalnum() or c in "-_ " else "_" for c in title).strip()
    return keep or "chat"
