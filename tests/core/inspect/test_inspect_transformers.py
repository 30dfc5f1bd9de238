"""core/inspect against transformers on the tiny random checkpoint of every family.

Oracle: ``tests/data/tiny-hf/tiny-<family>/inspect.json``, written by
``tests/data/tiny-hf/make_inspect_reference.py`` with torch: eager attention's
``output_attentions``, the decoder layers' outputs through the final norm and head (the lens),
per-head outputs of ``o_proj``'s input taken through each family's post-norms and multipliers
(attribution), and forward hooks that zero, mean or copy a head's values, an attention or MLP
output or a block's input (ablation and patching). Each family's folder also holds the
checkpoint, so the model under test is loaded from the same weights.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from loomlab.core.inspect import Ablation, ablate, attention_patterns, attribute, logit_lens, patch
from loomlab.core.llm.model.loader import load_causal_lm

from .test_inspect import FAMILIES, TINY

# the reference's patching sites by this package's names
SITES = {"resid_pre": "resid_pre", "attention": "attn_out", "mlp": "mlp_out", "heads": "z"}


@pytest.fixture(scope="module", params=FAMILIES)
def case(request):
    folder = TINY / f"tiny-{request.param}"
    return load_causal_lm(folder), json.loads((folder / "inspect.json").read_text())


def test_patterns(case):
    net, ref = case
    p = attention_patterns(net, ref["input_ids"])
    for i, want in enumerate(ref["patterns"]):
        np.testing.assert_allclose(p.layer(i), np.array(want), atol=2e-6, err_msg=f"layer {i}")


def test_logit_lens(case):
    net, ref = case
    lens = logit_lens(net, ref["input_ids"], target=ref["answer"], k=5)
    want = ref["lens"]
    np.testing.assert_allclose(lens.top_probs, np.array(want["top_probs"]), atol=2e-6)
    np.testing.assert_allclose(lens.target_probs, np.array(want["answer_probs"]), atol=2e-6)
    # ids and ranks where the probabilities are not tied within float32 rounding
    probs = np.array(want["top_probs"])
    clear = np.diff(probs, axis=-1) < -1e-5
    np.testing.assert_array_equal(lens.top_ids[..., :1][clear[..., :1]],
                                  np.array(want["top_ids"])[..., :1][clear[..., :1]])
    assert np.abs(lens.target_ranks - np.array(want["answer_ranks"])).max() <= 1


def test_direct_logit_attribution(case):
    net, ref = case
    want = ref["attribution"]
    a = attribute(net, ref["input_ids"], token=ref["answer"], position=-1)
    assert a.logit == pytest.approx(want["logit"], abs=2e-5)
    assert a.embed == pytest.approx(want["embed"], abs=2e-5)
    np.testing.assert_allclose(a.heads, np.array(want["heads"]), atol=2e-5)
    np.testing.assert_allclose(a.attn_bias, np.array(want["attn_bias"]), atol=2e-5)
    np.testing.assert_allclose(a.mlp, np.array(want["mlp"]), atol=2e-5)


def test_ablation(case):
    net, ref = case
    want = ref["ablation"]
    n = len(want["clean"]["greedy"])
    for c in want["cases"]:
        result = ablate(net, ref["input_ids"], [Ablation(c["kind"], c["layer"], c.get("head"), c["mode"])],
                        target=ref["answer"], new_tokens=n)
        assert result.logprob_before == pytest.approx(want["clean"]["answer_logprob"], abs=2e-5)
        assert result.greedy_before == want["clean"]["greedy"]
        assert result.logprob_after == pytest.approx(c["answer_logprob"], abs=2e-5), c
        assert result.greedy_after == c["greedy"], c


def test_patching(case):
    net, ref = case
    want = ref["patching"]
    for key, site in SITES.items():
        grid = patch(net, ref["input_ids"], ref["corrupted_ids"], site=site, answer=ref["answer"],
                     wrong=ref["wrong"])
        assert grid.clean_diff == pytest.approx(want["clean_diff"], abs=2e-5)
        assert grid.corrupted_diff == pytest.approx(want["corrupted_diff"], abs=2e-5)
        np.testing.assert_allclose(grid.diffs, np.array(want[key]), atol=2e-5, err_msg=site)


def test_the_default_answer_and_wrong_tokens_are_the_references(case):
    """Without answer and wrong given: the clean top token, and the corrupted one (the clean
    run's second when they agree), as the reference chose them."""
    net, ref = case
    grid = patch(net, ref["input_ids"], ref["corrupted_ids"], site="resid_pre")
    assert (grid.answer, grid.wrong) == (ref["answer"], ref["wrong"])
