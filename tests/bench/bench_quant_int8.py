"""Benchmark: decoding with 8-bit activations (core/llm/kernels/quant_int8.py) against the float kernels.

    python tests/bench/bench_quant_int8.py [--models smollm2-135m gemma3-270m] [--repeat 20]
        [--rounds 3] [--tokens 64] [--threads 2] [--skip-accuracy]

Three measurements per model, float and int8 taken in alternation in this one process (the
machine is shared; each number is the best of its runs):

* matvec: one per-token matrix of each (type, shape) the model has, ``QuantMatrix.matvec`` vs
  ``int8_matvec``, microseconds, on the threads ``adaptive_threads`` picks (as in generation).
* decode: tokens/s of a greedy 64-token generation, with ``QuantMatrix.matvec`` swapped for the
  integer kernel inside this process (prefill keeps the float ``matmul``).
* accuracy: five prompts continued greedily on the float path; along those tokens, each step's
  next-token distribution on both paths (the same tokens fed to both): KL(float || int8) in nats,
  mean and worst, and how often the top token agrees.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from contextlib import contextmanager

import numba
import numpy as np
from benchtools import best
from gguf import GGUFReader

from loomlab.core.llm.files import registry
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.kernels.quant import QuantMatrix, adaptive_threads
from loomlab.core.llm.kernels.quant_int8 import int8_matvec, supports
from loomlab.core.procinfo import machine

PROMPTS = [
    "The history of computing is a story of people and machines: from mechanical calculators",
    "Once upon a time, in a small village at the edge of a forest, there lived",
    "To make a good cup of tea, first",
    "The three laws of thermodynamics state that",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
]


@contextmanager
def int8_decode():
    """Every ``QuantMatrix.matvec`` of a supported encoding runs the integer kernel meanwhile."""
    original = QuantMatrix.matvec

    def matvec(self, x, out=None):
        if not supports(self):
            return original(self, x, out)
        y = int8_matvec(self, x)
        if out is None:
            return y
        out[:] = y
        return out

    QuantMatrix.matvec = matvec
    try:
        yield
    finally:
        QuantMatrix.matvec = original


def file_matrices(alias: str) -> dict[tuple[str, tuple[int, int]], QuantMatrix]:
    """One matrix of the model's file for each (type, shape) the integer kernels take."""
    found = {}
    for t in GGUFReader(registry.fetch(alias)).tensors:
        if len(t.shape) == 2:
            m = QuantMatrix(t.data, int(t.tensor_type), (int(t.shape[1]), int(t.shape[0])), name=t.name)
            if supports(m):
                found.setdefault((m.type_name, m.shape), m)
    return found


def bench_matvec(alias: str, repeat: int) -> list[dict]:
    rng = np.random.default_rng(0)
    rows = []
    for (name, shape), m in sorted(file_matrices(alias).items()):
        x = rng.standard_normal(shape[1]).astype(np.float32)
        float_us, int8_us = [], []
        with adaptive_threads():  # the threads a generating model would use on this busy machine
            for _ in range(3):  # alternate: a burst of load hits both
                float_us.append(best(lambda m=m, x=x: m.matvec(x), repeat) * 1e6)
                int8_us.append(best(lambda m=m, x=x: int8_matvec(m, x), repeat) * 1e6)
        f, i = min(float_us), min(int8_us)
        rows.append({"type": name, "shape": list(shape), "float_us": round(f, 1), "int8_us": round(i, 1),
                     "speedup": round(f / i, 2)})
    return rows


def decode_tokens_per_s(model, tokens: int) -> float:
    list(model.generate(PROMPTS[0], max_tokens=tokens, temperature=0.0))
    return model.metrics().decode_tokens_per_s


def bench_decode(model, tokens: int, rounds: int) -> dict:
    decode_tokens_per_s(model, 4)
    with int8_decode():
        decode_tokens_per_s(model, 4)  # compile / load the integer kernels
    runs = {"float": [], "int8": []}
    for _ in range(rounds):
        runs["float"].append(decode_tokens_per_s(model, tokens))
        with int8_decode():
            runs["int8"].append(decode_tokens_per_s(model, tokens))
    f, i = max(runs["float"]), max(runs["int8"])
    return {"float_tokens_per_s": round(f, 1), "int8_tokens_per_s": round(i, 1), "speedup": round(i / f, 2)}


def step_logits(model, ids: list[int], continuation: list[int]) -> np.ndarray:
    """The next-token logits after the prompt and after each token of ``continuation`` (prompt
    prefilled, then one decode step a token): ``[len(continuation), vocab]``."""
    net = model.net
    caches = net.make_cache(len(ids) + len(continuation))
    out = [net.step(np.array([ids]), [caches])[0]]
    for token in continuation[:-1]:
        out.append(net.step(np.array([[token]]), [caches])[0])
    return np.array(out, np.float64)


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def bench_accuracy(model, tokens: int) -> dict:
    kls, agree, n = [], 0, 0
    with model.busy():
        for prompt in PROMPTS:
            ids = model.tokenizer.encode(prompt, add_special_tokens=True)
            net = model.net
            caches = net.make_cache(len(ids) + tokens)
            logits = net.step(np.array([ids]), [caches])[0]
            continuation = []
            for _ in range(tokens):  # greedy on the float path
                continuation.append(int(np.argmax(logits)))
                logits = net.step(np.array([[continuation[-1]]]), [caches])[0]
            exact = step_logits(model, ids, continuation)
            with int8_decode():
                approx = step_logits(model, ids, continuation)
            lp, lq = log_softmax(exact), log_softmax(approx)
            kls.extend((np.exp(lp) * (lp - lq)).sum(-1))
            agree += int((exact.argmax(-1) == approx.argmax(-1)).sum())
            n += len(continuation)
    # step 0 is the prefill (float matmul on both paths): its KL is 0 and it is left in, as a
    # decode-only mode leaves it
    return {"positions": n, "kl_mean_nats": float(np.mean(kls)), "kl_max_nats": float(np.max(kls)),
            "top1_agreement": round(agree / n, 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3, help="alternating decode runs per path")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--threads", type=int, default=numba.get_num_threads(),
                    help="numba threads at most (generation adapts below it to the load)")
    args = ap.parse_args()
    numba.set_num_threads(args.threads)
    report = {"machine": machine(), "python": platform.python_version(),
              "numba_threads": numba.get_num_threads(), "models": {}}
    for alias in args.models:
        t = time.perf_counter()
        with load_model(alias) as model:
            entry = {"matvec": bench_matvec(alias, args.repeat),
                     "decode": bench_decode(model, args.tokens, args.rounds)}
            if not args.skip_accuracy:
                entry["accuracy"] = bench_accuracy(model, args.tokens)
        entry["seconds"] = round(time.perf_counter() - t, 1)
        report["models"][alias] = entry
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
