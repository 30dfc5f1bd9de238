"""Side by side: Loom Lab and llama.cpp (llama-cpp-python) on the same GGUF, prompt and threads.

    python tests/bench/bench_vs_llamacpp.py [--model smollm2-135m|FILE.gguf] [--tokens 64] [--repeat 3]
        [--llama-python /path/to/venv/bin/python] [--activations float32,int8] [--llama-batch 512]
        [--prompt-tokens N] [--no-lookup]

llama-cpp-python is not a dependency of Loom Lab: install it in any environment
(`pip install llama-cpp-python`, it compiles llama.cpp) and pass that interpreter. On Xeons with
AMX the native build has crashed evaluating batched prompts (then pass ``--llama-batch 1``); a
build without AMX evaluates them (docs/performance.md:
``CMAKE_ARGS="-DGGML_NATIVE=OFF ... -DGGML_AMX_INT8=OFF"``).
Both engines decode greedily with 2 threads; the best of ``--repeat`` runs is reported as JSON, for Loom Lab
in each activation mode asked for (``float32``, exact against transformers; ``int8``, 8-bit
activations as llama.cpp computes) with its ratios to llama.cpp. Loom Lab runs as a user's
``generate`` does: greedy requests speculate with prompt lookup, which copies part of some models'
continuations of this prompt (each run reports its drafted and accepted tokens); ``--no-lookup``
decodes one token a step, as llama.cpp does here.
Each engine and mode runs in a process of its own, whose peak RSS is reported beside its speeds.
For llama.cpp it also reports how many tokens a second one evaluation of 8 new tokens yields and
its speed-up over one token (the most 8 streams could gain there; compare
``tests/bench/bench_batching.py --streams 1,8``).
``--prompt-tokens N`` repeats the prompt's text to at least N tokens (a long prefill).
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
from pathlib import Path

from loomlab.core.llm.files import registry
from loomlab.core.llm.generate.prefix_cache import PrefixCache
from loomlab.core.llm.generate.speculative import AUTO
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.procinfo import machine

PROMPT = ("The history of computing is a story of people and machines: from mechanical calculators "
          "and punched cards to transistors, integrated circuits and the networks that")

LLAMA_CPP = r"""
import json, resource, sys, time
from llama_cpp import Llama
path, prompt = sys.argv[1], sys.argv[2]
n, repeat, batch, ctx = (int(a) for a in sys.argv[3:7])
llm = Llama(model_path=path, n_threads=2, n_ctx=ctx, n_batch=batch, verbose=False)
ids = llm.tokenize(prompt.encode(), add_bos=False)
best = None
for _ in range(repeat):
    llm.reset()
    t0 = time.perf_counter(); llm.eval(ids); prefill = time.perf_counter() - t0
    out = []
    t1 = time.perf_counter()
    for _ in range(n):
        tok = llm.sample(temp=0.0)
        out.append(tok); llm.eval([tok])
    decode = time.perf_counter() - t1
    run = {"prompt_tokens": len(ids), "prefill_tokens_per_s": len(ids) / prefill,
           "decode_tokens_per_s": n / decode}
    if best is None or run["decode_tokens_per_s"] > best["decode_tokens_per_s"]:
        best = run
steps = {1: [], 8: []}  # one evaluation of 1 and of 8 new tokens after the prompt, alternated
for _ in range(repeat * 4):
    for k in steps:
        llm.reset(); llm.eval(ids)
        t0 = time.perf_counter(); llm.eval(ids[:k]); steps[k].append(time.perf_counter() - t0)
one, eight = (sorted(t)[len(t) // 2] for t in steps.values())
best["eight_rows_tokens_per_s"] = 8 / eight
best["eight_rows_speedup"] = 8 * one / eight
best["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps(best))
"""


def loomlab_run(model_path: str, prompt: str, tokens: int, repeat: int, activations: str,
                lookup: bool = True) -> dict:
    best = None
    speculative = AUTO if lookup else None
    with load_model(model_path, activations=activations, first_run="wait") as model:
        model.prefix_cache = PrefixCache(0)  # every run prefills the whole prompt, as llama.cpp's
        list(model.generate(prompt, max_tokens=2))  # warm-up
        for _ in range(repeat):
            list(model.generate(prompt, max_tokens=tokens, speculative=speculative))
            m = model.metrics()
            run = {"prompt_tokens": m.prompt_tokens, "prefill_tokens_per_s": m.prefill_tokens_per_s,
                   "decode_tokens_per_s": m.decode_tokens_per_s, "drafted_tokens": m.drafted_tokens,
                   "accepted_tokens": m.accepted_tokens}
            if best is None or run["decode_tokens_per_s"] > best["decode_tokens_per_s"]:
                best = run
    best["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return best


def long_prompt(n: int) -> str:
    """The prompt's text repeated to at least ``n`` tokens of the model's tokenizer (words: a
    token is at most a word here)."""
    words = PROMPT.split()
    return " ".join(words * (n // len(words) + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--llama-python", default=sys.executable)
    ap.add_argument("--activations", default="float32,int8", help="Loom Lab's modes, comma-separated")
    ap.add_argument("--llama-batch", type=int, default=512,
                    help="llama.cpp's n_batch; 1 feeds the prompt a token at a time (its prefill then "
                         "understated), for builds that crash evaluating batched prompts")
    ap.add_argument("--prompt-tokens", type=int, default=0, help="a longer prompt: at least this many tokens")
    ap.add_argument("--no-lookup", action="store_true", help="Loom Lab without prompt lookup")
    ap.add_argument("--child", help=argparse.SUPPRESS)  # one Loom Lab mode, in a process of its own
    args = ap.parse_args()
    prompt = long_prompt(args.prompt_tokens) if args.prompt_tokens else PROMPT
    path = str(Path(args.model)) if Path(args.model).is_file() else str(registry.fetch(args.model))
    if args.child:
        print(json.dumps(loomlab_run(path, prompt, args.tokens, args.repeat, args.child, not args.no_lookup)))
        return
    modes = args.activations.split(",")
    ours = {mode: _child([sys.executable, __file__, *sys.argv[1:], "--child", mode]) for mode in modes}
    ctx = 512 if not args.prompt_tokens else 2 * args.prompt_tokens + args.tokens + 64  # room for the prompt
    theirs = _child([args.llama_python, "-c", LLAMA_CPP, path, prompt, str(args.tokens), str(args.repeat),
                     str(args.llama_batch), str(ctx)])
    print(json.dumps({
        "machine": machine(), "python": platform.python_version(), "model": args.model,
        "loomlab": {mode: {k: round(v, 1) for k, v in run.items()} for mode, run in ours.items()},
        "llama_cpp": {k: round(v, 1) for k, v in theirs.items()}, "llama_batch": args.llama_batch,
        "ratios": {mode: {kind: round(run[f"{kind}_tokens_per_s"] / theirs[f"{kind}_tokens_per_s"], 2)
                          for kind in ("prefill", "decode")} for mode, run in ours.items()},
    }, indent=2))


def _child(cmd: list[str]) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.exit(f"{cmd[0]} failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
