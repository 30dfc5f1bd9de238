"""Speculative decoding on the real SmolLM2 model: every output is checked against plain greedy
generation of the same prompt (the oracle), with both drafters."""

from __future__ import annotations

import json

import jsonschema
import numpy as np
import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.llm import load_model
from loomlab.core.llm.generate.speculative import DraftModel, PromptLookup
from loomlab.core.llm.quality.recipe import apply_recipe

PARAGRAPH = ("The river Loom rises in the northern hills and runs for two hundred kilometres to the "
             "sea. Its valley was settled by weavers in the twelfth century, who used the fast water "
             "to drive their looms. By the nineteenth century the town of Loomford had forty mills, "
             "and the river carried cloth to the port on flat-bottomed barges. The last mill closed "
             "in 1968; today the valley is known for its walking trails and its museum of weaving.")
SUMMARY = [{"role": "user", "content": PARAGRAPH + "\n\nSummarise the text above."}]
CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]
SHORT_CHAT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def model():
    with load_model("smollm2-135m") as m:
        yield m


@pytest.fixture(scope="module")
def draft():
    with load_model("smollm2-135m") as d:
        apply_recipe(d.net, "Q4_0")
        yield d


def _drafter(kind, draft):
    if kind == "draft-model":
        return DraftModel(draft, num_draft=4)
    # n-grams down to 1, never given up on, draft the most, so rejections (cache trims) happen often
    return _Unclocked(min_ngram=1)


class _Unclocked(PromptLookup):
    """Prompt lookup without a trial or a clock: no record ever counts against a length, and a
    first draft is as long as the rule allows."""

    TRIAL = 0
    FIRST_DRAFT = 100

    def timed(self, drafted, seconds):
        pass


def _records(model, prompt, **kw):
    if isinstance(prompt, list) and isinstance(prompt[0], dict):
        return list(model.chat(prompt, **kw))
    return list(model.generate(prompt, **kw))


def _assert_same(plain, spec):
    assert [r.id for r in spec] == [r.id for r in plain]
    assert [r.text for r in spec] == [r.text for r in plain]
    assert [r.finish_reason for r in spec] == [r.finish_reason for r in plain]


@pytest.mark.parametrize("kind", ["prompt-lookup", "draft-model"])
@pytest.mark.parametrize("prompt", [SUMMARY, CHAT, "def fibonacci(n):"], ids=["summary", "chat", "code"])
def test_greedy_output_is_the_plain_output(model, draft, kind, prompt):
    plain = _records(model, prompt, max_tokens=80, logprobs=3)
    spec = _records(model, prompt, max_tokens=80, logprobs=3, speculative=_drafter(kind, draft))
    _assert_same(plain, spec)
    for p, s in zip(plain, spec, strict=True):
        # the verify step's logits differ from a one-token step's in the last bits only
        assert s.logprob == pytest.approx(p.logprob, abs=1e-3)
        assert [t[0] for t in s.top] == [t[0] for t in p.top]
    m = model.metrics()
    assert m.generated_tokens == len(plain) and m.prompt_tokens > 0
    assert 0 <= m.accepted_tokens <= m.drafted_tokens and m.drafted_tokens > 0
    assert m.acceptance_rate == m.accepted_tokens / m.drafted_tokens


@pytest.mark.parametrize("kind", ["prompt-lookup", "draft-model"])
@pytest.mark.parametrize("max_tokens", [1, 2, 5, 11, 23])
def test_max_tokens_ends_mid_draft(model, draft, kind, max_tokens):
    plain = _records(model, SUMMARY, max_tokens=max_tokens)
    spec = _records(model, SUMMARY, max_tokens=max_tokens, speculative=_drafter(kind, draft))
    _assert_same(plain, spec)
    assert spec[-1].finish_reason == "length" and len(spec) == max_tokens


@pytest.mark.parametrize("kind", ["prompt-lookup", "draft-model"])
def test_stop_strings_end_mid_draft(model, draft, kind):
    full = "".join(r.text for r in model.chat(SUMMARY, max_tokens=64))
    for cut in (5, 17, 40):
        stop = full[cut:cut + 4]
        plain = _records(model, SUMMARY, max_tokens=64, stop=[stop])
        spec = _records(model, SUMMARY, max_tokens=64, stop=[stop], speculative=_drafter(kind, draft))
        _assert_same(plain, spec)
        assert spec[-1].finish_reason == "stop"
        assert "".join(r.text for r in spec) == full[:full.index(stop)]


@pytest.mark.parametrize("kind", ["prompt-lookup", "draft-model"])
def test_eos_ends_mid_draft(model, draft, kind):
    plain = _records(model, SHORT_CHAT, max_tokens=64)
    assert plain[-1].finish_reason == "eos"  # the oracle must end on eos for this test to mean it
    spec = _records(model, SHORT_CHAT, max_tokens=64, speculative=_drafter(kind, draft))
    _assert_same(plain, spec)


def test_cancel_stops_speculation(model):
    calls = iter(range(1000))
    records = list(model.chat(SUMMARY, max_tokens=64, speculative="prompt-lookup",
                                  cancel=lambda: next(calls) >= 6))
    assert records[-1].finish_reason == "cancelled" and len(records) == 7


def test_penalties_are_honoured_per_drafted_position(model):
    kw = dict(max_tokens=48, repetition_penalty=1.3, presence_penalty=0.2)
    _assert_same(_records(model, SUMMARY, **kw), _records(model, SUMMARY, speculative="prompt-lookup", **kw))


@pytest.mark.parametrize("kind", ["prompt-lookup", "draft-model"])
def test_a_constraint_masks_every_drafted_position(model, draft, kind):
    """Constrained output with speculation is the constrained plain output, and it validates."""
    schema = {"type": "object", "properties": {"river": {"type": "string", "maxLength": 30},
                                               "mills": {"type": "integer"}},
              "required": ["river", "mills"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "facts", "schema": schema}}
    messages = [{"role": "user", "content": PARAGRAPH + "\n\nThe river and its mills as JSON."}]
    plain = _records(model, messages, max_tokens=60, response_format=fmt)
    spec = _records(model, messages, max_tokens=60, response_format=fmt, speculative=_drafter(kind, draft))
    _assert_same(plain, spec)
    assert spec[-1].finish_reason == "stop"
    jsonschema.validate(json.loads("".join(r.text for r in spec)), schema)


def test_a_draft_model_keeps_its_cache_in_step_across_generations(model, draft):
    drafter = DraftModel(draft, num_draft=3)
    for prompt in (SUMMARY, CHAT, SUMMARY):
        _assert_same(_records(model, prompt, max_tokens=24),
                     _records(model, prompt, max_tokens=24, speculative=drafter))
        assert drafter._tokens == [] or drafter._cache[0].offset == len(drafter._tokens)


@pytest.mark.parametrize("kw, match", [
    (dict(temperature=0.7), "greedy only"),
    (dict(speculative="n-gram"), "speculative must be"),
])
def test_unsupported_settings_raise_before_any_work(model, kw, match):
    kw = {"speculative": "prompt-lookup", **kw}
    steps = model.net.step_count
    with pytest.raises(LoomConfigError, match=match):
        model.generate(PARAGRAPH, max_tokens=8, **kw)
    with pytest.raises(LoomConfigError, match=match):
        model.chat(CHAT, max_tokens=8, **kw)
    assert model.net.step_count == steps


def test_the_target_cannot_draft_for_itself(model):
    with pytest.raises(LoomConfigError, match="second loaded model"):
        model.generate(PARAGRAPH, speculative=DraftModel(model))


def test_prompt_lookup_proposes_what_followed_the_latest_match():
    """The rule, for a length's first proposal (without FIRST_DRAFT's limit)."""
    lookup = _Unclocked(num_draft=3, min_ngram=1)
    assert lookup.propose([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 2, 3], 3) == [7, 8, 2]  # latest "2 3"
    assert lookup.propose([5, 6, 7, 5], 3) == [6, 7]  # a 1-gram when no 2- or 3-gram matches: 2 at most
    assert _Unclocked(min_ngram=1, per_token=3).propose([5, 6, 7, 5], 3) == [6, 7, 5]
    assert lookup.propose([1, 2, 3], 3) == []
    assert lookup.propose(list(np.arange(4)), 2) == []
    assert _Unclocked().propose([1, 2, 3, 4, 1, 2], 6) == [3, 4, 1, 2]  # a 2-gram: 4 at most
    assert _Unclocked().propose(list(range(10)) + [1, 2, 3], 6) == [4, 5, 6, 7, 8, 9]  # a 3-gram: 6
    assert _Unclocked().propose([1, 2, 3, 4, 2], 6) == []  # 1-grams never by default
    with pytest.raises(LoomConfigError):
        PromptLookup(num_draft=0)
    with pytest.raises(LoomConfigError, match="per_token"):
        PromptLookup(per_token=0)


def _lookup_by_hand(h, k, max_ngram, min_ngram, per_token):
    """Prompt lookup's rule in plain loops: the longest n whose last n tokens occur earlier, its
    latest earlier occurrence, up to min(k, per_token * n) of the tokens after it."""
    for n in range(max_ngram, min_ngram - 1, -1):
        for start in range(len(h) - 1 - n, -1, -1):
            if h[start:start + n] == h[-n:]:
                return h[start + n:start + n + min(k, per_token * n)]
    return []


def test_prompt_lookup_matches_its_rule_by_hand_on_random_histories():
    rng = np.random.default_rng(7)
    for _ in range(3000):
        h = rng.integers(0, 3, int(rng.integers(1, 25))).tolist()  # 3 symbols: many matches
        min_ngram = int(rng.integers(1, 4))
        max_ngram = int(rng.integers(min_ngram, 5))
        k, per_token = int(rng.integers(1, 8)), int(rng.integers(1, 4))
        lookup = _Unclocked(num_draft=8, max_ngram=max_ngram, min_ngram=min_ngram, per_token=per_token)
        assert lookup.fork().propose(h, k) == _lookup_by_hand(h, k, max_ngram, min_ngram, per_token), h


def test_prompt_lookup_drafts_with_an_ngram_length_while_it_produces_tokens_faster_than_plain_steps():
    shared = PromptLookup()
    lookup = shared.fork()
    assert lookup is not shared and shared.fork() is not lookup  # one record per sequence
    lookup.timed(0, 0.010)
    lookup.timed(0, 0.010)  # plain steps: 1 token in 10 ms, 100 tokens/s
    two = [1, 2, 3, 4, 5, 1, 2]  # "1 2" recurs: a 2-gram match, 4 tokens to copy
    assert lookup.propose(two, 6) == [3, 4]  # a first draft: FIRST_DRAFT at most
    lookup.timed(2, 0.012)
    lookup.record(2, 0)  # 1 token in 12 ms; cut short: the next draft 1 shorter
    assert lookup.propose(two, 6) == [3]
    # each step weighs the length's record by RECENT (0.75) before adding its own
    lookup.timed(1, 0.011)
    lookup.record(1, 1)  # 0.75 + 2 tokens in 9 + 11 ms: 138 tokens/s >= 100, trusted after its trial
    assert lookup.propose(two, 6) == [3, 4, 5]  # kept whole: 2 longer
    lookup.timed(3, 0.010)
    lookup.record(3, 3)  # 6.06 tokens in 25 ms
    assert lookup.propose(two, 6) == [3, 4, 5, 1]  # 5 allowed, per_token * n = 4 at most
    lookup.timed(4, 0.030)
    lookup.record(4, 0)  # 5.55 tokens in 48.8 ms: 114 tokens/s
    assert lookup.propose(two, 6) == [3, 4, 5]
    lookup.timed(3, 0.040)
    lookup.record(3, 0)  # 5.16 tokens in 76.6 ms: 67 tokens/s < 100, 2-grams draft no more
    assert lookup.propose(two, 6) == []
    three = [7, 8, 9, 6, 7, 8, 9]  # 3-grams keep their own record: a trial
    assert lookup.propose(three, 6) == [6, 7]
    assert shared.fork().propose(two, 6) == [3, 4]  # a new sequence starts afresh


def test_prompt_lookup_trusts_a_length_until_plain_steps_have_been_timed():
    lookup = PromptLookup().fork()
    two = [1, 2, 3, 4, 5, 1, 2]
    for _ in range(PromptLookup.TRIAL):
        drafted = len(lookup.propose(two, 6))
        lookup.timed(drafted, 0.5)
        lookup.record(drafted, 0)
    assert lookup.propose(two, 6) == [3]  # no plain step to compare with yet
    lookup.timed(1, 0.5)
    lookup.record(1, 0)
    lookup.timed(0, 0.010)
    assert lookup.propose(two, 6) == []  # 2.3 (weighted) tokens in 1.16 s against 100 tokens/s


class _Logged(PromptLookup):
    """Prompt lookup that logs its proposals' sizes and the records it is given (in lists its
    forks share)."""

    def __init__(self):
        super().__init__(min_ngram=1)
        self.proposals, self.records = [], []

    def propose(self, history, k):
        out = super().propose(history, k)
        self.proposals.append(len(out))
        return out

    def record(self, drafted, accepted):
        super().record(drafted, accepted)
        self.records.append((drafted, accepted))


def test_each_verification_reports_how_its_draft_fared(model):
    lookup = _Logged()
    _records(model, SUMMARY, max_tokens=60, speculative=lookup)
    m = model.metrics()
    drafted = [n for n in lookup.proposals if n]
    assert [d for d, _ in lookup.records] == drafted[:len(lookup.records)]
    assert len(lookup.records) >= len(drafted) - 1  # all but perhaps the last, which ended the reply
    assert all(0 <= kept <= d for d, kept in lookup.records)
    kept = sum(k for _, k in lookup.records)
    assert kept <= m.accepted_tokens <= kept + (drafted[-1] if len(lookup.records) < len(drafted) else 0)
    assert m.accepted_tokens > 0
