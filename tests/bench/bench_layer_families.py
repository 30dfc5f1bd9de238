"""Benchmark: one forward + backward of two mid-size grids on numpy, the cost of the array-API code.

    python tests/bench/bench_layer_families.py [--rounds 100] [--backend numpy]

``transformer``: Dense 128 (Tanh), MultiHeadAttention d=128 (8 heads, 4 KV), RMSNorm, SwiGLU
128->256, LayerNorm, Dense (Gelu), Sparse softmax on 64 rows. ``conv_rnn``: CNN2 3->8 channels on
16x16 (8 samples), LSTM 64->64 over 32 steps, Embedding. Each in both precisions ("loom": float64
compute, "fast": float32). Prints the median and best of ``rounds`` in ms. To compare two commits,
run each alternately in one session (the machines here are shared and noisy): FACTS.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from loomlab.core import VolumetricNetwork, make_layer


def grid(layers, backend, precision):
    net = VolumetricNetwork(1, 1, len(layers), 1, backend=backend, precision=precision)
    for i, layer in enumerate(layers):
        net[0, 0, i, 0] = layer
    return net


def transformer(rng):
    return [make_layer("Dense", input_height=128, output_height=128, activation="Tanh", rng=rng),
            make_layer("MultiHeadAttention", d_model=128, num_heads=8, num_kv_heads=4, rng=rng),
            make_layer("RMSNorm", input_height=128, output_height=128, rng=rng),
            make_layer("SwiGLU", input_height=128, output_height=256, rng=rng),
            make_layer("LayerNorm", input_height=128, output_height=128, rng=rng),
            make_layer("Dense", input_height=128, output_height=128, activation="Gelu", rng=rng),
            make_layer("Softmax", softmax_type="Sparse")], (64, 128)


def conv_rnn(rng):
    return [make_layer("CNN2", input_channels=3, filters=8, kernel_size=3, stride=1, padding=1,
                       input_height=16, input_width=16, output_height=16, output_width=16,
                       activation="ReLU", rng=rng),
            make_layer("LSTM", input_height=64, output_height=64, seq_length=32, rng=rng),
            make_layer("Embedding", vocab_size=50, embedding_dim=4, rng=rng)], (8, 3, 16, 16)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--backend", default="numpy")
    args = ap.parse_args()
    for build in (transformer, conv_rnn):
        for precision in ("loom", "fast"):
            rng = np.random.default_rng(0)
            layers, shape = build(rng)
            net = grid(layers, args.backend, precision)
            x = rng.standard_normal(shape).astype(np.float32)
            times = []
            for i in range(args.rounds + 3):  # three warm-up passes (compiled kernels, caches)
                net.reset_state()
                net.zero_grad()
                t = time.perf_counter()
                y = net.forward(x, train=True)
                net.backward(np.ones(y.shape, np.float32))
                if i >= 3:
                    times.append(time.perf_counter() - t)
            print(f"{build.__name__:12s} {precision:5s} median {np.median(times) * 1e3:7.3f} ms"
                  f"  best {min(times) * 1e3:7.3f} ms")


if __name__ == "__main__":
    main()
