"""Makes tests/data/neat-conv-goldens.json with the Loom engine itself (welvet 0.80.0): NEAT
mutations and populations where layers become CNN1 / ConvTransposed1D (F·C·k² weights in Loom)
and are mutated again later, so that every later draw shows whether we drew as many as Loom.

Run it with the Python of /work/shared/tools/loom-reference's venv (it has welvet), from the
repository root:  ~/.cache/loom-reference/venv/bin/python tests/core/evolve/genetics/make_neat_conv_golden.py
Not a test: it needs welvet; the tests read the file it writes.
"""

from __future__ import annotations

import json
from pathlib import Path

from welvet import Network
from welvet import utils as loom

DATA = Path(__file__).resolve().parents[3] / "data"
EVOLVE = json.loads((DATA / "evolve-goldens-seed1.json").read_text())
CONV = ("CNN1", "ConvTransposed1D")


def parent(name: str) -> dict:
    return next(c["parent"] for c in EVOLVE["mutations"] if c["name"] == name)


def config(**over) -> dict:
    base = {"WeightPerturbRate": 0.9, "WeightPerturbScale": 0.05, "NodeMutateRate": 0.4,
            "ConnectionAddRate": 0.3, "ConnectionDropRate": 0.3, "ActivationMutRate": 0.3,
            "LayerToggleRate": 0.1, "AllowedLayerTypes": [0, 4, 10, 3, 5], "DModel": 7,
            "DefaultNumHeads": 4, "DefaultInChannels": 1, "DefaultFilters": 1, "DefaultKernelSize": 3,
            "DefaultVocabSize": 256, "DefaultNumClusters": 8, "Seed": 1}
    return {**base, **over}


def pop_config(**over) -> dict:
    return config(AllowedLayerTypes=[0, 4, 10, 3, 9], **over)


def serialised(net: Network) -> dict:
    return json.loads(net.serialize())


def chain(name: str, net: dict, cfg: dict, seeds: list[int]) -> dict:
    """``net`` mutated by ``cfg`` with each seed in turn, each child mutated in memory (as a
    population's member is), never through a file."""
    keep = [Network.deserialize(json.dumps(net))]
    children = []
    for seed in seeds:
        keep.append(Network(_handle=loom.neat_mutate(keep[-1].handle, {**cfg, "Seed": seed})))
        children.append(serialised(keep[-1]))
    return {"name": name, "parent": net, "config": cfg, "seeds": seeds, "children": children}


def conv_fitness(members: list[dict]) -> list[float]:
    """Rank members with more CNN1/ConvTransposed1D layers first (so they breed), ties by order."""
    n = len(members)
    return [float(sum(layer["type"] in CONV for layer in m["layers"])) + (n - i) / (10 * n)
            for i, m in enumerate(members)]


def population(name: str, seed_net: dict, size: int, cfg: dict, generations: int) -> dict:
    """Loom's population of ``size`` mutants of ``seed_net``, evolved ``generations`` times with
    :func:`conv_fitness` (member handles are the population's own: read, never freed)."""
    seed = Network.deserialize(json.dumps(seed_net))
    pop = loom.new_neat_population(seed.handle, size, cfg)

    def members() -> list[dict]:
        return [json.loads(loom.serialize_network(loom.neat_population_get_network(pop, i)))
                for i in range(size)]

    now = members()
    out = {"name": name, "seed_network": seed_net, "size": size, "config": cfg,
           "initial_members": now, "generations": []}
    for g in range(1, generations + 1):
        fitness = conv_fitness(now)
        loom.neat_population_evolve(pop, fitness)
        now = members()
        out["generations"].append({"fitness": fitness, "summary": loom.neat_population_summary(pop, g),
                                   "best_fitness": loom.neat_population_best_fitness(pop), "members": now})
    loom.free_neat_population(pop)
    return out


def main() -> None:
    wide = config(DefaultInChannels=2, DefaultFilters=3, DefaultKernelSize=2)  # F·C·k 12, Loom's 24
    doc = {
        "reference": "welvet 0.80.0 (the Loom engine, as /work/shared/tools/loom-reference installs it): "
                     "neat_mutate on each previous child in memory; Population + evolve with the "
                     "fitnesses given; networks as welvet serialises them. Made by "
                     "tests/core/evolve/genetics/make_neat_conv_golden.py",
        "chains": [
            chain("dense3_conv", parent("dense3_rates0_0"), config(), [1, 1234567, 7654321, 42, 99]),
            chain("dense3_conv_wide", parent("dense3_rates0_0"), wide, [1, 1234567, 7654321, 42, 99]),
            chain("mixed_conv", parent("mixed_rates0_0"), config(), [5, 6, 7, 8, 9]),
        ],
        # no layer type here has a CNN1's F·C·k² weights but CNN1 and ConvTransposed1D (Loom
        # splices layers of equal weight counts, whatever their types), and 8 members make 2 elites
        "populations": [
            population("dense3_conv_pop8", parent("dense3_rates0_0"), 8, pop_config(Seed=2024), 4),
            population("mixed_conv_pop8", parent("mixed_rates0_0"), 8,
                       pop_config(Seed=77, NodeMutateRate=0.3), 4),
        ],
    }
    (DATA / "neat-conv-goldens.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
