"""Morph a language model to a GGUF block format and back: time and memory (issue 14 §3).

    python tests/bench/bench_block_morph.py [--model smollm2-135m] [--format Q8_0]

Loads the model, warms the encoders up on a small matrix, morphs every matrix to ``--format``
(``morph_all``, as the Morph panel's Apply does it layer by layer), then reverts to the file's
blocks. Prints JSON: the file's size, the new blocks' bytes, the process's resident memory after
loading, after the morph and after the revert, and the bound the issue sets: what the model holds
(resident memory above the process's own before loading: interpreter, libraries, compiled kernels)
at most file size + new blocks + 150 MB; with the seconds each step took.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from loomlab.core.llm.files import registry
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.kernels.block_morph import encode
from loomlab.core.morph import morph_all, morph_sublayer, weighted_cells
from loomlab.core.procinfo import machine, release_memory, rss_bytes

MB = 1 << 20


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--format", default="Q8_0")
    args = p.parse_args()
    path = registry.fetch(args.model)
    encode(np.ones((4, 256), np.float32), args.format)  # compile the encoder before measuring
    release_memory()
    baseline = rss_bytes()  # the interpreter, numpy, numba and the compiled kernels, no model
    with load_model(args.model) as model:
        net = model.net
        before = net.memory_by_dtype()
        release_memory()
        loaded = rss_bytes()
        t = time.perf_counter()
        morph_all(net, args.format)
        morph_s = time.perf_counter() - t
        release_memory()
        morphed = rss_bytes()
        after = net.memory_by_dtype()
        t = time.perf_counter()
        for index, layer in weighted_cells(net):
            morph_sublayer(layer, index, layer.weights.file_encoding())
        revert_s = time.perf_counter() - t
        release_memory()
        reverted = rss_bytes()
        assert net.memory_by_dtype() == before
    new_blocks = after.get(args.format, 0)
    file_size = os.path.getsize(path)
    print(json.dumps({
        "machine": machine(), "python": platform.python_version(), "model": args.model, "format": args.format,
        "file_mb": round(file_size / MB, 1), "new_blocks_mb": round(new_blocks / MB, 1),
        "rss_baseline_mb": round(baseline / MB, 1), "rss_loaded_mb": round(loaded / MB, 1),
        "rss_morphed_mb": round(morphed / MB, 1),
        "rss_reverted_mb": round(reverted / MB, 1),
        "model_morphed_mb": round((morphed - baseline) / MB, 1),
        "bound_mb": round((file_size + new_blocks) / MB + 150, 1),
        "within_bound": morphed - baseline <= file_size + new_blocks + 150 * MB,
        "morph_s": round(morph_s, 2), "revert_s": round(revert_s, 3),
    }, indent=2))


if __name__ == "__main__":
    main()
