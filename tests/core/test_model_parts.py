"""How big a network is, in the words every panel uses (layer_names.Parts): counts against the
builders' own layouts, and one phrase for a language model's file and its loaded network."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from loomlab.core import VolumetricNetwork, make_layer
from loomlab.core.layer_names import Parts, layer_name, model_parts
from loomlab.core.llm.model.loader import load_causal_lm

TINY_LLAMA = Path(__file__).resolve().parent.parent / "data" / "tiny-hf" / "tiny-llama"


def nested_net() -> VolumetricNetwork:
    rng = np.random.default_rng(0)
    net = VolumetricNetwork(1, 1, 4, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=4, output_height=4, rng=rng)
    net[0, 0, 1, 0] = make_layer("Sequential", children=[
        make_layer("Dense", input_height=4, output_height=4, rng=rng), make_layer("Residual")])
    net[0, 0, 3, 0] = make_layer("Dense", input_height=4, output_height=2, rng=rng)  # cell 2 empty
    return net


def test_a_network_counts_its_grid_cells_every_layer_and_the_weighted_ones():
    parts = model_parts(nested_net())
    assert parts == Parts(cells=4, per_cell=1, blocks=None, layers=5, weighted=3)
    assert str(parts) == "4 cells · 5 layers, 3 weighted"
    net = VolumetricNetwork(2, 1, 3, 2)
    net[1, 0, 2, 1] = make_layer("Residual")
    assert str(model_parts(net)) == "6 cells × 2 per cell · 1 layer, 0 weighted"


def test_a_language_model_counts_blocks_and_block_n_sits_in_cell_n_plus_1():
    blocks = json.loads((TINY_LLAMA / "config.json").read_text())["num_hidden_layers"]
    net = load_causal_lm(TINY_LLAMA)
    try:
        parts = model_parts(net)
        # a llama block: Sequential[attention half [norm, attention], Residual, MLP half [norm, MLP],
        # Residual] = 9 layers, 4 weighted; around them embedding, final norm and head
        assert parts == Parts(cells=blocks + 3, per_cell=1, blocks=blocks, layers=9 * blocks + 3,
                              weighted=4 * blocks + 3)
        assert str(parts) == f"{blocks} blocks in {blocks + 3} cells · {9 * blocks + 3} layers, " \
                             f"{4 * blocks + 3} weighted"
        for n in range(blocks):
            assert layer_name(net, (0, 0, n + 1, 0, "")).label == f"block {n}"
        # the file's header alone says the same first words
        assert str(Parts.of_language_model(blocks)) == f"{blocks} blocks in {blocks + 3} cells"
    finally:
        net.close()
