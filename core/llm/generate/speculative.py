"""Speculative decoding for greedy generation: a drafter guesses the next few tokens, the target
checks them all with one multi-token step and keeps the longest prefix equal to its own greedy
choices, plus its own next token. The checking is the decode loop's
(:mod:`.decoding`: one loop for plain and speculative decoding); this module holds the drafters.

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

import copy
from collections.abc import Sequence
from contextlib import AbstractContextManager

import numpy as np

from ...errors import LoomConfigError
from .decoding import Drafter, Model
from .prefix_cache import common_prefix
from .sampling import SamplingParams, argmax_id

#: Generation's default: greedy requests speculate with prompt lookup, where its measured cost
#: (:class:`PromptLookup`) says it gains.
AUTO = "auto"


class PromptLookup(Drafter):
    """Find the last ``n`` tokens (``max_ngram`` down to ``min_ngram``) earlier in the history;
    propose up to ``per_token * n`` of the tokens that followed their latest earlier occurrence.

    A longer match predicts a longer copy: a reply that has begun copying a sentence of the
    prompt matches 3 tokens and goes on for many more, while a 2-token match is often a common
    pair and a 1-token match almost always is (drafting from 1-grams made a SmolLM2 chat reply
    slower than plain decoding). So 2-grams propose up to 4 tokens and 3-grams up to
    ``num_draft`` = 6: each row a step verifies costs a fraction of a one-row step, so a rejected
    draft costs less than an accepted one gains. What each kind of prompt gains is measured by
    ``tests/bench/bench_speculative.py`` (docs/performance.md, "speculative decoding").

    In a reply that does not quote the prompt, the 2-gram drafts are rejected one after another
    (measured: a story, 0 of 35 drafted tokens kept, 0.91x), and what a rejected draft costs
    depends on the kernels: a verification row is cheap where a step is bound by reading the
    weights, and on a CPU without VNNI the 8-bit kernels make it dearer. So each sequence keeps
    a record per n-gram length (:meth:`fork`): the tokens its steps produced (kept + 1) and the
    seconds they took, each step weighing the earlier ones by ``RECENT``, against the sequence's
    steps without a draft (:meth:`timed`). After its first ``TRIAL`` proposals a length drafts on
    only while its recent steps produce tokens at least as fast as plain steps do: the story's
    2-grams stop after their trial, the summaries' keep going. And a length's drafts grow as
    they are kept (``FIRST_DRAFT`` tokens at first; 2 more after a draft kept whole, 1 fewer after
    one cut short, as transformers' assisted generation sizes its drafts). Both for a reply whose
    first copy is kept and whose later ones are cut: with fixed sizes and the whole record
    weighing alike, a short summary ran 0.96x plain decoding (medians of 6 alternated runs);
    now 1.00x."""

    TRIAL = 2  # proposals of an n-gram length before its measured rate decides
    FIRST_DRAFT = 2  # the most tokens a length's first proposal drafts
    RECENT = 0.75  # the weight of a length's record at each of its next steps

    def __init__(self, num_draft: int = 6, max_ngram: int = 3, min_ngram: int = 2, per_token: int = 2):
        if not 1 <= min_ngram <= max_ngram:
            raise LoomConfigError(f"need 1 <= min_ngram <= max_ngram, got {min_ngram}, {max_ngram}")
        _check_positive(num_draft, "num_draft")
        _check_positive(per_token, "per_token")
        self.num_draft, self.max_ngram, self.min_ngram = num_draft, max_ngram, min_ngram
        self.per_token = per_token
        self._record: dict[int, list] = {}  # n -> [proposals, tokens its steps produced, their seconds]
        self._size: dict[int, int] = {}  # n -> the most tokens its next proposal drafts
        self._plain = [0, 0.0]  # steps without a draft, their seconds
        self._n = 0  # the n-gram length of the last proposal

    def fork(self) -> PromptLookup:
        fork = copy.copy(self)  # settings (TRIAL, FIRST_DRAFT set on the instance too), a fresh record
        fork._record, fork._size, fork._plain, fork._n = {}, {}, [0, 0.0], 0
        return fork

    def record(self, drafted: int, accepted: int) -> None:
        if drafted:
            r = self._last_record()
            r[0] += 1
            r[1] += accepted + 1
            self._size[self._n] = drafted + 2 if accepted == drafted else max(1, drafted - 1)

    def timed(self, drafted: int, seconds: float) -> None:
        if drafted:  # the length's earlier steps weigh less with each new one (RECENT)
            r = self._last_record()
            r[1] *= self.RECENT
            r[2] = r[2] * self.RECENT + seconds
        else:
            self._plain[0] += 1
            self._plain[1] += seconds

    def _last_record(self) -> list:
        """The record of the n-gram length of the last proposal."""
        return self._record.setdefault(self._n, [0, 0, 0.0])

    def _trusted(self, n: int) -> bool:
        """In its trial, or producing tokens at least as fast as plain steps (tokens a second)."""
        proposals, produced, seconds = self._record.get(n, (0, 0, 0.0))
        plain_steps, plain_seconds = self._plain
        if proposals < self.TRIAL or not plain_steps or not seconds:
            return True
        return produced * plain_seconds >= plain_steps * seconds

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        h = np.asarray(history, np.int64)
        # where a match can end: the earlier positions holding the last token (a scan per n-gram
        # length with sliding windows took ~50 us a step, ~1.5% of a SmolLM2 step)
        ends = np.flatnonzero(h[:-1] == h[-1])
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            if h.size <= n or not self._trusted(n):
                continue
            hits = ends[ends >= n - 1]
            for back in range(1, n):
                hits = hits[h[hits - back] == h[-1 - back]]
            if hits.size:
                start, self._n = int(hits[-1]) + 1, n
                most = min(k, self.per_token * n, self._size.get(n, self.FIRST_DRAFT))
                return h[start:start + most].tolist()
        return []


class DraftModel(Drafter):
    """Greedy guesses of a second model with the target's vocabulary. Its KV cache holds a prefix
    of the history; each proposal trims what the target rejected and feeds what it added."""

    def __init__(self, model: Model, num_draft: int = 4):
        _check_positive(num_draft, "num_draft")
        self.model, self.num_draft = model, num_draft
        self._cache = model.net.make_cache()
        self._tokens: list[int] = []  # the tokens whose keys and values the cache holds

    def session(self) -> AbstractContextManager:
        return self.model.busy()

    def check(self, target: Model) -> None:
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
        if self._cache[0].xp is not net.backend.xp:  # the draft model took its kernels (a first run)
            self._cache, self._tokens = net.make_cache(), []
            feed = list(history)
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


def drafter_for(spec, target: Model, params: SamplingParams) -> Drafter | None:
    """The drafter ``spec`` names (``"prompt-lookup"``, a :class:`Drafter`, or a draft model, a
    second ``TextModel``), after checking that speculation can serve ``params``. ``"auto"`` (the
    default of generation): prompt lookup for a greedy request, none for a sampled one."""
    if spec == AUTO:
        spec = "prompt-lookup" if params.temperature == 0 else None
    if spec is None:
        return None
    if params.temperature != 0:
        raise LoomConfigError(f"speculative decoding is greedy only (temperature 0), got temperature "
                              f"{params.temperature}")
    if spec == "prompt-lookup":
        drafter: Drafter = PromptLookup()
    elif isinstance(spec, Drafter):
        drafter = spec
    elif isinstance(spec, Model):
        drafter = DraftModel(spec)
    else:
        raise LoomConfigError(f"speculative must be 'auto', 'prompt-lookup', None, a Drafter or a draft "
                              f"TextModel, got {spec!r}")
    drafter.check(target)
    return drafter


def _check_positive(value: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LoomConfigError(f"{name} must be an integer >= 1, got {value!r}")
