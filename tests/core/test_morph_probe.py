"""Drift measures for morphed networks: KL / top-1 agreement by hand, relative output drift on a
probe (the number `net morph-report` prints), and per-layer morphing of nested layers (spelled like
core.morph's reports)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from loomlab.core import LoomConfigError, VolumetricNetwork, make_layer
from loomlab.core.llm.model.llm_layers import LLMEmbedding
from loomlab.core.morph import (
    dtype_sweep,
    layer_report,
    morph_all,
    morph_sublayer,
    output_drift,
    probe_input,
    report,
    weighted_cells,
)
from loomlab.core.morph_probe import (
    ProbeResult,
    compare,
    llm_probe,
    log_softmax,
    net_drift,
    net_outputs,
)


def probe(logits) -> ProbeResult:
    logits = np.asarray(logits, dtype=np.float32)
    return ProbeResult(np.arange(len(logits)), logits)


def nested_net(seed: int = 0) -> VolumetricNetwork:
    rng = np.random.default_rng(seed)

    def dense(i, o):
        return make_layer("Dense", input_height=i, output_height=o, activation="Tanh", rng=rng,
                          init_scale=0.5)

    net = VolumetricNetwork(1, 1, 3, 1)
    net[0, 0, 0, 0] = dense(6, 8)
    net[0, 0, 1, 0] = make_layer("Sequential", children=[dense(8, 8), make_layer("Residual"), dense(8, 4)])
    net[0, 0, 2, 0] = dense(4, 3)
    return net


# ----- KL and top-1 against formulas -------------------------------------------------------------
def test_a_distribution_has_no_divergence_from_itself():
    p = probe(np.random.default_rng(1).standard_normal((5, 11)) * 4)
    assert compare(p, p) == {"kl_mean": 0.0, "kl_max": 0.0, "top1_agreement": 1.0}


def test_kl_and_agreement_on_hand_worked_examples():
    # p = (1/2, 1/2) vs q = (3/4, 1/4): KL = 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3);
    # p = (9/10, 1/10) vs q = (1/10, 9/10): KL = 9/10 ln 9 + 1/10 ln(1/9) = 4/5 ln 9
    reference = probe([[0.0, 0.0], [math.log(9), 0.0]])
    current = probe([[math.log(3), 0.0], [0.0, math.log(9)]])
    got = compare(reference, current)
    kl = [0.5 * math.log(4 / 3), 0.8 * math.log(9)]
    assert got["kl_mean"] == pytest.approx(np.mean(kl), rel=1e-6)
    assert got["kl_max"] == pytest.approx(kl[1], rel=1e-6)
    assert got["top1_agreement"] == 0.5  # the tie (0, 0) resolves to token 0 as (ln 3, 0) does
    assert compare(current, reference)["kl_max"] == pytest.approx(kl[1], rel=1e-6)  # symmetric here


def test_kl_ignores_a_constant_added_to_the_logits():
    logits = np.random.default_rng(2).standard_normal((3, 7)).astype(np.float32)
    got = compare(probe(logits), probe(logits + 5.0))
    assert got["kl_max"] < 1e-12 and got["top1_agreement"] == 1.0


def test_log_softmax_is_float64_and_stable_for_large_logits():
    x = np.array([[1000.0, 999.0, -1000.0]], np.float32)
    got = log_softmax(x)
    assert got.dtype == np.float64 and np.all(np.isfinite(got))
    np.testing.assert_allclose(np.exp(got).sum(), 1.0, rtol=1e-12)
    np.testing.assert_allclose(got[0, 0] - got[0, 1], 1.0, rtol=1e-12)


def test_probes_of_different_tokens_do_not_compare():
    a = probe(np.zeros((2, 3)))
    with pytest.raises(ValueError):
        compare(a, ProbeResult(np.array([0, 5]), a.logits))


# ----- small networks -----------------------------------------------------------------------------
def test_net_drift_is_the_relative_drift_net_morph_report_prints_and_zero_after_revert():
    net = nested_net()
    x = probe_input(net)
    y0 = net_outputs(net, x)
    assert y0.dtype == np.float64
    morph_all(net, "int4")
    y = np.asarray(net.forward(x), dtype=np.float64)
    by_hand = math.sqrt(np.sum((y - y0) ** 2) / np.sum(y0 ** 2))
    assert net_drift(y0, net, x) == pytest.approx(by_hand, rel=1e-12) and by_hand > 1e-3
    [row] = dtype_sweep(nested_net, x, ["int4"])  # what `loomlab net morph-report` prints
    assert net_drift(y0, net, x) == row.output_drift
    morph_all(net, "float32")
    assert net_drift(y0, net, x) == 0.0


def test_output_drift_of_an_all_zero_reference_is_the_plain_norm():
    assert output_drift(np.zeros(4), np.array([3.0, 0, 4, 0])) == 5.0
    assert output_drift(np.array([[1.0, 2.0], [2.0, 4.0]]), np.array([[1.0, 2.0], [2.0, 9.0]])) == 1.0


def test_weighted_cells_follow_the_order_of_core_reports():
    net = nested_net()
    got = [(index, layer.path) for index, layer in weighted_cells(net)]
    assert got == [(r.index, r.path) for r in report(net)]
    assert got[1] == (1, "sequential_layers[0]") and len(got) == 4


def test_morph_sublayer_reaches_nested_layers_like_morph_all():
    net, twin = nested_net(), nested_net()
    index, layer = weighted_cells(net)[2]  # the Sequential's second Dense
    r = morph_sublayer(layer, index, "INT8")  # Loom's spellings are accepted
    assert layer.cfg.dtype == "int8" and r.dtype == "int8" and r.path == "sequential_layers[2]"
    assert r == [x for x in morph_all(twin, "int8") if x.path == r.path][0]
    assert [la.cfg.dtype for _, la in weighted_cells(net)] == ["float32", "float32", "int8", "float32"]


def test_a_bad_dtype_changes_nothing():
    net = nested_net()
    index, layer = weighted_cells(net)[1]
    with pytest.raises(LoomConfigError):
        morph_sublayer(layer, index, "int7")
    assert layer.cfg.dtype == "float32" and layer.weights.native == {}


def test_layer_report_against_the_weights_directly():
    net = nested_net()
    cells = weighted_cells(net)
    morph_sublayer(cells[0][1], 0, "fp8e4m3")
    for index, layer in cells:
        r = layer_report(layer, index)
        master = layer.weights.master.astype(np.float64)
        deq = layer.weights.dequantized(layer.cfg.dtype).astype(np.float64)
        assert r.dtype == layer.cfg.dtype and r.native_bytes == layer.weights.nbytes(layer.cfg.dtype)
        assert r.rel_error == pytest.approx(np.linalg.norm(deq - master) / np.linalg.norm(master), abs=1e-12)
        cosine = master @ deq / np.linalg.norm(master) / np.linalg.norm(deq)
        assert r.cosine == pytest.approx(cosine, abs=1e-12)
    assert layer_report(cells[1][1], cells[1][0]).rel_error == 0.0  # float32: the master itself


def test_a_language_model_layers_report_builds_no_float32_copy():
    table = np.random.default_rng(0).standard_normal((12, 8)).astype(np.float32)
    layer = LLMEmbedding(table)
    r = layer_report(layer, 0)
    assert (r.dtype, r.native_bytes, r.rel_error, r.cosine) == ("F32", table.nbytes, 0.0, 1.0)
    assert layer.weights._master is None  # the file's weights are the reference: nothing was built


# ----- language models --------------------------------------------------------------------------
class _Tokenizer:
    def encode(self, text, add_special_tokens=False):
        return [1] * add_special_tokens + [2 + ord(c) % 5 for c in text]


class _Net:
    """Logits that depend on the whole prefix, so a last-position-only pass would be caught."""

    def step(self, ids, caches=None, *, last_only=True):
        assert caches is None and not last_only and ids.shape[0] == 1
        onehot = np.eye(8, dtype=np.float32)[ids[0]]
        return np.cumsum(onehot, axis=0)[None]


class _Model:
    tokenizer, net = _Tokenizer(), _Net()


def test_llm_probe_predicts_after_every_position_of_the_truncated_text():
    got = llm_probe(_Model(), "abcdefgh", max_tokens=4)
    assert got.ids.tolist() == [1, 2 + ord("a") % 5, 2 + ord("b") % 5, 2 + ord("c") % 5]
    assert got.logits.shape == (4, 8) and got.logits.dtype == np.float32
    np.testing.assert_array_equal(got.logits.sum(axis=1), [1, 2, 3, 4])


def test_llm_probe_refuses_an_empty_text():
    with pytest.raises(ValueError):
        llm_probe(_Model(), "", max_tokens=0)
