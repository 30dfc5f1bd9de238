"""Memory and time of the inspections on a built-in model, as the Inspect panel and
``loomlab inspect`` run them (Inspector: the model held, float32 activations).

    python tests/bench/bench_inspect.py [--model smollm2-135m] [--tokens 512] [--grid-tokens 20]

Prints one JSON line per measurement: the attention patterns of a ``--tokens`` prompt (every
layer's and head's weights formed once, as the panel's thumbnail grid does) with the extra peak
resident memory they took, the logit lens and the attribution of the same prompt, and a full
layer x position patching grid (``resid_pre``) for a ``--grid-tokens`` prompt. The prompt is the
start of the English text quant-report probes with.
"""

from __future__ import annotations

import argparse
import json
import time

from loomlab.core.inspect import Inspector
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.quality.drift import default_probe
from loomlab.core.procinfo import machine, peak_rss_bytes, release_memory, rss_bytes

MIB = 2 ** 20


def reset_peak() -> None:
    """Start VmHWM again from the current resident size (Linux's clear_refs 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def measured(name: str, fn, **extra) -> object:
    release_memory()
    reset_peak()
    base = rss_bytes()
    t = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t
    print(json.dumps({"measure": name, "seconds": round(seconds, 2),
                      "extra_peak_mib": round((peak_rss_bytes() - base) / MIB, 1), **extra,
                      "machine": machine()}), flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--grid-tokens", type=int, default=20)
    args = ap.parse_args()
    with load_model(args.model, first_run="wait") as model:
        inspector = Inspector(model)
        ids = inspector.prompt_ids(default_probe())
        prompt, short = ids[:args.tokens], ids[:args.grid_tokens]
        inspector.lens(short)  # the model's pages read once, outside the measurements
        info = {"model": args.model, "tokens": len(prompt)}

        def all_patterns():
            patterns = inspector.patterns(prompt)
            return [patterns.layer(i) for i in range(patterns.n_layers)]

        measured("patterns", lambda: inspector.patterns(prompt).thumbnails(), **info,
                 what="queries and keys kept, every layer's weights formed once (thumbnails)")
        held = measured("patterns_held", all_patterns, **info,
                        what="every layer's [heads, T, T] weights held at once (float32)")
        del held
        measured("lens", lambda: inspector.lens(prompt), **info)
        measured("attribution", lambda: inspector.attribution(prompt), **info)
        corrupted = list(short)
        corrupted[len(short) // 2] = short[len(short) // 2 - 1]
        measured("patching_grid", lambda: inspector.patching(short, corrupted), model=args.model,
                 tokens=len(short), site="resid_pre", cells=len(short) * model.net.args.num_layers)


if __name__ == "__main__":
    main()
