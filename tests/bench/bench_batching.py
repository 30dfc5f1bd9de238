"""Benchmark: batched decoding and the prefix cache on a built-in model.

    python tests/bench/bench_batching.py [--model smollm2-135m] [--streams 1,2,4,8,16]
                                         [--tokens 64] [--rounds 2] [--turns 10] [--exact]

Streams: ``S`` different prompts decoded together by ``Batch`` (one net.step over every active
sequence), greedy, ``--tokens`` each; aggregate decode tokens/s = tokens generated after the
prompts' prefills / decode time, best of ``rounds``; the speed-up is over one stream. Every
stream's text is checked equal to its prompt generated alone first.

Turns: a chat of ``--turns`` user turns (each reply 16 tokens) with the model's prefix cache and
without one; time to first token per turn, and how many prompt tokens the cache served.
Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import time

from loomlab.core.llm import load_model
from loomlab.core.llm.generate.batching import Batch, Request
from loomlab.core.llm.generate.prefix_cache import DEFAULT_BYTES, PrefixCache
from loomlab.core.llm.generate.sampling import SamplingParams
from loomlab.core.procinfo import machine

SEEDS = ["The capital of France is", "Once upon a time", "def fibonacci(n):", "The three primary colours are",
         "In 1969, the first", "My favourite food is", "Water boils at", "The quick brown fox",
         "A good night's sleep", "The history of Rome", "To bake bread you need", "Photosynthesis is",
         "The best way to learn", "Mount Everest is", "In the year 3000,", "Dear diary, today"]


def streams(model, n: int, tokens: int, rounds: int) -> dict:
    prompts = [SEEDS[i % len(SEEDS)] + " " * (i // len(SEEDS)) for i in range(n)]
    params = SamplingParams(max_tokens=tokens)
    model.prefix_cache = PrefixCache(0)
    alone = ["".join(r.text for r in model.generate(p, max_tokens=tokens)) for p in prompts]
    best = None
    for _ in range(rounds):
        with model.busy():
            batch = Batch(model, max_batch=n)
            reqs = [Request(batch.check(model.tokenizer.encode(p, add_special_tokens=True), params), params)
                    for p in prompts]
            for r in reqs:
                batch.add(r)
            batch.step()  # admits (prefills) every prompt and runs the first decode step
            t0, done0 = time.perf_counter(), batch.tokens
            while batch.busy:
                batch.step()
            dt, made = time.perf_counter() - t0, batch.tokens - done0
        texts = [r.text() for r in reqs]
        if texts != alone:
            raise SystemExit(f"{n} streams: a batched output differs from its prompt alone")
        if best is None or made / dt > best:
            best = made / dt
    return {"streams": n, "aggregate_tokens_per_s": round(best, 1)}


def turns(model, n: int, cached: bool) -> list[dict]:
    model.prefix_cache = PrefixCache(DEFAULT_BYTES if cached else 0)
    messages, out = [], []
    for i in range(n):
        messages.append({"role": "user", "content": f"Tell me one more fact about the number {i + 1}."})
        reply = "".join(r.text for r in model.chat(messages, max_tokens=16))
        m = model.metrics()
        out.append({"turn": i + 1, "prompt_tokens": m.prompt_tokens, "cached_tokens": m.cached_tokens,
                    "ttft_ms": round(m.time_to_first_token_s * 1000, 1)})
        messages.append({"role": "assistant", "content": reply})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--streams", default="1,2,4,8,16")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--turns", type=int, default=10)
    ap.add_argument("--exact", action="store_true", help="the exact path (default: int8 activations)")
    args = ap.parse_args()
    model = load_model(args.model)
    model.activations = "float32" if args.exact else "int8"
    rows = [streams(model, int(s), args.tokens, args.rounds) for s in args.streams.split(",")]
    for row in rows:
        row["speedup"] = round(row["aggregate_tokens_per_s"] / rows[0]["aggregate_tokens_per_s"], 2)
    report = {"machine": machine(), "model": args.model, "activations": model.activations,
              "tokens_per_stream": args.tokens, "streams": rows}
    if args.turns:
        report["chat_turns"] = {"prefix_cache": turns(model, args.turns, True),
                                "no_cache": turns(model, args.turns, False)}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
