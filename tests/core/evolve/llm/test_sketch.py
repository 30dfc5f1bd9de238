"""LLM DNA sketches (core.evolve.llm.sketch) against exact cosines of the same weights.

Oracle: the cosine of the dequantized weights themselves, in float64, for SmolLM2's real layers
(a layer against its int8 morph, against itself plus as much noise, against another block);
for layers no wider than the sketch the sketch is the weights, so their cosine must be exact.
"""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core import VolumetricNetwork
from loomlab.core.errors import LoomCancelled, LoomConfigError
from loomlab.core.evolve.genetics.dna import compare_dna, extract_dna
from loomlab.core.evolve.llm.sketch import DEFAULT_WIDTH, compare_models, sketch_dna, sketch_vector
from loomlab.core.layers.base import make_layer
from loomlab.core.llm.files import registry
from loomlab.core.llm.model.llm_layers import dense
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.morph import morph_all

TOLERANCE = 0.02  # issue 12 §5: sketch cosine within 0.02 of the exact cosine
BLOCKS = (1, 10, 20, 30)  # grid cells of transformer blocks (cell 0 is the embedding)


@pytest.fixture(scope="module")
def smollm2():
    net = load_causal_lm(registry.fetch("smollm2-135m"))
    yield net
    net.close()


@pytest.fixture(scope="module")
def smollm2_int8():
    net = load_causal_lm(registry.fetch("smollm2-135m"))
    morph_all(net, "int8")
    yield net
    net.close()


def file_weights(layer) -> np.ndarray:
    return np.concatenate([dense(m).reshape(-1) for m in layer.weights.blocks.values()]).astype(np.float64)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def weighted(net, cell: int) -> list:
    return [la for la in net.cells[cell].walk() if la.weights is not None]


def test_sketch_cosine_is_within_002_of_the_exact_cosine_on_real_layers(smollm2):
    rng = np.random.default_rng(0)
    seen = {"other block": [], "noise": []}
    for cell in BLOCKS:
        other = BLOCKS[(BLOCKS.index(cell) + 1) % len(BLOCKS)]
        for la, lb in zip(weighted(smollm2, cell), weighted(smollm2, other), strict=True):
            a = file_weights(la)
            noisy = a + rng.standard_normal(a.size) * a.std()
            for what, b in (("other block", file_weights(lb)), ("noise", noisy)):
                exact = cosine(a, b)
                sketched = float(sketch_vector([a.astype(np.float32)])
                                 @ sketch_vector([b.astype(np.float32)]))
                assert abs(sketched - exact) <= TOLERANCE, (cell, la.cfg.type, what, exact, sketched)
                seen[what].append(exact)
    # the oracle spans unrelated layers (attention, MLP of two blocks), half-related ones and
    # near-identical ones (the norms of two blocks), not only the last
    other = sorted(map(abs, seen["other block"]))
    assert other[0] < 0.01 and other[-1] > 0.9 and 0.6 < min(seen["noise"]) < 0.8


def test_a_model_and_its_int8_morph_score_at_least_099_per_layer(smollm2, smollm2_int8):
    comparison = compare_models(smollm2, smollm2_int8)
    positions = [f"0,0,{x},0" for x in range(len(smollm2.cells))]
    assert list(comparison.layer_overlaps) == positions  # lined up by grid position
    assert min(comparison.layer_overlaps.values()) >= 0.99
    assert comparison.logic_shifts == []  # every layer's best match is itself
    # the oracle: each block's overlap is the mean of its layers' exact cosines (Loom's container rule)
    for cell in (0, *BLOCKS, len(smollm2.cells) - 1):
        pairs = zip(weighted(smollm2, cell), weighted(smollm2_int8, cell), strict=True)
        exact = np.mean([cosine(file_weights(la), lb.weights.dequantized(lb.cfg.dtype)) for la, lb in pairs])
        assert abs(comparison.layer_overlaps[f"0,0,{cell},0"] - exact) <= TOLERANCE
        assert exact < 1  # int8 did change the weights


def test_sketches_are_deterministic_and_the_same_whether_read_as_blocks_or_flat(smollm2):
    mlp = weighted(smollm2, 5)[-1]  # Q4_1 matrices read row block by row block
    from_blocks = sketch_vector(list(mlp.weights.blocks.values()))
    flat = sketch_vector([file_weights(mlp).astype(np.float32)])
    assert from_blocks.shape == (DEFAULT_WIDTH,)
    np.testing.assert_allclose(from_blocks, flat, atol=1e-6)
    np.testing.assert_array_equal(from_blocks, sketch_vector(list(mlp.weights.blocks.values())))
    dna = sketch_dna(smollm2)
    assert dna.signatures[0].weights is dna.signatures[-1].weights  # the tied head: sketched once


def test_a_layer_no_wider_than_the_sketch_has_its_exact_cosine():
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(500).astype(np.float32), rng.standard_normal(500).astype(np.float32)
    b += a
    assert sketch_vector([a], 500).shape == (500,)
    assert float(sketch_vector([a], 500) @ sketch_vector([b], 500)) == pytest.approx(cosine(a, b), abs=1e-6)


def small_net(seed: int) -> VolumetricNetwork:
    rng = np.random.default_rng(seed)
    net = VolumetricNetwork(1, 1, 3, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=8, output_height=16, activation="Tanh", rng=rng)
    net[0, 0, 1, 0] = make_layer("Sequential", children=[
        make_layer("RMSNorm", input_height=16, output_height=16, rng=rng),
        make_layer("Dense", input_height=16, output_height=4, rng=rng)])
    net[0, 0, 2, 0] = make_layer("Softmax")
    return net


def test_on_a_small_network_the_sketch_gives_loom_dna_overlaps():
    a, b = small_net(0), small_net(1)
    morph_all(b, "int8")
    exact = compare_dna(extract_dna(a, dequantized=True), extract_dna(b, dequantized=True),
                        across_dtypes=True)
    sketched = compare_dna(sketch_dna(a), sketch_dna(b), across_dtypes=True)
    assert list(sketched.layer_overlaps) == list(exact.layer_overlaps) == ["0,0,0,0", "0,0,1,0", "0,0,2,0"]
    for key, value in exact.layer_overlaps.items():
        assert sketched.layer_overlaps[key] == pytest.approx(value, abs=1e-6)


def test_progress_per_layer_cancel_and_bad_arguments():
    net = small_net(0)
    calls = []
    sketch_dna(net, progress=lambda *a: calls.append(a))
    assert calls == [("sketch", 1, 3), ("sketch", 2, 3), ("sketch", 3, 3)]
    with pytest.raises(LoomCancelled, match="after 0 of 3 layers"):
        sketch_dna(net, cancel=lambda: True)
    for width in (0, 2**21, 1.5, True):
        with pytest.raises(LoomConfigError, match="sketch width must be an integer from 1 to"):
            sketch_dna(net, width=width)
    with pytest.raises(LoomConfigError, match="takes a network or a model holding one, got str"):
        sketch_dna("net.json")
