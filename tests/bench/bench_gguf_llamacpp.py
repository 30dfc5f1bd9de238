"""Exported GGUF files in llama.cpp: SmolLM2 as loaded, morphed to Q8_0 and to a mixed recipe
(or ``--model``, its file morphed to each ``--recipe`` JSON, an evolved recipe say), each exported
with ``export_gguf`` and decoded greedily on the golden prompts by both engines.

    python tests/bench/bench_gguf_llamacpp.py [--tokens 32] [--keep DIR]
        [--model smollm2-f16.gguf --recipe evolved.json ...]
        [--llama-python ~/.cache/loomlab/bench-llamacpp/bin/python]

llama-cpp-python is not a dependency of Loom Lab: build it into an environment of its own
(``python3 -m venv ~/.cache/loomlab/bench-llamacpp && ~/.cache/loomlab/bench-llamacpp/bin/pip
install llama-cpp-python==0.3.36``, which compiles llama.cpp) and pass that interpreter. Prompts are
the golden token ids (tests/data/llm), so neither tokenizer is involved; both continuations are
decoded by ours for reading. Prints JSON: per recipe and prompt, both continuations, whether the
ids agree, where they first part and our logit margin there of our token over llama.cpp's.
llama.cpp multiplies quantized matrices with 8-bit activations, so a near-tie between two tokens
may go either way (tests/data/llm notes one).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.quality.drift import weighted_layers
from loomlab.core.llm.quality.gguf_export import export_gguf
from loomlab.core.llm.quality.recipe import apply_recipe
from loomlab.core.morph import morph_sublayer
from loomlab.core.procinfo import machine

MODEL = "smollm2-135m"
GOLDEN = Path(__file__).parents[1] / "data" / "llm" / "smollm2-135m-instruct-q4_1.json"
LLAMA_PYTHON = Path.home() / ".cache" / "loomlab" / "bench-llamacpp" / "bin" / "python"

LLAMA_CPP = r"""
import json, sys
from llama_cpp import Llama
path, prompts, n, batch = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
llm = Llama(model_path=path, n_threads=2, n_ctx=512, n_batch=batch, verbose=False)
out = []
for ids in prompts:
    llm.reset()
    llm.eval(ids)
    got = []
    for _ in range(n):
        tok = llm.sample(temp=0.0)
        got.append(tok)
        if tok == llm.token_eos():
            break
        llm.eval([tok])
    out.append(got)
print(json.dumps(out))
"""


def mixed(name: str) -> str | None:
    """A recipe mixing every kind of encoding the export writes: attention Q8_0, MLPs Q4_0 but the
    first in float16 and the last in bfloat16, the head F16 (so no longer tied to the Q8_0 table),
    the norms and the table as in the file."""
    if name.startswith("output"):
        return "float16"
    if name == "blk.0.ffn_gate/up/down":
        return "float16"
    if name == "blk.29.ffn_gate/up/down":
        return "bfloat16"
    if "/" in name:
        return "Q8_0" if "attn_" in name else "Q4_0"
    return None


RECIPES = {"file (Q4_1, as loaded)": lambda name: None, "Q8_0": lambda name: "Q8_0", "mixed": mixed}


def ours(path: Path, prompts: list[list[int]], n: int, theirs: list[list[int]]) -> list[dict]:
    """Our greedy continuations of ``prompts`` from the file at ``path``; where llama.cpp's part
    from ours, our logit margin there of our token over llama.cpp's (a small one is a near-tie)."""
    out = []
    with load_model(path) as model:
        for ids, other in zip(prompts, theirs, strict=True):
            got = [r.id for r in model.generate(ids, max_tokens=n, temperature=0.0) if r.id >= 0]
            at = first_difference(got, other)
            margin = None
            if at is not None and at < min(len(got), len(other)):
                logits = model.classify([ids + got[:at]])[0].logits
                margin = round(float(logits[got[at]] - logits[other[at]]), 3)
            out.append({"ids": got, "first_difference": at, "margin_at_difference": margin})
    return out


def theirs(python: str, path: Path, prompts: list[list[int]], n: int, batch: int) -> list[list[int]]:
    done = subprocess.run([python, "-c", LLAMA_CPP, str(path), json.dumps(prompts), str(n), str(batch)],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        sys.exit(f"llama.cpp could not run {path.name} (exit status {done.returncode}): "
                 f"{done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where the continuations differ (None when they are the same)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--llama-python", default=str(LLAMA_PYTHON))
    # llama-cpp-python 0.3.36 compiled natively on an AMX Xeon (Sapphire Rapids) died of SIGSEGV
    # in batched prompt evaluation, whatever the file, its own included; one token at a time it runs
    ap.add_argument("--llama-batch", type=int, default=1, help="llama.cpp's n_batch (default 1)")
    ap.add_argument("--keep", type=Path, help="write the exported files here (default: a temporary folder)")
    ap.add_argument("--model", default=MODEL, help=f"the model the recipes morph (default {MODEL})")
    ap.add_argument("--recipe", type=Path, action="append",
                    help="a JSON recipe to export and compare (repeatable; default: the three built in)")
    args = ap.parse_args()
    recipes = {p.name: p for p in args.recipe} if args.recipe else RECIPES
    golden = json.loads(GOLDEN.read_text())["generate"]
    prompts = [g["prompt_ids"] for g in golden]
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        results = {}
        for label, recipe in recipes.items():
            stem = Path(label).stem if args.recipe else f"smollm2-{label.split()[0].lower()}"
            path = folder / f"{stem}.gguf"
            with load_model(args.model) as model:
                if isinstance(recipe, Path):
                    apply_recipe(model.net, recipe)
                for w in weighted_layers(model.net) if callable(recipe) else ():
                    if recipe(w.name) is not None:
                        morph_sublayer(w.layer, w.cell, recipe(w.name))
                report = export_gguf(model, path)
                decode = model.tokenizer.decode
                b = theirs(args.llama_python, path, prompts, args.tokens, args.llama_batch)
                a = ours(path, prompts, args.tokens, b)
                rows = [{"prompt": decode(ids)[-60:], "loomlab": decode(x["ids"]), "llama_cpp": decode(y),
                         "agree": x["ids"] == y, "first_difference": x["first_difference"],
                         "our_logit_margin_there": x["margin_at_difference"]}
                        for ids, x, y in zip(prompts, a, b, strict=True)]
            results[label] = {"file_mb": round(report.nbytes / 1e6, 1), "file_type": report.file_type,
                              "tensors_changed": report.changed, "prompts": rows,
                              "all_agree": all(r["agree"] for r in rows)}
    print(json.dumps({"machine": machine(), "model": args.model, "tokens": args.tokens,
                      "llama_python": args.llama_python, "llama_batch": args.llama_batch, "recipes": results},
                     indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
