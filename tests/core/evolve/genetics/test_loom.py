"""Loom-exact DNA, splicing, NEAT mutation and populations against Loom's own results
(tests/data/evolve-goldens-seed1.json, made by the welvet 0.80.0 engine) and Go's math/rand."""

from __future__ import annotations

import base64
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from loomlab.core.errors import LoomConfigError
from loomlab.core.evolve.genetics.dna import DNA, compare_dna, extract_dna
from loomlab.core.evolve.genetics.gorand import GoRand
from loomlab.core.evolve.genetics.neat import NEATConfig, neat_mutate
from loomlab.core.evolve.genetics.splicing import SpliceConfig, splice
from loomlab.core.evolve.search.population import NEATPopulation
from loomlab.core.io.checkpoint import load_checkpoint, save_checkpoint
from loomlab.core.io.loom_json import dumps, load_json, network_to_dict, read_network
from loomlab.core.layers.base import layer_class, make_layer
from loomlab.core.network import VolumetricNetwork

from ...dna_goldens import loom_result

GOLDEN = json.loads((Path(__file__).resolve().parents[3] / "data" / "evolve-goldens-seed1.json").read_text())
OUR_KEYS = ("is_remote_link", "target_z", "target_y", "target_x", "target_l")  # Loom drops these on save


def case_ids(cases):
    return [c["name"] for c in cases]


# ----- Go's math/rand ---------------------------------------------------------------------
def test_go_rand_matches_go_for_seed_1():
    # rand.New(rand.NewSource(1)): Go's well-known first values
    r = GoRand(1)
    assert [r.int63() for _ in range(5)] == [5577006791947779410, 8674665223082153551, 6129484611666145821,
                                             4037200794235010051, 3916589616287113937]
    r = GoRand(1)
    assert [r.intn(100) for _ in range(10)] == [81, 87, 47, 59, 81, 18, 25, 40, 56, 0]
    r = GoRand(1)
    assert [r.float64() for _ in range(3)] == [0.6046602879796196, 0.9405090880450124, 0.6645600532184904]


@pytest.mark.parametrize("seed", [0, 42, -7, 89482311, 2**62 + 12345])
def test_go_rand_vector_draws_equal_scalar_draws(seed):
    a, b = GoRand(seed), GoRand(seed)
    vec = np.concatenate([a.float32_array(5), a.float32_array(700), a.float32_array(1)])
    assert np.array_equal(vec, np.array([b.float32() for _ in range(706)], dtype=np.float32))
    assert a.int63() == b.int63()  # both consumed the same number of words
    # seed 0 is Go's 89482311
    if seed == 0:
        assert GoRand(0).int63() == GoRand(89482311).int63()


def go_seed_register(seed: int) -> list[int]:
    """Go's rngSource.Seed as written in rng.go: seedrand by Schrage's method, step by step."""
    from loomlab.core.evolve.genetics._go_cooked import RNG_COOKED

    def seedrand(x: int) -> int:
        hi, lo = divmod(x, 44488)
        x = 48271 * lo - 3399 * hi
        return x + 2147483647 if x < 0 else x

    x = seed % 2147483647 or 89482311
    register = []
    for i in range(-20, 607):
        x = seedrand(x)
        if i >= 0:
            u = x << 40
            x = seedrand(x)
            u ^= x << 20
            x = seedrand(x)
            register.append((u ^ x ^ RNG_COOKED[i]) & 0xFFFF_FFFF_FFFF_FFFF)
    return register


@pytest.mark.parametrize("seed", [1, 0, -5, 2147483647, 2**62 + 12345, -(2**63), 2**63 - 1])
def test_go_rand_seeding_equals_gos_step_by_step_seeding(seed):
    # Go's first Int63 calls read register[334 - k] + register[607 - k], k = 1, 2, ...
    reg = go_seed_register(seed)
    r = GoRand(seed)
    for k in range(1, 700):
        reg[(334 - k) % 607] = (reg[(334 - k) % 607] + reg[(607 - k) % 607]) & 0xFFFF_FFFF_FFFF_FFFF
        assert r.int63() == reg[(334 - k) % 607] & ((1 << 63) - 1)


def test_go_rand_int31n_rejection_and_bounds():
    r, s = GoRand(3), GoRand(3)
    n = 3 * 2**29  # not a power of two: rejection sampling above the largest multiple
    limit = (1 << 31) - 1 - (1 << 31) % n
    for _ in range(200):
        v = r.int31n(n)
        # the slow definition: draw Int31 until it is at most limit, then take it modulo n
        w = s.int63() >> 32
        while w > limit:
            w = s.int63() >> 32
        assert v == w % n and 0 <= v < n
    with pytest.raises(LoomConfigError):
        r.intn(0)
    with pytest.raises(LoomConfigError):
        GoRand(1.5)


# ----- DNA ----------------------------------------------------------------------------------
def f32(v):
    return np.float32(v)


@pytest.mark.parametrize("case", GOLDEN["dna_signatures"], ids=case_ids(GOLDEN["dna_signatures"]))
def test_extract_dna_equals_loom(case):
    ours = extract_dna(read_network(case["network"])).to_loom()
    assert len(ours) == len(case["dna"])
    for a, b in zip(ours, case["dna"], strict=True):
        assert {k: a[k] for k in "ZYXL"} == {k: b[k] for k in "ZYXL"}
        assert (a["Type"], a["DType"]) == (b["Type"], b["DType"])
        assert np.array_equal(np.float32(a["Weights"]), np.float32(b["Weights"]))
    assert DNA.from_loom(case["dna"]).to_loom() == [{**s, "Weights": [float(f32(w)) for w in s["Weights"]]}
                                                     for s in case["dna"]]


@pytest.mark.parametrize("case", GOLDEN["dna_pairs"], ids=case_ids(GOLDEN["dna_pairs"]))
def test_compare_dna_equals_loom(case):
    a, b = read_network(case["a"]), read_network(case["b"])
    ours, loom = compare_dna(a, b).to_loom(), loom_result(case["result"])  # identical layers: exactly 1
    assert f32(ours["OverallOverlap"]) == f32(loom["OverallOverlap"])
    assert {k: f32(v) for k, v in ours["LayerOverlaps"].items()} == \
        {k: f32(v) for k, v in loom["LayerOverlaps"].items()}
    assert [(s["SourcePos"], s["TargetPos"], f32(s["Overlap"])) for s in ours["LogicShifts"]] == \
        [(s["SourcePos"], s["TargetPos"], f32(s["Overlap"])) for s in loom["LogicShifts"]]
    # the same from DNA objects
    assert compare_dna(extract_dna(a), extract_dna(b)).to_loom() == ours


def test_dna_across_dtypes_compares_a_morph_with_its_original():
    rng = np.random.default_rng(0)
    net, morphed = (VolumetricNetwork(1, 1, 1, 2) for _ in range(2))
    for i in range(2):
        w = rng.normal(size=64 * 32)
        net[0, 0, 0, i] = make_layer("Dense", input_height=64, output_height=32, weights=w)
        morphed[0, 0, 0, i] = make_layer("Dense", input_height=64, output_height=32, weights=w, dtype="int8")
    assert compare_dna(net, morphed).overall_overlap == 0  # Loom: another dtype scores 0
    across = compare_dna(net, morphed, across_dtypes=True)
    for key, overlap in across.layer_overlaps.items():
        layer = morphed[tuple(map(int, key.split(",")))]
        w, q = layer.weights.master, layer.weights.dequantized("int8")
        exact = float(np.dot(w, q) / np.linalg.norm(w) / np.linalg.norm(q))
        assert overlap == pytest.approx(exact, abs=1e-6) and overlap >= 0.99


def test_dna_from_loom_rejects_malformed_entries():
    with pytest.raises(LoomConfigError, match=r"DNA\[0\] lacks"):
        DNA.from_loom([{"Z": 0}])
    with pytest.raises(LoomConfigError, match="Type 99"):
        DNA.from_loom([{"Z": 0, "Y": 0, "X": 0, "L": 0, "Type": 99, "DType": 1, "Weights": [1.0]}])
    with pytest.raises(LoomConfigError, match="list"):
        DNA.from_loom({"Z": 0})


# ----- splicing ------------------------------------------------------------------------------
def blobs(layers):
    """Every layer's float32 weights (None for none), nested ones included, in order."""
    out = []
    for layer in layers:
        w = layer.get("weights")
        out.append(None if not w else np.frombuffer(base64.b64decode(w), "<f4"))
        for key in ("parallel_branches", "sequential_layers"):
            out += blobs(layer.get(key) or [])
    return out


@pytest.mark.parametrize("case", GOLDEN["splices"], ids=case_ids(GOLDEN["splices"]))
def test_splice_equals_loom(case):
    a, b = read_network(case["a"]), read_network(case["b"])
    before = dumps(a), dumps(b)
    result = splice(a, b, SpliceConfig.from_loom(case["config"]))
    ours, loom = blobs(network_to_dict(result.child)["layers"]), blobs(case["child"]["layers"])
    assert len(ours) == len(loom)
    for x, y in zip(ours, loom, strict=True):
        assert (x is None and y is None) or np.array_equal(x, y)
    assert {k: f32(v) for k, v in result.similarities.items()} == \
        {k: f32(v) for k, v in case["similarities"].items()}
    assert result.blended_count == case["blended_count"]
    assert (dumps(a), dumps(b)) == before  # parents untouched


def dense_pair(n=40):
    rng = np.random.default_rng(5)
    nets = []
    for _ in range(2):
        net = VolumetricNetwork(1, 1, 1, 1)
        net[0, 0, 0, 0] = make_layer("Dense", input_height=n // 4, output_height=4,
                                     weights=rng.normal(size=n))
        nets.append(net)
    return nets


def test_uniform_splice_is_repeatable_and_follows_fitness():
    a, b = dense_pair(4000)
    wa, wb = a[0, 0, 0, 0].weights.master, b[0, 0, 0, 0].weights.master
    cfg = SpliceConfig(mode="uniform", fitness_a=3.0, fitness_b=1.0, seed=11)
    child = splice(a, b, cfg).child[0, 0, 0, 0].weights.master
    # the oracle: Go's Float32 per weight, below the threshold f32(FA/(FA+FB)) takes A's
    draws = GoRand(11).float32_array(4000)
    assert np.array_equal(child, np.where(draws < np.float32(0.75), wa, wb))
    assert np.array_equal(child, splice(a, b, cfg).child[0, 0, 0, 0].weights.master)
    assert abs((child == wa).mean() - 0.75) < 0.03


def test_splice_config_round_trip_and_validation():
    cfg = SpliceConfig(mode="point", blend_alpha=0.3, split_ratio=0.4, fitness_a=2.0, fitness_b=1.0)
    assert SpliceConfig.from_loom(cfg.to_loom()) == cfg
    assert SpliceConfig.from_loom({}) == SpliceConfig(mode="", blend_alpha=0.0, split_ratio=0.0)
    with pytest.raises(LoomConfigError, match="mode"):
        SpliceConfig(mode="average")
    with pytest.raises(LoomConfigError, match="unknown splice config keys: Alpha"):
        SpliceConfig.from_loom({"Alpha": 0.5})
    with pytest.raises(LoomConfigError, match="blend_alpha"):
        SpliceConfig(blend_alpha=float("nan"))


# ----- NEAT mutation ---------------------------------------------------------------------------
def test_neat_v14_vector():
    net = VolumetricNetwork(1, 1, 1, 2)
    for l in range(2):  # noqa: E741
        net[0, 0, 0, l] = make_layer("Dense", input_height=2, output_height=2, weights=[1, 2, 3, 4])
    cfg = dataclasses.replace(NEATConfig.default(2, seed=42), weight_perturb_rate=1, node_mutate_rate=0,
                              connection_add_rate=0, connection_drop_rate=0, activation_mut_rate=0,
                              layer_toggle_rate=0)
    for _ in range(2):  # identical on repeat
        child = neat_mutate(net, cfg)
        assert child[0, 0, 0, 0].weights.master.tolist() == \
            np.float32([0.9566000700, 2.0104093552, 2.9708819389, 3.9543819427]).tolist()
        assert child[0, 0, 0, 1].weights.master.tolist() == \
            np.float32([1.0146375895, 2.0235629082, 2.9717941284, 3.9861683846]).tolist()
    assert net[0, 0, 0, 0].weights.master.tolist() == [1, 2, 3, 4]  # the parent is untouched


def loom_differences(ours: dict, loom: dict, path: str = "") -> list[str]:
    """Where our saved layer differs from Loom's, beyond the differences docs/compat.md lists:
    our extra remote-link keys, unsized conv axes we size, CNN1/ConvTransposed1D's kernel."""
    out = []
    if ours.get("is_remote_link") and "seq_length" not in loom:
        loom = {**loom, "seq_length": 1}  # Loom's zero value, read (and so kept) as 1 by us
    ours = {k: v for k, v in ours.items() if k not in OUR_KEYS}
    cls = layer_class(ours["type"])
    sized_by_us = set(getattr(cls, "in_fields", ())) | set(getattr(cls, "out_fields", ()))
    for key in sorted(set(ours) | set(loom)):
        a, b = ours.get(key), loom.get(key)
        if key == "weights":
            wa, wb = (np.frombuffer(base64.b64decode(w), "<f4") if w else None for w in (a, b))
            if (wa is None) != (wb is None):
                out.append(f"{path}.weights presence")
            elif wa is not None and not (np.array_equal(wa, wb) or (
                    ours["type"] in ("CNN1", "ConvTransposed1D") and np.array_equal(wa, wb[:wa.size]))):
                out.append(f"{path}.weights")
        elif key in ("parallel_branches", "sequential_layers"):
            if len(a or []) != len(b or []):
                out.append(f"{path}.{key} count")
            for i, (x, y) in enumerate(zip(a or [], b or [], strict=False)):
                out += loom_differences(x, y, f"{path}.{key}[{i}]")
        elif a != b and not (key in sized_by_us and b is None and a in (1, ours.get("input_height"))):
            out.append(f"{path}.{key}: ours {a!r}, Loom {b!r}")
    return out


def assert_like_loom(net: VolumetricNetwork, loom: dict) -> None:
    ours = network_to_dict(net)
    assert [k for k in ours if k != "layers"] == [k for k in loom if k != "layers"]
    assert len(ours["layers"]) == len(loom["layers"])
    diffs = [d for a, b in zip(ours["layers"], loom["layers"], strict=True) for d in loom_differences(a, b)]
    assert not diffs, diffs


def assert_saves_reloads_and_runs(net: VolumetricNetwork, tmp_path: Path, width: int) -> None:
    again = load_json(dumps(net).encode())
    save_checkpoint(net, tmp_path / "net.loom")
    for other in (again, load_checkpoint(tmp_path / "net.loom")):
        assert dumps(other) == dumps(net)
    x = np.random.default_rng(1).uniform(-1, 1, (1, width)).astype(np.float32)
    assert np.array_equal(again.forward(x), net.forward(x))


@pytest.mark.parametrize("case", GOLDEN["mutations"], ids=case_ids(GOLDEN["mutations"]))
def test_neat_mutate_equals_loom(case, tmp_path):
    parent = read_network(case["parent"])
    before = dumps(parent)
    config = NEATConfig.from_loom(case["config"])
    child = neat_mutate(parent, config)
    assert_like_loom(child, case["child"])
    assert dumps(parent) == before
    assert dumps(neat_mutate(parent, config)) == dumps(child)  # same seed, same child
    assert_saves_reloads_and_runs(child, tmp_path, config.d_model)


def test_neat_config_round_trip_and_validation():
    cfg = NEATConfig.default(7, seed=3)
    assert NEATConfig.from_loom(cfg.to_loom()) == cfg
    assert (cfg.default_num_heads, cfg.default_filters) == (4, 1)
    assert NEATConfig.default(2, seed=1).default_num_heads == 1
    for bad, match in (({"node_mutate_rate": 1.5}, r"node_mutate_rate must lie in \[0, 1\]"),
                       ({"allowed_layer_types": (0, 42)}, "42, which is no Loom layer type"),
                       ({"d_model": 0}, "d_model must be >= 1"),
                       ({"seed": 2**63}, "int64"),
                       ({"weight_perturb_scale": -1.0}, "weight_perturb_scale")):
        with pytest.raises(LoomConfigError, match=match):
            dataclasses.replace(cfg, **bad)
    with pytest.raises(LoomConfigError, match="unknown NEAT config keys: Rate"):
        NEATConfig.from_loom({"Rate": 1})
    assert NEATConfig.default(4).seed != NEATConfig.default(4).seed  # None: a random seed


# ----- populations -------------------------------------------------------------------------------
@pytest.mark.parametrize("case", GOLDEN["populations"], ids=case_ids(GOLDEN["populations"]))
def test_population_equals_loom(case, tmp_path):
    config = NEATConfig.from_loom(case["config"])
    pop = NEATPopulation(read_network(case["seed_network"]), case["size"], config)
    for member, loom in zip(pop.members, case["initial_members"], strict=True):
        assert_like_loom(member, loom)
    for generation, step in enumerate(case["generations"], 1):
        pop.evolve(step["fitness"])
        assert pop.summary(generation) == step["summary"]
        assert pop.best_fitness == step["best_fitness"]
        assert pop.best() is pop.members[0]
        for member, loom in zip(pop.members, step["members"], strict=True):
            assert_like_loom(member, loom)
    for member in pop.members:
        assert_saves_reloads_and_runs(member, tmp_path, config.d_model)


def test_population_rejects_bad_fitness():
    net = dense_pair()[0]
    pop = NEATPopulation(net, 4, NEATConfig.default(10, seed=1))
    with pytest.raises(LoomConfigError, match="needs 4 fitnesses"):
        pop.evolve([1.0, 2.0])
    with pytest.raises(LoomConfigError, match="fitness 1 must be a finite number"):
        pop.evolve([1.0, float("nan"), 0.0, 0.0])
    with pytest.raises(LoomConfigError, match="size >= 1"):
        NEATPopulation(net, 0, NEATConfig.default(10, seed=1))


def test_every_export_is_what_it_names_after_every_module_is_imported():
    """An export named like a module was shadowed by that module once anything imported it
    (``from loomlab.core.evolve import splice`` gave the module)."""
    import importlib
    import pkgutil
    import types

    import loomlab.core.evolve as evolve

    for info in pkgutil.iter_modules(evolve.__path__):
        importlib.import_module(f"loomlab.core.evolve.{info.name}")
    for name in evolve.__all__:
        assert not isinstance(getattr(evolve, name), types.ModuleType), name
