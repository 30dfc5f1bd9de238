"""What wraps every HTTP request: the API key check, the request log and the request counter
(:class:`Guard`), and the time a body may take to arrive (:class:`BodyDeadline`).

A plain ASGI middleware (not Starlette's BaseHTTPMiddleware, which would run streaming replies
through an extra task group). Each request gets a :class:`LiveLog` in ``request.state.log`` that
the route fills in (model, tokens, finish); the middleware reports it through ``on_log`` once
when the request starts (status 0) and once when it ends, with the same id.
"""

from __future__ import annotations

import asyncio
import hmac
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .metrics import ServerMetrics
from .schemas import ApiError

log = logging.getLogger(__name__)
PUBLIC_PATHS = frozenset({"/health"})  # answered without the API key (load balancers probe it)
# counted under their own label; any other path (a 404) counts as "other", so random paths cannot
# grow the metrics without bound
ENDPOINTS = frozenset({"/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                       "/health", "/metrics"})


@dataclass(frozen=True)
class RequestLog:
    """One request as the log shows it; ``status`` is 0 while it runs."""

    id: int
    time: float  # when it arrived, epoch seconds
    method: str
    path: str
    status: int
    model: str
    stream: bool
    prompt_tokens: int
    completion_tokens: int
    duration_s: float
    tokens_per_s: float
    finish_reason: str | None
    error: str | None


@dataclass
class LiveLog:
    """What a route learns about its request, for the log."""

    model: str = ""
    stream: bool = False
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tokens_per_s: float = 0.0
    finish_reason: str | None = None
    error: str | None = None


class Guard:
    """Checks ``Authorization: Bearer KEY`` (when a key is set), logs and counts each request."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, metrics: ServerMetrics,
                 on_log: Callable[[RequestLog], None] | None):
        self.app, self.api_key, self.metrics, self.on_log = app, api_key, metrics, on_log
        self._ids = itertools.count(1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        live = LiveLog()
        scope.setdefault("state", {})["log"] = live
        rid, arrived, t0 = next(self._ids), time.time(), time.perf_counter()
        method, path = scope["method"], scope["path"]
        status = 0

        def entry(status: int, duration: float) -> RequestLog:
            return RequestLog(rid, arrived, method, path, status, live.model, live.stream, live.prompt_tokens,
                              live.completion_tokens, duration, live.tokens_per_s, live.finish_reason,
                              live.error)

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self._report(entry(0, 0.0))
        try:
            if self.api_key is not None and path not in PUBLIC_PATHS and not self._authorized(scope):
                error = ApiError(401, "missing or wrong API key (send Authorization: Bearer KEY)",
                                 code="invalid_api_key")
                live.error = error.message
                await JSONResponse(error.body(), 401)(scope, receive, send_status)
            else:
                await self.app(scope, receive, send_status)
        finally:
            endpoint = path if path in ENDPOINTS else "other"
            # a client gone before any reply: 499, nginx's "client closed request"
            self.metrics.requests.labels(endpoint, str(status or 499)).inc()
            self._report(entry(status or 499, time.perf_counter() - t0))

    def _authorized(self, scope: Scope) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key.encode())

    def _report(self, entry: RequestLog) -> None:
        if self.on_log is None:
            return
        try:
            self.on_log(entry)
        except Exception:  # a broken log view must not break the request
            log.exception("on_log failed")


class BodyDeadline:
    """Bounds the time a request's body may take to arrive, however it trickles: past
    ``seconds`` from the request's start, reading it raises a 408 :class:`ApiError` (the routes
    answer it, and the connection closes). Messages after the body (the wait for a disconnect)
    are not timed."""

    def __init__(self, app: ASGIApp, seconds: float):
        self.app, self.seconds = app, seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        deadline = asyncio.get_running_loop().time() + self.seconds
        body_done = False

        async def timed_receive() -> Message:
            nonlocal body_done
            if body_done:
                return await receive()
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                raise ApiError(408, f"the request body did not arrive within {self.seconds:g} s",
                               code="body_timeout", headers={"connection": "close"}) from None
            body_done = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        await self.app(scope, timed_receive, send)
