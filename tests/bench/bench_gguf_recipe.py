"""Benchmark: scoring GGUF recipes (core.evolve.llm.format_space), what a gguf-recipe run spends.

    python tests/bench/bench_gguf_recipe.py MODEL-f16.gguf [--children 8]

Builds a :class:`FormatSpace` on the shipped texts (timed: the reference passes), scores the
Q4_K_M preset (every (matrix, format) encoded on first use), then ``--children`` mutants of it at
the runs' rate 0.02, which share their first blocks with it, and as many fresh recipes (mutants
of Q8_0 at rate 0.5, no residual stream cached), their formats encoded beforehand -- with the
chunks on one thread per CPU (what runs use), then on one thread. Prints JSON: seconds per
recipe, cache hits, peak memory.
"""

from __future__ import annotations

import argparse
import json
import time

from loomlab.core.evolve.genetics.gorand import GoRand
from loomlab.core.evolve.llm import format_space
from loomlab.core.evolve.llm.format_space import HELDOUT, FormatSpace
from loomlab.core.evolve.llm.format_task import TRAIN_RESOURCE
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.quality.drift import default_probe
from loomlab.core.procinfo import machine, peak_rss_bytes


def per_recipe(space: FormatSpace, recipes: list) -> float:
    t = time.perf_counter()
    for genes in recipes:
        space.score(genes)
    return (time.perf_counter() - t) / len(recipes)


def main() -> None:
    from importlib import resources

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", help="a 16- or 32-bit GGUF or HF folder")
    ap.add_argument("--children", type=int, default=8)
    args = ap.parse_args()
    train = resources.files("loomlab.resources").joinpath(TRAIN_RESOURCE).read_text("utf-8")
    out = {"machine": machine(), "model": args.model, "threads": format_space.CHUNK_THREADS}
    with load_model(args.model) as model:
        t = time.perf_counter()
        space = FormatSpace(model, train, default_probe())
        out["build_s"] = round(time.perf_counter() - t, 2)
        base = space.presets["Q4_K_M"]
        out["first_recipe_s"] = round(per_recipe(space, [base]), 2)
        rng = GoRand(1)
        for threads in (format_space.CHUNK_THREADS, 1):
            format_space.CHUNK_THREADS = threads
            children = [space.mutate(base, rng, 0.02) for _ in range(args.children)]
            fresh = [space.mutate(space.presets["Q8_0"], rng, 0.5) for _ in range(args.children)]
            for genes in children + fresh:  # their formats encoded before the timing
                space.score(genes, HELDOUT)
            hits = space.cache_info().hits
            out[f"{threads}_threads"] = {"child_s": round(per_recipe(space, children), 2),
                                         "fresh_s": round(per_recipe(space, fresh), 2),
                                         "cache_hits": space.cache_info().hits - hits}
    out["peak_rss_mib"] = round(peak_rss_bytes() / 2**20)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
