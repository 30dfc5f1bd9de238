"""Benchmark: loading a 10M-parameter network from Loom JSON versus from a .loom checkpoint.

    python tests/bench/bench_checkpoint.py [--params 10000000] [--dtype float32] [--repeat 5]

Prints the best-of-N save and load times of both formats and the load speed-up.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

import numpy as np
from benchtools import best

from loomlab.core import VolumetricNetwork, load_network, make_layer, save_network
from loomlab.core.morph import morph_all
from loomlab.core.procinfo import machine


def build(params: int, dtype: str) -> VolumetricNetwork:
    n_layers = 5
    width = int((params / n_layers) ** 0.5)
    net = VolumetricNetwork(1, 1, 1, n_layers)
    rng = np.random.default_rng(0)
    for i in range(n_layers):
        net[0, 0, 0, i] = make_layer("Dense", input_height=width, output_height=width, activation="Tanh",
                                     rng=rng)
    if dtype != "float32":
        morph_all(net, dtype)
    return net


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--params", type=int, default=10_000_000)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    net = build(args.params, args.dtype)
    x = np.ones((1, net[0, 0, 0, 0].cfg.input_height), np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        results = {}
        for suffix in (".json", ".loom"):
            path = Path(tmp) / f"net{suffix}"
            save_s = best(lambda p=path: save_network(net, p), args.repeat)
            load_s = best(lambda p=path: load_network(p), args.repeat)
            np.testing.assert_array_equal(load_network(path).forward(x), net.forward(x))
            results[suffix] = {"save_s": round(save_s, 4), "load_s": round(load_s, 4),
                               "bytes": path.stat().st_size}
    print(json.dumps({
        "machine": machine(),
        "python": platform.python_version(), "parameters": net.parameter_count(), "dtype": args.dtype,
        "json": results[".json"], "loom": results[".loom"],
        "load_speedup": round(results[".json"]["load_s"] / results[".loom"]["load_s"], 1),
    }, indent=2))


if __name__ == "__main__":
    main()
