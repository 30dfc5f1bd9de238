"""The HTTP endpoints of ``loomlab serve`` (OpenAI's API, plus /health and /metrics).

Every handler is ``async`` and never blocks on the engine: generation goes through
:class:`~.generation.Submission` (records pushed onto the event loop), embeddings through
``engine.run`` awaited as a future, a few inputs at a time so generation steps in between.
So the server needs no worker threads of its own. Errors are OpenAI's JSON error object with a
4xx status; the core's typed errors are the client's (400), before generating or during it (a
constraint that cannot be followed: the reply's 400, or a stream's error event), and an
unexpected exception is logged and answered 500.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

import numpy as np
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from loomlab.core.errors import (
    EmbeddingModelError,
    EngineProcessError,
    LoomConfigError,
    LoomError,
    LoomShapeError,
)
from loomlab.core.llm.generate.batching import BatchEngine
from loomlab.core.llm.generate.constrain import Constraint
from loomlab.core.llm.generate.textmodel import TextModel
from loomlab.core.llm.text.chat_template import encode_chat

from . import replies
from .generation import Submission
from .metrics import CONTENT_TYPE, ServerMetrics
from .replies import Reply
from .schemas import ApiError, Generation, bad, decode_json, parse_chat, parse_completion, parse_embedding

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 4 << 20  # a prompt that fits any context is far smaller; more is a mistake or abuse
EMBED_CHUNK_TOKENS = 256  # tokens embedded between two decode steps, so generation goes on meanwhile
MAX_EMBEDDING_TOKENS = 1 << 16  # tokens of one embeddings request (a minute or so of forward passes)


@dataclass
class Context:
    """What the handlers share (one per server)."""

    model: TextModel
    engine: BatchEngine
    model_name: str
    metrics: ServerMetrics
    created: int
    closing: Callable[[], bool]

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.model_name:
            raise ApiError(404, f"the model {name!r} does not exist; this server has {self.model_name!r}",
                           param="model", code="model_not_found")


def make_app(ctx: Context) -> Starlette:
    routes = [
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/v1/models/{name:path}", get_model, methods=["GET"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings, methods=["POST"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    # async handlers only: Starlette runs a sync one in a worker thread
    app = Starlette(routes=routes, exception_handlers={ApiError: api_error, HTTPException: http_error,
                                                       LoomError: loom_error, Exception: internal_error})
    app.state.ctx = ctx
    return app


# ----- errors ---------------------------------------------------------------------------------------

def error_response(request: Request, error: ApiError, headers: dict | None = None) -> JSONResponse:
    request.state.log.error = error.message
    return JSONResponse(error.body(), error.status, headers=headers)


async def api_error(request: Request, exc: ApiError) -> JSONResponse:
    return error_response(request, exc, exc.headers)


async def loom_error(request: Request, exc: LoomError) -> JSONResponse:
    """A typed core error no handler turned into its field's 400 (the safety net)."""
    return error_response(request, typed_failure(exc))


async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
    """Starlette's own 404 (no such route) and 405 (wrong method), in OpenAI's shape."""
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(request, ApiError(exc.status_code, message, code=code), exc.headers)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unexpected error in %s %s", request.method, request.url.path)
    return error_response(request, ApiError(500, f"internal error: {type(exc).__name__}: {exc}",
                                            kind="server_error"))


def engine_error(e: LoomError, param: str) -> ApiError:
    """A core error raised for a request (bad ids, too long for the context...) as the client's."""
    if isinstance(e, LoomShapeError):
        return bad(str(e), "max_tokens", "context_length_exceeded")
    return bad(str(e), param)


def typed_failure(e: BaseException | None, why: str | None = None) -> ApiError:
    """Why a request failed, as its reply: a typed core error is the request's (400; the param
    is response_format when the message names it), a helper process of the engine failing is a
    503, anything else is the engine's fault (500)."""
    message = (str(e) if isinstance(e, LoomError) else why) or "the engine failed this request"
    if isinstance(e, EngineProcessError):
        return ApiError(503, message, kind="server_error", code="engine_unavailable")
    if isinstance(e, LoomError):
        return bad(message, "response_format" if "response_format" in message else None)
    return ApiError(500, message, kind="server_error")


# ----- small endpoints ------------------------------------------------------------------------------

async def health(request: Request) -> JSONResponse:
    ctx: Context = request.app.state.ctx
    if ctx.closing():
        return JSONResponse({"status": "stopping"}, 503)
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    return Response(request.app.state.ctx.metrics.exposition(), media_type=CONTENT_TYPE)


def _model_card(ctx: Context) -> dict:
    return {"id": ctx.model_name, "object": "model", "created": ctx.created, "owned_by": "loomlab",
            "meta": {"context_length": ctx.model.context_length, "vocab_size": ctx.model.vocab_size}}


async def list_models(request: Request) -> JSONResponse:
    return JSONResponse({"object": "list", "data": [_model_card(request.app.state.ctx)]})


async def get_model(request: Request) -> JSONResponse:
    ctx: Context = request.app.state.ctx
    ctx.check_model(request.path_params["name"])
    return JSONResponse(_model_card(ctx))


async def read_json(request: Request) -> dict:
    """The body as a JSON object, refused (413) past MAX_BODY_BYTES without reading it all."""
    declared = request.headers.get("content-length", "")
    too_large = ApiError(413, f"the body is larger than {MAX_BODY_BYTES} bytes", code="body_too_large")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise too_large
        chunks.append(chunk)
    return decode_json(b"".join(chunks))


async def on_engine(ctx: Context, fn: Callable[[TextModel], object], param: str):
    """``fn(model)`` run on the engine's thread between two steps, awaited; a typed error it
    raises is the request's (400 naming ``param``), but a helper process's failure (503)."""
    if ctx.closing():
        raise ApiError(503, "the server is stopping", kind="server_error", code="stopping")
    try:
        future = ctx.engine.run(fn)
    except LoomConfigError as e:  # the engine closed meanwhile
        raise ApiError(503, str(e), kind="server_error", code="stopping") from None
    try:
        return await asyncio.wrap_future(future)
    except EngineProcessError as e:
        raise typed_failure(e) from None
    except LoomError as e:
        raise bad(str(e), param) from None
    except asyncio.CancelledError:
        if not future.cancelled():
            raise  # this handler was cancelled, not the engine's call
        raise ApiError(503, "the server is stopping", kind="server_error", code="stopping") from None


async def check_constraint(ctx: Context, gen: Generation) -> None:
    """Compile the request's response_format for this model's vocabulary and compute its first
    mask, before generating: a schema or grammar that cannot start (a ``$ref`` to itself, say)
    is a 400 here rather than an error after the prompt was prefilled."""
    fmt = gen.params.response_format
    if fmt is None:
        return

    def first_mask(model: TextModel) -> None:
        constraint = Constraint.for_tokenizer(model.tokenizer, model.vocab_size, model.net.source, fmt)
        if constraint is not None:
            constraint.mask(np.zeros(model.vocab_size, np.float32))

    await on_engine(ctx, first_mask, "response_format")


async def _disconnected(request: Request) -> None:
    """Returns when the client goes away (the body has been read, so only that message is left)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


# ----- generation -----------------------------------------------------------------------------------

def refuse_embedding_model(ctx: Context) -> None:
    """An embedding model's answer to a chat or completion request: a 400 saying it only embeds."""
    try:
        ctx.model.check_generates()
    except EmbeddingModelError as e:
        raise bad(str(e), "model", "embedding_model") from None


def _submit(request: Request, prompts: list[list[int]], gen: Generation, param: str) -> Submission:
    ctx: Context = request.app.state.ctx
    if ctx.closing():
        raise ApiError(503, "the server is stopping", kind="server_error", code="stopping")
    jobs = [(ids, gen.params_for(i, len(ids), ctx.model.context_length))
            for ids in prompts for i in range(gen.n)]
    live = request.state.log
    live.stream, live.prompt_tokens = gen.stream, sum(map(len, prompts))
    try:
        return Submission(ctx.engine, jobs)
    except LoomError as e:
        raise engine_error(e, param) from None


def _finished(request: Request, sub: Submission) -> None:
    """Count a finished reply in the metrics and the log."""
    ctx: Context = request.app.state.ctx
    live = request.state.log
    choices = sub.choices
    live.completion_tokens = sum(c.metrics.generated_tokens for c in choices)
    # a choice with no finish record yet was cut short by the client leaving
    finishes = sorted({c.finish_reason or "cancelled" for c in choices})
    live.finish_reason = ",".join(finishes)
    live.tokens_per_s = replies.timings(choices)["predicted_per_second"]
    m = ctx.metrics
    m.prompt_tokens.inc(live.prompt_tokens)
    m.generated_tokens.inc(live.completion_tokens)
    if sub.first_token_s is not None:
        m.time_to_first_token.observe(sub.first_token_s)
    for c in choices:
        if c.metrics.generated_tokens > 1:
            m.tokens_per_second.observe(c.metrics.decode_tokens_per_s)


def _failure(sub: Submission) -> ApiError | None:
    """Why a whole (non-streamed) reply cannot be given: a choice failed (:func:`typed_failure`)
    or the engine stopped it."""
    failed = [r for r, c in zip(sub.requests, sub.choices, strict=True) if c.finish_reason == "error"]
    if failed:
        return typed_failure(failed[0].failure, failed[0].error)
    if any(c.finish_reason == "cancelled" for c in sub.choices):
        return ApiError(503, "the reply was cancelled (the server is stopping)", kind="server_error",
                        code="stopping")
    return None


def _error_event(sub: Submission, choice) -> str:
    """A choice's failure mid-stream, as the error event OpenAI's clients raise on."""
    request = sub.requests[choice.index]
    return _sse(typed_failure(request.failure, request.error).body())


def _sse(obj) -> str:
    return f"data: {json.dumps(obj)}\n\n"


class EventStream(StreamingResponse):
    """A server-sent-event reply that cancels its generation however it ends: finished, client
    gone (Starlette cancels the stream when the disconnect message arrives), or never started."""

    def __init__(self, events: AsyncIterator[str], sub: Submission):
        super().__init__(events, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.sub = sub

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.sub.cancel()


async def chat_completions(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    req = parse_chat(await read_json(request))
    ctx.check_model(req.model)
    request.state.log.model = ctx.model_name
    refuse_embedding_model(ctx)
    try:
        ids = encode_chat(ctx.model.tokenizer, ctx.model.template, req.messages)
    except LoomError as e:
        raise bad(str(e), "messages") from None
    gen = req.gen
    await check_constraint(ctx, gen)
    sub = _submit(request, [ids], gen, "messages")
    reply = Reply("chatcmpl", ctx.model_name, ctx.model.token_text, ctx.model.tokenizer.eos_ids)
    if gen.stream:
        return EventStream(_chat_events(request, sub, reply, gen, len(ids)), sub)
    choices = await sub.collect(_disconnected(request))
    _finished(request, sub)
    failure = _failure(sub)
    if failure is not None:
        raise failure
    return JSONResponse(replies.chat_object(reply, choices, len(ids), gen.top_logprobs))


async def _chat_events(request: Request, sub: Submission, reply: Reply, gen: Generation,
                       prompt_tokens: int) -> AsyncIterator[str]:
    try:
        for i in range(len(sub.choices)):
            yield _sse(replies.chat_chunk(reply, i, {"role": "assistant", "content": ""}))
        async for choice, record in sub.records():
            if record.text or (gen.top_logprobs is not None and reply.scored(record)):
                yield _sse(replies.chat_chunk(reply, choice.index, {"content": record.text},
                                              records=[record], top=gen.top_logprobs))
            if record.finish_reason is not None:
                if choice.finish_reason == "error":
                    yield _error_event(sub, choice)
                yield _sse(_finish_chunk(replies.chat_chunk(reply, choice.index, {},
                                                            finish_reason=choice.finish_reason), sub))
        if gen.include_usage:
            yield _sse(replies.usage_chunk(reply, "chat.completion.chunk", sub.choices, prompt_tokens))
        yield "data: [DONE]\n\n"
    finally:  # also when the client left mid-stream: the log and metrics count what was sent
        _finished(request, sub)


def _finish_chunk(chunk: dict, sub: Submission) -> dict:
    """A choice's last chunk; the stream's very last one carries the timings (as llama.cpp's)."""
    if sub.finished:
        chunk["timings"] = replies.timings(sub.choices)
    return chunk


async def completions(request: Request) -> Response:
    ctx: Context = request.app.state.ctx
    req = parse_completion(await read_json(request))
    ctx.check_model(req.model)
    request.state.log.model = ctx.model_name
    refuse_embedding_model(ctx)
    tok = ctx.model.tokenizer
    try:
        prompts = [tok.encode(p, add_special_tokens=True) if isinstance(p, str) else p for p in req.prompts]
    except LoomError as e:
        raise bad(str(e), "prompt") from None
    gen = req.gen
    await check_constraint(ctx, gen)
    sub = _submit(request, prompts, gen, "prompt")
    reply = Reply("cmpl", ctx.model_name, ctx.model.token_text, tok.eos_ids)
    # echo: each choice's text starts with its prompt (as text)
    prefixes = [(p if isinstance(p, str) else tok.decode(p)) if req.echo else ""
                for p in req.prompts for _ in range(gen.n)]
    prompt_tokens = sum(map(len, prompts))
    if gen.stream:
        return EventStream(_completion_events(request, sub, reply, gen, prompt_tokens, prefixes), sub)
    choices = await sub.collect(_disconnected(request))
    _finished(request, sub)
    failure = _failure(sub)
    if failure is not None:
        raise failure
    return JSONResponse(replies.completion_object(reply, choices, prompt_tokens, gen.top_logprobs, prefixes))


async def _completion_events(request: Request, sub: Submission, reply: Reply, gen: Generation,
                             prompt_tokens: int, prefixes: list[str]) -> AsyncIterator[str]:
    try:
        for i, prefix in enumerate(prefixes):
            if prefix:
                yield _sse(replies.completion_chunk(reply, i, prefix))
        async for choice, record in sub.records():
            if record.text or (gen.top_logprobs is not None and reply.scored(record)):
                yield _sse(replies.completion_chunk(reply, choice.index, record.text, records=[record],
                                                    top=gen.top_logprobs))
            if record.finish_reason is not None:
                if choice.finish_reason == "error":
                    yield _error_event(sub, choice)
                yield _sse(_finish_chunk(replies.completion_chunk(reply, choice.index, "",
                                                                  finish_reason=choice.finish_reason), sub))
        if gen.include_usage:
            yield _sse(replies.usage_chunk(reply, "text_completion", sub.choices, prompt_tokens))
        yield "data: [DONE]\n\n"
    finally:
        _finished(request, sub)


# ----- embeddings -----------------------------------------------------------------------------------

async def embeddings(request: Request) -> JSONResponse:
    ctx: Context = request.app.state.ctx
    req = parse_embedding(await read_json(request))
    ctx.check_model(req.model)
    live = request.state.log
    live.model = ctx.model_name
    try:
        counts = [len(ctx.model.tokenizer.encode(t, add_special_tokens=True)) for t in req.texts]
    except LoomError as e:
        raise bad(str(e), "input") from None
    live.prompt_tokens = sum(counts)
    too_long = [i for i, n in enumerate(counts) if n > ctx.model.context_length]
    if too_long:
        raise bad(f"input {too_long[0]} has {counts[too_long[0]]} tokens, more than the context length "
                  f"{ctx.model.context_length}", "input", "context_length_exceeded")
    if live.prompt_tokens > MAX_EMBEDDING_TOKENS:
        raise bad(f"input has {live.prompt_tokens} tokens in all; at most {MAX_EMBEDDING_TOKENS} per request "
                  f"(split it)", "input")
    t0 = time.perf_counter()
    vectors = []
    for lo, hi in chunks(counts, EMBED_CHUNK_TOKENS):  # the batch steps between two chunks
        texts = req.texts[lo:hi]
        vectors.extend(await on_engine(ctx, lambda model, texts=texts: model.embed(texts), "input"))
    seconds = time.perf_counter() - t0
    ctx.metrics.prompt_tokens.inc(live.prompt_tokens)
    return JSONResponse({
        "object": "list", "model": ctx.model_name,
        "data": [{"object": "embedding", "index": i, "embedding": _vector(v, req.encoding_format)}
                 for i, v in enumerate(vectors)],
        "usage": {"prompt_tokens": live.prompt_tokens, "total_tokens": live.prompt_tokens},
        "timings": {"prompt_n": live.prompt_tokens, "prompt_ms": seconds * 1000,
                    "prompt_per_second": live.prompt_tokens / seconds if seconds else 0.0,
                    "predicted_n": 0, "predicted_ms": 0.0, "predicted_per_second": 0.0, "cached_tokens": 0}})


def chunks(counts: list[int], budget: int) -> list[tuple[int, int]]:
    """``[lo, hi)`` runs of consecutive inputs of at most ``budget`` tokens (at least one input)."""
    runs, lo, total = [], 0, 0
    for i, n in enumerate(counts):
        if i > lo and total + n > budget:
            runs.append((lo, i))
            lo, total = i, 0
        total += n
    runs.append((lo, len(counts)))
    return runs


def _vector(v: np.ndarray, encoding: str):
    if encoding == "base64":  # little-endian float32, as OpenAI sends it
        return base64.b64encode(np.asarray(v, "<f4").tobytes()).decode("ascii")
    return [float(x) for x in v]
