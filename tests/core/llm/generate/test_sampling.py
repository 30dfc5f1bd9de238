"""Samplers and logit processors against their formulas."""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.generate.sampling import (
    SamplingParams,
    filtered_probs,
    log_softmax,
    log_softmax_terms,
    make_logits_processor,
    make_sampler,
)

LOGITS = np.array([2.0, 1.0, 0.5, 3.0, -1.0, 3.0], np.float32)


def test_temperature_zero_is_argmax_first_maximum():
    assert make_sampler(0.0)(LOGITS, np.random.default_rng(0)) == 3


@pytest.mark.filterwarnings("error")  # no overflow warning per token either
@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-300])
def test_a_tiny_temperature_is_argmax_not_nan(temperature):
    """The limit of softmax(z / T) as T -> 0: all the mass on the maxima (here the tie 3, 5)."""
    probs = filtered_probs(LOGITS, temperature)
    np.testing.assert_array_equal(probs, [0, 0, 0, 0.5, 0, 0.5])
    assert make_sampler(temperature)(LOGITS, np.random.default_rng(0)) in (3, 5)


def test_filters_match_their_definitions():
    z = LOGITS.astype(np.float64) / 0.7
    p = np.exp(z) / np.exp(z).sum()
    np.testing.assert_allclose(filtered_probs(LOGITS, 0.7), p, rtol=1e-12)
    top2 = filtered_probs(LOGITS, 1.0, top_k=2)
    assert set(np.flatnonzero(top2)) == {3, 5} and top2[3] == pytest.approx(0.5)
    q = np.exp(LOGITS.astype(np.float64)) / np.exp(LOGITS.astype(np.float64)).sum()
    nucleus = filtered_probs(LOGITS, 1.0, top_p=0.8)
    order = np.argsort(-q, kind="stable")
    k = int(np.searchsorted(np.cumsum(q[order]), 0.8) + 1)  # smallest prefix with mass >= 0.8
    assert set(np.flatnonzero(nucleus)) == set(order[:k])
    minp = filtered_probs(LOGITS, 1.0, min_p=0.3)
    assert set(np.flatnonzero(minp)) == set(np.flatnonzero(q >= 0.3 * q.max()))


def test_sampling_frequencies_follow_the_distribution_and_the_seed():
    sample = make_sampler(1.0, top_k=3)
    rng = np.random.default_rng(42)
    draws = np.array([sample(LOGITS, rng) for _ in range(4000)])
    expected = filtered_probs(LOGITS, 1.0, top_k=3)
    freq = np.bincount(draws, minlength=6) / draws.size
    np.testing.assert_allclose(freq, expected, atol=0.03)
    a = [sample(LOGITS, np.random.default_rng(7)) for _ in range(5)]
    assert a == [sample(LOGITS, np.random.default_rng(7)) for _ in range(5)]


def test_penalties():
    process = make_logits_processor(repetition_penalty=2.0, presence_penalty=0.5, frequency_penalty=0.25,
                                    window=3)
    out = process(LOGITS, [1, 0, 4, 4])  # the window keeps [0, 4, 4]
    expected = LOGITS.copy()
    expected[0] = 2.0 / 2 - 0.5 - 0.25
    expected[4] = -1.0 * 2 - 0.5 - 0.5
    np.testing.assert_allclose(out, expected)
    assert make_logits_processor()(LOGITS, [1, 2]) is LOGITS


def test_log_softmax():
    np.testing.assert_allclose(np.exp(log_softmax(LOGITS)).sum(), 1.0)
    np.testing.assert_allclose(log_softmax(LOGITS), LOGITS - np.log(np.exp(LOGITS.astype(np.float64)).sum()),
                               rtol=1e-6)


@pytest.mark.parametrize("size, dtype", [(49152, np.float32), (6, np.float32), (1000, np.float64)])
def test_log_softmax_terms_give_log_softmax(size, dtype):
    rng = np.random.default_rng(size)
    for _ in range(3):  # the per-thread scratch buffer is reused, and resized between sizes
        z = (rng.standard_normal(size) * 6).astype(dtype)
        m, log_total = log_softmax_terms(z)
        ours = np.array([(float(v) - m) - log_total for v in z])
        np.testing.assert_allclose(ours, log_softmax(z), rtol=0, atol=1e-6)
        assert m == float(z.max())


def test_generated_logprobs_are_the_log_softmax_of_the_processed_logits():
    from loomlab.core.llm.generate.decoding import token_logprobs

    z = (np.random.default_rng(5).standard_normal(5000) * 4).astype(np.float32)
    z[[10, 20]] = z.max()  # a tie at the top: the lower index first, as a stable sort gives
    lp = log_softmax(z)
    token_lp, top = token_logprobs(z, 7, 5, lambda ids: [str(i) for i in ids])
    assert token_lp == pytest.approx(float(lp[7]), rel=0, abs=1e-6)
    order = np.argsort(-lp, kind="stable")[:5]
    assert [(i, text) for i, text, _ in top] == [(int(i), str(int(i))) for i in order]
    np.testing.assert_allclose([p for _, _, p in top], lp[order], rtol=0, atol=1e-6)
    assert [i for i, _, _ in top[:2]] == [10, 20]


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_k=-2), dict(top_p=0), dict(top_p=1.5),
                                 dict(min_p=1), dict(repetition_penalty=0), dict(max_tokens=-1),
                                 dict(stop="x"), dict(stop=("",)), dict(seed=1.5),
                                 dict(temperature=float("nan")), dict(top_k=True)])
def test_invalid_parameters_are_rejected(bad):
    with pytest.raises(LoomConfigError):
        SamplingParams(**bad)
