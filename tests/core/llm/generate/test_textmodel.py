"""The generation API on the real SmolLM2 model, against transformers' greedy continuations."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from loomlab.core.errors import LoomConfigError, LoomShapeError
from loomlab.core.llm.generate.sampling import log_softmax
from loomlab.core.llm.generate.textmodel import load_model

GOLDEN = json.loads((Path(__file__).resolve().parents[3] / "data" / "llm" /
                     "smollm2-135m-instruct-q4_1.json").read_text())


@pytest.fixture(scope="module")
def model():
    """The exact path (float32 activations): the goldens are transformers' own numbers."""
    with load_model("smollm2-135m", activations="float32") as m:
        yield m


@pytest.mark.parametrize("case", GOLDEN["generate"], ids=lambda c: c["kind"])
def test_greedy_generation_matches_transformers(model, case):
    records = list(model.generate(case["prompt_ids"], max_tokens=32, temperature=0))
    ids = [r.id for r in records]
    assert ids == case["greedy_32"][:len(ids)]
    if records[-1].finish_reason == "eos":
        assert ids[-1] in model.tokenizer.eos_ids
    else:
        assert len(ids) == 32 and records[-1].finish_reason == "length"
    text = "".join(r.text for r in records)
    assert text == model.tokenizer.decode([i for i in ids if i not in model.tokenizer.eos_ids],
                                          skip_special_tokens=True)
    m = model.metrics()
    assert m.prompt_tokens == len(case["prompt_ids"]) and m.generated_tokens == len(ids)
    assert m.prefill_s > 0 and m.time_to_first_token_s > 0 and m.peak_rss_bytes > 0


def test_chat_and_raw_prompts_tokenize_like_transformers_and_continue_greedily(model):
    for case in GOLDEN["generate"]:
        if case["kind"] == "chat":
            records = list(model.chat(case["prompt"], max_tokens=32))
        else:
            records = list(model.generate(case["prompt"], max_tokens=32))
        assert model.metrics().prompt_tokens == len(case["prompt_ids"])
        assert [r.id for r in records] == case["greedy_32"][:len(records)]


def test_stop_strings_cut_the_text_and_finish_with_stop(model):
    case = next(c for c in GOLDEN["generate"] if c["kind"] == "raw")
    full = "".join(r.text for r in model.generate(case["prompt_ids"], max_tokens=32))
    stop = full[10:16]
    records = list(model.generate(case["prompt_ids"], max_tokens=32, stop=[stop]))
    assert "".join(r.text for r in records) == full[:full.index(stop)]
    assert records[-1].finish_reason == "stop"


def test_cancel_stops_within_one_token(model):
    event = threading.Event()
    event.set()
    records = list(model.generate("Once upon a time", max_tokens=50, cancel=event))
    assert [r.finish_reason for r in records] == ["cancelled"]
    seen = []
    for r in model.generate("Once upon a time", max_tokens=50, cancel=lambda: len(seen) >= 2):
        seen.append(r)
    assert [r.finish_reason for r in seen] == [None, None, "cancelled"]  # two tokens, then the stop


def test_a_second_generation_while_one_is_streaming_is_refused(model):
    first = model.generate("Once upon a time", max_tokens=5)
    next(first)
    with pytest.raises(LoomConfigError, match="busy"):
        next(model.generate("Hello", max_tokens=2))
    first.close()
    assert len(list(model.generate("Hello", max_tokens=2))) == 2


def test_logprobs_and_top_alternatives(model):
    records = list(model.generate("The sky is", max_tokens=3, logprobs=4))
    ids = model.tokenizer.encode("The sky is", add_special_tokens=True)
    logits = model.classify([ids])[0].logits
    lp = log_softmax(logits)
    first = records[0]
    assert first.top[0][0] == first.id == int(np.argmax(logits))  # greedy picks the best alternative
    assert first.logprob == pytest.approx(float(lp[first.id]), abs=1e-4)
    alternatives = [t[2] for t in first.top]
    assert alternatives == sorted(alternatives, reverse=True) and len(alternatives) == 4


def test_seeded_sampling_is_reproducible(model):
    a = [r.id for r in model.generate("Hello", max_tokens=8, temperature=0.9, top_p=0.9, seed=5)]
    b = [r.id for r in model.generate("Hello", max_tokens=8, temperature=0.9, top_p=0.9, seed=5)]
    assert a == b


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=2), dict(max_tokens=-3), dict(bogus=1)])
def test_invalid_parameters_fail_before_any_work(model, bad):
    before = model.net.step_count
    with pytest.raises((LoomConfigError, TypeError)):
        model.generate("Hi", **bad)
    assert model.net.step_count == before


def test_context_policies(model, monkeypatch):
    monkeypatch.setattr(model.net.args, "context_length", 80)
    long = [{"role": "user", "content": "tell me a long story " * 6},
            {"role": "assistant", "content": "ok " * 10}, {"role": "user", "content": "Hi"}]
    with pytest.raises(LoomShapeError, match="context length"):
        model.chat(long, max_tokens=20)
    reply = list(model.chat(long, max_tokens=20, context_policy="drop_oldest"))
    from loomlab.core.llm.text.chat_template import encode_chat

    kept = encode_chat(model.tokenizer, model.template, long[1:])
    assert len(encode_chat(model.tokenizer, model.template, long)) + 20 > 80 >= len(kept) + 20
    assert model.metrics().dropped_turns == 1 and model.metrics().prompt_tokens == len(kept) and reply
    with pytest.raises(LoomConfigError):
        model.chat(long, context_policy="truncate")


def test_classify_batches_equal_lengths_and_matches_single_prompts(model):
    a = model.tokenizer.encode("The capital of France is", add_special_tokens=True)
    b = model.tokenizer.encode("The capital of Spain is", add_special_tokens=True)
    assert len(a) == len(b)
    both = model.classify([a, b, a[:3]])
    single = model.classify([b])[0]
    np.testing.assert_allclose(both[1].logits, single.logits, atol=2e-4)
    assert both[0].token == int(np.argmax(both[0].logits)) and both[2].logits.shape == (model.vocab_size,)


def test_embed(model):
    e = model.embed(["hello world", "hello world", "a different sentence"])
    assert e.shape == (3, 576)
    np.testing.assert_array_equal(e[0], e[1])
    assert not np.allclose(e[0], e[2])


def test_info(model):
    info = model.info()
    assert (info["architecture"], info["layers"], info["hidden_size"], info["vocab_size"]) == \
        ("llama", 30, 576, 49152)
    assert info["chat_template"] == "file" and info["weight_types"]["Q4_1"] == 210


@pytest.mark.parametrize("seed", range(5))
def test_top_k_is_a_stable_argsort_without_sorting_everything(seed):
    from loomlab.core.llm.generate.decoding import top_k

    rng = np.random.default_rng(seed)
    values = rng.integers(0, 20, 1000).astype(np.float32)  # many ties, at the boundary too
    for k in (1, 5, 37, 1000):
        assert top_k(values, k).tolist() == np.argsort(-values, kind="stable")[:k].tolist()
