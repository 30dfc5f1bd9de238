"""The server's routes in process, fed request bodies built field by field from valid and invalid
values of every field of chat completions, completions and embeddings.

Oracle: a client's mistake is never a 5xx. Every answer is 200 or a 4xx in OpenAI's error shape,
and a stream never carries a server error event. Replies are kept tiny (1-2 tokens), so each
example costs a prefill of a short, mostly cached prompt.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from loomlab.app.serve.metrics import ServerMetrics
from loomlab.app.serve.middleware import BodyDeadline, Guard
from loomlab.app.serve.routes import Context, make_app
from loomlab.core.llm.generate.batching import BatchEngine

FUZZ = settings(max_examples=30, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
NAME = "fuzzed"
OK_STATUSES = {200, 400, 404}

# any JSON value, small: what a confused client might put in any field
scalars = (st.none() | st.booleans() | st.integers(-10**30, 10**30)
           | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8))
junk = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


@dataclass(frozen=True)
class Field:
    valid: st.SearchStrategy
    bad: st.SearchStrategy
    required: bool = False


def field(valid, *invalid) -> Field:
    """A field's valid values, and its bad ones: known-bad values and any JSON."""
    return Field(valid, st.sampled_from(invalid) | junk if invalid else junk)


def tiny(*invalid) -> Field:
    """A reply length: always given (the default is long), 1 or 2 tokens, or a known-bad value
    (not any JSON: a large integer is valid, and slow)."""
    return Field(st.integers(1, 2), st.sampled_from(invalid), required=True)


def number(low, high, *bad):
    return field(st.floats(low, high), low - 1e-9, high + 1, -1e308, 1e308, 1e-320, 10**400, "1", True,
                 *bad)


SAMPLING = {
    "model": field(st.just(NAME), "gpt-4", ""),
    "temperature": number(0, 2),
    "top_p": number(0, 1),
    "presence_penalty": number(-2, 2),
    "frequency_penalty": number(-2, 2),
    "min_p": number(0, 1),
    "repetition_penalty": number(0.01, 100, 0),
    "top_k": field(st.integers(0, 50), -1, 10**30, 2.5),
    "max_tokens": tiny(0, -1, 10**12, 8190, 2.5, True, "2", [1]),
    "seed": field(st.integers(-(1 << 63), (1 << 63) - 1), (1 << 63), -(1 << 63) - 1, 1.5, "7"),
    "n": field(st.integers(1, 2), 0, 17, -1),
    "stop": field(st.sampled_from(["\n", ["a", "b"], []]), "", [""], 5, ["x"] * 17),
    "stream": field(st.booleans(), "yes", 1),
    "stream_options": field(st.just({"include_usage": True}), {"include_usage": "yes"}, []),
    "response_format": field(
        st.sampled_from([{"type": "text"}, {"type": "json_object"},
                         {"type": "regex", "pattern": "[ab]{1,3}"},
                         {"type": "json_schema", "json_schema": {"schema": {"type": "integer"}}}]),
        {"type": "json_schema", "json_schema": {"schema": {"$ref": "#"}}},
        {"type": "json_schema", "json_schema": {"schema": {"type": "no-such-type"}}},
        {"type": "regex", "pattern": "("},
        {"type": "grammar", "grammar": "start: ("}, {"type": "xml"}, "json", {"type": "regex"}),
    "logit_bias": field(st.just({}), {"1": 5}, {"x": "y"}),
    "user": field(st.text(max_size=5)),
}
CHAT = {
    **SAMPLING,
    "messages": field(
        st.lists(st.fixed_dictionaries({"role": st.sampled_from(["system", "developer", "user", "assistant"]),
                                        "content": st.text(max_size=12)}), min_size=1, max_size=3),
        [], [{"role": "wizard", "content": "hi"}], [{"role": "tool", "content": "x"}],
        [{"role": "user", "content": [{"type": "image_url"}]}], [{"role": "user"}], "hello",
        [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]),
    "logprobs": field(st.booleans(), "yes"),
    "top_logprobs": field(st.integers(0, 20), 21, -1),
    "max_completion_tokens": field(st.integers(1, 2), 0, 10**12, "1", -1),
    "tools": field(st.just([]), [{"type": "function", "function": {"name": "f"}}], {}),
    "tool_choice": field(st.just("none"), "auto", "required", {"type": "function"}),
    "functions": field(st.just([]), [{"name": "f"}]),
    "function_call": field(st.just("none"), "auto"),
    "modalities": field(st.just(["text"]), ["text", "audio"]),
    "audio": field(st.none(), {"voice": "alloy"}),
    "prediction": field(st.none(), {"type": "content", "content": "x"}),
    "web_search_options": field(st.none(), {}),
    "parallel_tool_calls": field(st.booleans()),
    "metadata": field(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2)),
}
COMPLETION = {
    **SAMPLING,
    "prompt": field(st.text(min_size=1, max_size=12)
                    | st.lists(st.integers(0, 49151), min_size=1, max_size=4),
                    "", [], [-1], [10**7], [[]], ["x"] * 17, 5),
    "logprobs": field(st.integers(0, 5), 6, -1, True),
    "echo": field(st.booleans(), "yes"),
    "suffix": field(st.just(""), "end"),
    "best_of": field(st.just(1), 3, 0),
}
EMBEDDING = {
    "model": SAMPLING["model"],
    "input": field(st.text(min_size=1, max_size=12) | st.lists(st.text(min_size=1, max_size=8), min_size=1,
                                                               max_size=2),
                   "", [], [""], [1, 2], ["a"] * 257),
    "encoding_format": field(st.sampled_from(["float", "base64"]), "hex", 5),
    "dimensions": field(st.none(), 64),
    "user": SAMPLING["user"],
}


@st.composite
def bodies(draw, fields: dict[str, Field]) -> dict:
    """A body of valid values (each optional field present or not), then none, one or two
    fields given a bad value."""
    body = {name: draw(f.valid) for name, f in fields.items() if f.required or draw(st.booleans())}
    for name in draw(st.lists(st.sampled_from(sorted(fields)), max_size=2, unique=True)):
        body[name] = draw(fields[name].bad)
    return body


@pytest.fixture(scope="module")
def app_client(smollm2):
    engine = BatchEngine(smollm2, max_batch=4)
    metrics = ServerMetrics(engine.stats)
    ctx = Context(smollm2, engine, NAME, metrics, int(time.time()), lambda: False)
    app = Guard(BodyDeadline(make_app(ctx), 30.0), api_key=None, metrics=metrics, on_log=None)
    try:
        with TestClient(app, raise_server_exceptions=False) as client:
            yield client
    finally:
        engine.close()


def check(reply) -> None:
    """200 or a 4xx with OpenAI's error object; a stream has no server error event."""
    assert reply.status_code in OK_STATUSES, reply.text[:500]
    if reply.status_code != 200:
        error = reply.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"], error
        return
    if reply.headers["content-type"].startswith("text/event-stream"):
        events = [line[6:] for line in reply.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]", reply.text[-500:]
        for event in events[:-1]:
            error = json.loads(event).get("error")
            assert error is None or error["type"] == "invalid_request_error", error


def with_issue_cases(test):
    """The reproducers of the 5xx found by hand, each as an explicit example of ``test`` (but the
    regex (a{100}){100}{100}: seconds of llguidance's time; test_serve simulates its failure)."""
    base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [{"temperature": 1e-320}, {"frequency_penalty": -1e308}, {"seed": -1},
             {"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#"}}}},
             {"messages": [{"role": "wizard", "content": "hi"}]}]
    for case in cases:
        test = example(body={**base, **case})(test)
    return test


@FUZZ
@with_issue_cases
@given(body=bodies(CHAT))
def test_chat_completions_never_answer_a_client_error_with_5xx(app_client, body):
    check(app_client.post("/v1/chat/completions", json=body))


@FUZZ
@given(body=bodies(COMPLETION))
def test_completions_never_answer_a_client_error_with_5xx(app_client, body):
    check(app_client.post("/v1/completions", json=body))


@FUZZ
@given(body=bodies(EMBEDDING))
def test_embeddings_never_answer_a_client_error_with_5xx(app_client, body):
    check(app_client.post("/v1/embeddings", json=body))
