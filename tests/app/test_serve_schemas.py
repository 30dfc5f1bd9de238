"""The request parsing of ``loomlab serve`` alone (no model, no HTTP): OpenAI's shapes in,
SamplingParams out, one ApiError naming the field otherwise."""

from __future__ import annotations

import pytest

from loomlab.app.serve.schemas import (
    DEFAULT_MAX_TOKENS,
    ApiError,
    decode_json,
    parse_chat,
    parse_completion,
    parse_embedding,
)

CHAT = [{"role": "user", "content": "hi"}]


def test_chat_fields_become_sampling_params():
    req = parse_chat({"messages": CHAT, "temperature": 0.5, "top_p": 0.9, "max_completion_tokens": 7,
                      "stop": "\n", "seed": 3, "logprobs": True, "top_logprobs": 0, "n": 2})
    p = req.gen.params
    assert (p.temperature, p.top_p, p.max_tokens, p.stop, p.seed) == (0.5, 0.9, 7, ("\n",), 3)
    # the chosen token's logprob needs one alternative from the engine; none are shown
    assert (p.logprobs, req.gen.top_logprobs, req.gen.n) == (1, 0, 2)
    assert [req.gen.params_for(i, 10, 100).seed for i in range(2)] == [3, 4]
    assert req.gen.params_for(1, 10, 100).max_tokens == 7  # given: kept, even near the context's end


def test_a_default_max_tokens_shrinks_to_the_context_left():
    gen = parse_chat({"messages": CHAT}).gen
    assert gen.params.temperature == 1.0  # OpenAI's default
    assert gen.params_for(0, 10, 100_000).max_tokens == DEFAULT_MAX_TOKENS
    assert gen.params_for(0, 90, 100).max_tokens == 10


def test_content_parts_are_joined_and_prompts_take_four_shapes():
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert parse_chat({"messages": [{"role": "user", "content": parts}]}).messages[0]["content"] == "ab"
    assert parse_completion({"prompt": "x"}).prompts == ["x"]
    assert parse_completion({"prompt": [1, 2]}).prompts == [[1, 2]]
    assert parse_completion({"prompt": ["x", [3]]}).prompts == ["x", [3]]
    assert parse_embedding({"input": "x"}).texts == ["x"]


@pytest.mark.parametrize("body, param", [
    ({"messages": CHAT, "top_logprobs": 3}, "top_logprobs"),  # without logprobs: true
    ({"messages": CHAT, "stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ({"messages": CHAT, "stream": True, "stream_options": {"include_usage": 1}},
     "stream_options.include_usage"),
    ({"messages": CHAT, "top_p": 0}, "top_p"),
    ({"messages": CHAT, "max_tokens": 0}, "max_tokens"),
    ({"messages": CHAT, "max_tokens": 2.5}, "max_tokens"),
    ({"messages": CHAT, "stop": ["a", ""]}, "stop"),
    ({"messages": CHAT, "n": 17}, "n"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content"),
    ({"messages": []}, "messages"),
])
def test_bad_fields_are_named(body, param):
    with pytest.raises(ApiError) as e:
        parse_chat(body)
    assert (e.value.status, e.value.param) == (400, param)


@pytest.mark.parametrize("raw", [b"NaN", b'{"t": Infinity}', b'{"t": -Infinity}', b"\xff", b"[" * 100_000])
def test_what_is_not_json_is_refused(raw):
    with pytest.raises(ApiError, match="JSON"):
        decode_json(raw)
