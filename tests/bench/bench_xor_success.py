"""Benchmark: how often, and how fast, evolution solves XOR: Loom's population against speciation.

    python tests/bench/bench_xor_success.py [--seeds 1-10] [--generations 300] [--population 150]
                                            [--config loom|speciated|both] [--neat auto|loom|task]

For each seed (the NEAT config's seed, which seeds the whole run) an ``Evolution`` on the XOR task
(``get_task("xor")``: neat-python's fitness ``4 - sum((y - t)^2)``, solved at 3.9) runs until a
member is solved or ``--generations`` have been evaluated. Configurations:

* ``loom``: Loom's population (``speciation=None``), elitist truncation as Loom does it.
* ``speciated``: ``SpeciationConfig()`` (the defaults of :mod:`loomlab.core.evolve.search.speciation`).

``--neat`` picks the NEAT mutation settings: ``loom`` is Loom's ``DefaultNEATConfig`` for the
genome's width (what ``Evolution`` uses when given no config), ``task`` is the task's recommended
one (``task.neat_config(seed)``: Dense layers only for XOR), ``auto`` (the default) gives the Loom
configuration Loom's settings and the speciated one the task's. Runs go one after another in this
process. Prints JSON: per seed solved / generations / best fitness / seconds, and per
configuration the success rate and the median generations of the solved runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

from loomlab.core.evolve.genetics.neat import NEATConfig
from loomlab.core.evolve.search.run import Evolution, genome_width
from loomlab.core.evolve.search.speciation import SpeciationConfig
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.procinfo import machine


def seeds_arg(text: str) -> list[int]:
    """``"1-10"`` or ``"1,4,7"``."""
    if "-" in text:
        lo, hi = (int(v) for v in text.split("-", 1))
        return list(range(lo, hi + 1))
    return [int(v) for v in text.split(",")]


def one_run(config: str, neat: str, seed: int, generations: int, population: int) -> dict:
    task = get_task("xor")
    neat_config = (task.neat_config(seed) if neat == "task"
                   else NEATConfig.default(genome_width(task.seed_network()), seed=seed))
    speciation = SpeciationConfig() if config == "speciated" else None
    t = time.perf_counter()
    run = Evolution(task, config=neat_config, population=population, speciation=speciation)
    result = run.run(generations)
    seconds = time.perf_counter() - t
    species = [len(s.species) for s in run.history]
    out = {"seed": seed, "solved": result.solved, "generations": result.generation,
           "best_fitness": round(result.best_fitness, 4), "seconds": round(seconds, 1)}
    if speciation is not None:
        out["species_median"] = statistics.median(species)
        out["species_range_after_20"] = [min(species[20:], default=None), max(species[20:], default=None)]
    print(json.dumps({"config": config, **out}), file=sys.stderr, flush=True)  # progress
    return out


def summary(runs: list[dict]) -> dict:
    solved = [r["generations"] for r in runs if r["solved"]]
    return {"solved": f"{len(solved)}/{len(runs)}", "success_rate": len(solved) / len(runs),
            "median_generations_solved": statistics.median(solved) if solved else None,
            "median_seconds": round(statistics.median(r["seconds"] for r in runs), 1),
            "total_seconds": round(sum(r["seconds"] for r in runs), 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=seeds_arg, default=list(range(1, 11)))
    ap.add_argument("--generations", type=int, default=300)
    ap.add_argument("--population", type=int, default=150)
    ap.add_argument("--config", choices=("loom", "speciated", "both"), default="both")
    ap.add_argument("--neat", choices=("auto", "loom", "task"), default="auto")
    args = ap.parse_args()
    configs = ("loom", "speciated") if args.config == "both" else (args.config,)
    results = {}
    for config in configs:
        neat = args.neat if args.neat != "auto" else ("loom" if config == "loom" else "task")
        runs = [one_run(config, neat, s, args.generations, args.population) for s in args.seeds]
        results[config] = {"neat": neat, **summary(runs), "runs": runs}
    print(json.dumps({
        "machine": machine(), "python": platform.python_version(),
        "command": " ".join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "population": args.population, "generations": args.generations, "seeds": args.seeds,
        "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
