"""Speculative decoding for greedy generation: a drafter guesses the next few tokens, the target
checks them all with one multi-token step and keeps the longest prefix equal to its own greedy
choices, plus its own next token.

Two drafters: :class:`PromptLookup` (n-gram copy from the prompt and output so far; no second
model) and :class:`DraftModel` (a model sharing the vocabulary, e.g. a low-bit morph of the
target, with its own KV cache kept in step with the accepted tokens). Only greedy decoding
(temperature 0); logit penalties work, as each drafted position is processed with the history
it would have had.

The output equals plain greedy generation as long as the target's multi-token step picks the
same argmax as its one-token steps; the two differ in the last float bits (about 3e-5 on
SmolLM2's logits), which flips a choice only at a near tie.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import numpy as np

from ..errors import LoomConfigError
from .prefix_cache import common_prefix
from .sampling import SamplingParams
from .textmodel import Decoding, Metrics, TokenRecord

if TYPE_CHECKING:
    from .textmodel import TextModel

# SamplingParams fields whose setting speculation honours (penalties are applied per drafted
# position; top-k/p and min-p do not change an argmax; the seed is unused by greedy decoding).
# A field outside this set that is not at its default (a logits constraint, say) is refused
# rather than silently ignored.
_SUPPORTED = {"temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
              "frequency_penalty", "penalty_window", "max_tokens", "stop", "seed", "logprobs"}


class Drafter:
    """Proposes up to ``k`` tokens that may follow ``history`` (prompt + output so far)."""

    num_draft: int  # the most tokens proposed per target step

    def session(self) -> AbstractContextManager:
        """Held for one whole generation (a draft model's lock and thread settings)."""
        return nullcontext()

    def check(self, target: TextModel) -> None:
        """Raise :class:`LoomConfigError` if this drafter cannot serve ``target``."""

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        raise NotImplementedError


class PromptLookup(Drafter):
    """Find the last ``n`` tokens (``max_ngram`` down to ``min_ngram``) earlier in the history;
    propose the tokens that followed their latest earlier occurrence.

    ``min_ngram`` defaults to 3: shorter matches guess badly and a rejected draft still costs its
    verify rows (SmolLM2-135M, 128-token chat reply: n = 3..1 drafted 393 tokens, 6 accepted,
    0.31x plain speed; n = 3 only: 12 drafted, no loss)."""

    def __init__(self, num_draft: int = 10, max_ngram: int = 3, min_ngram: int = 3):
        if not 1 <= min_ngram <= max_ngram:
            raise LoomConfigError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        _check_num_draft(num_draft)
        self.num_draft, self.max_ngram, self.min_ngram = num_draft, max_ngram, min_ngram

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        h = np.asarray(history, np.int64)
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if h.size <= n:
                continue
            # windows of h[:-1] start everywhere but at the suffix itself, and each leaves at
            # least one following token to propose
            windows = np.lib.stride_tricks.sliding_window_view(h[:-1], n)
            hits = np.flatnonzero((windows == h[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return h[start:start + k].tolist()
        return []


class DraftModel(Drafter):
    """Greedy guesses of a second model with the target's vocabulary. Its KV cache holds a prefix
    of the history; each proposal trims what the target rejected and feeds what it added."""

    def __init__(self, model: TextModel, num_draft: int = 4):
        _check_num_draft(num_draft)
        self.model, self.num_draft = model, num_draft
        self._cache = model.net.make_cache()
        self._tokens: list[int] = []  # the tokens whose keys and values the cache holds

    def session(self) -> AbstractContextManager:
        return self.model.busy()

    def check(self, target: TextModel) -> None:
        if self.model.net is target.net:
            raise LoomConfigError("the draft model must be a second loaded model (it keeps its own "
                                  "KV cache), not the target itself")
        if self.model.vocab_size != target.vocab_size:
            raise LoomConfigError(f"the draft model's vocabulary ({self.model.vocab_size}) differs from "
                                  f"the target's ({target.vocab_size})")

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        if k == 0:
            return []
        keep = common_prefix(self._tokens, history)
        keep = min(keep, len(history) - 1)  # feed at least one token, to get logits
        self._trim(len(self._tokens) - keep)
        feed = list(history[keep:])
        net = self.model.net
        logits = net.step(np.array([feed]), [self._cache])[0]
        self._tokens += feed
        out = [int(np.argmax(logits))]
        while len(out) < k:
            logits = net.step(np.array([[out[-1]]]), [self._cache])[0]
            self._tokens.append(out[-1])
            out.append(int(np.argmax(logits)))
        return out

    def _trim(self, n: int) -> None:
        for c in self._cache:
            c.trim(n)
        del self._tokens[len(self._tokens) - n:]


def drafter_for(spec, target: TextModel, params: SamplingParams) -> Drafter:
    """The drafter ``spec`` names (``"prompt-lookup"``, a :class:`Drafter`, or a draft
    :class:`TextModel`), after checking that speculation can serve ``params``."""
    from .textmodel import TextModel

    if params.temperature != 0:
        raise LoomConfigError(f"speculative decoding is greedy only (temperature 0), got temperature "
                              f"{params.temperature}")
    others = [f.name for f in dataclasses.fields(params) if f.name not in _SUPPORTED
              and getattr(params, f.name) != _default(f)]
    if others:
        raise LoomConfigError(f"speculative decoding and {', '.join(others)} do not work together yet")
    if spec == "prompt-lookup":
        drafter: Drafter = PromptLookup()
    elif isinstance(spec, Drafter):
        drafter = spec
    elif isinstance(spec, TextModel):
        drafter = DraftModel(spec)
    else:
        raise LoomConfigError(f"speculative must be 'prompt-lookup', a Drafter or a draft TextModel, "
                              f"got {spec!r}")
    drafter.check(target)
    return drafter


def run(target: TextModel, ids: list[int], params: SamplingParams, cancel: Callable[[], bool],
        metrics: Metrics, drafter: Drafter) -> Iterator[TokenRecord]:
    """What ``TextModel._run`` yields for greedy decoding, with drafted tokens verified in one
    target step each."""
    processor = params.processor()
    run = Decoding(target, ids, params, metrics)
    if params.max_tokens == 0:
        return
    rows = run.prefill(ids)  # [1, vocab]: the prompt's last position decides the first token
    draft: list[int] = []
    while True:
        finish = None
        for j, row in enumerate(rows):
            if cancel():
                yield run.cancelled()
                finish = "cancelled"
                break
            processed = processor(row, run.history)
            token = int(np.argmax(processed))  # the greedy sampler's rule: the first maximum
            record = run.record(processed, token)
            yield record
            finish = record.finish_reason
            if finish is not None:
                break
            if j < len(draft) and token == draft[j]:
                metrics.accepted_tokens += 1
                continue
            # draft[j:] went into the cache after a token the target did not choose
            for c in run.caches[0]:
                c.trim(len(draft) - j)
            break
        if finish is not None:
            break
        # the last token chosen is not in the cache yet: it leads the next verify step
        draft = drafter.propose(run.history, min(drafter.num_draft, params.max_tokens - run.index - 1))
        metrics.drafted_tokens += len(draft)
        rows = run.net.step(np.array([[token] + draft]), run.caches, last_only=False)[0]
    run.end()


def _check_num_draft(num_draft: int) -> None:
    if isinstance(num_draft, bool) or not isinstance(num_draft, int) or num_draft < 1:
        raise LoomConfigError(f"num_draft must be an integer >= 1, got {num_draft!r}")


def _default(f: dataclasses.Field):
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
