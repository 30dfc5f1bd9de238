"""Benchmark: one network's own forward against the same maths written in plain numpy.

    python tests/bench/bench_forward_overhead.py [--width 1024] [--layers 4] [--batches 1 64]
        [--activation Tanh] [--repeat 200] [--rounds 5] [--loom]

The network is ``layers`` x Dense(width) with one activation. The plain-numpy reference is
``h = act(h @ W.T)`` per layer with the weights already in the compute dtype: float32 under the
"fast" precision; under "loom", float64 maths with each layer's output rounded to float32 (what
``VolumetricNetwork.precision`` says). Ours and the reference alternate in ``rounds`` rounds of
``repeat`` calls and the ratio is of the best per-call times, so load on the machine hits both
alike. ``--loom`` also times the reference Loom engine (the ``welvet`` wheel, in a venv of its own
that this script creates under ~/.cache/loomlab/bench-welvet) on the same network and input.
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from loomlab.core import VolumetricNetwork, make_layer, save_network
from loomlab.core.procinfo import machine

WELVET = "welvet==0.80.0"
WELVET_VENV = Path.home() / ".cache" / "loomlab" / "bench-welvet"

# Runs inside the welvet venv: argv = net.json, batch, repeat; prints the best seconds per call.
WELVET_TIMER = """
import sys, time, json
import numpy as np
from welvet import Network
net = Network.deserialize(open(sys.argv[1]).read())
width, batch, repeat = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
x = np.random.default_rng(0).standard_normal((batch, width)).astype(np.float32)
flat, shape = x.ravel().tolist(), [batch, width]
best = float("inf")
for _ in range(repeat):
    t = time.perf_counter()
    net.forward_polymorphic(flat, shape)
    best = min(best, time.perf_counter() - t)
print(json.dumps(best))
"""


def build(width: int, layers: int, activation: str, precision: str) -> VolumetricNetwork:
    net = VolumetricNetwork(1, 1, 1, layers, precision=precision)
    rng = np.random.default_rng(0)
    for i in range(layers):
        net[0, 0, 0, i] = make_layer("Dense", input_height=width, output_height=width,
                                     activation=activation, rng=rng)
    return net


# the activations as a person would write them in numpy (the engine's own code is what is timed)
PLAIN_ACTIVATIONS = {
    "Linear": lambda v: v,
    "ReLU": lambda v: np.maximum(v, 0),
    "Tanh": np.tanh,
    "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
}


def plain_numpy(net: VolumetricNetwork):
    """The forward of ``net`` as a person would write it in numpy, weights prepared once."""
    act = PLAIN_ACTIVATIONS[net.cells[0].cfg.activation]
    compute = np.float64 if net.precision == "loom" else np.float32
    weights = [la.weights.master.reshape(la.cfg.output_height, -1).astype(compute) for la in net.cells]

    def forward(x):
        h = x
        for w in weights:
            h = act(h.astype(compute, copy=False) @ w.T).astype(np.float32, copy=False)
        return h

    return forward


def per_call(fn, x, repeat: int) -> float:
    t = time.perf_counter()
    for _ in range(repeat):
        fn(x)
    return (time.perf_counter() - t) / repeat


def compare(net: VolumetricNetwork, batch: int, repeat: int, rounds: int) -> dict:
    x = np.random.default_rng(1).standard_normal((batch, net.cells[0].cfg.input_height)).astype(np.float32)
    ref = plain_numpy(net)
    np.testing.assert_allclose(net.forward(x), ref(x), rtol=1e-5, atol=1e-5)
    ours, theirs = [], []
    for _ in range(rounds):
        ours.append(per_call(net.forward, x, repeat))
        theirs.append(per_call(ref, x, repeat))
    return {"ours_ms": round(min(ours) * 1e3, 4), "numpy_ms": round(min(theirs) * 1e3, 4),
            "ratio": round(min(ours) / min(theirs), 3)}


def welvet_python() -> Path:
    python = WELVET_VENV / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(WELVET_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", WELVET, "numpy"], check=True)
    return python


def time_welvet(net: VolumetricNetwork, batch: int, repeat: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "net.json"
        save_network(net, path)
        out = subprocess.run([str(welvet_python()), "-c", WELVET_TIMER, str(path),
                              str(net.cells[0].cfg.input_height), str(batch), str(repeat)],
                             check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 64])
    ap.add_argument("--activation", default="Tanh", choices=sorted(PLAIN_ACTIVATIONS))
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--loom", action="store_true", help="also time the reference Loom engine (welvet)")
    args = ap.parse_args()
    results, welvet_s = {}, {}
    for precision in ("fast", "loom"):
        net = build(args.width, args.layers, args.activation, precision)
        for batch in args.batches:
            # fewer calls at large batches keep each round near the same length
            row = compare(net, batch, max(5, args.repeat // batch), args.rounds)
            if args.loom:  # Loom has one precision: timed once per batch, compared with both of ours
                if batch not in welvet_s:
                    welvet_s[batch] = time_welvet(net, batch, max(3, args.rounds))
                row["welvet_ms"] = round(welvet_s[batch] * 1e3, 3)
                row["faster_than_welvet"] = round(welvet_s[batch] / (row["ours_ms"] / 1e3), 1)
            results[f"{precision}_batch{batch}"] = row
    print(json.dumps({
        "machine": machine(), "python": platform.python_version(),
        "command": " ".join([os.path.relpath(sys.argv[0]) if sys.argv[0] else "", *sys.argv[1:]]).strip(),
        "network": f"{args.layers} x Dense({args.width}, {args.activation})",
        "load_avg_1min": round(os.getloadavg()[0], 2),
        "results": results,
    }, indent=2))


if __name__ == "__main__":
    main()
