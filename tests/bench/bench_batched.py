"""Benchmark: many small networks through ``forward_many`` against a Python loop over ``forward``.

    python tests/bench/bench_batched.py [--members 1000] [--sizes 32 64 64 8] [--batches 1 32]
        [--activation Tanh] [--rounds 5]

The population is ``members`` MLPs of Dense layers ``sizes[0] -> sizes[1] -> ...`` (by default
1,000 MLPs 64-64-8 on 32 inputs), each with its own weights; every member reads the same input
of ``batch`` rows. Three ways, alternating in ``rounds`` rounds, the best time of each kept:
the loop, ``forward_many`` (stacks the weights, then one matmul per layer: what an evolution
generation pays) and ``NetworkStack.forward`` on a stack made beforehand (passes over a population
whose weights are already stacked: many inputs or steps). Outputs are checked equal to float32
rounding first. Prints JSON, one row per precision and batch.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import numpy as np
from benchtools import best

from loomlab.core import VolumetricNetwork, make_layer
from loomlab.core.evolve.search.batched import NetworkStack, forward_many
from loomlab.core.procinfo import machine


def population(members: int, sizes: list[int], activation: str, precision: str) -> list[VolumetricNetwork]:
    rng = np.random.default_rng(0)
    nets = []
    for _ in range(members):
        net = VolumetricNetwork(1, 1, 1, len(sizes) - 1, precision=precision)
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
            net[0, 0, 0, i] = make_layer("Dense", input_height=n_in, output_height=n_out,
                                         activation=activation, rng=rng, init_scale=0.3)
        nets.append(net)
    return nets


def compare(nets: list[VolumetricNetwork], x: np.ndarray, rounds: int) -> dict:
    stack = NetworkStack(nets)
    ways = {"loop": lambda: [net.forward(x) for net in nets], "forward_many": lambda: forward_many(nets, x),
            "stacked": lambda: stack.forward(x)}
    expected = ways["loop"]()
    for way in ("forward_many", "stacked"):
        for ours, theirs in zip(ways[way](), expected, strict=True):
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    seconds = dict.fromkeys(ways, float("inf"))
    for _ in range(rounds):
        for way, fn in ways.items():
            seconds[way] = min(seconds[way], best(fn, 1))
    row = {f"{way}_ms": round(s * 1e3, 3) for way, s in seconds.items()}
    for way in ("forward_many", "stacked"):
        row[f"{way}_speedup"] = round(seconds["loop"] / seconds[way], 1)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--members", type=int, default=1000)
    ap.add_argument("--sizes", type=int, nargs="+", default=[32, 64, 64, 8])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--activation", default="Tanh")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    results = {}
    for precision in ("fast", "loom"):
        nets = population(args.members, args.sizes, args.activation, precision)
        for batch in args.batches:
            x = np.random.default_rng(1).standard_normal((batch, args.sizes[0])).astype(np.float32)
            results[f"{precision}_batch{batch}"] = compare(nets, x, args.rounds)
    print(json.dumps({
        "machine": machine(), "python": platform.python_version(),
        "command": " ".join([os.path.relpath(sys.argv[0]), *sys.argv[1:]]),
        "population": f"{args.members} x Dense {'-'.join(map(str, args.sizes))} ({args.activation})",
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
