"""core/inspect on the tiny random checkpoints of every family (tests/data/tiny-hf).

Oracles here: the model's own forward (the traced pass must be it), Loom's ``is_disabled`` switch
(a disabled block), the linearisation's identity (attributions sum to the logit), a patch of the
one position two prompts differ in (restores all of it, at the first layer exactly), an
unbatched run with the same edit (the batched grid from the patched layer on), the softmax's and
the mask's definitions, max-pooling written as loops, and the numpy results for the strict
backend. The transformers oracle is in test_inspect_transformers.py.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest

from loomlab.core.errors import InspectError, LoomCancelled
from loomlab.core.inspect import (
    Ablation,
    Inspector,
    Tracer,
    ablate,
    attention_patterns,
    attribute,
    logit_lens,
    patch,
)
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.model.llm_layers import soft_cap
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.morph import morph_sublayer

TINY = Path(__file__).resolve().parents[2] / "data" / "tiny-hf"
FAMILIES = ("llama", "qwen2", "gemma2", "gemma3", "granite", "mixtral", "qwen3moe", "olmo2", "phi3",
            "smollm3")
IDS = [1, 17, 42, 99, 3, 250, 7, 7, 7, 128, 64, 5]
CORRUPTED = [1, 17, 42, 99, 3, 250, 7, 7, 7, 130, 64, 5]  # position 9 differs


def ids_of(family: str) -> list[int]:
    return json.loads((TINY / f"tiny-{family}" / "reference.json").read_text())["input_ids"]


@pytest.fixture(scope="module")
def nets():
    return {family: load_causal_lm(TINY / f"tiny-{family}") for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_the_traced_pass_is_the_models_forward(family, nets):
    """Logits at every position from the tracer's walk equal ``net.forward`` (the model's kernels),
    and the head's rows of two tokens give their logits."""
    net = nets[family]
    ids = np.array([ids_of(family)])
    tracer = Tracer(net)
    trace = tracer.run(ids)
    want = net.forward(ids)[0]
    np.testing.assert_allclose(tracer.logits(trace.final)[0], want, atol=1e-5)
    np.testing.assert_allclose(tracer.token_logits(trace.final[0], [3, 200]), want[:, [3, 200]], atol=1e-5)


def test_a_morphed_model_is_inspected_as_morphed(nets):
    """After block 1's attention is morphed to Q4_0 the traced pass follows the morphed weights
    (the model's forward, which changed)."""
    net = load_causal_lm(TINY / "tiny-llama")
    ids = np.array([IDS])
    before = Tracer(net).logits(Tracer(net).run(ids).final)[0]
    morph_sublayer(net.cells[2].children[0].children[1], 2, "Q4_0")
    after_model = net.forward(ids)[0]
    tracer = Tracer(net)
    after = tracer.logits(tracer.run(ids).final)[0]
    np.testing.assert_allclose(after, after_model, atol=1e-5)
    assert np.abs(after - before).max() > 1e-3


@pytest.mark.parametrize("family", FAMILIES)
def test_attributions_sum_to_the_logit(family, nets):
    """Embedding + heads + output biases + MLPs = the target's logit before any soft cap (the
    linearisation is exact for the frozen norm scales), and that logit is the model's (capped)."""
    net = nets[family]
    ids = ids_of(family)
    a = attribute(net, ids, token=77, position=5)
    assert a.total() == pytest.approx(a.logit, abs=1e-4 * max(1.0, abs(a.logit)))
    model_logit = net.forward(np.array([ids]))[0, 5, 77]
    head = net.cells[-1]
    capped = a.logit if head.softcap is None else float(soft_cap(np.float32(a.logit), head.softcap))
    assert capped == pytest.approx(model_logit, abs=1e-4)
    kinds = {kind for kind, *_ in a.components()}
    assert kinds == {"embed", "head", "attn_bias", "mlp"}
    assert len(a.components()) == 1 + net.args.num_layers * (net.args.num_heads + 2)


def test_a_disabled_block_is_looms_switch(nets):
    """Ablating block 1 with "disable" gives what the model gives with the block's is_disabled set,
    and "zero" (both halves add nothing) the same."""
    net = load_causal_lm(TINY / "tiny-llama")
    target = 9
    disabled = ablate(net, IDS, [Ablation("block", 1, mode="disable")], target=target, new_tokens=4)
    zeroed = ablate(net, IDS, [Ablation("block", 1, mode="zero")], target=target, new_tokens=4)
    net.cells[2].cfg.is_disabled = True
    seq, logits = list(IDS), None
    for _ in range(5):
        out = net.forward(np.array([seq]))[0, -1]
        logits = out if logits is None else logits
        seq.append(int(np.argmax(out)))
    log_p = float(np.log(np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum())[target])
    assert disabled.greedy_after == seq[len(IDS):len(IDS) + 4] == zeroed.greedy_after
    assert disabled.logprob_after == pytest.approx(log_p, abs=1e-5)
    assert zeroed.logprob_after == pytest.approx(log_p, abs=1e-5)
    pairs = zip(disabled.greedy_before, disabled.greedy_after, strict=True)
    assert disabled.changed == [a != b for a, b in pairs]


def test_mean_ablation_uses_the_prompts_mean(nets):
    """A head's mean ablation replaces its values by their mean over the prompt's positions: the
    same as an edit written here with that mean."""
    net = nets["qwen2"]
    tracer = Tracer(net)
    z = tracer.run(np.array([IDS]), keep=("z",))["z", 0][0]
    mean = z[:, 2].mean(axis=0)

    def edit(site, layer, value):
        if (site, layer) == ("z", 0):
            value = value.copy()
            value[:, :, 2] = mean
        return value

    logits = tracer.logits(tracer.run(np.array([IDS]), edit=edit).final)[0, -1]
    result = ablate(net, IDS, [Ablation("head", 0, 2, "mean")], new_tokens=0)
    want = logits - logits.max()
    want = float(want[result.target] - np.log(np.exp(want).sum()))
    assert result.logprob_after == pytest.approx(want, abs=1e-5)


@pytest.mark.parametrize("family", ["llama", "gemma2", "mixtral"])
def test_patching_the_one_differing_position_restores_it_all(family, nets):
    """Prompts differing at position 9 only: copying the clean residual there into block 0 gives
    the clean run exactly (share 1), and any other position at block 0 changes nothing (share 0)."""
    grid = patch(nets[family], IDS, CORRUPTED)
    restored = grid.restored
    assert restored[0, 9] == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(np.delete(restored[0], 9), 0.0, atol=1e-5)
    # positions after the last one that differs at no layer restore anything either (causal)
    np.testing.assert_allclose(restored[:, :9], 0.0, atol=1e-5)


@pytest.mark.parametrize("site", ["resid_pre", "attn_out", "mlp_out", "z"])
def test_the_batched_grid_is_one_run_per_cell(site, nets):
    """Each cell of the grid (a batch of cells run from the patched layer on) equals a whole
    unbatched run of the corrupted prompt with that one value copied in."""
    net = nets["gemma3"]
    tracer = Tracer(net)
    clean = tracer.run(np.array([IDS]), keep=(site,))
    grid = patch(net, IDS, CORRUPTED, site=site, batch=5)
    for layer, cell in ((0, 9 if site != "z" else 0), (1, 3), (2, 11 if site != "z" else 1)):
        def edit(name, i, value, layer=layer, cell=cell):
            if (name, i) != (site, layer):
                return value
            value = value.copy()
            if site == "z":
                value[:, :, cell] = clean[site, layer][:, :, cell]
            else:
                value[:, cell] = clean[site, layer][:, cell]
            return value

        logits = tracer.token_logits(tracer.run(np.array([CORRUPTED]), edit=edit).final[:, -1],
                                     [grid.answer, grid.wrong])[0]
        assert grid.diffs[layer, cell] == pytest.approx(logits[0] - logits[1], abs=1e-4)


@pytest.mark.parametrize("family", ["gemma2", "qwen3moe"])
def test_patterns_are_softmaxed_over_the_positions_each_query_sees(family, nets):
    """Rows sum to 1; no weight on later positions or (gemma2's window of 4) positions 4 or more
    back; thumbnails are max-pooled cells; attending_to is the mean of a column."""
    net = nets[family]
    p = attention_patterns(net, IDS)
    T = len(IDS)
    for i in range(p.n_layers):
        window = net.cells[1 + i].children[0].children[1].spec.window
        weights = p.layer(i)
        np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-5)
        q, k = np.indices((T, T))
        unseen = (k > q) | ((q - k >= window) if window else False)
        assert np.all(weights[:, unseen] == 0)
        np.testing.assert_array_equal(p.head(i, 1), weights[1])
    thumbs = p.thumbnails(5)
    edges = np.linspace(0, T, 6).astype(int)
    layer2 = p.layer(2)
    for r in range(5):
        for c in range(5):
            cell = layer2[:, edges[r]:edges[r + 1], edges[c]:edges[c + 1]]
            np.testing.assert_array_equal(thumbs[2, :, r, c], cell.max(axis=(1, 2)))
    np.testing.assert_allclose(p.attending_to(4)[1], p.layer(1)[:, 4:, 4].mean(axis=1), atol=1e-7)
    np.testing.assert_allclose(p.attending_to(4, query=7)[0], p.layer(0)[:, 7, 4], atol=1e-7)


def test_the_lens_last_row_is_the_models_prediction(nets):
    """The last row is the model's softmax: its top-k, the target's probability and rank."""
    net = nets["granite"]
    lens = logit_lens(net, IDS, target=33, k=4)
    logits = net.forward(np.array([IDS]))[0].astype(np.float64)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    np.testing.assert_array_equal(lens.top_ids[-1], np.argsort(-logits, axis=-1, kind="stable")[:, :4])
    np.testing.assert_allclose(lens.top_probs[-1], np.sort(probs, axis=-1)[:, ::-1][:, :4], atol=1e-6)
    np.testing.assert_allclose(lens.target_probs[-1], probs[:, 33], atol=1e-6)
    np.testing.assert_array_equal(lens.target_ranks[-1], (logits > logits[:, 33:34]).sum(-1))
    assert lens.row_names == ["embed", "block 0", "block 1", "block 2"]
    assert logit_lens(net, IDS).target == int(np.argmax(logits[-1]))


@pytest.mark.parametrize("backend", ["strict"])
def test_the_strict_backend_gives_the_same_numbers(backend, nets):
    """A model placed on array-api-strict's device: patterns, lens, attributions, ablation and a
    patching grid equal the numpy results (float32 tolerance)."""
    pytest.importorskip("array_api_strict")
    host = nets["qwen3moe"]
    device = load_causal_lm(TINY / "tiny-qwen3moe")
    device.place(backend)
    np.testing.assert_allclose(attention_patterns(device, IDS).layer(1),
                               attention_patterns(host, IDS).layer(1), atol=1e-5)
    a, b = logit_lens(device, IDS, target=5), logit_lens(host, IDS, target=5)
    np.testing.assert_allclose(a.target_probs, b.target_probs, atol=1e-5)
    np.testing.assert_array_equal(a.top_ids[:, :, 0], b.top_ids[:, :, 0])
    a, b = attribute(device, IDS, 5), attribute(host, IDS, 5)
    np.testing.assert_allclose(a.heads, b.heads, atol=1e-4)
    np.testing.assert_allclose(a.mlp, b.mlp, atol=1e-4)
    ablations = [Ablation("head", 1, 2, "mean"), Ablation("mlp", 0)]
    a, b = ablate(device, IDS, ablations, new_tokens=3), ablate(host, IDS, ablations, new_tokens=3)
    assert a.greedy_after == b.greedy_after and a.logprob_after == pytest.approx(b.logprob_after, abs=1e-4)
    for site in ("resid_pre", "z"):
        np.testing.assert_allclose(patch(device, IDS, CORRUPTED, site=site).diffs,
                                   patch(host, IDS, CORRUPTED, site=site).diffs, atol=1e-4)


def test_bad_requests_get_one_clear_error(nets):
    net = nets["llama"]
    with pytest.raises(InspectError, match="equally long"):
        patch(net, IDS, IDS[:-1])
    with pytest.raises(InspectError, match="site 'nowhere'"):
        patch(net, IDS, CORRUPTED, site="nowhere")
    with pytest.raises(InspectError, match="layer 3 does not exist"):
        ablate(net, IDS, [Ablation("mlp", 3)])
    with pytest.raises(InspectError, match="head 4 does not exist"):
        ablate(net, IDS, [Ablation("head", 0, 4)])
    with pytest.raises(InspectError, match="only a block can be disabled"):
        ablate(net, IDS, [Ablation("mlp", 0, mode="disable")])
    with pytest.raises(InspectError, match="kind 'neuron'"):
        ablate(net, IDS, [Ablation("neuron", 0)])
    with pytest.raises(InspectError, match="vocabulary"):
        logit_lens(net, IDS, target=256)
    with pytest.raises(InspectError, match="vocabulary"):
        attention_patterns(net, [1, 2, 999])
    with pytest.raises(InspectError, match="outside the sequence"):
        attribute(net, IDS, position=12)
    with pytest.raises(InspectError, match="one sequence"):
        logit_lens(net, [IDS, IDS])
    with pytest.raises(InspectError, match="context length"):
        attention_patterns(net, [1] * (net.args.context_length + 1))
    with load_model(TINY / "tiny-bert") as bert:
        with pytest.raises(InspectError, match="embedding model"):
            Inspector(bert)
        with pytest.raises(InspectError, match="embedding model"):
            Tracer(bert.net)


def test_long_work_reports_progress_and_stops_when_cancelled(nets):
    net = nets["llama"]
    seen = []
    patch(net, IDS, CORRUPTED, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    stop = threading.Event()

    def cancel_after_first(done, total):
        stop.set()

    with pytest.raises(LoomCancelled):
        patch(net, IDS, CORRUPTED, progress=cancel_after_first, cancel=stop)
    seen.clear()
    attention_patterns(net, IDS, progress=lambda done, total: seen.append((done, total)))
    assert seen == [(1, 3), (2, 3), (3, 3)]
    with pytest.raises(LoomCancelled):
        logit_lens(net, IDS, cancel=lambda: True)
    with pytest.raises(LoomCancelled):
        attribute(net, IDS, progress=cancel_after_first, cancel=stop)
    with pytest.raises(LoomCancelled):
        ablate(net, IDS, [Ablation("mlp", 0)], progress=cancel_after_first, cancel=stop)
