"""Request bodies of the OpenAI API, parsed and checked before any work starts.

Each ``parse_*`` takes the decoded JSON body and returns a small dataclass whose sampling fields
are already a :class:`SamplingParams`; anything wrong raises one :class:`ApiError` naming the
field (OpenAI's ``param``), which the routes turn into a 400. Ranges are OpenAI's. An OpenAI field
this server does not implement (tools, logit_bias...) is refused when it asks for something, never
silently ignored; fields this server does not know are ignored, as OpenAI-compatible servers do, so
clients that send extras (llama.cpp's, vLLM's) keep working.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, replace

from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.generate.sampling import SamplingParams

MAX_N = 16  # choices per request: each is a sequence of its own in the engine
MAX_PROMPTS = 16  # prompts of one text completion request (each times n is a sequence)
MAX_EMBEDDING_INPUTS = 256  # inputs of one embeddings request (OpenAI allows 2048: ours are slower)
MAX_STOPS = 16
MAX_CHAT_TOP_LOGPROBS = 20  # OpenAI's limits
MAX_COMPLETION_LOGPROBS = 5
DEFAULT_MAX_TOKENS = 512  # when a request names none (each sequence's KV cache is sized by it)
SEED_RANGE = (-(1 << 63), (1 << 63) - 1)  # OpenAI's: a 64-bit integer
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}

# OpenAI fields this server does not implement, with the test of a value that asks for nothing (a
# request that asks for one of them gets a 400 naming it, not an answer that ignores it)
UNSUPPORTED_CHAT = {
    "tools": lambda v: v in (None, []),
    "tool_choice": lambda v: v in (None, "none"),
    "functions": lambda v: v in (None, []),
    "function_call": lambda v: v in (None, "none"),
    "logit_bias": lambda v: v in (None, {}),
    "audio": lambda v: v is None,
    "modalities": lambda v: v in (None, ["text"]),
    "prediction": lambda v: v is None,
    "web_search_options": lambda v: v is None,
}
UNSUPPORTED_COMPLETION = {
    "logit_bias": lambda v: v in (None, {}),
    "suffix": lambda v: v in (None, ""),
    "best_of": lambda v: v in (None, 1),
}
UNSUPPORTED_EMBEDDING = {"dimensions": lambda v: v is None}


class ApiError(Exception):
    """A request the server refuses: the HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.kind = status, message, param, code, kind
        self.headers = headers  # of the reply (a 408 closes its connection)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code=code)


def decode_json(raw: bytes) -> dict:
    """The body as a JSON object. NaN and Infinity are not JSON (Python's json accepts them)."""
    def no_constant(name: str):
        raise ValueError(f"{name} is not valid JSON")

    try:
        body = json.loads(raw, parse_constant=no_constant)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise bad(f"the body is not valid JSON: {e}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad(f"the body must be a JSON object, got {type(body).__name__}", code="invalid_json")
    return body


@dataclass(frozen=True)
class Generation:
    """What chat and text completions share: how to sample, how many choices, how to stream."""

    params: SamplingParams
    max_tokens_given: bool  # False: max_tokens is the default, shortened to fit the context
    n: int
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # None: no logprobs; else alternatives per token (0: the chosen only)

    def params_for(self, choice: int, prompt_tokens: int, context_length: int) -> SamplingParams:
        """The engine's params of choice ``choice``: seeds ``seed + choice`` so choices differ yet
        repeat; a default max_tokens shrinks to the context left after the prompt."""
        changes = {}
        if self.params.seed is not None:
            changes["seed"] = self.params.seed + choice
        if not self.max_tokens_given:
            changes["max_tokens"] = max(1, min(self.params.max_tokens, context_length - prompt_tokens))
        return replace(self.params, **changes) if changes else self.params


@dataclass(frozen=True)
class ChatRequest:
    model: str | None
    messages: list[dict]
    gen: Generation


@dataclass(frozen=True)
class CompletionRequest:
    model: str | None
    prompts: list[str | list[int]]
    gen: Generation
    echo: bool


@dataclass(frozen=True)
class EmbeddingRequest:
    model: str | None
    texts: list[str]
    encoding_format: str  # "float" or "base64" (the openai client asks for base64 by default)


def parse_chat(body: Mapping) -> ChatRequest:
    _refuse_unsupported(body, UNSUPPORTED_CHAT)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    logprobs = _typed(body, "logprobs", bool, False)
    top = _int(body, "top_logprobs", None, 0, MAX_CHAT_TOP_LOGPROBS)
    if top is not None and not logprobs:
        raise bad("top_logprobs needs logprobs: true", "top_logprobs")
    return ChatRequest(_model(body), [_message(m, i) for i, m in enumerate(messages)],
                       _generation(body, (top or 0) if logprobs else None))


def parse_completion(body: Mapping) -> CompletionRequest:
    _refuse_unsupported(body, UNSUPPORTED_COMPLETION)
    logprobs = _int(body, "logprobs", None, 0, MAX_COMPLETION_LOGPROBS)
    return CompletionRequest(_model(body), _prompts(body.get("prompt")), _generation(body, logprobs),
                             _typed(body, "echo", bool, False))


def parse_embedding(body: Mapping) -> EmbeddingRequest:
    _refuse_unsupported(body, UNSUPPORTED_EMBEDDING)
    texts = body.get("input")
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise bad("input must be a non-empty string or a list of non-empty strings", "input")
    if len(texts) > MAX_EMBEDDING_INPUTS:
        raise bad(f"input has {len(texts)} texts; at most {MAX_EMBEDDING_INPUTS} per request", "input")
    fmt = _typed(body, "encoding_format", str, "float")
    if fmt not in ("float", "base64"):
        raise bad(f"encoding_format must be 'float' or 'base64', got {fmt!r}", "encoding_format")
    return EmbeddingRequest(_model(body), texts, fmt)


# ----- fields ---------------------------------------------------------------------------------------

def _generation(body: Mapping, top_logprobs: int | None) -> Generation:
    max_tokens = _int(body, "max_completion_tokens", None, 1, None)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", None, 1, None)
    options = _typed(body, "stream_options", dict, None)
    stream = _typed(body, "stream", bool, False)
    if options is not None and not stream:
        raise bad("stream_options is only allowed with stream: true", "stream_options")
    include_usage = _typed(options or {}, "include_usage", bool, False, "stream_options.include_usage")
    fields = {
        "temperature": _number(body, "temperature", 1.0, 0, 2),
        "top_p": _number(body, "top_p", 1.0, 0, 1),  # 0 is refused by SamplingParams (it keeps nothing)
        "presence_penalty": _number(body, "presence_penalty", 0.0, -2, 2),
        "frequency_penalty": _number(body, "frequency_penalty", 0.0, -2, 2),
        # llama.cpp's extensions, which many clients send
        "top_k": _int(body, "top_k", 0, 0, None),
        "min_p": _number(body, "min_p", 0.0, 0, 1),
        "repetition_penalty": _number(body, "repetition_penalty", 1.0, 0.01, 100),
        "max_tokens": DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
        "stop": _stops(body.get("stop")),
        "seed": _seed(body),
        # the chosen token's logprob comes with any k >= 1; fewer alternatives are cut later
        "logprobs": 0 if top_logprobs is None else max(top_logprobs, 1),
        "response_format": _response_format(body.get("response_format")),
    }
    try:
        params = SamplingParams(**fields)
    except LoomConfigError as e:
        raise bad(str(e), _param_named(str(e), fields)) from None
    return Generation(params, max_tokens is not None, _int(body, "n", 1, 1, MAX_N),
                      stream, include_usage, top_logprobs)


def _model(body: Mapping) -> str | None:
    return _typed(body, "model", str, None)


def _seed(body: Mapping) -> int | None:
    """OpenAI's 64-bit seed as the engine's generator takes it (non-negative): two's complement."""
    seed = _int(body, "seed", None, *SEED_RANGE)
    return None if seed is None else seed % (1 << 64)


def _refuse_unsupported(body: Mapping, fields: Mapping) -> None:
    for name, unused in fields.items():
        if not unused(body.get(name)):
            raise bad(f"{name} is not supported by this server (see docs/serving.md for the fields "
                      f"it honours); leave it out", name, "unsupported_parameter")


def _message(m, i: int) -> dict:
    """One chat message; a content given as OpenAI's list of text parts is joined. ``developer``
    is OpenAI's newer name for ``system``; tool and function messages need tool calls, which this
    server does not implement."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        raise bad(f"messages[{i}] must be an object with a string role", f"messages[{i}]")
    if m["role"] not in ROLES:
        raise bad(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {json.dumps(m['role'])[:40]}",
                  f"messages[{i}].role")
    for name in ("tool_calls", "function_call"):
        if m.get(name) not in (None, []):
            raise bad(f"messages[{i}].{name}: tool calls are not supported by this server",
                      f"messages[{i}].{name}", "unsupported_parameter")
    content = m.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise bad(f"messages[{i}].content parts must be {{'type': 'text', 'text': str}} (text only)",
                      f"messages[{i}].content")
        content = "".join(p["text"] for p in content)
    elif content is None and m["role"] == "assistant":
        content = ""
    if not isinstance(content, str):
        raise bad(f"messages[{i}].content must be a string or a list of text parts", f"messages[{i}].content")
    return {"role": ROLES[m["role"]], "content": content}


def _prompts(prompt) -> list[str | list[int]]:
    """OpenAI's four prompt shapes: a string, token ids, or a list of either."""
    def is_ids(p) -> bool:
        return isinstance(p, list) and bool(p) and all(isinstance(t, int) and not isinstance(t, bool)
                                                       for t in p)

    if isinstance(prompt, str) and prompt:
        return [prompt]
    if is_ids(prompt):
        return [prompt]
    if isinstance(prompt, list) and prompt and all((isinstance(p, str) and p) or is_ids(p) for p in prompt):
        if len(prompt) > MAX_PROMPTS:
            raise bad(f"prompt has {len(prompt)} prompts; at most {MAX_PROMPTS} per request", "prompt")
        return list(prompt)
    raise bad("prompt must be a non-empty string, a list of token ids, or a list of those", "prompt")


def _stops(stop) -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops) \
            or len(stops) > MAX_STOPS:
        raise bad(f"stop must be a non-empty string or a list of at most {MAX_STOPS} of them", "stop")
    return tuple(stops)


def _response_format(fmt):
    """OpenAI's response_format; {"type": "text"} means none. The shape and schema are checked by
    SamplingParams (constrain.grammar_of)."""
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad("response_format must be an object with a 'type'", "response_format")
    return None if fmt.get("type") == "text" else fmt


def _typed(body: Mapping, name: str, kind: type, default, param: str | None = None):
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, kind):
        param = param or name
        raise bad(f"{param} must be a {_KIND_NAMES[kind]}, got {json.dumps(value)[:40]}", param)
    return value


def _number(body: Mapping, name: str, default: float, low: float, high: float) -> float:
    """A number in ``low..high`` (both included)."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise bad(f"{name} must be a number, got {json.dumps(value)[:40]}", name)
    if not low <= value <= high:  # compared as given: an integer past float's range stays exact
        raise bad(f"{name} must be between {low} and {high}, got {json.dumps(value)[:40]}", name)
    return float(value)


def _int(body: Mapping, name: str, default, low: int | None, high: int | None):
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"{name} must be an integer, got {json.dumps(value)[:40]}", name)
    if (low is not None and value < low) or (high is not None and value > high):
        span = f">= {low}" if high is None else f"between {low} and {high}"
        raise bad(f"{name} must be {span}, got {value}", name)
    return value


def _param_named(message: str, fields: Mapping) -> str | None:
    """The request field a SamplingParams error names (its messages start with the field)."""
    return next((name for name in fields if message.startswith(name)), None)


_KIND_NAMES = {bool: "boolean", str: "string", dict: "object", list: "list"}
