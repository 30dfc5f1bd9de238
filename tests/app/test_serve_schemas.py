"""The request parsing of ``loomlab serve`` alone (no model, no HTTP): OpenAI's shapes in,
SamplingParams out, one ApiError naming the field otherwise."""

from __future__ import annotations

import pytest

from loomlab.app.serve.schemas import (
    DEFAULT_MAX_TOKENS,
    MAX_EMBEDDING_INPUTS,
    MAX_PROMPTS,
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


@pytest.mark.parametrize("field, value", [
    ("temperature", 2.01), ("temperature", -1e-9), ("temperature", 10**400),
    ("top_p", 1.5), ("min_p", 1.5), ("presence_penalty", 2.5), ("presence_penalty", -3),
    ("frequency_penalty", -1e308), ("frequency_penalty", 1e308),
    ("repetition_penalty", 1e-320), ("repetition_penalty", 0), ("repetition_penalty", 1e9),
    ("seed", -(1 << 63) - 1), ("seed", 1 << 63), ("seed", 1.5),
])
def test_numbers_out_of_openais_ranges_are_named(field, value):
    """Ranges as OpenAI's (temperature 0..2, penalties -2..2, top_p 0..1, a 64-bit seed); an
    integer past float's range (10**400) is compared exactly, not converted (OverflowError)."""
    with pytest.raises(ApiError) as e:
        parse_chat({"messages": CHAT, field: value})
    assert (e.value.status, e.value.param) == (400, field)
    assert field in e.value.message


def test_edge_values_inside_the_ranges_are_taken():
    p = parse_chat({"messages": CHAT, "temperature": 1e-320, "frequency_penalty": -2, "presence_penalty": 2,
                    "top_p": 1, "seed": -1}).gen.params
    assert (p.temperature, p.frequency_penalty, p.presence_penalty, p.top_p) == (1e-320, -2, 2, 1)
    assert p.seed == (1 << 64) - 1  # OpenAI's signed seed, two's complement for the generator
    assert parse_chat({"messages": CHAT, "seed": (1 << 63) - 1}).gen.params.seed == (1 << 63) - 1


@pytest.mark.parametrize("role", ["wizard", "tool", "function", "", "System"])
def test_unknown_and_tool_roles_are_refused(role):
    with pytest.raises(ApiError) as e:
        parse_chat({"messages": [{"role": role, "content": "hi"}]})
    assert (e.value.status, e.value.param) == (400, "messages[0].role")
    assert "system, developer, user, assistant" in e.value.message


def test_developer_is_system_for_the_template():
    messages = parse_chat({"messages": [{"role": "developer", "content": "be brief"}] + CHAT}).messages
    assert [m["role"] for m in messages] == ["system", "user"]


TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("parse, body, param", [
    (parse_chat, {"messages": CHAT, "tools": TOOLS}, "tools"),
    (parse_chat, {"messages": CHAT, "tool_choice": "required"}, "tool_choice"),
    (parse_chat, {"messages": CHAT, "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tool_choice"),
    (parse_chat, {"messages": CHAT, "functions": [{"name": "f"}]}, "functions"),
    (parse_chat, {"messages": CHAT, "function_call": "auto"}, "function_call"),
    (parse_chat, {"messages": CHAT, "logit_bias": {"50256": -100}}, "logit_bias"),
    (parse_chat, {"messages": CHAT, "modalities": ["text", "audio"]}, "modalities"),
    (parse_chat, {"messages": CHAT, "audio": {"voice": "alloy"}}, "audio"),
    (parse_chat, {"messages": CHAT + [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]},
     "messages[1].tool_calls"),
    (parse_completion, {"prompt": "x", "suffix": "end"}, "suffix"),
    (parse_completion, {"prompt": "x", "best_of": 3}, "best_of"),
    (parse_completion, {"prompt": "x", "logit_bias": {"1": 5}}, "logit_bias"),
    (parse_embedding, {"input": "x", "dimensions": 64}, "dimensions"),
])
def test_fields_we_do_not_implement_are_refused_by_name(parse, body, param):
    """Until tool calls (and the rest) are implemented, using them is a 400 naming the field,
    not an answer that ignores it."""
    with pytest.raises(ApiError) as e:
        parse(body)
    assert (e.value.status, e.value.param) == (400, param)
    assert param.split(".")[-1] in e.value.message and "not supported" in e.value.message


def test_unused_values_of_those_fields_and_unknown_extras_pass():
    body = {"messages": CHAT, "tools": [], "tool_choice": "none", "logit_bias": {}, "modalities": ["text"],
            "user": "u1", "metadata": {"a": "b"}, "store": False, "parallel_tool_calls": False,
            "cache_prompt": True}  # the last: llama.cpp's extra, ignored
    assert parse_chat(body).messages == CHAT
    assert parse_completion({"prompt": "x", "best_of": 1, "suffix": ""}).prompts == ["x"]


def test_how_many_inputs_one_request_may_carry():
    assert len(parse_embedding({"input": ["a"] * MAX_EMBEDDING_INPUTS}).texts) == MAX_EMBEDDING_INPUTS
    with pytest.raises(ApiError, match=f"at most {MAX_EMBEDDING_INPUTS}") as e:
        parse_embedding({"input": ["a"] * (MAX_EMBEDDING_INPUTS + 1)})
    assert e.value.param == "input"
    with pytest.raises(ApiError, match=f"at most {MAX_PROMPTS}") as e:
        parse_completion({"prompt": ["a"] * (MAX_PROMPTS + 1)})
    assert e.value.param == "prompt"
