"""Benchmark: matrix products over several rows of X (batched decoding, speculative verification,
prefill), the row-invariant kernels against what ran before.

    python tests/bench/bench_quant_batch.py [--threads 2] [--repeat 5] [--models] [--formats]

Three ways to multiply T rows, timed in alternation inside this process (best of N):
  per_row  the fused decode kernel once per row (what ran below T=8 before)
  batch    the row-invariant kernel: each weight row dequantized once, dotted with every row
  tiled    dequantize 1 MB row tiles on one thread, BLAS ``X @ tile.T`` (what ran from T=8)
``--formats``: ms per matmul per format and T (one matrix per format, from the built-in models or
quantized with gguf-py). ``--models``: whole ``net.step`` decode steps of SmolLM2-135M and
Gemma-3-270M with B sequences of one token each, "before" (per_row below 8, tiled from 8) and
"after" (this module's policy). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from functools import partial

import numba
import numpy as np
from benchtools import best
from gguf import GGMLQuantizationType as GT
from gguf import GGUFReader, quants

from loomlab.core.llm import load_model
from loomlab.core.llm.files import registry
from loomlab.core.llm.kernels import quant
from loomlab.core.llm.kernels.quant import QuantMatrix, single_threaded_blas
from loomlab.core.procinfo import cpu_name

NEVER = 1 << 62
POLICIES = {  # (FUSED_MAX_T, MATMUL_MIN_T)
    "per_row": (NEVER, NEVER), "batch": (0, NEVER), "tiled": (0, 1),
    "before": (NEVER, 8), "after": (quant.FUSED_MAX_T, quant.MATMUL_MIN_T)}


def use(policy: str) -> None:
    quant.FUSED_MAX_T, quant.MATMUL_MIN_T = POLICIES[policy]


def format_matrices() -> dict[str, QuantMatrix]:
    """One matrix per block format: real tensors where the built-in models have the format."""
    mats = {}
    for alias, names in (("smollm2-135m", ("blk.0.ffn_up.weight",)),
                         ("gemma3-270m", ("blk.0.attn_q.weight", "blk.0.attn_output.weight",
                                          "blk.0.ffn_down.weight", "blk.0.ffn_up.weight"))):
        for t in GGUFReader(registry.fetch(alias)).tensors:
            if t.name in names:
                m = QuantMatrix(t.data, int(t.tensor_type), (int(t.shape[1]), int(t.shape[0])), name=t.name)
                mats.setdefault(m.type_name, m)
    rng = np.random.default_rng(0)
    for ggml_type in (GT.Q4_0, GT.Q5_1, GT.Q8_0):  # absent from the models' blocks: quantize 1536 x 576
        if ggml_type.name not in mats:
            W = rng.standard_normal((1536, 576)).astype(np.float32)
            mats[ggml_type.name] = QuantMatrix(quants.quantize(W, ggml_type), ggml_type, (1536, 576))
    return dict(sorted(mats.items()))


def bench_formats(rows: list[int], repeat: int) -> dict:
    rng = np.random.default_rng(1)
    result = {}
    for name, m in format_matrices().items():
        per_t = {}
        for T in rows:
            X = rng.standard_normal((T, m.shape[1])).astype(np.float32)
            times = {p: [] for p in ("per_row", "batch", "tiled")}
            for _ in range(repeat):  # alternate the ways, so a disturbance hits them alike
                for p, ts in times.items():
                    use(p)
                    ts.append(best(partial(m.matmul, X), 1))
            per_t[T] = {p: round(min(ts) * 1e3, 3) for p, ts in times.items()}
        result[f"{name} {m.shape}"] = per_t
    use("after")
    return result


def bench_models(batches: list[int], repeat: int) -> dict:
    result = {}
    for alias in ("smollm2-135m", "gemma3-270m"):
        net = load_model(alias).net
        rng = np.random.default_rng(2)
        per_b = {}
        for B in batches:
            caches = []
            for _ in range(B):  # prompts of different lengths, as a batch in flight has
                cache = net.make_cache()
                net.step(rng.integers(10, 1000, (1, int(rng.integers(3, 12)))), [cache])
                caches.append(cache)
            ids = rng.integers(10, 1000, (B, 1))
            times = {p: [] for p in ("before", "after")}
            for _ in range(repeat):
                for p, ts in times.items():
                    use(p)
                    ts.append(best(partial(net.step, ids, caches), 1))
                    for c in caches:  # drop the token just added: every step sees the same lengths
                        for layer in c:
                            layer.trim(1)
            per_b[B] = {p: round(min(ts) * 1e3, 2) for p, ts in times.items()}
        one = per_b[batches[0]]["after"]
        result[alias] = {"step_ms_by_B": per_b,
                         "after_cost_vs_B1": {B: round(v["after"] / one, 2) for B, v in per_b.items()}}
    use("after")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--rows", default="1,2,3,4,8,16,32,64,128,300", help="T values for --formats")
    ap.add_argument("--batches", default="1,2,4,8,16,32", help="B values for --models")
    ap.add_argument("--formats", action="store_true")
    ap.add_argument("--models", action="store_true")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    out = {"machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                       "numba": numba.__version__, "threads": args.threads},
           "policy": {"FUSED_MAX_T": quant.FUSED_MAX_T, "MATMUL_MIN_T": quant.MATMUL_MIN_T},
           "repeat": args.repeat}
    with single_threaded_blas():
        if args.formats or not args.models:
            rows = [int(v) for v in args.rows.split(",")]
            out["matmul_ms_by_format_and_T"] = bench_formats(rows, args.repeat)
        if args.models or not args.formats:
            out["decode_step"] = bench_models([int(v) for v in args.batches.split(",")], args.repeat)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
