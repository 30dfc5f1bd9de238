"""Benchmark: where one decode token's time goes, and how much of it is Python outside the kernels.

    python tests/bench/bench_step_overhead.py [--model smollm2-135m] [--tokens 64] [--rounds 3] [--exact]

Greedy generation of ``--tokens`` tokens, timed three ways in one process (best of ``rounds``):
the whole token (``generate``'s loop: step, choice, record), the ``net.step`` call alone, and the
time inside the heavy kernels, summed by wrapping them: the weight matrices (``QuantMatrix``
matvec / matmul / rows and ``linear`` on float arrays) and attention (``LLMAttention._attend``);
in the int8 mode a decode step is one compiled call (``fused_decode``), which counts whole as
kernels (its norms, RoPE and residual adds included), and ``fused_steps`` says how many steps
took it.
Reported per token: kernels, the rest of the step (numpy's small ops: norms, RoPE, activations,
residual adds, plus the Python that drives the layers) and the loop outside the step (logit
processing, sampling, detokenizing, the record). Wrapping costs a clock read per kernel call
(~0.1 us, ~200 calls a token), which lands in the kernel column. Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time
from contextlib import contextmanager

from loomlab.core.llm import load_model
from loomlab.core.llm.kernels import quant
from loomlab.core.llm.model import causal_lm, fused_decode, llm_layers
from loomlab.core.procinfo import machine


class Clock:
    def __init__(self):
        self.kernels = 0.0
        self.step = 0.0
        self.fused = 0

    def timed(self, fn, field: str):
        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                setattr(self, field, getattr(self, field) + time.perf_counter() - t)
        return wrapper


@contextmanager
def patched(obj, name: str, value):
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


def one_round(model, prompt: str, tokens: int) -> dict:
    clock, prefill = Clock(), {}
    qm, att = quant.QuantMatrix, llm_layers.LLMAttention

    def step(ids, caches=None, _real=model.net.step, **kw):
        t, k0 = time.perf_counter(), clock.kernels
        try:
            return _real(ids, caches, **kw)
        finally:
            if ids.shape[1] > 1:  # the prompt's step: no decode token's
                prefill["kernels"] = clock.kernels - k0
            else:
                clock.step += time.perf_counter() - t

    def fused(*args, _real=causal_lm.fused_step):
        logits = _real(*args)
        clock.fused += logits is not None
        return logits

    with (patched(qm, "matvec", clock.timed(qm.matvec, "kernels")),
          patched(qm, "matmul", clock.timed(qm.matmul, "kernels")),
          patched(qm, "rows", clock.timed(qm.rows, "kernels")),
          patched(att, "_attend", clock.timed(att._attend, "kernels")),
          patched(llm_layers, "int8_product", clock.timed(llm_layers.int8_product, "kernels")),
          patched(llm_layers, "int8_products", clock.timed(llm_layers.int8_products, "kernels")),
          patched(fused_decode, "_step_parallel", clock.timed(fused_decode._step_parallel, "kernels")),
          patched(fused_decode, "_step_worker", clock.timed(fused_decode._step_worker, "kernels")),
          patched(causal_lm, "fused_step", fused),
          patched(model.net, "step", step)):
        records = list(model.generate(prompt, max_tokens=tokens))
    m = model.metrics()
    n = len(records) - 1  # decode steps: the first token comes out of the prefill
    kernels = clock.kernels - prefill["kernels"]
    return {"decode_tokens": n, "token_ms": m.decode_s / n * 1e3, "kernels_ms": kernels / n * 1e3,
            "step_outside_kernels_ms": (clock.step - kernels) / n * 1e3,
            "loop_outside_step_ms": (m.decode_s - clock.step) / n * 1e3, "fused_steps": clock.fused}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--exact", action="store_true", help="the exact path (default: int8 activations)")
    args = ap.parse_args()
    model = load_model(args.model)
    model.activations = "float32" if args.exact else "int8"
    model.prefix_cache.max_bytes = 0  # every round prefills and decodes the same way
    prompt = "The history of computing is a story of people and machines: from mechanical calculators"
    rows = [one_round(model, prompt, args.tokens) for _ in range(args.rounds)]
    best = min(rows, key=lambda r: r["token_ms"])
    best = {k: round(v, 3) if isinstance(v, float) else v for k, v in best.items()}
    best["python_and_small_ops_share"] = round(
        (best["step_outside_kernels_ms"] + best["loop_outside_step_ms"]) / best["token_ms"], 3)
    report = {"machine": machine(), "model": args.model, "activations": model.activations, **best}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
