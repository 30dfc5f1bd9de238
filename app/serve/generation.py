"""The bridge from the asyncio server to the engine thread: one :class:`Submission` is the n
engine requests of one HTTP request, whose records arrive, in order per choice, on one
asyncio queue (the engine's ``on_record`` must not block: it only schedules a ``put`` on the
event loop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from functools import partial

from loomlab.core.llm.generate.batching import BatchEngine
from loomlab.core.llm.generate.decoding import TokenRecord
from loomlab.core.llm.generate.sampling import SamplingParams

from .replies import Choice


class Submission:
    """Submits every ``(prompt_ids, params)`` job at once (a bad one raises before any is left
    queued); iterate it for ``(choice index, record)`` until every choice has finished."""

    def __init__(self, engine: BatchEngine, jobs: Sequence[tuple[list[int], SamplingParams]]):
        self.loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue[tuple[int, TokenRecord]] = asyncio.Queue()
        self.started = time.perf_counter()
        self.first_token_s: float | None = None  # from arrival to the first record, queueing included
        self.requests = []
        try:
            for i, (ids, params) in enumerate(jobs):
                self.requests.append(engine.submit(ids, params, on_record=partial(self._deliver, i)))
        except BaseException:
            self.cancel()
            raise
        self.choices = [Choice(i, r.metrics) for i, r in enumerate(self.requests)]
        self._open = len(self.requests)

    def _deliver(self, index: int, record: TokenRecord) -> None:  # on the engine thread
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, (index, record))
        except RuntimeError:  # the event loop has closed: nobody is listening any more
            pass

    async def records(self) -> AsyncIterator[tuple[Choice, TokenRecord]]:
        """Each record with its choice (already added to it), as they come."""
        while self._open:
            index, record = await self.queue.get()
            if self.first_token_s is None:
                self.first_token_s = time.perf_counter() - self.started
            choice = self.choices[index]
            choice.add(record)
            if record.finish_reason is not None:
                self._open -= 1
            yield choice, record

    async def collect(self, disconnected) -> list[Choice]:
        """Wait for every choice to finish; cancel them all if ``disconnected`` (an awaitable that
        returns when the client goes away) returns first."""
        watch = asyncio.ensure_future(disconnected)
        watch.add_done_callback(lambda _: self.cancel())
        try:
            async for _ in self.records():
                pass
        finally:  # also when this handler itself is cancelled
            watch.cancel()
            self.cancel()
        return self.choices

    @property
    def finished(self) -> bool:
        return self._open == 0

    def cancel(self) -> None:
        """Free every slot (a finished request ignores it)."""
        for request in self.requests:
            request.cancel()
