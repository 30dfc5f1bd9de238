"""Benchmark: LLM DNA of a model against its morph, and a merge of two models into an HF folder.

    python tests/bench/bench_llm_dna.py [--model smollm2-135m] [--dtype int8] [--repeat 3]

Loads the model twice and morphs the second copy to ``--dtype`` (timed once: that is the morph's
cost, not the DNA's), then times, best of ``--repeat``: sketching each copy, comparing the
sketches, and ``compare_models`` (both sketches and the comparison: the figure issue 12 asks to
keep under 10 s). Then times one linear merge of the model with itself at t = 0.5 into a
temporary HF folder. Prints JSON with the overlaps (mean and lowest block) beside the times.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

from benchtools import best

from loomlab.core.evolve.genetics.dna import compare_dna
from loomlab.core.evolve.llm.sketch import DEFAULT_WIDTH, compare_models, sketch_dna
from loomlab.core.llm.files.discovery import resolve
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.quality.merge import merge_models
from loomlab.core.morph import morph_all
from loomlab.core.procinfo import machine, peak_rss_bytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--dtype", default="int8")
    ap.add_argument("--width", type=int, default=DEFAULT_WIDTH)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    path = resolve(args.model)
    model, morphed = load_causal_lm(path), load_causal_lm(path)
    t = time.perf_counter()
    morph_all(morphed, args.dtype)
    morph_s = time.perf_counter() - t
    dna = {}
    sketch_s = {}
    for label, net in (("model", model), ("morphed", morphed)):
        sketch_s[label] = best(lambda n=net, k=label: dna.__setitem__(k, sketch_dna(n, width=args.width)),
                               args.repeat)
    compare_s = best(lambda: compare_dna(dna["model"], dna["morphed"], across_dtypes=True), args.repeat)
    total_s = best(lambda: compare_models(model, morphed, width=args.width), args.repeat)
    overlaps = compare_dna(dna["model"], dna["morphed"], across_dtypes=True)
    with tempfile.TemporaryDirectory() as tmp:
        merge_s = best(lambda: merge_models(path, path, Path(tmp) / "merged", t=0.5), 1)
        merged_bytes = (Path(tmp) / "merged" / "model.safetensors").stat().st_size
    print(json.dumps({
        "machine": machine(), "python": platform.python_version(), "model": args.model,
        "dtype": args.dtype, "width": args.width, "morph_s": round(morph_s, 2),
        "sketch_model_s": round(sketch_s["model"], 3), "sketch_morphed_s": round(sketch_s["morphed"], 3),
        "compare_sketches_s": round(compare_s, 3), "compare_models_s": round(total_s, 3),
        "overall_overlap": round(overlaps.overall_overlap, 6),
        "lowest_layer_overlap": round(min(overlaps.layer_overlaps.values()), 6),
        "merge_linear_s": round(merge_s, 2), "merged_safetensors_mib": round(merged_bytes / 2**20, 1),
        "peak_rss_mib": round(peak_rss_bytes() / 2**20, 1),
    }, indent=2))


if __name__ == "__main__":
    main()
