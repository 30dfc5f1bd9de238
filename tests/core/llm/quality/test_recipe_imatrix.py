"""Recipes applied with an importance matrix (llama-quantize ``--imatrix``).

Oracle: the weighted quantizer itself (``quantize(matrix, fmt, importance)``, byte-identical to
llama.cpp's C in test_quantize_imatrix.py) on each file matrix with its tensor's imatrix vector:
applying a recipe must give every matrix exactly those bytes, and a tensor the imatrix has no
entry for the unweighted bytes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from loomlab.core.llm.kernels.quantize import quantize
from loomlab.core.llm.model.llm_layers import dense
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.quality.imatrix import collect_imatrix
from loomlab.core.llm.quality.recipe import apply_recipe, plan_recipe, weighted_layers

TINY = Path(__file__).resolve().parents[3] / "data" / "tiny-hf" / "tiny-llama"
CHUNKS = [[1, 17, 42, 99, 3, 250, 7, 7], [1, 5, 9, 200, 64, 128, 31, 2]]


@pytest.mark.parametrize("fmt", ["Q4_0", "Q5_1"])
def test_a_recipe_with_an_imatrix_quantizes_each_matrix_with_its_vector(fmt):
    net = load_causal_lm(TINY)
    im = collect_imatrix(net, CHUNKS)
    skipped = "blk.1.attn_k.weight"

    def importance(name):
        return im.importance(name) if name in im.in_sum2 and name != skipped else None

    plan = plan_recipe(net, fmt)
    planned = {lp.position: lp.parts for lp in plan.layers}
    apply_recipe(net, plan, importance=importance)
    checked = 0
    for la in weighted_layers(net):
        store = la.layer.weights
        for part, name in la.parts.items():
            if part not in planned.get(la.position, {}):
                continue
            vector = importance(name)
            want = quantize(dense(store.blocks[part]), fmt, vector)
            got = store.encoded[part].raw_blocks
            np.testing.assert_array_equal(got.ravel(), want.view(np.uint8).ravel(), err_msg=name)
            checked += vector is not None
    assert checked == 3 * 7 - 1  # every block matrix the imatrix covers (7 per block), one left out
    unweighted = load_causal_lm(TINY)
    apply_recipe(unweighted, plan)
    differs = [name for la, lb in zip(weighted_layers(net), weighted_layers(unweighted), strict=True)
               for part, name in la.parts.items() if part in planned.get(la.position, {})
               and not np.array_equal(la.layer.weights.encoded[part].raw_blocks,
                                      lb.layer.weights.encoded[part].raw_blocks)]
    assert differs and skipped not in differs
