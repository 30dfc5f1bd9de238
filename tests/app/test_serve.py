"""``loomlab serve``: the Server on a free port, driven by the official openai client and httpx.

Oracles: the model's own ``generate`` / ``chat`` / ``embed`` (greedy output through the batch
engine is the same as alone), the ``loomlab generate`` CLI, jsonschema, Prometheus' own parser.
"""

from __future__ import annotations

import errno
import itertools
import json
import logging
import select
import socket
import threading
import time

import httpx
import jsonschema
import numpy as np
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from loomlab.app.cli import main
from loomlab.app.serve import RequestLog, ServeError, Server, routes
from loomlab.app.serve.connections import ConnectionLimits, ResourceWarnings
from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.generate.constrain import Constraint
from loomlab.core.llm.text.chat_template import encode_chat

TIMEOUT = 300  # seconds: the shared 2-core machine can be slow, a hang still fails
CHAT = [{"role": "user", "content": "What is the capital of France?"}]
PROMPTS = ["Once upon a time", "The capital of Germany is", "def fibonacci(n):", "Water boils at",
           "My favourite colour is", "In 1969, the first", "The quick brown fox", "import numpy as"]
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "population"],
          "properties": {"city": {"type": "string", "maxLength": 30},
                         "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}}


@pytest.fixture(scope="module")
def served(smollm2):
    logs: list[RequestLog] = []
    server = Server(smollm2, port=0, on_log=logs.append)
    url = server.start()
    yield server, url, logs
    server.stop()


@pytest.fixture()
def client(served):
    return openai.OpenAI(base_url=served[1], api_key="unused", timeout=TIMEOUT, max_retries=0)


@pytest.fixture()
def http(served):
    with httpx.Client(base_url=served[1], timeout=TIMEOUT) as c:
        yield c


def alone(fn, *args, **kwargs) -> str:
    """``fn``'s text, run on the model directly. The engine holds the model for a moment after a
    reply has gone out, so a refusal ("busy") is retried."""
    for _ in range(200):
        try:
            return "".join(r.text for r in fn(*args, **kwargs))
        except LoomConfigError as e:
            if "busy" not in str(e):
                raise
            time.sleep(0.05)
    raise AssertionError("the model stayed busy")


def outside_v1(http, path: str) -> httpx.Response:
    return httpx.get(str(http.base_url).replace("/v1/", path), timeout=TIMEOUT)


def scrape(http) -> dict:
    """/metrics parsed by Prometheus' own parser: {(name, labels): value}."""
    text = outside_v1(http, "/metrics").text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


# ----- text -----------------------------------------------------------------------------------------

def test_chat_stream_and_whole_equal_model_chat(smollm2, client):
    expected = alone(smollm2.chat, CHAT, max_tokens=12)
    whole = client.chat.completions.create(model="smollm2-135m", messages=CHAT, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model="smollm2-135m", messages=CHAT, max_tokens=12,
                                                 temperature=0, stream=True))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert whole.choices[0].message.content == streamed == expected and expected
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]
    assert whole.usage.prompt_tokens == len(encode_chat(smollm2.tokenizer, smollm2.template, CHAT))
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    timings = whole.model_extra["timings"]
    assert timings["prompt_ms"] > 0 and timings["predicted_per_second"] > 0
    assert timings["cached_tokens"] + timings["prompt_n"] == whole.usage.prompt_tokens


def test_completion_equals_generate_and_the_cli(smollm2, client, capsys):
    prompt = "The history of computing"
    expected = alone(smollm2.generate, prompt, max_tokens=10)
    assert main(["generate", "smollm2-135m", "--prompt", prompt, "--max-tokens", "10", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["text"]
    whole = client.completions.create(model="smollm2-135m", prompt=prompt, max_tokens=10, temperature=0)
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="smollm2-135m", prompt=prompt, max_tokens=10, temperature=0, stream=True) if c.choices)
    assert whole.choices[0].text == streamed == expected == cli
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 10


def test_stop_string(smollm2, client):
    expected = alone(smollm2.generate, "Count: one, two, three,", max_tokens=20, stop=(" five",))
    reply = client.completions.create(model="smollm2-135m", prompt="Count: one, two, three,", max_tokens=20,
                                      temperature=0, stop=" five")
    assert reply.choices[0].text == expected and " five" not in expected
    assert reply.choices[0].finish_reason == "stop"


def test_eight_concurrent_clients_get_their_alone_texts(smollm2, served):
    expected = [alone(smollm2.generate, p, max_tokens=8) for p in PROMPTS]
    got: dict[int, str] = {}

    def ask(i: int) -> None:
        c = openai.OpenAI(base_url=served[1], api_key="unused", timeout=TIMEOUT, max_retries=0)
        got[i] = c.completions.create(model="smollm2-135m", prompt=PROMPTS[i], max_tokens=8,
                                      temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert [got.get(i) for i in range(len(PROMPTS))] == expected


def test_n_choices_are_seeded_seed_plus_i(client):
    many = client.completions.create(model="smollm2-135m", prompt="Once upon a time", max_tokens=8,
                                     temperature=1.0, seed=40, n=2)
    singles = [client.completions.create(model="smollm2-135m", prompt="Once upon a time", max_tokens=8,
                                         temperature=1.0, seed=40 + i).choices[0].text for i in range(2)]
    assert [c.text for c in sorted(many.choices, key=lambda c: c.index)] == singles
    assert many.usage.completion_tokens == 16


def test_cancelled_stream_frees_its_slot(served, http):
    server, _, logs = served
    stream = openai.OpenAI(base_url=served[1], api_key="unused", timeout=TIMEOUT, max_retries=0) \
        .chat.completions.create(model="smollm2-135m", messages=CHAT, max_tokens=400, temperature=0,
                                 stream=True)
    assert len(list(itertools.islice(stream, 3))) == 3  # the role chunk and two tokens
    assert scrape(http)[("loomlab_active_sequences", ())] == 1
    stream.close()
    t0 = time.perf_counter()
    while scrape(http)[("loomlab_active_sequences", ())] != 0:
        assert time.perf_counter() - t0 < 10, "the slot of a closed stream was not freed"
        time.sleep(0.02)
    last = [e for e in logs if e.path == "/v1/chat/completions" and e.status != 0][-1]
    assert last.finish_reason == "cancelled" and 2 <= last.completion_tokens < 400


def test_a_client_that_gives_up_on_a_whole_reply_frees_its_slot(served, http):
    with pytest.raises(httpx.ReadTimeout):
        # sampled (seed 1 writes all 1000 tokens; greedy ends at 82, in 0.7 s here): seconds on any CPU
        httpx.post(f"{served[1]}/completions", json={"prompt": "Once", "max_tokens": 1000, "temperature": 1.0,
                                                     "seed": 1}, timeout=0.5)
    t0 = time.perf_counter()
    while scrape(http)[("loomlab_active_sequences", ())] != 0:
        assert time.perf_counter() - t0 < 10, "the slot of a gone client was not freed"
        time.sleep(0.02)
    while not (ends := [e for e in served[2] if e.path == "/v1/completions" and e.status != 0]) \
            or ends[-1].finish_reason != "cancelled":
        assert time.perf_counter() - t0 < 10, f"no log of the cancelled request: {ends[-1:]}"
        time.sleep(0.02)
    assert ends[-1].completion_tokens < 1000


# ----- structure: logprobs, schema, usage -----------------------------------------------------------

def test_top_logprobs(client):
    reply = client.chat.completions.create(model="smollm2-135m", messages=CHAT, max_tokens=4, temperature=0,
                                           logprobs=True, top_logprobs=20)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens == 4
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 20 and all(lp <= 0 for lp in tops) and entry.logprob <= 0
        assert tops == sorted(tops, reverse=True)
        # greedy: the chosen token is the most likely one
        assert (entry.token, entry.logprob) == (entry.top_logprobs[0].token, tops[0])
        assert sum(np.exp(tops)) <= 1 + 1e-6
    assert "".join(e.token for e in content) == reply.choices[0].message.content


def test_completion_logprobs_legacy_shape(client):
    reply = client.completions.create(model="smollm2-135m", prompt="The sky is", max_tokens=3,
                                      temperature=0, logprobs=5)
    lp = reply.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 3
    assert all(len(alts) == 5 and max(alts.values()) == chosen <= 0
               for alts, chosen in zip(lp.top_logprobs, lp.token_logprobs, strict=True))
    assert lp.text_offset[0] == 0 and "".join(lp.tokens) == reply.choices[0].text


def test_json_schema_output_validates(client):
    reply = client.chat.completions.create(
        model="smollm2-135m", max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "Give the largest city in France as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}})
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)


def test_include_usage_final_chunk(smollm2, client):
    chunks = list(client.chat.completions.create(model="smollm2-135m", messages=CHAT, max_tokens=5,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.choices == [] and all(c.usage is None for c in chunks[:-1])
    prompt = len(encode_chat(smollm2.tokenizer, smollm2.template, CHAT))
    generated = sum(1 for c in chunks if c.choices and c.choices[0].delta.content)
    usage = last.usage
    assert (usage.prompt_tokens, usage.total_tokens) == (prompt, prompt + usage.completion_tokens)
    assert generated <= usage.completion_tokens <= 5
    assert last.model_extra["timings"]["predicted_n"] == usage.completion_tokens


def test_embeddings_equal_model_embed(smollm2, client, http):
    texts = ["a cat sat on the mat", "quantum chromodynamics"]
    expected = smollm2.embed(texts)
    got = client.embeddings.create(model="smollm2-135m", input=texts)  # the client asks for base64
    np.testing.assert_array_equal(np.array([d.embedding for d in got.data], np.float32), expected)
    plain = http.post("/embeddings", json={"input": texts[0], "encoding_format": "float"}).json()
    np.testing.assert_array_equal(np.array(plain["data"][0]["embedding"], np.float32), expected[0])
    assert plain["usage"]["prompt_tokens"] == len(smollm2.tokenizer.encode(texts[0], add_special_tokens=True))


# ----- errors ---------------------------------------------------------------------------------------

CHAT_OK = {"model": "smollm2-135m", "messages": CHAT, "max_tokens": 2}
ERRORS = [
    ("POST", "/chat/completions", b"{", 400, None),
    ("POST", "/chat/completions", b'{"messages": [{"role": "user", "content": "x"}], "temperature": NaN}',
     400, None),
    ("POST", "/chat/completions", b"[1, 2]", 400, None),
    ("POST", "/chat/completions", {"messages": "hello"}, 400, "messages"),
    ("POST", "/chat/completions", {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content"),
    ("POST", "/chat/completions", {**CHAT_OK, "temperature": "hot"}, 400, "temperature"),
    ("POST", "/chat/completions", {**CHAT_OK, "temperature": -1}, 400, "temperature"),
    ("POST", "/chat/completions", {**CHAT_OK, "max_tokens": -5}, 400, "max_tokens"),
    ("POST", "/chat/completions", {**CHAT_OK, "max_tokens": 10**12}, 400, "max_tokens"),
    ("POST", "/chat/completions", {**CHAT_OK, "max_tokens": 8190}, 400, "max_tokens"),  # + prompt > context
    ("POST", "/chat/completions", {**CHAT_OK, "max_tokens": True}, 400, "max_tokens"),
    ("POST", "/chat/completions", {**CHAT_OK, "stop": 5}, 400, "stop"),
    ("POST", "/chat/completions", {**CHAT_OK, "n": 0}, 400, "n"),
    ("POST", "/chat/completions", {**CHAT_OK, "seed": "x"}, 400, "seed"),
    ("POST", "/chat/completions", {**CHAT_OK, "stream": "yes"}, 400, "stream"),
    ("POST", "/chat/completions", {**CHAT_OK, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs"),
    ("POST", "/chat/completions", {**CHAT_OK, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "no-such-type"}}}}, 400, "response_format"),
    ("POST", "/chat/completions", {**CHAT_OK, "response_format": "json"}, 400, "response_format"),
    ("POST", "/completions", {"prompt": [10**7]}, 400, "prompt"),
    ("POST", "/completions", {"prompt": 5}, 400, "prompt"),
    ("POST", "/completions", {"prompt": "x", "logprobs": 6}, 400, "logprobs"),
    ("POST", "/embeddings", {"input": 5}, 400, "input"),
    ("POST", "/embeddings", {"input": ["a"] * 257}, 400, "input"),
    # OpenAI's ranges, roles, and fields this server does not implement
    ("POST", "/chat/completions", {**CHAT_OK, "frequency_penalty": -1e308}, 400, "frequency_penalty"),
    ("POST", "/chat/completions", {**CHAT_OK, "seed": 1 << 64}, 400, "seed"),
    ("POST", "/chat/completions", {**CHAT_OK, "messages": [{"role": "wizard", "content": "hi"}]}, 400,
     "messages[0].role"),
    ("POST", "/chat/completions", {**CHAT_OK, "tools": [{"type": "function", "function": {"name": "f"}}],
                                   "tool_choice": "auto"}, 400, "tools"),
    ("POST", "/completions", {"prompt": "x", "logit_bias": {"1": 100}}, 400, "logit_bias"),
    # a schema that compiles but cannot start: refused before any prefill
    ("POST", "/chat/completions", {**CHAT_OK, "response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"$ref": "#"}}}}, 400, "response_format"),
    ("POST", "/chat/completions", {**CHAT_OK, "model": "gpt-4"}, 404, "model"),
    ("POST", "/nope", {}, 404, None),
    ("GET", "/chat/completions", None, 405, None),
    ("DELETE", "/models", None, 405, None),
    ("POST", "/chat/completions", b"x" * (5 << 20), 413, None),
]


@pytest.mark.parametrize("method, path, body, status, param", ERRORS,
                         ids=[f"{i}-{e[3]}-{e[4]}" for i, e in enumerate(ERRORS)])
def test_bad_requests_get_an_openai_error_and_the_server_lives(http, method, path, body, status, param):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body} if body is not None else {}
    reply = http.request(method, path, **kwargs)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"] and error["param"] == param
    assert outside_v1(http, "/health").json() == {"status": "ok"}


def test_api_key_and_a_taken_port(smollm2, served):
    port = int(served[1].rsplit(":", 1)[1].split("/")[0])
    with pytest.raises(ServeError, match="cannot listen"):
        Server(smollm2, port=port).start()
    with Server(smollm2, port=0, api_key="sekrit") as server:
        base = server.url
        assert httpx.get(f"{base}/models", timeout=TIMEOUT).status_code == 401
        wrong = httpx.get(f"{base}/models", headers={"Authorization": "Bearer nope"}, timeout=TIMEOUT)
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
        ok = openai.OpenAI(base_url=base, api_key="sekrit", max_retries=0).models.list()
        assert [m.id for m in ok.data] == ["smollm2-135m"]
        assert httpx.get(base.replace("/v1", "/health"), timeout=TIMEOUT).status_code == 200
    assert not server.running
    server.stop()  # idempotent
    server.start()  # and it starts again, on a fresh port and engine
    health = httpx.get(server.url.replace("/v1", "/health"), timeout=TIMEOUT)
    assert server.running and health.status_code == 200
    server.stop()


# ----- observability --------------------------------------------------------------------------------

def test_metrics_parse_and_grow(http, served):
    before = scrape(http)
    key = ("loomlab_requests_total", (("endpoint", "/v1/completions"), ("status", "200")))
    http.post("/completions", json={"prompt": "Hello", "max_tokens": 3, "temperature": 0}).raise_for_status()
    after = scrape(http)
    assert after[key] == before.get(key, 0) + 1
    assert after[("loomlab_generated_tokens_total", ())] == before[("loomlab_generated_tokens_total", ())] + 3
    assert after[("loomlab_prompt_tokens_total", ())] > before[("loomlab_prompt_tokens_total", ())]
    ttft = ("loomlab_time_to_first_token_seconds_count", ())
    assert after[ttft] == before[ttft] + 1


def test_request_log_reports_start_and_end(smollm2, http, served):
    logs = served[2]
    http.post("/completions", json={"prompt": "Hello", "max_tokens": 2, "temperature": 0}).raise_for_status()
    # the end is reported once the app has returned, which can be just after the client has the
    # whole reply: wait for it (at most a few seconds)
    deadline = time.monotonic() + 10
    while not logs[-1].status and time.monotonic() < deadline:
        time.sleep(0.01)
    end = logs[-1]
    start = next(e for e in logs if e.id == end.id)
    assert (start.status, end.status) == (0, 200) and start.path == end.path == "/v1/completions"
    prompt = len(smollm2.tokenizer.encode("Hello", add_special_tokens=True))
    assert (end.prompt_tokens, end.completion_tokens, end.finish_reason) == (prompt, 2, "length")
    assert end.duration_s > 0 and end.model == "smollm2-135m"


def test_an_engine_failure_is_a_server_error_and_the_server_goes_on(smollm2, client, http, monkeypatch):
    step = smollm2.net.step

    def broken_decode(ids, caches, **kw):  # prefills (several ids) work, decode steps (one id) raise
        if ids.shape[1] == 1:
            raise RuntimeError("kernel exploded")
        return step(ids, caches, **kw)

    monkeypatch.setattr(smollm2.net, "step", broken_decode)
    body = {"model": "smollm2-135m", "max_tokens": 3}
    whole = http.post("/completions", json={**body, "prompt": "A failing whole reply"})
    assert whole.status_code == 500 and "kernel exploded" in whole.json()["error"]["message"]
    with pytest.raises(openai.APIError, match="kernel exploded"):
        list(client.completions.create(**body, prompt="A failing stream", stream=True))
    monkeypatch.undo()
    again = client.completions.create(**body, prompt="A failing stream", temperature=0)
    assert again.choices[0].text == alone(smollm2.generate, "A failing stream", max_tokens=3)


def test_a_speculating_server_gives_the_plain_greedy_text(smollm2):
    """--speculative prompt-lookup: greedy requests verify drafts, the text is generate()'s."""
    prompt = ("The river Loom rises in the northern hills. The river Loom runs to the sea. "
              "In one sentence: the river Loom")
    want = alone(smollm2.generate, prompt, max_tokens=24)
    with Server(smollm2, port=0, speculative="prompt-lookup") as server:
        client = openai.OpenAI(base_url=server.url, api_key="unused", timeout=TIMEOUT, max_retries=0)
        reply = client.completions.create(model=server.model_name, prompt=prompt, max_tokens=24,
                                          temperature=0)
        stats = server.stats()
    assert reply.choices[0].text == want
    assert stats["accepted_tokens"] > 0  # it did speculate, and drafts were kept
    with pytest.raises(LoomConfigError, match="speculative"):
        Server(smollm2, port=0, speculative="draft")


def test_a_tiny_temperature_is_greedy_and_a_negative_seed_is_taken(smollm2, client):
    """temperature 1e-320 and seed -1 are inside OpenAI's ranges: an answer, the greedy one."""
    greedy = alone(smollm2.chat, CHAT, max_tokens=4)
    reply = client.chat.completions.create(model="smollm2-135m", messages=CHAT, max_tokens=4,
                                           temperature=1e-320, seed=-1)
    assert reply.choices[0].message.content == greedy


def test_a_constraint_that_fails_mid_reply_is_the_clients_error(client, http, monkeypatch):
    """A constraint llguidance accepts up front and gives up on mid-reply (as it does on the regex
    (a{100}){100}{100}, slowly: simulated here) is the request's fault: a 400 for a whole reply,
    an invalid_request_error event for a stream, never a 500."""
    def give_up(self, token):
        raise LoomConfigError(f"response_format rejected token {token}: lexer error: too many expressions")

    monkeypatch.setattr(Constraint, "consume", give_up)
    body = {"model": "smollm2-135m", "max_tokens": 4, "messages": CHAT,
            "response_format": {"type": "regex", "pattern": "[ab]{1,6}"}}
    whole = http.post("/chat/completions", json=body)
    assert whole.status_code == 400, whole.text
    error = whole.json()["error"]
    assert (error["type"], error["param"]) == ("invalid_request_error", "response_format")
    assert error["message"].startswith("response_format rejected token")
    with pytest.raises(openai.APIError) as e:
        list(client.chat.completions.create(**body, stream=True))
    assert (e.value.type, e.value.param) == ("invalid_request_error", "response_format")


def test_embeddings_are_bounded_in_tokens_per_request(smollm2, http, monkeypatch):
    texts = ["one two three four", "five six seven eight"]
    total = sum(len(smollm2.tokenizer.encode(t, add_special_tokens=True)) for t in texts)
    monkeypatch.setattr(routes, "MAX_EMBEDDING_TOKENS", total - 1)
    reply = http.post("/embeddings", json={"input": texts})
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "input"
    assert f"input has {total} tokens in all; at most {total - 1}" in reply.json()["error"]["message"]
    monkeypatch.setattr(routes, "MAX_EMBEDDING_TOKENS", total)
    assert http.post("/embeddings", json={"input": texts}).status_code == 200


def test_a_chat_is_served_while_a_long_embeddings_request_runs(smollm2, served, http, monkeypatch):
    """Embeddings go to the engine a chunk at a time (here one input), so a chat arriving
    meanwhile gets its decode steps between two chunks instead of waiting for all of them."""
    monkeypatch.setattr(routes, "EMBED_CHUNK_TOKENS", 1)
    texts = [f"word {i}" for i in range(10)]
    want = smollm2.embed(texts[-1:])
    embed, calls, finished = smollm2.embed, [], {}
    monkeypatch.setattr(smollm2, "embed", lambda batch: calls.append(len(batch)) or embed(batch))

    def embeddings() -> None:
        reply = httpx.post(f"{served[1]}/embeddings", json={"input": texts, "encoding_format": "float"},
                           timeout=TIMEOUT)
        finished["embeddings"] = time.perf_counter()
        finished["vectors"] = [d["embedding"] for d in reply.json()["data"]]

    worker = threading.Thread(target=embeddings)
    worker.start()
    try:
        deadline = time.monotonic() + 30
        while not calls:  # the engine is embedding
            assert time.monotonic() < deadline, "the embeddings request never reached the engine"
            time.sleep(0.005)
        chat = http.post("/chat/completions", json={"messages": CHAT, "max_tokens": 2, "temperature": 0})
        chat_done = time.perf_counter()
    finally:
        worker.join(TIMEOUT)
    assert chat.status_code == 200 and chat.json()["usage"]["completion_tokens"] == 2
    assert chat_done < finished["embeddings"]
    assert calls == [1] * len(texts)
    np.testing.assert_array_equal(np.array(finished["vectors"][-1:], np.float32), want)


# ----- connections ----------------------------------------------------------------------------------

def _connect(url: str) -> socket.socket:
    host, port = url.split("//")[1].split("/")[0].rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=5)


def _until_closed(sock: socket.socket) -> bytes:
    """What the server sent before closing ``sock`` (a socket.timeout if it does not close it)."""
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    sock.close()
    return data


def _trickle(sock: socket.socket, data: bytes, every: float) -> int:
    """Send ``data`` a byte every ``every`` seconds until the server closes; how many were sent."""
    for sent, byte in enumerate(data):
        if select.select([sock], [], [], every)[0]:  # the server's close (EOF) is readable
            return sent
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            return sent
    return len(data)


def test_slow_heads_and_bodies_are_cut_and_connections_are_bounded(smollm2):
    """A head that never ends, or trickles, is closed after head_timeout_s; a body that does not
    arrive gets a 408 after body_timeout_s; /health answers meanwhile; past max_connections a
    connection gets a 503 at once. (uvicorn alone kept every one of them open for ever.)"""
    limits = ConnectionLimits(max_connections=4, head_timeout_s=0.4, body_timeout_s=0.4)
    head = b"GET /health HTTP/1.1\r\nHost: x\r\nAccept: */*\r\n"
    with Server(smollm2, port=0, limits=limits) as server:
        health = server.url.replace("/v1", "/health")
        partial, body, trickling = (_connect(server.url) for _ in range(3))
        partial.sendall(head)
        body.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"input\":")
        assert httpx.get(health, timeout=TIMEOUT).status_code == 200
        assert _trickle(trickling, head, 0.05) < len(head)  # cut mid-head, though data kept coming
        trickling.close()
        assert _until_closed(partial) == b""
        late = _until_closed(body)
        assert late.startswith(b"HTTP/1.1 408") and b"body_timeout" in late
        held = [_connect(server.url) for _ in range(limits.max_connections)]
        refused = _until_closed(_connect(server.url))
        assert refused.startswith(b"HTTP/1.1 503") and b"too many connections" in refused
        assert [_until_closed(s) for s in held] == [b""] * limits.max_connections  # idle: cut too
        assert httpx.get(health, timeout=TIMEOUT).status_code == 200


@pytest.mark.parametrize("kwargs, name", [
    ({"max_connections": 0}, "max_connections"), ({"max_connections": True}, "max_connections"),
    ({"max_connections": 4, "head_timeout_s": 0}, "head_timeout_s"),
    ({"max_connections": 4, "body_timeout_s": float("inf")}, "body_timeout_s"),
    ({"max_connections": 4, "keep_alive_s": "5"}, "keep_alive_s"),
])
def test_bad_connection_limits_are_named(kwargs, name):
    with pytest.raises(LoomConfigError, match=name):
        ConnectionLimits(**kwargs)


def test_running_out_of_descriptors_is_one_line_not_a_traceback_per_accept(caplog):
    """asyncio reports each failed accept (EMFILE) through the loop's exception handler: ours
    summarises them in one warning per interval and passes anything else on."""
    passed = []

    class Loop:
        def default_exception_handler(self, context):
            passed.append(context)

    handler, loop = ResourceWarnings(), Loop()
    with caplog.at_level(logging.WARNING, logger="loomlab.app.serve.connections"):
        for _ in range(5000):
            handler(loop, {"message": "socket.accept() out of system resource",
                           "exception": OSError(errno.EMFILE, "Too many open files")})
    assert len(caplog.records) == 1 and "Too many open files" in caplog.records[0].getMessage()
    assert passed == []
    other = {"message": "something else", "exception": RuntimeError("x")}
    handler(loop, other)
    assert passed == [other]


def test_the_cli_checks_max_connections_before_loading(capsys):
    assert main(["serve", "smollm2-135m", "--port", "0", "--max-connections", "0"]) == 2
    assert "--max-connections must be >= 1, got 0" in capsys.readouterr().err


def test_a_constrained_reply_cut_by_max_tokens_says_length(client):
    """An integer without a maximum can go on for ever: the reply says it was cut."""
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    reply = client.chat.completions.create(
        model="smollm2-135m", max_tokens=3, temperature=0, messages=CHAT,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(1, 40), min_size=1, max_size=30), budget=st.integers(1, 60))
def test_embedding_chunks_cover_the_inputs_in_order_within_the_budget(counts, budget):
    """Consecutive runs covering every input once; each within the budget unless it is one input
    over it alone; none could take the next input (as few engine calls as the budget allows)."""
    runs = routes.chunks(counts, budget)
    assert [lo for lo, _ in runs] == [0] + [hi for _, hi in runs[:-1]] and runs[-1][1] == len(counts)
    for lo, hi in runs:
        assert hi > lo and (sum(counts[lo:hi]) <= budget or hi - lo == 1)
        assert hi == len(counts) or sum(counts[lo:hi + 1]) > budget
