"""Benchmark: quantize() on all of SmolLM2-135M's weight matrices, to each format.

    python tests/bench/bench_quantize.py [--threads 2] [--repeat 2]

The model's 2-D tensors (the 210 block matrices and the 49152 x 576 token table: 134 M weights)
are dequantized to float32 once, then encoded whole to each format, best of N. Q4_K and Q6_K take
256-weight super-blocks, which SmolLM2's 576-wide rows are not: for them only the matrices whose
rows are (the 30 ffn_down, 1536 wide) are timed, and ``weights`` says how many that is. Also the
first call (numba's cache load, or its compile on a cold cache). Prints one JSON object.
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
from gguf import GGMLQuantizationType as GT
from gguf import GGUFReader, quants

from loomlab.core.llm.files import registry
from loomlab.core.llm.kernels.quant import FORMATS
from loomlab.core.llm.kernels.quantize import QUANTIZE_FORMATS, quantize
from loomlab.core.procinfo import cpu_name


def load_matrices() -> dict[str, np.ndarray]:
    reader = GGUFReader(registry.fetch("smollm2-135m"))
    return {t.name: quants.dequantize(t.data, t.tensor_type) for t in reader.tensors if len(t.shape) == 2}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    t = time.perf_counter()
    quantize(np.ones((1, 256), np.float32), "Q8_0")
    first_call = time.perf_counter() - t
    mats = load_matrices()
    results = {}
    for fmt in QUANTIZE_FORMATS:
        block = FORMATS[int(GT[fmt])].block_elems
        todo = [W for W in mats.values() if W.shape[1] % block == 0]
        seconds = best(lambda: [quantize(W, fmt) for W in todo], args.repeat)  # noqa: B023
        n = sum(W.size for W in todo)
        results[fmt] = {"matrices": len(todo), "weights": n, "seconds": round(seconds, 3),
                        "mweights_per_s": round(n / seconds / 1e6, 1)}
    print(json.dumps({
        "machine": {"cpu": cpu_name(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "numpy": np.__version__, "numba": numba.__version__, "threads": args.threads},
        "model": "smollm2-135m", "total_weights": sum(W.size for W in mats.values()),
        "first_call_s": round(first_call, 3), "quantize": results,
    }, indent=1))


if __name__ == "__main__":
    main()
