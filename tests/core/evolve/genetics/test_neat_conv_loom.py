"""NEAT re-initialising layers into CNN1 / ConvTransposed1D draws as Loom does, also later: Loom
gives such a layer F·C·k² weights (ours runs on F·C·k), and a later mutation perturbs every one of
them, so every draw after it depends on that count. Against Loom itself:
tests/data/neat-conv-goldens.json, made by welvet 0.80.0 with make_neat_conv_golden.py."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from loomlab.core.evolve.genetics.clone import clone_network
from loomlab.core.evolve.genetics.gorand import GoRand
from loomlab.core.evolve.genetics.neat import NEATConfig, neat_mutate, reinitialised
from loomlab.core.evolve.search.population import NEATPopulation
from loomlab.core.io.loom_json import dumps, load_json, network_to_dict, read_network
from loomlab.core.layers.base import make_layer
from loomlab.core.network import VolumetricNetwork

from .test_loom import loom_differences

GOLDEN = json.loads((Path(__file__).resolve().parents[3] / "data" / "neat-conv-goldens.json").read_text())


_AXES = ("input_width", "output_width", "input_depth", "output_depth")


def case_ids(cases):
    return [c["name"] for c in cases]


def blob(layer: dict) -> np.ndarray | None:
    return np.frombuffer(base64.b64decode(layer["weights"]), "<f4") if layer.get("weights") else None


def loom_values(layer) -> np.ndarray:
    """All the weights Loom's layer holds: ours, then the rest of a CNN1/ConvTransposed1D's."""
    store = layer.weights
    return np.concatenate([store.master, getattr(store, "loom_rest", np.empty(0, np.float32))])


def differences(net: VolumetricNetwork, loom: dict, where: str, *, weights_of_conv: bool) -> list[str]:
    """Where ``net`` is not Loom's: every layer's type, activation, flags, links, sizes and
    weights must be Loom's; a layer Loom gives more weights than ours must hold as many in all,
    and (``weights_of_conv``) Loom's very values."""
    ours = network_to_dict(net)
    assert len(ours["layers"]) == len(loom["layers"])
    diffs = []
    for (coord, layer), a, b in zip(net.layers(), ours["layers"], loom["layers"], strict=True):
        wb = blob(b)
        if layer.weights is not None and wb is not None and len(layer.weights) != wb.size:
            # a re-initialised CNN1/ConvTransposed1D: F·C·k of Loom's F·C·k² run here
            got = loom_values(layer)
            if got.size != wb.size or (weights_of_conv and not np.array_equal(got, wb)):
                diffs.append(f"{where} {coord} {b['type']}: Loom's {wb.size} weights, ours {got.size} in all")
            a, b = {**a, "weights": None}, {**b, "weights": None}
        for axis in _AXES:
            # an axis we sized where Loom left it 0 (docs/compat.md) stays when NEAT turns the
            # layer into another type, as Loom keeps any old field
            if b.get(axis) is None and a.get(axis) in (1, a.get("input_height")):
                a = {k: v for k, v in a.items() if k != axis}
        diffs += [f"{where} {coord}{d}" for d in loom_differences(a, b)]
    return diffs


@pytest.mark.parametrize("case", GOLDEN["chains"], ids=case_ids(GOLDEN["chains"]))
def test_mutating_a_mutant_with_conv_layers_draws_as_loom(case):
    # each child mutated again, as a population's member is: a conv layer NEAT made is perturbed
    # with one draw per Loom weight, so the layers after it, and the next child, stay Loom's
    net, diffs = read_network(case["parent"]), []
    for i, (seed, loom) in enumerate(zip(case["seeds"], case["children"], strict=True)):
        net = neat_mutate(net, NEATConfig.from_loom({**case["config"], "Seed": seed}))
        diffs += differences(net, loom, f"child {i + 1}", weights_of_conv=True)
        again = load_json(dumps(net).encode())  # saves and reloads (F·C·k weights in the file)
        assert dumps(again) == dumps(net)
    assert not diffs, diffs


@pytest.mark.parametrize("case", GOLDEN["populations"], ids=case_ids(GOLDEN["populations"]))
def test_population_with_conv_members_equals_loom(case):
    config = NEATConfig.from_loom(case["config"])
    pop = NEATPopulation(read_network(case["seed_network"]), case["size"], config)
    diffs = []
    for i, (member, loom) in enumerate(zip(pop.members, case["initial_members"], strict=True)):
        diffs += differences(member, loom, f"gen 0 member {i}", weights_of_conv=True)
    for generation, step in enumerate(case["generations"], 1):
        pop.evolve(step["fitness"])
        assert pop.summary(generation) == step["summary"]
        assert pop.best_fitness == step["best_fitness"]
        for i, (member, loom) in enumerate(zip(pop.members, step["members"], strict=True)):
            # splicing blends our F·C·k weights of such a layer, Loom all F·C·k² (docs/compat.md):
            # their values may differ, their count and every other layer may not
            diffs += differences(member, loom, f"gen {generation} member {i}", weights_of_conv=False)
    assert not diffs, diffs


@pytest.mark.parametrize("new_type", ["CNN1", "ConvTransposed1D"])
def test_a_re_initialised_1d_conv_keeps_all_of_looms_weights(new_type):
    config = dataclasses.replace(NEATConfig.default(7, seed=1), default_in_channels=2, default_filters=3,
                                 default_kernel_size=2)
    dense = make_layer("Dense", input_height=7, output_height=7, rng=np.random.default_rng(0))
    rng = GoRand(5)
    layer = reinitialised(dense, new_type, config, rng)
    assert len(layer.weights) == 3 * 2 * 2  # F·C·k: the layer runs on these
    ref = GoRand(5)
    seed = ref.int63()  # the one draw Loom makes from the mutation's generator, whatever the layer
    assert rng.state() == ref.state()
    expected = (GoRand(seed).float32_array(3 * 2 * 4) * np.float32(2) - np.float32(1)) * np.float32(0.05)
    assert np.array_equal(loom_values(layer), expected)  # Loom's Randomize: F·C·k² values
    net = VolumetricNetwork(1, 1, 1, 1)
    net[0, 0, 0, 0] = layer
    assert np.array_equal(loom_values(clone_network(net)[0, 0, 0, 0]), expected)  # a copy keeps them
    only_1d = dataclasses.replace(config, allowed_layer_types=(10, 4))
    assert only_1d.largest_new_layer() == ("ConvTransposed1D", 3 * 2 * 4)  # what the layer holds
