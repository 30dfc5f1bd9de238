"""Decode speed as a share of the memory roofline: the bytes a token reads times tokens per second,
over this machine's read bandwidth on the same threads.

    python tests/bench/bench_roofline.py [--model smollm2-135m] [--tokens 64] [--repeat 3]

The bandwidth is the best of five parallel sums (numba, every thread the model uses) over a
1 GiB array of int64, far larger than any cache. A token reads every matrix it multiplies as the
default mode holds it (the repacked int8 rows, or the float32 values of a float matrix; a tied
embedding table once, as the head) and the KV cache (keys and values of every attention layer at
the mean context of the decode). Decode speed is the best of ``--repeat`` greedy runs of
``--tokens`` tokens, as ``loomlab bench`` measures it. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import numba
import numpy as np
from bench_vs_llamacpp import PROMPT
from numba import njit, prange

from loomlab.core.llm.generate.prefix_cache import PrefixCache
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.model.kernel_compilation import matrices
from loomlab.core.procinfo import machine

ARRAY_BYTES = 1 << 30


@njit(parallel=True, cache=True)
def _parallel_sum(a):
    total = 0
    for i in prange(a.size):
        total += a[i]
    return total


def read_bandwidth() -> float:
    """Bytes a second the threads read, the best of five sums of a 1 GiB array."""
    a = np.ones(ARRAY_BYTES // 8, np.int64)
    _parallel_sum(a[:1024])
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        _parallel_sum(a)
        best = min(best, time.perf_counter() - t)
    return ARRAY_BYTES / best


def matrix_bytes(m) -> int:
    """What a product with ``m`` reads in the default mode."""
    rows = getattr(m, "int8_rows", None)
    if rows is not None:
        return rows[1].nbytes
    if isinstance(m, np.ndarray):
        return m.nbytes
    return m.nbytes if m.raw_blocks is None else m.raw_blocks.nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    with load_model(args.model, first_run="wait") as model:
        model.prefix_cache = PrefixCache(0)
        list(model.generate(PROMPT, max_tokens=2, speculative=None))
        best = None
        for _ in range(args.repeat):
            list(model.generate(PROMPT, max_tokens=args.tokens, speculative=None))
            m = model.metrics()
            best = m if best is None or m.decode_tokens_per_s > best.decode_tokens_per_s else best
        net = model.net
        embedding, head = (la.weights.current(la.cfg.dtype) for la in (net.cells[0], net.cells[-1]))
        multiplied = {id(m): m for m in matrices(net) if m is not embedding["table"]}
        multiplied.update({id(m): m for m in head.values()})  # a tied table: read whole as the head
        weights = sum(matrix_bytes(m) for m in multiplied.values() if len(getattr(m, "shape", ())) == 2)
        cfg = net.args
        context = best.prompt_tokens + best.generated_tokens / 2
        kv = 2 * len(net.attention_layers) * cfg.num_kv_heads * cfg.head_dim * 4 * context
    bandwidth = read_bandwidth()
    per_token = weights + kv
    tps = best.decode_tokens_per_s
    print(json.dumps({
        "machine": machine(), "model": args.model, "threads": numba.get_num_threads(),
        "decode_tokens_per_s": round(tps, 1), "weight_bytes_per_token": int(weights),
        "kv_bytes_per_token": int(kv), "read_bandwidth_gb_s": round(bandwidth / 1e9, 2),
        "roofline_tokens_per_s": round(bandwidth / per_token, 1),
        "roofline_share": round(per_token * tps / bandwidth, 3),
    }, indent=2))


if __name__ == "__main__":
    main()
