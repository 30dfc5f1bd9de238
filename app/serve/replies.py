"""The JSON objects the server answers with: OpenAI's shapes, plus llama.cpp's ``timings``.

A :class:`Choice` gathers one engine request's records; the ``*_object`` / ``*_chunk`` functions
turn choices into chat and text completion replies (whole, or as stream chunks).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from loomlab.core.llm.generate.decoding import Metrics, TokenRecord

# the engine's finish reasons in OpenAI's words; "context" (context full) is a length limit too
FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "context": "length",
                  "cancelled": "cancelled", "error": "error"}


@dataclass
class Choice:
    """One generated sequence: its records so far and its finish."""

    index: int
    metrics: Metrics
    records: list[TokenRecord] = field(default_factory=list)
    finish_reason: str | None = None  # OpenAI's word, once finished

    def add(self, record: TokenRecord) -> None:
        self.records.append(record)
        if record.finish_reason is not None:
            self.finish_reason = FINISH_REASONS.get(record.finish_reason, record.finish_reason)

    @property
    def text(self) -> str:
        return "".join(r.text for r in self.records)


class Reply:
    """What every object of one reply shares: id, creation time, model name; and how a token id
    reads (for logprobs: the token alone, not its delta, which a stop string or a pending
    multi-byte character may have held back)."""

    def __init__(self, prefix: str, model: str, token_text: Callable[[int], str],
                 end_ids: Iterable[int] = ()):
        self.id = f"{prefix}-{uuid.uuid4().hex[:24]}"
        self.created = int(time.time())
        self.model = model
        self.token_text = token_text
        self.end_ids = frozenset(end_ids)  # end-of-text tokens: not the reply's text, nor its logprobs

    def scored(self, record: TokenRecord) -> bool:
        """Whether ``record`` is a token of the reply with a logprob (a cancelled or error record
        has no token)."""
        return record.id >= 0 and record.logprob is not None and record.id not in self.end_ids

    def head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}


# ----- usage and timings ----------------------------------------------------------------------------

def usage(prompt_tokens: int, choices: Sequence[Choice]) -> dict:
    """OpenAI's usage: the prompt counted once (as OpenAI counts it for n > 1), every choice's tokens."""
    completion = sum(c.metrics.generated_tokens for c in choices)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
            "total_tokens": prompt_tokens + completion}


def timings(choices: Sequence[Choice]) -> dict:
    """llama.cpp's timings over all choices: prefill of the prompt tokens not served by the prefix
    cache, and decode (tokens after the first, each one decode step)."""
    ms = [c.metrics for c in choices]
    prompt_s = sum(m.prefill_s for m in ms)
    predicted_s = sum(m.decode_s for m in ms)
    prefilled = sum(m.prompt_tokens - m.cached_tokens for m in ms)
    decoded = sum(max(m.generated_tokens - 1, 0) for m in ms)
    return {"prompt_n": prefilled, "prompt_ms": prompt_s * 1000,
            "prompt_per_second": prefilled / prompt_s if prompt_s else 0.0,
            "predicted_n": sum(m.generated_tokens for m in ms), "predicted_ms": predicted_s * 1000,
            "predicted_per_second": decoded / predicted_s if predicted_s else 0.0,
            "cached_tokens": sum(m.cached_tokens for m in ms)}


# ----- logprobs -------------------------------------------------------------------------------------

def chat_logprobs(reply: Reply, records: Sequence[TokenRecord], top: int | None) -> dict | None:
    """OpenAI's chat ``logprobs``: one entry per token with its ``top`` alternatives."""
    if top is None:
        return None
    return {"content": [{"token": (t := reply.token_text(r.id)), "logprob": r.logprob, "bytes": _bytes(t),
                         "top_logprobs": [{"token": a, "logprob": lp, "bytes": _bytes(a)}
                                          for _, a, lp in (r.top or [])[:top]]}
                        for r in records if reply.scored(r)]}


def completion_logprobs(reply: Reply, records: Sequence[TokenRecord], top: int | None,
                        offset: int = 0) -> dict | None:
    """The legacy completions ``logprobs``: parallel lists (tokens, their logprobs, the top
    alternatives as {token: logprob}, each token's offset in the text)."""
    if top is None:
        return None
    scored = [r for r in records if reply.scored(r)]
    tokens = [reply.token_text(r.id) for r in scored]
    offsets, at = [], offset
    for t in tokens:
        offsets.append(at)
        at += len(t)
    return {"tokens": tokens, "token_logprobs": [r.logprob for r in scored],
            "top_logprobs": [{t: lp for _, t, lp in (r.top or [])[:top]} for r in scored],
            "text_offset": offsets}


def _bytes(text: str) -> list[int]:
    return list(text.encode("utf-8"))


# ----- chat completions -----------------------------------------------------------------------------

def chat_object(reply: Reply, choices: Sequence[Choice], prompt_tokens: int, top: int | None) -> dict:
    return {**reply.head("chat.completion"),
            "choices": [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                         "logprobs": chat_logprobs(reply, c.records, top), "finish_reason": c.finish_reason}
                        for c in choices],
            "usage": usage(prompt_tokens, choices), "timings": timings(choices)}


def chat_chunk(reply: Reply, index: int, delta: dict, *, records: Sequence[TokenRecord] = (),
               top: int | None = None, finish_reason: str | None = None) -> dict:
    return {**reply.head("chat.completion.chunk"),
            "choices": [{"index": index, "delta": delta,
                         "logprobs": chat_logprobs(reply, records, top) if records else None,
                         "finish_reason": finish_reason}]}


# ----- text completions -----------------------------------------------------------------------------

def completion_object(reply: Reply, choices: Sequence[Choice], prompt_tokens: int, top: int | None,
                      prefixes: Sequence[str]) -> dict:
    """``prefixes``: each choice's echoed prompt ("" without echo)."""
    return {**reply.head("text_completion"),
            "choices": [{"index": c.index, "text": p + c.text,
                         "logprobs": completion_logprobs(reply, c.records, top, len(p)),
                         "finish_reason": c.finish_reason}
                        for c, p in zip(choices, prefixes, strict=True)],
            "usage": usage(prompt_tokens, choices), "timings": timings(choices)}


def completion_chunk(reply: Reply, index: int, text: str, *, records: Sequence[TokenRecord] = (),
                     top: int | None = None, finish_reason: str | None = None) -> dict:
    return {**reply.head("text_completion"),
            "choices": [{"index": index, "text": text,
                         "logprobs": completion_logprobs(reply, records, top) if records else None,
                         "finish_reason": finish_reason}]}


def usage_chunk(reply: Reply, kind: str, choices: Sequence[Choice], prompt_tokens: int) -> dict:
    """The last chunk of a stream with ``include_usage``: no choices, the usage (and timings)."""
    return {**reply.head(kind), "choices": [], "usage": usage(prompt_tokens, choices),
            "timings": timings(choices)}
