"""A stand-in for ``TextModel`` in tests of ``loomlab chat`` that are about the command, not the
model: it has the members ``ChatSession`` and the CLI use, replies with fixed tokens at once, and
loads nothing. ``use_fake_model`` makes ``load_model`` return it, in this process or in a child
(``python -c`` run from the repository root)."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from types import SimpleNamespace

from loomlab.core.llm.generate import textmodel
from loomlab.core.llm.generate.decoding import Metrics, TokenRecord


@dataclass
class FakeChatModel:
    """Replies ``words`` to every message, then ends with ``finish`` ("eos", "length"...).

    ``hang``: after the first word, wait until the process ends (a reply still streaming).
    ``requests`` keeps what each reply was asked: its messages (or prompt) and sampling.
    """

    name: str = "fake-chat"
    supports_chat: bool = True
    words: tuple[str, ...] = ("Hello", " there")
    finish: str = "eos"
    hang: bool = False
    context_length: int = 2048
    kernels_ready: bool = True  # not on a first run: nothing to finish when a command ends
    requests: list = field(default_factory=list)
    backend: SimpleNamespace = field(default_factory=lambda: SimpleNamespace(name="numpy"))

    def chat(self, messages, *, cancel=None, logprobs=0, **sampling):
        self.requests.append({"messages": list(messages), **sampling})
        return self._reply()

    def generate(self, prompt, *, cancel=None, logprobs=0, **sampling):
        self.requests.append({"prompt": prompt, **sampling})
        return self._reply()

    def _reply(self):
        for k, word in enumerate(self.words):
            last = k == len(self.words) - 1
            yield TokenRecord(k, 1000 + k, word, finish_reason=self.finish if last else None)
            if self.hang:
                threading.Event().wait()

    def metrics(self) -> Metrics:
        return Metrics(generated_tokens=len(self.words))

    def count_chat_tokens(self, messages) -> int:
        return sum(len(m["content"].split()) for m in messages)

    def close(self) -> None:
        pass

    def __enter__(self) -> FakeChatModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def use_fake_model(model: FakeChatModel, monkeypatch=None) -> FakeChatModel:
    """``load_model`` gives ``model`` from now on (undone with ``monkeypatch`` when one is given)."""
    def load(*args, **kwargs):
        return model
    if monkeypatch is not None:
        monkeypatch.setattr(textmodel, "load_model", load)
    else:
        textmodel.load_model = load
    return model
