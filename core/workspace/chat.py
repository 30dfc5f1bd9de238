"""A chat with a language model, kept in the workspace: the logic the Chat panel and
``loomlab chat`` share, so the two cannot disagree.

A :class:`ChatSession` holds the open conversation (its system prompt and sampling are stored
with it), turns what a person does (send, regenerate, edit a past message) into stored messages
and a :class:`Reply`, and knows what the model is given. A :class:`Reply` is prepared in the
caller's thread — the request is validated before anything is stored — and streamed by
:meth:`Reply.stream` in any thread: each token's text is appended to the stored reply as it
comes (a killed process loses only text not yet generated) and the reply is finished in the
store, with its metrics, when the stream ends for any reason. Readers in other threads poll
:attr:`Reply.records`, which only grows, so a window can draw a frame's worth of tokens at a time
instead of handling one event per token.

The session talks to the model only through :class:`~loomlab.core.llm.generate.textmodel.TextModel`'s
public members: ``chat``/``generate``, ``context_length``, ``count_chat_tokens``, ``token_text``,
``metrics`` and ``name``.
"""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..errors import LoomError
from ..llm.generate.decoding import Metrics, TokenRecord
from ..llm.generate.textmodel import TextModel
from .store import Conversation, Message, Workspace, format_metrics

NEW_TITLE = "New chat"
TITLE_LENGTH = 40

#: What Regenerate samples with when the chat decodes greedily: greedy decoding would give the
#: same reply word for word, which is not what a person asking for another reply wants.
REGENERATE_SAMPLING = {"temperature": 0.7, "top_p": 0.9}

#: Generation settings a conversation stores and ``TextModel.chat`` takes.
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "max_tokens", "seed", "stop", "context_policy", "response_format")


class ChatBusyError(LoomError):
    """A reply is still streaming: stop it (or let it finish) first."""


@dataclass
class _Request:
    """What a reply asks of the model: chat messages, or a plain prompt to continue."""

    messages: list[dict] | None
    prompt: str | None
    sampling: dict


class Reply:
    """One reply being generated. Built by :class:`ChatSession`; :meth:`stream` runs it.

    Attributes:
        conversation_id, message_id: where it is stored (None for an unstored completion).
        records: the :class:`TokenRecord` s so far; only ever appended to.
        seed: the sampling seed, when the reply samples (shown, so a reply can be repeated).
        finish_reason: ``eos``, ``stop``, ``length``, ``context``, ``cancelled`` or ``error``, once done.
        error: one line, when it failed.
        metrics: the model's figures for this reply, once done.
        message: the stored reply, once done.
    """

    def __init__(self, model: TextModel, request: _Request, logprobs: int):
        self.model = model
        self.workspace: Workspace | None = None  # set with the ids when the session stores it
        self.conversation_id: int | None = None
        self.message_id: int | None = None
        self.seed = request.sampling.get("seed") if request.sampling.get("temperature", 0) > 0 else None
        self.records: list[TokenRecord] = []
        self.generated_tokens = 0  # records that are tokens (a cancelled stream's last one is not)
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.metrics: Metrics | None = None
        self.message: Message | None = None
        self._cancel = threading.Event()
        self._outer_cancel: Callable[[], bool] = lambda: False
        self._done = threading.Event()
        kwargs = {"cancel": self._cancelled, "logprobs": logprobs, **request.sampling}
        # called here, not in stream(): the model validates the request (sampling, context) at
        # once, so a bad one raises before the caller has stored anything
        self._tokens = (model.chat(request.messages, **kwargs) if request.messages is not None
                        else model.generate(request.prompt, **kwargs))

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.records)

    def cancel(self) -> None:
        """Stop within one token; what was generated is kept."""
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the stream has ended and the reply is stored; True when it has."""
        return self._done.wait(timeout)

    def _cancelled(self) -> bool:
        return self._cancel.is_set() or self._outer_cancel()

    def stream(self, cancel: Callable[[], bool] | None = None) -> Iterator[TokenRecord]:
        """Generate, storing each token's text as it comes; yields every :class:`TokenRecord`.

        ``cancel`` is checked before each token besides :meth:`cancel`. When the stream ends —
        finished, cancelled, closed early, or failed (the error is re-raised) — the reply is
        finished in the store with its metrics.
        """
        if self._done.is_set() or self.records:
            raise LoomError("a reply streams once")
        if cancel is not None:
            self._outer_cancel = cancel
        reason, error = None, None
        try:
            for record in self._tokens:
                self.records.append(record)
                self.generated_tokens += record.id >= 0
                if record.text and self.message_id is not None:
                    self.workspace.append_to_reply(self.message_id, record.text)
                reason = record.finish_reason or reason
                yield record
        except (GeneratorExit, KeyboardInterrupt):  # the reader stopped early, or Ctrl-C
            reason = reason or "cancelled"
            raise
        except Exception as exc:
            reason = "error"
            error = str(exc) if isinstance(exc, LoomError) else f"{type(exc).__name__}: {exc}"
            raise
        finally:
            self._tokens.close()
            self._tokens = iter(())  # the spent generator held the model's frames
            self._finish(reason or ("cancelled" if self._cancelled() else "error"), error)

    def _finish(self, reason: str, error: str | None) -> None:
        self.metrics, self.finish_reason, self.error = replace(self.model.metrics()), reason, error
        try:
            if self.message_id is not None:
                self.message = self.workspace.finish_reply(self.message_id, reason, **self._figures())
        finally:
            self._done.set()

    def _figures(self) -> dict[str, Any]:
        """What a finished reply keeps: its counts and speeds, and its seed and error as extras."""
        m = self.metrics
        generated = m.generated_tokens > 0
        extra = {k: v for k, v in (("error", self.error), ("seed", self.seed)) if v is not None}
        return {"token_count": self.generated_tokens,
                "tokens_per_s": m.decode_tokens_per_s if generated else None,
                "ttft_s": m.time_to_first_token_s if generated else None, "extra": extra}

    def summary(self) -> str:
        """One line about the finished reply, the same whether it was stored or not."""
        return _summary_line(finish_reason=self.finish_reason, **self._figures())


class ChatSession:
    """The open conversation of a workspace, chatting with ``model``.

    Args:
        workspace: where conversations are kept.
        model: the loaded model (``None`` until one is; :meth:`set_model`).
        logprobs: top alternatives recorded per token (0 = none).
    """

    def __init__(self, workspace: Workspace, model: TextModel | None = None, *, logprobs: int = 0):
        self.workspace = workspace
        self.model = model
        self.logprobs = logprobs
        self.conversation_id: int | None = None
        self.reply: Reply | None = None  # the newest reply made by this session
        self._system_prompt = ""
        self._sampling: dict = {}

    # ----- model -----------------------------------------------------------------------------
    def set_model(self, model: TextModel | None) -> None:
        """Chat with ``model`` from the next reply on (a streaming reply goes on with its own). A
        finished reply is let go, so that an unloaded model is not kept alive by it."""
        self.model = model
        if not self.busy:
            self.reply = None

    @property
    def busy(self) -> bool:
        """A reply made by this session is still streaming."""
        return self.reply is not None and not self.reply.done

    # ----- conversations ---------------------------------------------------------------------
    def open(self, conv_id: int) -> Conversation:
        """Make ``conv_id`` the open conversation, with its stored system prompt and sampling."""
        self._refuse_while_busy()
        conv = self.workspace.get(conv_id)
        self.conversation_id = conv.id
        self._system_prompt = conv.system_prompt
        self._sampling = _sampling_of(conv.sampling)
        return conv

    def new(self, title: str = NEW_TITLE) -> Conversation:
        """Create an empty conversation with the current system prompt and sampling, and open it."""
        self._refuse_while_busy()
        conv = self.workspace.create_conversation(title, self.model.name if self.model else "",
                                                  self._system_prompt, self._sampling)
        return self.open(conv.id)

    def close_conversation(self) -> None:
        """No conversation is open (the next message starts one)."""
        self._refuse_while_busy()
        self.conversation_id = None

    @property
    def system_prompt(self) -> str:
        return self._system_prompt

    def set_system_prompt(self, text: str) -> None:
        """Use ``text`` from the next reply on; stored with the open conversation."""
        self._system_prompt = text
        if self.conversation_id is not None:
            self.workspace.update(self.conversation_id, system_prompt=text)

    @property
    def sampling(self) -> dict:
        return dict(self._sampling)

    def set_sampling(self, values: Mapping[str, Any]) -> None:
        """Sampling for the next replies (keys of :data:`SAMPLING_KEYS`); stored with the conversation."""
        self._sampling = _sampling_of(values)
        if self.conversation_id is not None:
            self.workspace.update(self.conversation_id, sampling=self._sampling)

    def thread(self) -> list[Message]:
        """The open conversation's active thread (empty when none is open)."""
        return self.workspace.thread(self.conversation_id) if self.conversation_id is not None else []

    def model_messages(self, thread: list[Message] | None = None) -> list[dict]:
        """What the model is given: the system prompt, then the thread (empty failed replies left out)."""
        thread = self.thread() if thread is None else thread
        head = [{"role": "system", "content": self._system_prompt}] if self._system_prompt.strip() else []
        return head + [{"role": m.role, "content": m.content} for m in thread
                       if m.content or m.role != "assistant"]

    def context_usage(self) -> tuple[int, int]:
        """(tokens the open thread takes as a prompt, the model's context length); (0, 0) without a model."""
        if self.model is None:
            return 0, 0
        return self.model.count_chat_tokens(self.model_messages()), self.model.context_length

    def last_reply(self) -> Message | None:
        """The open thread's last assistant message (whose metrics a status line shows)."""
        return next((m for m in reversed(self.thread()) if m.role == "assistant"), None)

    def status_line(self) -> str:
        """The metrics of the open thread's last reply, as ``loomlab chat`` prints them."""
        message = self.last_reply()
        return reply_summary(message) if message is not None else ""

    # ----- replies ---------------------------------------------------------------------------
    def send(self, text: str) -> Reply:
        """Add ``text`` as a user message under the active leaf; the reply to stream."""
        text = text.strip()
        if not text:
            raise LoomError("the message is empty")
        model = self._ready_model()
        request = _Request(self.model_messages() + [{"role": "user", "content": text}], None, self._sampling)
        reply = self._prepare(model, request)  # validated before anything is stored
        if self.conversation_id is None:
            self.new(_title_from(text))
        elif self._untitled_and_empty():
            self.workspace.rename(self.conversation_id, _title_from(text))
        user = self.workspace.add_message(self.conversation_id, "user", text)
        return self._store(reply, user)

    def regenerate(self) -> Reply:
        """Another reply to the thread's last user message, a sibling of the one there.

        It samples: with the chat's own settings when they sample, else with
        :data:`REGENERATE_SAMPLING` (and a seed drawn when none is set, kept with the reply).
        """
        model = self._ready_model()
        users = [m for m in self.thread() if m.role == "user"]
        if not users:
            raise LoomError("nothing to regenerate: send a message first")
        sampling = dict(self._sampling)
        if sampling.get("temperature", 0.0) <= 0:
            sampling.update(REGENERATE_SAMPLING)
        thread = self.workspace.thread(self.conversation_id, users[-1].id)
        reply = self._prepare(model, _Request(self.model_messages(thread), None, sampling))
        return self._store(reply, users[-1])

    def edit(self, message_id: int, text: str) -> Reply | None:
        """Replace a past message by a new sibling branch with ``text``. A user message is resent
        (the reply is returned); an edited assistant message just becomes the active leaf."""
        text = text.strip()
        if not text:
            raise LoomError("the message is empty")
        self._refuse_while_busy()
        old = self.workspace.get_message(message_id)
        if old.role != "user":
            self.workspace.edit_and_branch(message_id, text)
            return None
        model = self._ready_model()
        before = [] if old.parent_id is None else self.workspace.thread(old.conversation_id, old.parent_id)
        request = _Request(self.model_messages(before) + [{"role": "user", "content": text}], None,
                           self._sampling)
        reply = self._prepare(model, request)
        return self._store(reply, self.workspace.edit_and_branch(message_id, text))

    def complete(self, prompt: str) -> Reply:
        """Continue ``prompt`` as plain text (no chat template): for base models. Not stored."""
        if not prompt:
            raise LoomError("the prompt is empty")
        model = self._ready_model()
        reply = self._prepare(model, _Request(None, prompt, self._sampling))
        self.reply = reply
        return reply

    def show_branch(self, message_id: int) -> None:
        """Show the thread through ``message_id`` (down to its newest leaf)."""
        self._refuse_while_busy()
        self.workspace.set_active_leaf(self.conversation_id, self.workspace.latest_leaf(message_id).id)

    def step_branch(self, message_id: int, step: int) -> None:
        """Show the sibling ``step`` places after ``message_id`` (wrapping around)."""
        siblings = [m.id for m in self.workspace.branches(message_id)]
        self.show_branch(siblings[(siblings.index(message_id) + step) % len(siblings)])

    # ----- internals -------------------------------------------------------------------------
    def _ready_model(self) -> TextModel:
        self._refuse_while_busy()
        if self.model is None:
            raise LoomError("no model is loaded")
        return self.model

    def _refuse_while_busy(self) -> None:
        if self.busy:
            raise ChatBusyError("a reply is still streaming: stop it or wait for it to finish")

    def _prepare(self, model: TextModel, request: _Request) -> Reply:
        if request.sampling.get("temperature", 0.0) > 0 and request.sampling.get("seed") is None:
            # a sampled reply always has a seed, shown with it, so it can be repeated
            request.sampling = {**request.sampling, "seed": secrets.randbelow(2**31)}
        return Reply(model, request, self.logprobs)

    def _store(self, reply: Reply, parent: Message) -> Reply:
        """Give a prepared reply its place in the store, under ``parent``."""
        conv_id = parent.conversation_id
        if self.workspace.get(conv_id).model != reply.model.name:
            self.workspace.update(conv_id, model=reply.model.name)
        message = self.workspace.begin_reply(conv_id, parent.id)
        reply.workspace, reply.conversation_id, reply.message_id = self.workspace, conv_id, message.id
        self.reply = reply
        return reply

    def _untitled_and_empty(self) -> bool:
        # a chat made with "New" is named after its first message
        return self.workspace.get(self.conversation_id).title == NEW_TITLE and not self.thread()


def reply_summary(message: Message) -> str:
    """One line about a stored reply: its metrics, its seed when it sampled, its error."""
    return _summary_line(message.token_count, message.tokens_per_s, message.ttft_s, message.finish_reason,
                         message.extra)


def _summary_line(token_count: int | None, tokens_per_s: float | None, ttft_s: float | None,
                  finish_reason: str | None, extra: Mapping[str, Any]) -> str:
    metrics = format_metrics(token_count, tokens_per_s, ttft_s, finish_reason)
    parts = [metrics] if metrics else []
    if extra.get("seed") is not None:
        parts.append(f"seed {extra['seed']}")
    if extra.get("error"):
        parts.append(extra["error"])
    return " · ".join(parts) or "no reply (interrupted)"


def _sampling_of(values: Mapping[str, Any] | None) -> dict:
    return {k: (tuple(v) if k == "stop" else v) for k, v in (values or {}).items() if k in SAMPLING_KEYS}


def _title_from(text: str) -> str:
    line = " ".join(text.split())
    return line if len(line) <= TITLE_LENGTH else line[:TITLE_LENGTH - 1].rstrip() + "…"
