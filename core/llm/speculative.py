"""Speculative decoding for greedy generation: a drafter guesses the next few tokens, the target
checks them all with one multi-token step and keeps the longest prefix equal to its own greedy
choices, plus its own next token. :func:`run` is also the plain decode loop (no drafter: one
token a step), so generation has one loop.

Two drafters: :class:`PromptLookup` (n-gram copy from the prompt and output so far; no second
model) and :class:`DraftModel` (a model sharing the vocabulary, e.g. a low-bit morph of the
target, with its own KV cache kept in step with the accepted tokens). Only greedy decoding
(temperature 0); logit penalties and a response_format constraint work, as each drafted position
is processed (and masked) with the history it would have had; top-k/p and min-p do not change an
argmax.

The output equals plain greedy generation as long as the target's multi-token step picks the
same argmax as its one-token steps; the two differ in the last float bits (about 3e-5 on
SmolLM2's logits), which flips a choice only at a near tie.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING

import numpy as np

from ..errors import LoomConfigError
from .prefix_cache import common_prefix
from .sampling import SamplingParams, argmax_id
from .textmodel import Decoding, Metrics, TokenRecord

if TYPE_CHECKING:
    from .textmodel import TextModel


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
    0.31x plain speed; n = 3 only: 12 drafted, no loss). ``num_draft`` defaults to 3: each row a
    step verifies costs about a third of a one-row step in the int8 kernels (they are bound by
    their integer dots, not by reading the weights, on this machine), and longer drafts are
    rejected more (int8, 96 tokens, best of 3, 2026-11-25: summary prompt 1 / 2 / 3 / 4 / 6
    drafted 1.14-1.16 / 1.20-1.22 / 1.20-1.21 / 1.15-1.20 / 1.20x plain speed, chat 1.01-1.05 /
    1.03-1.04 / 1.00-1.05 / 0.94-1.00 / 0.95-0.98x)."""

    def __init__(self, num_draft: int = 3, max_ngram: int = 3, min_ngram: int = 3):
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
        logits = net.step(np.array([feed]), [self._cache])[0, ...]
        self._tokens += feed
        out = [argmax_id(logits)]
        while len(out) < k:
            logits = net.step(np.array([[out[-1]]]), [self._cache])[0, ...]
            self._tokens.append(out[-1])
            out.append(argmax_id(logits))
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


class Speculation:
    """One sequence's speculative decoding: the drafter, and the draft its next target step
    verifies. Shared by the one-sequence loop (:func:`run`) and the batch scheduler, which puts
    several sequences' verify rows into one step."""

    def __init__(self, drafter: Drafter | None, run: Decoding):
        """``drafter`` None: plain decoding, one token a step (the batch treats every sequence
        alike)."""
        self.drafter, self.run = drafter, run
        self.draft: list[int] = []

    def feed(self, token: int, limit: int | None = None) -> list[int]:
        """The tokens the next target step takes: ``token`` (the last chosen, not yet in the
        cache) and a fresh draft of at most ``limit`` tokens, none past the sequence's last
        allowed token."""
        run = self.run
        k = 0 if self.drafter is None else min(self.drafter.num_draft, run.params.max_tokens - run.index - 1)
        if limit is not None:
            k = min(k, limit)
        self.draft = self.drafter.propose(run.history, k) if k > 0 else []
        run.metrics.drafted_tokens += len(self.draft)
        return [token, *self.draft]

    def verify(self, rows: np.ndarray, cancel: Callable[[], bool]) -> Iterator[TokenRecord]:
        """The records of one step's ``rows`` (logits of the fed token and each drafted one): the
        target's own choice at each position (penalties and a constraint applied as in plain
        decoding), kept while it equals the draft; the first disagreement ends the step and the
        rejected positions leave the cache."""
        run, draft = self.run, self.draft
        for j in range(rows.shape[0]):  # by index: a device array may refuse iteration
            if cancel():
                yield run.cancelled()
                return
            record = run.choose(rows[j, ...])  # greedy: the first maximum, as the plain loop picks
            yield record
            if record.finish_reason is not None:
                return
            if j < len(draft) and record.id == draft[j]:
                run.metrics.accepted_tokens += 1
                continue
            # draft[j:] went into the cache after a token the target did not choose (none when
            # there was no draft: plain decoding steps through here every token)
            if j < len(draft):
                for c in run.caches[0]:
                    c.trim(len(draft) - j)
            return


def run(target: TextModel, ids: list[int], params: SamplingParams, cancel: Callable[[], bool],
        metrics: Metrics, drafter: Drafter | None) -> Iterator[TokenRecord]:
    """The decode loop of ``generate`` / ``chat``: one token a step without a drafter; with one,
    each step also verifies the drafted tokens (greedy)."""
    run = Decoding(target, ids, params, metrics, prefix_cache=target.prefix_cache)
    if params.max_tokens == 0:
        return
    spec = Speculation(drafter, run)
    rows = run.prefill(ids)  # [1, vocab]: the prompt's last position decides the first token
    while True:
        for record in spec.verify(rows, cancel):  # always one record at least
            yield record
        if record.finish_reason is not None:
            break
        rows = run.net.step(np.array([spec.feed(record.id)]), run.caches, last_only=False)[0, ...]
    run.end()


def _check_num_draft(num_draft: int) -> None:
    if isinstance(num_draft, bool) or not isinstance(num_draft, int) or num_draft < 1:
        raise LoomConfigError(f"num_draft must be an integer >= 1, got {num_draft!r}")
