"""Identical layers score exactly 1 and no score leaves [-1, 1], so a model compared with its
morphed copy shows its untouched layers as 1 and the morphed ones below (Loom's float32 sum puts a
layer against itself at 1 +- a few ulp, and a float32 sum over a 65,521-wide sketch errs by ~1e-5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from loomlab.core import VolumetricNetwork, make_layer
from loomlab.core.evolve.genetics.dna import compare_dna, extract_dna
from loomlab.core.evolve.llm.dna_table import model_report
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.morph import morph_sublayer

TINY_LLAMA = Path(__file__).resolve().parents[3] / "data" / "tiny-hf" / "tiny-llama"


def dense_net(seed: int) -> VolumetricNetwork:
    rng = np.random.default_rng(seed)
    net = VolumetricNetwork(1, 1, 1, 4)
    for i in range(4):
        net[0, 0, 0, i] = make_layer("Dense", input_height=37, output_height=29, rng=rng)
    return net


def test_a_network_against_itself_scores_exactly_1_where_a_float32_sum_does_not():
    off = 0
    for seed in range(5):
        dna = extract_dna(dense_net(seed))
        comparison = compare_dna(dna, dna)
        assert set(comparison.layer_overlaps.values()) == {1.0} and comparison.overall_overlap == 1.0
        assert comparison.logic_shifts == []  # no layer is its neighbour
        # the oracle that the case is real: Loom's in-order float32 sum of u * u misses 1
        off += sum(float(np.cumsum(s.weights * s.weights, dtype=np.float32)[-1]) != 1.0 for s in dna)
    assert off > 0


def test_a_model_against_its_morphed_copy_shows_exactly_the_morphed_layer():
    a, b = load_causal_lm(TINY_LLAMA), load_causal_lm(TINY_LLAMA)
    try:
        mlp = b.cells[2].children[2].children[1]  # block 1's MLP
        morph_sublayer(mlp, 2, "int8")
        report = model_report(a, b)
        morphed = [r for r in report.rows if r.name == "blk.1.ffn_gate/up/down"]
        assert len(morphed) == 1 and 0.99 < morphed[0].overlap < 1.0
        block = next(r for r in report.rows if r.name == "block 1 (all of it)")
        assert 0.99 < block.overlap < 1.0
        untouched = [r for r in report.rows if r is not morphed[0] and r is not block]
        assert untouched and {r.overlap for r in untouched} == {1.0}
        assert all(-1.0 <= r.overlap <= 1.0 for r in report.rows)
        # the heatmap marks that one cell below 1
        values = report.heatmap.values
        assert np.count_nonzero(values[np.isfinite(values)] < 1.0) == 1
    finally:
        a.close()
        b.close()
