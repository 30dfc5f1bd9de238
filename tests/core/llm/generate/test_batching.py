"""Batched decoding, the continuous-batching engine and the prefix cache, on the real SmolLM2.

The oracle for every output is the same request generated alone (``model.generate``) with an
empty prefix cache: batching, neighbours, joining late and cached prefixes must not change a token.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

import numpy as np
import pytest

from loomlab.core.errors import LoomConfigError, LoomShapeError
from loomlab.core.llm.generate.batching import Batch, BatchEngine, Request
from loomlab.core.llm.generate.prefix_cache import PrefixCache, common_prefix
from loomlab.core.llm.generate.sampling import SamplingParams

PROMPTS = ["The capital of France is", "Once upon a time, in a small village by the sea,",
           "def fibonacci(n):", "The three primary colours are", "Water boils at",
           "A list of fruits: apple, banana,"]


@contextmanager
def no_prefix_cache(model):
    saved, model.prefix_cache = model.prefix_cache, PrefixCache(0)
    try:
        yield
    finally:
        model.prefix_cache = saved


def alone(model, prompt, **sampling) -> tuple[str, list[int]]:
    with no_prefix_cache(model):
        records = list(model.generate(prompt, **sampling))
    return "".join(r.text for r in records), [r.id for r in records]


def ids_of(model, prompt) -> list[int]:
    return model.tokenizer.encode(prompt, add_special_tokens=True)


@pytest.mark.parametrize("sampling", [dict(max_tokens=16),
                                      dict(max_tokens=16, temperature=0.9, top_p=0.9, seed=11)])
def test_batch_generate_equals_each_prompt_alone(smollm2, sampling):
    expected = [alone(smollm2, p, **sampling)[0] for p in PROMPTS]
    with no_prefix_cache(smollm2):
        assert smollm2.batch_generate(PROMPTS, **sampling) == expected
    m = smollm2.metrics()
    assert m.prompt_tokens == sum(len(ids_of(smollm2, p)) for p in PROMPTS)
    assert m.generated_tokens == 16 * len(PROMPTS) or m.generated_tokens <= 16 * len(PROMPTS)


def step_shapes(model, monkeypatch) -> list[tuple[int, int]]:
    """The shape of the ids of every ``net.step`` from now on (the list fills as they run)."""
    shapes, real = [], model.net.step

    def spy(ids, caches=None, **kw):
        shapes.append(np.asarray(ids).shape)
        return real(ids, caches, **kw)

    monkeypatch.setattr(model.net, "step", spy)
    return shapes


def test_batch_decodes_the_active_sequences_in_one_step(smollm2, monkeypatch):
    """Every decode step feeds all active sequences to one net.step: B rows of one token."""
    shapes = step_shapes(smollm2, monkeypatch)
    params = SamplingParams(max_tokens=5, stop=())
    with no_prefix_cache(smollm2), smollm2.busy():
        batch = Batch(smollm2, max_batch=3)
        requests = [Request(batch.check(ids_of(smollm2, p), params), params) for p in PROMPTS[:4]]
        for r in requests:
            batch.add(r)
        while batch.busy:
            batch.step()
    prefills = [s for s in shapes if s[0] == 1 and s[1] > 1]
    decodes = [s for s in shapes if s[1] == 1]
    assert len(prefills) == 4
    # three join at once; the fourth waits for a free slot (continuous batching), then runs alone
    assert decodes[:4] == [(3, 1)] * 4 and decodes[4:] == [(1, 1)] * 4
    assert [r.metrics.generated_tokens for r in requests] == [5] * 4
    assert all(r.done for r in requests)


def test_engine_serves_concurrent_clients_each_as_alone(smollm2):
    expected = [alone(smollm2, p, max_tokens=12) for p in PROMPTS]
    results = [None] * len(PROMPTS)
    with no_prefix_cache(smollm2), BatchEngine(smollm2, max_batch=4, prefix_cache_mb=0) as engine:
        def client(i):
            req = engine.submit(ids_of(smollm2, PROMPTS[i]), SamplingParams(max_tokens=12))
            records = list(req)
            results[i] = ("".join(r.text for r in records), [r.id for r in records],
                          [r.index for r in records], records[-1].finish_reason)

        threads = [threading.Thread(target=client, args=(i,)) for i in range(len(PROMPTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        stats = engine.stats()
    for (text, ids, indices, finish), (want_text, want_ids) in zip(results, expected, strict=True):
        assert (text, ids) == (want_text, want_ids)
        assert indices == list(range(len(ids)))
        assert finish in ("length", "eos")
    assert stats["active"] == 0 and stats["queued"] == 0
    assert stats["tokens"] == sum(len(e[1]) for e in expected)


def test_a_late_request_joins_the_running_batch(smollm2):
    params = SamplingParams(max_tokens=40)
    want_late = alone(smollm2, PROMPTS[2], max_tokens=8)[0]
    with BatchEngine(smollm2, prefix_cache_mb=0) as engine:
        first = engine.submit(ids_of(smollm2, PROMPTS[1]), params)
        it = iter(first)
        next(it)
        late = engine.submit(ids_of(smollm2, PROMPTS[2]), SamplingParams(max_tokens=8))
        assert late.text() == want_late
        assert not first.done  # the late one finished while the first was still decoding
        list(it)
        assert first.done


def test_cancel_frees_the_slot_within_one_step(smollm2):
    seen = []
    with BatchEngine(smollm2, max_batch=1, prefix_cache_mb=0) as engine:
        def on_record(record):
            seen.append(record)
            if record.index == 2:
                req.cancel()

        req = engine.submit(ids_of(smollm2, PROMPTS[1]), SamplingParams(max_tokens=200), on_record=on_record)
        assert req.wait(60)
        assert [r.index for r in seen] == [0, 1, 2, 3] and seen[-1].finish_reason == "cancelled"
        assert engine.stats()["active"] == 0
        # the single slot is free again: the next request runs
        nxt = engine.submit(ids_of(smollm2, PROMPTS[0]), SamplingParams(max_tokens=3))
        assert len(list(nxt)) == 3


def test_close_cancels_waiting_and_running_requests(smollm2):
    engine = BatchEngine(smollm2, max_batch=1, prefix_cache_mb=0)
    running = engine.submit(ids_of(smollm2, PROMPTS[1]), SamplingParams(max_tokens=200))
    waiting = engine.submit(ids_of(smollm2, PROMPTS[0]), SamplingParams(max_tokens=200))
    next(iter(running))
    engine.close()
    assert list(running)[-1].finish_reason == "cancelled"
    assert [r.finish_reason for r in waiting] == ["cancelled"]
    with pytest.raises(LoomConfigError, match="closed"):
        engine.submit(ids_of(smollm2, PROMPTS[0]))


def test_run_executes_between_steps(smollm2):
    want = smollm2.embed(["hello there"])
    with BatchEngine(smollm2) as engine:
        got = engine.run(lambda m: m.embed(["hello there"])).result(60)
        with pytest.raises(ZeroDivisionError):
            engine.run(lambda m: 1 / 0).result(60)
        assert engine.submit(ids_of(smollm2, PROMPTS[0]), SamplingParams(max_tokens=2)).text()
    np.testing.assert_array_equal(got, want)


def test_a_failing_step_fails_its_requests_and_the_engine_goes_on(smollm2, monkeypatch):
    real, calls = smollm2.net.step, []

    def flaky(ids, caches=None, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise RuntimeError("simulated kernel failure")
        return real(ids, caches, **kw)

    monkeypatch.setattr(smollm2.net, "step", flaky)
    with BatchEngine(smollm2, prefix_cache_mb=0) as engine:
        broken = engine.submit(ids_of(smollm2, PROMPTS[0]), SamplingParams(max_tokens=10))
        records = list(broken)
        assert records[-1].finish_reason == "error" and "simulated kernel failure" in broken.error
        after = engine.submit(ids_of(smollm2, PROMPTS[0]), SamplingParams(max_tokens=4))
        assert len(list(after)) == 4


def test_requests_wait_while_the_model_generates_elsewhere(smollm2):
    with BatchEngine(smollm2, prefix_cache_mb=0) as engine:
        stream = smollm2.generate(PROMPTS[0], max_tokens=6)
        next(stream)  # the model is held by this generation now
        req = engine.submit(ids_of(smollm2, PROMPTS[0]), SamplingParams(max_tokens=3))
        time.sleep(0.2)
        assert not req.done and engine.stats()["queued"] + engine.stats()["active"] == 1
        list(stream)
        assert req.wait(60) and len(list(req)) == 3


@pytest.mark.parametrize("bad, error, match", [
    (dict(params=SamplingParams(max_tokens=0)), LoomConfigError, "max_tokens"),
    (dict(params=SamplingParams(max_tokens=10**6)), LoomShapeError, "context length"),
    (dict(ids=[1, 2, 10**7]), LoomConfigError, "outside the vocabulary"),
    (dict(ids=[]), LoomConfigError, "empty"),
])
def test_bad_requests_are_refused_before_queueing(smollm2, bad, error, match):
    with BatchEngine(smollm2) as engine:
        with pytest.raises(error, match=match):
            engine.submit(bad.get("ids", [1, 2, 3]), bad.get("params", SamplingParams()))
        assert engine.stats()["queued"] == 0


@pytest.mark.parametrize("kwargs", [dict(max_batch=0), dict(max_batch=2.5), dict(prefix_cache_mb=-1),
                                    dict(prefix_cache_mb="big")])
def test_bad_engine_settings(smollm2, kwargs):
    with pytest.raises(LoomConfigError):
        BatchEngine(smollm2, **kwargs)


# ----- prefix cache -----------------------------------------------------------------------------

def test_a_repeated_prompt_reuses_its_prefix_and_gives_the_same_tokens(smollm2):
    text, want = alone(smollm2, PROMPTS[1], max_tokens=12)
    with no_prefix_cache(smollm2):
        smollm2.prefix_cache = PrefixCache(64 << 20)
        first = [r.id for r in smollm2.generate(PROMPTS[1], max_tokens=12)]
        assert smollm2.metrics().cached_tokens == 0
        again = [r.id for r in smollm2.generate(PROMPTS[1], max_tokens=12)]
        n = len(ids_of(smollm2, PROMPTS[1]))
        assert smollm2.metrics().cached_tokens == n - 1  # all but the last prompt token
        # a continuation of the first sequence reuses its prompt and its generated tokens
        longer = ids_of(smollm2, PROMPTS[1]) + first[:8]
        cont = [r.id for r in smollm2.generate(longer, max_tokens=6)]
        assert smollm2.metrics().cached_tokens == len(longer) - 1
    assert first == want and again == want
    with no_prefix_cache(smollm2):
        assert cont == [r.id for r in smollm2.generate(longer, max_tokens=6)]


def test_chat_turns_prefill_only_their_new_tokens(smollm2):
    messages = [{"role": "user", "content": "Name a colour."}]
    with no_prefix_cache(smollm2):
        smollm2.prefix_cache = PrefixCache(64 << 20)
        previous_prompt = 0
        for turn in range(3):
            reply = "".join(r.text for r in smollm2.chat(messages, max_tokens=8))
            m = smollm2.metrics()
            if turn:
                # everything up to the previous turn's reply came from the cache
                assert m.cached_tokens >= previous_prompt
                assert m.prompt_tokens - m.cached_tokens < 40
            previous_prompt = m.prompt_tokens
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Another."}]


class _FakeCache:
    def __init__(self, nbytes, n=0):
        self.nbytes, self.n = nbytes, n

    def fork(self, n):
        return _FakeCache(self.nbytes, n)


def test_prefix_cache_bounds_bytes_and_evicts_least_recently_used():
    cache = PrefixCache(300)
    cache.store([1, 2, 3], [_FakeCache(100)])
    cache.store([4, 5, 6], [_FakeCache(100)])
    cache.store([7, 8, 9], [_FakeCache(100)])
    assert cache.lookup([1, 2, 3, 10])[1] == 3  # touched: now the most recently used
    cache.store([11, 12], [_FakeCache(100)])  # over 300 bytes: [4, 5, 6] goes
    assert cache.nbytes == 300 and len(cache) == 3
    assert cache.lookup([4, 5, 6, 1]) is None
    # the longest common prefix is served, capped below the prompt's last token
    caches, n = cache.lookup([7, 8, 99])
    assert n == 2 and caches[0].n == 2
    assert cache.lookup([7, 8, 9])[1] == 2
    # an entry the new sequence extends is replaced by it
    cache.store([7, 8, 9, 10], [_FakeCache(100)])
    assert len(cache) == 3 and cache.lookup([7, 8, 9, 10, 11])[1] == 4
    # a sequence larger than the whole cache is not kept (and evicts nothing)
    cache.store([42], [_FakeCache(1000)])
    assert len(cache) == 3 and cache.hits == 4
    with pytest.raises(LoomConfigError):
        PrefixCache(-1)


@pytest.mark.parametrize("a, b, n", [([], [1], 0), ([1, 2, 3], [1, 2, 3], 3), ([1, 2, 3], [1, 2], 2),
                                     ([1, 2, 3], [1, 5, 3], 1), ([9], [1], 0)])
def test_common_prefix(a, b, n):
    assert common_prefix(a, b) == n


# ----- speculation in the batch -----------------------------------------------------------------

PARAGRAPH = ("The river Loom rises in the northern hills and runs for two hundred kilometres to the sea. "
             "Its valley was settled by weavers in the twelfth century, who used the fast water to drive "
             "their looms. The last mill closed in 1968; today the valley is known for its museum.")


def test_speculating_and_plain_sequences_share_steps_and_each_gives_its_alone_output(smollm2, monkeypatch):
    """Prompt-lookup requests (greedy) verify their drafts in the same steps as plain requests;
    shorter rows are padded and the padding trimmed: every output is its prompt's alone."""
    summary = smollm2.tokenizer.encode(PARAGRAPH + " In short, the river Loom", add_special_tokens=True)
    plain = [ids_of(smollm2, p) for p in PROMPTS[:2]]
    want = [alone(smollm2, ids, max_tokens=24)[1] for ids in (summary, *plain)]
    widths = step_shapes(smollm2, monkeypatch)
    with BatchEngine(smollm2, prefix_cache_mb=0) as engine:
        spec = engine.submit(summary, SamplingParams(max_tokens=24), speculative="prompt-lookup")
        others = [engine.submit(ids, SamplingParams(max_tokens=24)) for ids in plain]
        got = [[r.id for r in req] for req in (spec, *others)]
    assert got == want
    assert spec.metrics.accepted_tokens > 0
    assert any(b > 1 and t > 1 for b, t in widths)  # drafts and plain rows in one step


def test_batched_speculation_refuses_what_it_cannot_serve(smollm2):
    with BatchEngine(smollm2) as engine:
        with pytest.raises(LoomConfigError, match="greedy only"):
            engine.submit([1, 2, 3], SamplingParams(temperature=0.5), speculative="prompt-lookup")
        with pytest.raises(LoomConfigError, match="one sequence at a time"):
            engine.submit([1, 2, 3], SamplingParams(), speculative=smollm2)


def test_a_failing_prefill_fails_only_its_request(smollm2, monkeypatch):
    real = smollm2.net.step

    def broken_prefill(ids, caches=None, **kw):
        if np.asarray(ids).shape[1] > 1:
            raise MemoryError("simulated allocation failure")
        return real(ids, caches, **kw)

    with BatchEngine(smollm2, prefix_cache_mb=0) as engine:
        monkeypatch.setattr(smollm2.net, "step", broken_prefill)
        req = engine.submit(ids_of(smollm2, PROMPTS[0]), SamplingParams(max_tokens=4))
        assert [r.finish_reason for r in req] == ["error"] and "MemoryError" in req.error
        monkeypatch.setattr(smollm2.net, "step", real)
        assert len(list(engine.submit(ids_of(smollm2, PROMPTS[0]), SamplingParams(max_tokens=4)))) == 4


def test_a_failing_choice_fails_only_its_request(smollm2, monkeypatch):
    """A request's own choice raising (a constraint it cannot follow, say) mid-generation ends it
    with an "error" record carrying the exception; its neighbour in the batch goes on as alone."""
    from loomlab.core.llm.generate.decoding import Decoding

    real = Decoding.choose

    def choose(self, logits):
        if self.params.seed == 13 and self.index == 2:
            raise LoomConfigError("response_format could not be followed")
        return real(self, logits)

    want, _ = alone(smollm2, PROMPTS[1], max_tokens=5)
    monkeypatch.setattr(Decoding, "choose", choose)
    batch = Batch(smollm2, max_batch=2, prefix_cache=PrefixCache(0))
    failing = Request(ids_of(smollm2, PROMPTS[0]), SamplingParams(max_tokens=5, seed=13))
    other = Request(ids_of(smollm2, PROMPTS[1]), SamplingParams(max_tokens=5))
    batch.add(failing)
    batch.add(other)
    while batch.busy:
        batch.step()
    assert [r.finish_reason for r in failing] == [None, None, "error"]
    assert isinstance(failing.failure, LoomConfigError) and "could not be followed" in failing.error
    assert other.text() == want
