"""Benchmark: evaluating quantization recipes of a language model (core.evolve.llm.recipe_genome).

    python tests/bench/bench_recipe.py [--model smollm2-135m] [--mutants 8] [--repeat 3]

Builds a :class:`RecipeSpace` with the default dtypes and probes (timed: the reference forward
passes), then times one random recipe cold (its layers quantized on first use) and warm (best of
``--repeat``: forward passes and KL only), the unmorphed recipe, and ``--mutants`` mutants of the
random recipe at rate 0.05 in one ``evaluate_many`` (mostly cached layers). Prints JSON with the
seconds per recipe, the cache's size and the process's peak memory.
"""

from __future__ import annotations

import argparse
import json
import time

from benchtools import best

from loomlab.core.evolve.genetics.gorand import GoRand
from loomlab.core.evolve.llm.recipe_genome import RecipeSpace
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.procinfo import machine, peak_rss_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--mutants", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with load_model(args.model) as model:
        t = time.perf_counter()
        space = RecipeSpace(model)
        build_s = time.perf_counter() - t
        rng = GoRand(1)
        recipe = space.random_recipe(rng)
        t = time.perf_counter()
        space.evaluate(recipe)
        cold_s = time.perf_counter() - t
        warm_s = best(lambda: space.evaluate(recipe), args.repeat)
        unmorphed_s = best(lambda: space.evaluate(space.uniform("float32")), args.repeat)
        mutants = [space.mutate(recipe, rng, 0.05) for _ in range(args.mutants)]
        t = time.perf_counter()
        space.evaluate_many(mutants)
        mutants_s = (time.perf_counter() - t) / max(len(mutants), 1)
        info = space.cache_info()
    print(json.dumps({
        "machine": machine(), "model": args.model, "layers": len(space), "dtypes": list(space.dtypes),
        "probe_positions": space.positions, "space_build_s": round(build_s, 3),
        "cold_recipe_s": round(cold_s, 3), "warm_recipe_s": round(warm_s, 3),
        "unmorphed_recipe_s": round(unmorphed_s, 3), "mutant_recipe_s": round(mutants_s, 3),
        "cache_mb": round(info.bytes / 2**20), "cache_entries": info.entries,
        "peak_rss_mb": round(peak_rss_bytes() / 2**20),
    }, indent=2))


if __name__ == "__main__":
    main()
