"""Benchmark: the quantized matrix kernels on SmolLM2-135M's real weights.

    python tests/bench/bench_quant.py [--threads 2] [--repeat 30] [--prompt 37]

Decode: every per-token matvec of the model (the 210 Q4_1 matrices of the 30 blocks plus the
tied Q8_0 output head, 49152 x 576), best of N. Prefill: the same matrices times a
``[prompt, in]`` input through ``matmul``. Also the matmul time per row at small T (where the
per-row kernel hands over to dequantize + BLAS) and the first-call time (numba's cache load, or
its compile on a cold cache). Prints one JSON object with the machine and the numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numba
import numpy as np
from benchtools import best
from gguf import GGUFReader

from loomlab.core.llm.files import registry
from loomlab.core.llm.kernels import quant
from loomlab.core.llm.kernels.quant import MATMUL_MIN_T, QuantMatrix
from loomlab.core.procinfo import cpu_name


def load_matrices() -> dict[str, QuantMatrix]:
    reader = GGUFReader(registry.fetch("smollm2-135m"))
    return {t.name: QuantMatrix(t.data, int(t.tensor_type), (int(t.shape[1]), int(t.shape[0])), name=t.name)
            for t in reader.tensors if len(t.shape) == 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--prompt", type=int, default=37)
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    mats = load_matrices()
    head = mats["token_embd.weight"]  # tied embeddings: the output head is the token table
    blocks = [m for name, m in mats.items() if name.startswith("blk.")]
    rng = np.random.default_rng(0)
    xs = {n: rng.standard_normal(n).astype(np.float32) for n in {m.shape[1] for m in mats.values()}}
    Xs = {n: rng.standard_normal((args.prompt, n)).astype(np.float32) for n in xs}
    outs = {id(m): np.empty(m.shape[0], np.float32) for m in mats.values()}

    def decode(ms):
        for m in ms:
            m.matvec(xs[m.shape[1]], outs[id(m)])

    def prefill(ms, T=args.prompt):
        for m in ms:
            m.matmul(Xs[m.shape[1]][:T])

    t = time.perf_counter()
    decode([head, blocks[0]])
    first_call = time.perf_counter() - t
    decode(blocks)
    ms = lambda s: round(s * 1e3, 2)  # noqa: E731
    # Decode before any BLAS call: OpenBLAS's spinning workers would compete with numba's.
    dec = {"blocks": best(lambda: decode(blocks), args.repeat),
           "head": best(lambda: decode([head]), args.repeat)}
    dec["all"] = best(lambda: decode(blocks + [head]), args.repeat)
    prefill(blocks + [head])
    pre_repeat = max(3, args.repeat // 5)
    pre = {"blocks": best(lambda: prefill(blocks), pre_repeat),
           "head": best(lambda: prefill([head]), pre_repeat)}
    after = []
    for _ in range(3):
        prefill(blocks + [head])
        after.append(best(lambda: decode(blocks + [head]), 1))
    per_row = {}
    for path, min_t in (("kernel", 1 << 30), ("tiles", 1)):
        quant.MATMUL_MIN_T = min_t
        per_row[path] = {T: round(best(lambda T=T: prefill(blocks, T), pre_repeat) * 1e3 / T, 2)
                         for T in (1, 2, 3, 4, 6, 8)}
    embed = best(lambda: head.rows(np.arange(args.prompt)), args.repeat)

    blocks_bytes = sum(m.nbytes for m in blocks)
    print(json.dumps({
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__, "numba": numba.__version__,
                    "threading_layer": numba.threading_layer(), "threads": args.threads},
        "model": "smollm2-135m",
        "matrices": {"blocks": len(blocks), "block_types": sorted({m.type_name for m in blocks}),
                     "head": f"{head.type_name} {head.shape}", "blocks_bytes": blocks_bytes,
                     "head_bytes": head.nbytes},
        "first_call_s": round(first_call, 3),
        "decode_ms": {k: ms(v) for k, v in dec.items()},
        "decode_blocks_GBps": round(blocks_bytes / dec["blocks"] / 1e9, 2),
        "prefill_ms": {"T": args.prompt, **{k: ms(v) for k, v in pre.items()}, "all": ms(sum(pre.values()))},
        "decode_all_right_after_prefill_ms": [ms(v) for v in after],
        "blocks_matmul_ms_per_row_by_T": per_row, "matmul_min_T": MATMUL_MIN_T,
        "embedding_rows_ms": round(embed * 1e3, 3),
        "repeat": args.repeat,
    }, indent=1))


if __name__ == "__main__":
    main()
