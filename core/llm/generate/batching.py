"""Many sequences decoded together: a continuous-batching scheduler and its thread-safe front.

:class:`Batch` is the scheduler, driven by whoever calls :meth:`Batch.step`: each step admits
waiting requests up to ``max_batch`` (each prefilled alone, from the longest prefix the
:class:`PrefixCache` holds), then runs ONE decode step for every active sequence together
(``CausalLM.step`` on ``[B, 1]`` ids, each row with its own KV cache and position), so each weight
matrix is read once per step for all of them. Finished and cancelled sequences leave at once;
their caches go to the prefix cache. :class:`BatchEngine` runs a Batch on its own thread and
takes requests from any thread (the server's); ``TextModel.batch_generate`` drives one inline.

Determinism: a sequence's rows are computed by row-invariant kernels (the quantized matmul and
attention give a row the same bits whatever else is in the step), and its sampler has its own
generator, so its output does not depend on its neighbours (tests compare every sequence with the
same request run alone).
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from ...errors import LoomConfigError
from .decoding import Decoding, Drafter, Metrics, Model, Speculation, TokenRecord
from .prefix_cache import PrefixCache
from .sampling import SamplingParams
from .speculative import DraftModel, drafter_for

_ids = itertools.count(1)


class Request:
    """One generation submitted to a :class:`Batch`: its records arrive through ``on_record``
    (called on the scheduler's thread; must not block) or, without one, by iterating the request
    (blocking). The last record carries the finish reason; ``metrics`` fills in as it runs."""

    def __init__(self, prompt_ids: Sequence[int], params: SamplingParams,
                 on_record: Callable[[TokenRecord], None] | None = None, drafter: Drafter | None = None):
        self.id = next(_ids)
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.drafter = drafter  # speculative decoding's, or None
        self.metrics = Metrics(prompt_tokens=len(self.prompt_ids))
        self.error: str | None = None  # why the engine failed it (finish reason "error")
        self.failure: Exception | None = None  # the exception that failed it, for its type
        self._on_record = on_record
        self._records: queue.SimpleQueue | None = None if on_record is not None else queue.SimpleQueue()
        self._cancelled = threading.Event()
        self._done = threading.Event()

    def cancel(self) -> None:
        """Stop this generation: it leaves the batch at the next step with a "cancelled" record."""
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the request has finished (True) or ``timeout`` seconds passed (False)."""
        return self._done.wait(timeout)

    def __iter__(self) -> Iterator[TokenRecord]:
        if self._records is None:
            raise LoomConfigError("this request delivers its records to on_record; it cannot be iterated")
        while True:
            item = self._records.get()
            yield item
            if item.finish_reason is not None:
                return

    def text(self) -> str:
        """Iterate to the end and return the generated text."""
        return "".join(r.text for r in self)

    def _emit(self, record: TokenRecord) -> None:
        if self._on_record is not None:
            self._on_record(record)
        else:
            self._records.put(record)
        if record.finish_reason is not None:
            self._done.set()

    def _fail(self, index: int, failure: Exception) -> None:
        self.failure, self.error = failure, f"{type(failure).__name__}: {failure}"
        self._emit(TokenRecord(index, -1, "", finish_reason="error"))


@dataclass(eq=False)
class _Active:
    """A request in the batch: its decoding state, its speculation (a drafter, or none: then
    each step feeds one token) and the token its next step feeds."""

    request: Request
    run: Decoding
    spec: Speculation
    token: int = -1


class Batch:
    """The continuous-batching scheduler over one model. Not thread-safe: one thread calls
    :meth:`add` and :meth:`step` (:class:`BatchEngine` is the thread-safe front), holding the
    model (``model.busy()``) while it steps."""

    def __init__(self, model: Model, max_batch: int = 8, prefix_cache: PrefixCache | None = None):
        """``prefix_cache``: where prompts find earlier sequences' KV (the model's own when None);
        pass ``PrefixCache(0)`` for none."""
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise LoomConfigError(f"max_batch must be an integer >= 1, got {max_batch!r}")
        self.model = model
        self.max_batch = max_batch
        self.prefix_cache = model.prefix_cache if prefix_cache is None else prefix_cache
        self.waiting: deque[Request] = deque()
        self.active: list[_Active] = []
        self.steps = 0  # decode steps run (each over every active sequence)
        self.tokens = 0  # records emitted
        self.drafted = self.accepted = 0  # speculation's totals over finished requests

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.active)

    def check(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[int]:
        """The prompt as a list of ids, or the typed error a generation of it would raise."""
        self.model.check_generates()
        ids = self.model.prompt_ids(list(prompt_ids))
        if params.max_tokens < 1:
            raise LoomConfigError("max_tokens must be >= 1 for a generation request")
        self.model.check_fits(ids, params)
        return ids

    def drafter(self, speculative, params: SamplingParams) -> Drafter | None:
        """The drafter of ``speculative`` (None, "prompt-lookup" or a stateless Drafter) for a
        request with ``params``; LoomConfigError when speculation cannot serve it. A draft model
        is refused: it keeps one sequence's KV cache, and a batch holds many."""
        if isinstance(speculative, Model | DraftModel):
            raise LoomConfigError("a draft model drafts for one sequence at a time; batched requests "
                                  "speculate with 'prompt-lookup'")
        return drafter_for(speculative, self.model, params)

    def add(self, request: Request) -> None:
        self.waiting.append(request)

    def step(self) -> None:
        """Admit what fits, then one decode step for every active sequence: one token each, or
        the token and its draft for a speculating sequence (shorter rows padded, the padding's
        positions trimmed from their caches after the step)."""
        self._drop_cancelled()
        while self.waiting and len(self.active) < self.max_batch:
            self._admit(self.waiting.popleft())
        if not self.active:
            return
        # every row's positions must fit its context, padding included
        room = min(self.model.context_length - a.run.caches[0][0].offset for a in self.active)
        feeds = [a.spec.feed(a.token, room - 1) for a in self.active]
        T = max(map(len, feeds))
        ids = np.array([f + [f[-1]] * (T - len(f)) for f in feeds])
        start = time.perf_counter()
        logits = self.model.net.step(ids, [a.run.caches[0] for a in self.active], last_only=False)
        seconds = time.perf_counter() - start
        for a in self.active:
            a.spec.timed(seconds)  # the whole batch's step: a draft widens every row
        self.steps += 1
        for i, (a, feed) in enumerate(zip(list(self.active), feeds, strict=True)):
            if T > len(feed):
                for c in a.run.caches[0]:
                    c.trim(T - len(feed))
            self._deliver(a, logits[i, :len(feed), :])  # indexed: a device array may refuse iteration

    def cancel_all(self) -> None:
        for request in self.waiting:
            request.cancel()
        for a in self.active:
            a.request.cancel()
        self._drop_cancelled()
        while self.waiting:
            self._emit_cancelled(self.waiting.popleft())

    def fail_all(self, failure: Exception) -> None:
        """End every request with an "error" record (a step raised): the batch is empty after."""
        for a in self.active:
            a.request._fail(a.run.index, failure)
        for request in self.waiting:
            request._fail(0, failure)
        self.active.clear()
        self.waiting.clear()

    # ----- internals -----------------------------------------------------------------------
    def _admit(self, request: Request) -> None:
        if request.cancelled:
            self._emit_cancelled(request)
            return
        ids, params = request.prompt_ids, request.params
        try:
            run = Decoding(self.model, ids, params, request.metrics, prefix_cache=self.prefix_cache)
            a = _Active(request, run, Speculation(request.drafter, run))
            logits = run.prefill(ids)
        except Exception as e:  # this request's failure (a constraint the tokenizer cannot follow,
            request._fail(0, e)  # a failing kernel): the batch goes on
            return
        self.active.append(a)
        self._deliver(a, logits)

    def _deliver(self, a: _Active, rows: np.ndarray) -> None:
        """Choose from one step's ``rows`` of ``a`` (one, or the fed token's and its draft's) and
        emit the records; a finish takes ``a`` out of the batch."""
        record = None
        try:
            for record in a.spec.verify(rows, lambda: a.request.cancelled):
                if record.finish_reason is not None:
                    self._finish(a, record)
                    return
                self.tokens += 1
                a.request._emit(record)
        except Exception as e:  # this request's own choice failed (its constraint, its sampler):
            self.active.remove(a)  # it leaves, the batch goes on
            a.run.end()
            a.request._fail(a.run.index, e)
            return
        a.token = record.id

    def _finish(self, a: _Active, record: TokenRecord) -> None:
        if record.finish_reason != "cancelled":
            self.tokens += 1
        self.drafted += a.run.metrics.drafted_tokens
        self.accepted += a.run.metrics.accepted_tokens
        self.active.remove(a)
        a.run.end()
        a.request._emit(record)

    def _drop_cancelled(self) -> None:
        for a in [a for a in self.active if a.request.cancelled]:
            self._finish(a, a.run.cancelled())

    def _emit_cancelled(self, request: Request) -> None:
        request._emit(TokenRecord(0, -1, "", finish_reason="cancelled"))


class BatchEngine:
    """A :class:`Batch` on its own thread: :meth:`submit` from any thread; requests join the
    running batch at the next step (continuous batching). The thread holds the model only while
    there is work, so the model stays usable (``generate``) between bursts; while someone else
    holds it, requests wait in the queue."""

    def __init__(self, model: Model, *, max_batch: int = 8, prefix_cache_mb: float | None = None,
                 speculate_greedy: str | None = None):
        """``prefix_cache_mb``: a prefix cache of its own of that size (0: none); None shares the
        model's (``model.prefix_cache``). ``speculate_greedy`` ("prompt-lookup" or None): the
        speculation of every greedy request submitted without one of its own."""
        if speculate_greedy not in (None, "prompt-lookup"):
            raise LoomConfigError(f"speculate_greedy must be None or 'prompt-lookup', got "
                                  f"{speculate_greedy!r}")
        self.speculate_greedy = speculate_greedy
        cache = None
        if prefix_cache_mb is not None:
            if isinstance(prefix_cache_mb, bool) or not isinstance(prefix_cache_mb, int | float) \
                    or not prefix_cache_mb >= 0:
                raise LoomConfigError(f"prefix_cache_mb must be a number >= 0, got {prefix_cache_mb!r}")
            cache = PrefixCache(int(prefix_cache_mb * (1 << 20)))
        self.model = model
        self._batch = Batch(model, max_batch, cache)
        self._inbox: deque[Request] = deque()
        self._calls: deque[tuple[Callable, Future]] = deque()
        self._cv = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name="loomlab-batch-engine", daemon=True)
        self._thread.start()

    def __enter__(self) -> BatchEngine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams | None = None, *,
               on_record: Callable[[TokenRecord], None] | None = None, speculative=None) -> Request:
        """Queue a generation of ``prompt_ids``; bad ids, a prompt that does not fit or a
        speculation that cannot serve ``params`` raise here (LoomConfigError / LoomShapeError),
        before anything is queued. ``speculative``: None or "prompt-lookup" (greedy requests)."""
        params = SamplingParams() if params is None else params
        if speculative is None and params.temperature == 0:
            speculative = self.speculate_greedy
        ids = self._batch.check(prompt_ids, params)
        request = Request(ids, params, on_record, self._batch.drafter(speculative, params))
        with self._cv:
            if self._closed:
                raise LoomConfigError("the batch engine is closed")
            self._inbox.append(request)
            self._cv.notify()
        return request

    def run(self, fn: Callable[[Model], object]) -> Future:
        """Run ``fn(model)`` on the engine's thread between two steps (embeddings, say)."""
        future: Future = Future()
        with self._cv:
            if self._closed:
                raise LoomConfigError("the batch engine is closed")
            self._calls.append((fn, future))
            self._cv.notify()
        return future

    def stats(self) -> dict:
        b, cache = self._batch, self._batch.prefix_cache
        with self._cv:
            queued = len(self._inbox) + len(b.waiting)
        return {"active": len(b.active), "queued": queued, "max_batch": b.max_batch, "steps": b.steps,
                "tokens": b.tokens, "drafted_tokens": b.drafted, "accepted_tokens": b.accepted,
                "prefix_cache_bytes": cache.nbytes, "prefix_cache_entries": len(cache),
                "prefix_hits": cache.hits, "prefix_hit_tokens": cache.hit_tokens}

    def close(self) -> None:
        """Cancel every request (each gets its "cancelled" record) and join the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
        self._thread.join()

    # ----- the engine thread -----------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while not (self._closed or self._inbox or self._calls or self._batch.busy):
                    self._cv.wait()
                if self._closed:
                    break
            try:
                with self.model.busy(nestable=True):
                    self._work()
            except LoomConfigError:  # the model is generating for someone else: wait our turn
                time.sleep(0.02)
        self._shutdown()

    def _work(self) -> None:
        """Step while there is work (the model held throughout: one thread setting per burst)."""
        while True:
            with self._cv:
                if self._closed:
                    return
                while self._inbox:
                    self._batch.add(self._inbox.popleft())
                calls = list(self._calls)
                self._calls.clear()
            for fn, future in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn(self.model))
                    except BaseException as e:  # the caller's to see, not the engine's end
                        future.set_exception(e)
            if not self._batch.busy:
                return
            try:
                self._batch.step()
            except Exception as e:  # never a dead engine: fail what was in the batch, go on
                self._batch.fail_all(e)

    def _shutdown(self) -> None:
        with self._cv:
            while self._inbox:
                self._batch.add(self._inbox.popleft())
            calls = list(self._calls)
            self._calls.clear()
        self._batch.cancel_all()
        for _, future in calls:
            future.cancel()
