"""The decode loop and what it keeps per sequence, under speculative decoding, batching and the
``TextModel`` facade.

:class:`Decoding` holds one generation (KV cache, stop filter, detokenizer, history, clocks) and
turns each chosen token into a :class:`TokenRecord`. :class:`Speculation` is one sequence's steps:
each feeds the last chosen token and, with a :class:`Drafter`, a draft of the tokens that may
follow; the target's choices are kept while they equal the draft. :func:`decode` is the loop of
``generate`` and ``chat``, plain or speculative (one loop for both); the batch scheduler puts
many sequences' steps into one.

The floor knows a model through the :class:`Model` protocol, so it never imports the facade
that is built on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from ...backend import DeviceMemory, to_host
from ...procinfo import peak_rss_bytes
from ..model.causal_lm import CausalLM
from ..text.tokenizer import Tokenizer
from ..text.tokenizer_process import TokenizerProcess
from .constrain import Constraint
from .prefix_cache import PrefixCache
from .sampling import SamplingParams, argmax_id, device_logprobs, log_softmax_terms


@dataclass(frozen=True)
class TokenRecord:
    """One generated token. ``finish_reason`` is set on the last record only: ``"eos"``,
    ``"stop"`` (a stop string), ``"length"`` (max_tokens), ``"context"`` (context full) or
    ``"cancelled"``."""

    index: int
    id: int
    text: str  # the text this token adds (may be "" while a multi-byte character or stop is pending)
    logprob: float | None = None
    top: list[tuple[int, str, float]] | None = None  # (id, token's text as read, logprob), best first
    finish_reason: str | None = None


@dataclass
class Metrics:
    """Figures of the last generate/chat/classify call."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_s: float = 0.0
    decode_s: float = 0.0
    time_to_first_token_s: float = 0.0
    peak_rss_bytes: int = 0
    dropped_turns: int = 0  # chat turns removed by the "drop_oldest" context policy
    drafted_tokens: int = 0  # speculative decoding: tokens a drafter proposed
    accepted_tokens: int = 0  # ... and how many of them the target kept
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache (not prefilled)
    device_memory: DeviceMemory | None = None  # read by metrics(); None on numpy

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def prefill_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s else 0.0

    @property
    def decode_tokens_per_s(self) -> float:
        # the first token comes out of the prefill; the others each cost one decode step
        steps = max(self.generated_tokens - 1, 0)
        return steps / self.decode_s if self.decode_s else 0.0


@runtime_checkable
class Model(Protocol):
    """What decoding, drafting and batching need of a language model:
    :class:`~loomlab.core.llm.generate.textmodel.TextModel` is one."""

    net: CausalLM
    tokenizer: Tokenizer | TokenizerProcess
    vocab_size: int
    prefix_cache: PrefixCache

    @property
    def context_length(self) -> int: ...

    def token_text(self, token_id: int) -> str: ...

    def token_texts(self, token_ids: Sequence[int]) -> list[str]: ...

    def prompt_ids(self, prompt: str | Sequence[int]) -> list[int]: ...

    def check_fits(self, ids: list[int], params: SamplingParams) -> None: ...

    def check_generates(self) -> None: ...

    def busy(self, *, nestable: bool = False) -> AbstractContextManager: ...


class Drafter:
    """Proposes up to ``k`` tokens that may follow ``history`` (prompt + output so far)."""

    num_draft: int  # the most tokens proposed per target step

    def session(self) -> AbstractContextManager:
        """Held for one whole generation (a draft model's lock and thread settings)."""
        return nullcontext()

    def check(self, target: Model) -> None:
        """Raise :class:`LoomConfigError` if this drafter cannot serve ``target``."""

    def propose(self, history: Sequence[int], k: int) -> list[int]:
        raise NotImplementedError

    def fork(self) -> Drafter:
        """The drafter one sequence uses (its own track record, where the drafter keeps one)."""
        return self

    def record(self, drafted: int, accepted: int) -> None:
        """How the last proposal fared: ``accepted`` of its ``drafted`` tokens were kept."""

    def timed(self, drafted: int, seconds: float) -> None:
        """How long the step that verified ``drafted`` tokens took (0: a step without a draft)."""


class Decoding:
    """What one generation keeps, for the decode loop (:func:`decode`, plain or speculative) and
    the batch scheduler alike: the KV cache, the stop filter and detokenizer, the token history,
    and the metrics' clocks; :meth:`record` turns a chosen token into its :class:`TokenRecord`."""

    def __init__(self, model: Model, ids: list[int], params: SamplingParams, metrics: Metrics, *,
                 prefix_cache: PrefixCache | None = None):
        self.net, self.tok, self.token_texts = model.net, model.tokenizer, model.token_texts
        self.params, self.metrics = params, metrics
        self.sampler, self.processor = params.sampler(), params.processor()
        self.constraint = Constraint.for_tokenizer(model.tokenizer, model.vocab_size, model.net.source,
                                                   params.response_format)
        # a device row is chosen from on the device when nothing but its argmax is needed
        self.greedy = params.temperature == 0 and not params.penalized and self.constraint is None
        self.rng = np.random.default_rng(params.seed)
        # a constraint allows end of text only once its format is complete: a stop, not an eos
        self.eos_finish = "eos" if self.constraint is None else "stop"
        # the KV of the longest prompt prefix ``prefix_cache`` holds (a copy; the cache gets this
        # sequence's at :meth:`end`), else fresh caches: no step ever runs past the last allowed
        # token, so this is the most they hold
        self.prefix_cache = prefix_cache
        hit = prefix_cache.lookup(ids) if prefix_cache is not None else None
        caches, self.cached = hit if hit is not None else (None, 0)
        self.caches = [caches if caches is not None else model.net.make_cache(len(ids) + params.max_tokens)]
        self.text = _StopFilter(params.stop)
        self.decoder = self.tok.decode_stream(skip_special_tokens=True)
        self.history = list(ids)
        self.index = 0  # of the next record
        self.start = self.decode_start = time.perf_counter()

    def prefill(self, ids: list[int]) -> np.ndarray:
        """The prompt's step (its positions the prefix cache did not hold): the logits of its last
        position, ``[1, vocab]`` (on the model's device)."""
        logits = self.net.step(np.array([ids[self.cached:]]), self.caches)
        self.metrics.cached_tokens = self.cached
        self.metrics.prefill_s = time.perf_counter() - self.start
        self.decode_start = time.perf_counter()
        return logits

    def choose(self, logits: np.ndarray) -> TokenRecord:
        """The next token from one position's ``logits``: penalties, the constraint's mask (before
        logprobs too: they are the masked distribution's), the sampler; returns its record.

        A row on a device: greedy choice without penalties or a constraint is the argmax there
        (one transfer of the id, and of the logprobs asked for); anything else brings the row to
        the host once and goes on as there."""
        if not isinstance(logits, np.ndarray):
            if self.greedy:
                token = argmax_id(logits)
                return self.record(logits, token)
            logits = to_host(logits)
        processed = self.processor(logits, self.history)
        if self.constraint is not None:
            processed = self.constraint.mask(processed)
        token = self.sampler(processed, self.rng)
        if self.constraint is not None:
            self.constraint.consume(token)
        return self.record(processed, token)

    def record(self, processed: np.ndarray, token: int) -> TokenRecord:
        """``token``, chosen from the ``processed`` logits, as the next record."""
        index, metrics = self.index, self.metrics
        self.history.append(token)
        metrics.generated_tokens += 1
        if index == 0:
            metrics.time_to_first_token_s = time.perf_counter() - self.start
        logprob, top = token_logprobs(processed, token, self.params.logprobs, self.token_texts)
        last = index == self.params.max_tokens - 1
        delta, finish = _token_delta(self.tok, self.text, self.decoder, token, last)
        completed = finish == "length" and self.constraint is not None and self.constraint.complete
        if finish == "eos" or completed:
            finish = self.eos_finish  # a format the last allowed token completed was not cut
        self.index += 1
        return TokenRecord(index, token, delta, logprob, top, finish)

    def cancelled(self) -> TokenRecord:
        return TokenRecord(self.index, -1, self.text.flush(), finish_reason="cancelled")

    def end(self) -> None:
        self.metrics.decode_s = time.perf_counter() - self.decode_start
        self.metrics.peak_rss_bytes = peak_rss_bytes()
        if self.prefix_cache is not None:
            # positions below the last chosen token's hold the history's tokens (a speculative
            # step that ended on a finish may also hold a rejected draft token at and past it)
            n = min(self.caches[0][0].offset, len(self.history) - 1)
            self.prefix_cache.store(self.history[:n], self.caches[0])


class _StopFilter:
    """Holds back text that could be the start of a stop string; cuts at the first stop."""

    def __init__(self, stops: Sequence[str]):
        self.stops = list(stops)
        self.hold = max((len(s) for s in self.stops), default=1) - 1
        self.pending = ""

    def push(self, delta: str) -> tuple[str, bool]:
        self.pending += delta
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending = self.pending[:cut], ""
            return out, True
        safe = len(self.pending) - self.hold if self.stops else len(self.pending)
        out, self.pending = self.pending[:max(safe, 0)], self.pending[max(safe, 0):]
        return out, False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


def _token_delta(tok, text: _StopFilter, decoder, token: int, last: bool) -> tuple[str, str | None]:
    """The text ``token`` adds and the finish reason it brings: ``"eos"``, ``"stop"`` (a stop
    string) or, on the ``last`` allowed token, ``"length"`` (which flushes what was held)."""
    if token in tok.eos_ids:
        return text.flush(), "eos"
    delta, stopped = text.push(decoder.push(token))
    if stopped:
        return delta, "stop"
    if last:
        return delta + text.push(decoder.flush())[0] + text.flush(), "length"
    return delta, None


def token_logprobs(logits: np.ndarray, token: int, k: int, token_texts: Callable[[list[int]], list[str]]
                   ) -> tuple[float | None, list[tuple[int, str, float]] | None]:
    """What a record reports: the log-probability of ``token`` under ``logits`` (the processed,
    masked row it was chosen from, on any backend) and its ``k`` most likely alternatives as
    ``(id, text, logprob)``, best first, their texts from one ``token_texts(ids)`` call;
    ``(None, None)`` for k 0."""
    if k == 0:
        return None, None
    if not isinstance(logits, np.ndarray):  # a device row: reduced there, one transfer
        logprob, top = device_logprobs(logits, token, k)
    else:
        m, log_total = log_softmax_terms(logits)

        def logprob_of(i) -> float:
            return (float(logits[i]) - m) - log_total

        # the logits' order is their log-probabilities' (one shift), so their top k are the same;
        # tokens a constraint forbids (-inf) are no alternatives (and -Infinity is not JSON)
        logprob = logprob_of(token)
        top = [(int(i), logprob_of(i)) for i in top_k(logits, k) if np.isfinite(logits[i])]
    texts = token_texts([i for i, _ in top])
    return logprob, [(i, text, lp) for (i, lp), text in zip(top, texts, strict=True)]


def top_k(values: np.ndarray, k: int) -> np.ndarray:
    """The indices of the ``k`` largest values, largest first, ties by index: what a stable
    ``argsort(-values)[:k]`` gives, without sorting the vocabulary (3 ms per token for 49k
    entries, 0.06 ms this way)."""
    k = min(k, values.size)
    kth = np.partition(values, values.size - k)[values.size - k]
    candidates = np.flatnonzero(values >= kth)  # every tie at the boundary too
    return candidates[np.lexsort((candidates, -values[candidates]))][:k]


class Speculation:
    """One sequence's steps: the drafter, and the draft its next target step verifies. Shared by
    the one-sequence loop (:func:`decode`) and the batch scheduler, which puts several sequences'
    verify rows into one step."""

    def __init__(self, drafter: Drafter | None, run: Decoding):
        """``drafter`` None: plain decoding, one token a step (the batch treats every sequence
        alike)."""
        self.drafter, self.run = (None if drafter is None else drafter.fork()), run
        self.draft: list[int] = []
        self.kept = 0  # how many of the draft the last verification kept

    def feed(self, token: int, limit: int | None = None) -> list[int]:
        """The tokens the next target step takes: ``token`` (the last chosen, not yet in the
        cache) and a fresh draft of at most ``limit`` tokens, none past the sequence's last
        allowed token."""
        run = self.run
        if self.draft:
            self.drafter.record(len(self.draft), self.kept)
        k = 0 if self.drafter is None else min(self.drafter.num_draft, run.params.max_tokens - run.index - 1)
        if limit is not None:
            k = min(k, limit)
        self.draft = self.drafter.propose(run.history, k) if k > 0 else []
        run.metrics.drafted_tokens += len(self.draft)
        return [token, *self.draft]

    def timed(self, seconds: float) -> None:
        """The target step that verified :attr:`draft` took ``seconds`` (told to the drafter)."""
        if self.drafter is not None:
            self.drafter.timed(len(self.draft), seconds)

    def verify(self, rows: np.ndarray, cancel: Callable[[], bool]) -> Iterator[TokenRecord]:
        """The records of one step's ``rows`` (logits of the fed token and each drafted one): the
        target's own choice at each position (penalties and a constraint applied as in plain
        decoding), kept while it equals the draft; the first disagreement ends the step and the
        rejected positions leave the cache."""
        run, draft = self.run, self.draft
        self.kept = 0
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
                self.kept += 1
                continue
            # draft[j:] went into the cache after a token the target did not choose (none when
            # there was no draft: plain decoding steps through here every token)
            if j < len(draft):
                for c in run.caches[0]:
                    c.trim(len(draft) - j)
            return


def decode(model: Model, ids: list[int], params: SamplingParams, cancel: Callable[[], bool],
           metrics: Metrics, drafter: Drafter | None = None) -> Iterator[TokenRecord]:
    """The decode loop of ``generate`` / ``chat``: one token a step without a drafter; with one,
    each step also verifies the drafted tokens (greedy). The caller holds the model."""
    run = Decoding(model, ids, params, metrics, prefix_cache=model.prefix_cache)
    if params.max_tokens == 0:
        return
    spec = Speculation(drafter, run)
    rows = run.prefill(ids)  # [1, vocab]: the prompt's last position decides the first token
    while True:
        for record in spec.verify(rows, cancel):  # always one record at least
            yield record
        if record.finish_reason is not None:
            break
        feed = spec.feed(record.id)
        start = time.perf_counter()
        rows = run.net.step(np.array([feed]), run.caches, last_only=False)[0, ...]
        spec.timed(time.perf_counter() - start)
    run.end()
