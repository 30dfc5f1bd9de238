"""Constrained generation on SmolLM2: whatever the model would say, the output parses and
validates (oracles: json.loads + jsonschema, re.fullmatch, a hand-written grammar check)."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import numpy as np
import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.generate.constrain import Constraint
from loomlab.core.llm.generate.sampling import SamplingParams

PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "student"],
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 120},
                         "student": {"type": "boolean"}}}
COLOUR = {"type": "object", "required": ["colour"], "additionalProperties": False,
          "properties": {"colour": {"enum": ["red", "green", "blue"]}}}
TAGS = {"type": "array", "minItems": 2, "maxItems": 4,
        "items": {"type": "string", "pattern": "^[a-z]{1,8}$"}}
SCHEMAS = [PERSON, COLOUR, TAGS]
DATE = r"(19|20)[0-9]{2}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
# sums of small numbers, e.g. "3 + 14 = 17" (the sum need not be right: the grammar is syntax)
SUM = 'start: NUM (" + " NUM)+ " = " NUM\nNUM: /[1-9][0-9]?/'
SAMPLED = dict(temperature=1.0, top_p=0.95)


def _run(model, prompt, response_format, max_tokens=96, **sampling):
    records = list(model.chat([{"role": "user", "content": prompt}], response_format=response_format,
                              max_tokens=max_tokens, **sampling))
    assert records[-1].finish_reason == "stop", "".join(r.text for r in records)
    return "".join(r.text for r in records)


@pytest.mark.parametrize("schema", SCHEMAS, ids=["object", "enum", "array"])
@pytest.mark.parametrize("sampling", [{}, *({"seed": s, **SAMPLED} for s in (1, 2))],
                         ids=["greedy", "seed1", "seed2"])
def test_json_schema_output_validates(smollm2, schema, sampling):
    fmt = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    out = _run(smollm2, "Describe a student as JSON.", fmt, **sampling)
    jsonschema.validate(json.loads(out), schema)


def test_bare_schema_and_json_object(smollm2):
    jsonschema.validate(json.loads(_run(smollm2, "A colour?", {"type": "json_schema",
                                                               "json_schema": COLOUR})), COLOUR)
    # any object: unbounded, so a prompt asks for a small one (a loop would end at max_tokens)
    prompt = 'Return a JSON object with one key, "answer", set to 42.'
    assert isinstance(json.loads(_run(smollm2, prompt, {"type": "json_object"})), dict)


@pytest.mark.parametrize("sampling", [{}, {"seed": 3, **SAMPLED}], ids=["greedy", "sampled"])
def test_regex_output_fullmatches(smollm2, sampling):
    out = _run(smollm2, "When did the Berlin wall fall?", {"type": "regex", "pattern": DATE}, **sampling)
    assert re.fullmatch(DATE, out)


@pytest.mark.parametrize("sampling", [{}, {"seed": 4, **SAMPLED}], ids=["greedy", "sampled"])
def test_lark_grammar_output_parses(smollm2, sampling):
    out = _run(smollm2, "Write an addition.", {"type": "grammar", "grammar": SUM}, **sampling)
    left, right = out.split(" = ")
    assert all(re.fullmatch(r"[1-9][0-9]?", n) for n in [*left.split(" + "), right])
    assert " + " in left


def test_logprobs_come_from_the_masked_distribution(smollm2):
    records = list(smollm2.generate("The year:", response_format={"type": "regex", "pattern": "[0-9]{4}"},
                                    max_tokens=8, logprobs=3))
    for r in records[:-1]:  # the digits; then EOS
        assert r.text.isdigit() and r.logprob <= 0
        # forbidden tokens are no alternatives: every one listed is allowed, finite, and the
        # allowed tokens' probabilities sum to at most 1
        assert r.top and all(text.isdigit() and np.isfinite(lp) and lp <= 0 for _, text, lp in r.top)
        assert sum(np.exp(lp) for _, _, lp in r.top) <= 1 + 1e-6


def test_text_format_is_unconstrained(smollm2):
    plain = list(smollm2.generate("Hello", max_tokens=6))
    assert list(smollm2.generate("Hello", max_tokens=6, response_format={"type": "text"})) == plain


@pytest.mark.parametrize("fmt, words", [
    ({"type": "json_schema", "json_schema": {"type": "wat"}}, "json_schema"),
    ({"type": "json_schema", "json_schema": "not a schema"}, "json_schema"),
    ({"type": "regex", "pattern": "(("}, "regex"),
    ({"type": "regex"}, "pattern"),
    ({"type": "grammar", "grammar": "start: undefined_rule"}, "grammar"),
    ({"type": "yaml"}, "type"),
    ("json", "mapping"),
    ({"type": "json_object", "extra": {1, 2}}, "JSON"),
])
def test_bad_formats_raise_before_any_work(smollm2, fmt, words):
    with pytest.raises(LoomConfigError, match=words):
        SamplingParams(response_format=fmt)
    before = smollm2.metrics()
    with pytest.raises(LoomConfigError):
        smollm2.generate("Hi", response_format=fmt)  # raises on the call, not on iteration
    assert smollm2.metrics() is before


def _first_token(model, pattern: str) -> tuple[Constraint, int]:
    """A regex constraint on ``model`` after its first mask, and the first token that mask allows."""
    fmt = {"type": "regex", "pattern": pattern}
    c = Constraint.for_tokenizer(model.tokenizer, model.vocab_size, model.net.source, fmt)
    return c, int(np.argmax(c.mask(np.zeros(model.vocab_size, np.float32))))


@pytest.mark.parametrize("pattern", ["(a{100}){100}{100}", "(a{100}){500}"])
def test_a_regex_past_the_lexer_fuel_is_refused_at_its_first_token(smollm2, pattern):
    """Both need more lexer fuel than LEXER_FUEL. With llguidance's default (1,000,000) the first
    spent ~4 s on its first mask before its token was refused, and the second (50,000
    characters) was followed; now both are refused at the first token, with the typed error the
    server answers with a 400."""
    c, token = _first_token(smollm2, pattern)
    with pytest.raises(LoomConfigError, match="response_format rejected token"):
        c.consume(token)
    with pytest.raises(LoomConfigError, match="response_format rejected token"):
        list(smollm2.generate("a", response_format={"type": "regex", "pattern": pattern}, max_tokens=4))


def test_a_long_regex_within_the_lexer_fuel_is_followed(smollm2):
    c, token = _first_token(smollm2, "(a{100}){100}")  # 10,000 characters
    for _ in range(3):
        c.consume(token)
        token = int(np.argmax(c.mask(np.zeros(smollm2.vocab_size, np.float32))))


def test_mask_cost_per_token(smollm2):
    """Reported, not asserted: the time a constraint adds per decode step over 64 tokens."""
    prompt = "Once upon a time, in a list of facts about cats,"
    # minItems keeps the array open past 64 tokens, so both runs decode the same number of steps
    fmt = {"type": "json_schema", "json_schema": {"type": "array", "minItems": 40,
                                                  "items": {"type": "string"}}}

    def per_step(**kw) -> float:
        records = list(smollm2.generate(prompt, max_tokens=64, **kw))
        assert len(records) == 64
        m = smollm2.metrics()
        return m.decode_s / (m.generated_tokens - 1)

    list(smollm2.generate(prompt, max_tokens=2, response_format=fmt))  # builds the tokenizer adapter
    base, constrained = per_step(), per_step(response_format=fmt)
    c = Constraint.for_tokenizer(smollm2.tokenizer, smollm2.vocab_size, smollm2.net.source, fmt)
    logits = np.zeros(smollm2.vocab_size, np.float32)
    start = time.perf_counter()
    for _ in range(64):
        c.mask(logits)
    mask_only = (time.perf_counter() - start) / 64
    print(f"\nper decode step over 64 tokens: unconstrained {base * 1e3:.2f} ms, constrained "
          f"{constrained * 1e3:.2f} ms (+{(constrained - base) * 1e3:.2f} ms); mask alone "
          f"{mask_only * 1e3:.3f} ms")


def test_a_reply_cut_by_max_tokens_finishes_length_and_one_just_complete_stops(smollm2):
    def reply(max_tokens):
        return list(smollm2.chat([{"role": "user", "content": "Pick a colour as JSON."}], temperature=0,
                                 response_format={"type": "json_schema", "json_schema": COLOUR},
                                 max_tokens=max_tokens))

    def text(records):
        return "".join(r.text for r in records)

    whole = reply(32)
    assert whole[-1].finish_reason == "stop" and whole[-1].id in smollm2.tokenizer.eos_ids
    n = len(whole) - 1  # the tokens before the end-of-text one
    # the last allowed token completes the format: the output matches, nothing was cut
    exact = reply(n)
    assert exact[-1].finish_reason == "stop" and text(exact) == text(whole)
    cut = reply(n - 1)
    assert cut[-1].finish_reason == "length" and text(cut) != text(whole)
    assert text(whole).startswith(text(cut))
    with pytest.raises(json.JSONDecodeError):
        json.loads(text(cut))
