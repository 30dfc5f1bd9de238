"""Decode speed per GGUF tensor type, beside llama.cpp on the same files.

    python tests/bench/bench_tensor_types.py --llama-python VENV/bin/python [--model smollm2-135m]
        [--types Q2_K,Q3_K_M,Q5_K_M,IQ4_NL,IQ4_XS] [--out /tmp/types]

The files are made as people get them: the model's F16 export (``loomlab quantize MODEL F16
--recipe float16``, the same function as the built-in file) quantized by llama.cpp itself
(llama-cpp-python's ``llama_model_quantize``, in the interpreter given, like
``llama-quantize``). Each file then runs through ``bench_vs_llamacpp.py --activations int8
--no-lookup`` (one token a step, both engines); one JSON line per type: the file's tensor types,
both engines' decode tokens/s and peak RSS, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from loomlab.core.llm.model.model_info import describe

QUANTIZE = r"""
import ctypes, sys, llama_cpp
p = llama_cpp.llama_model_quantize_default_params()
p.ftype = getattr(llama_cpp, "LLAMA_FTYPE_MOSTLY_" + sys.argv[3])
p.nthread = 2
sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), ctypes.byref(p)))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", required=True)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--types", default="Q2_K,Q3_K_M,Q5_K_M,IQ4_NL,IQ4_XS")
    ap.add_argument("--out", default="/tmp/loomlab-tensor-types")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    f16 = out / f"{args.model}-F16.gguf"
    if not f16.exists():
        subprocess.run([sys.executable, "-m", "loomlab.app.cli", "quantize", args.model, str(f16),
                        "--recipe", "float16"], check=True, capture_output=True)
    bench = Path(__file__).with_name("bench_vs_llamacpp.py")
    for ftype in args.types.split(","):
        path = out / f"{args.model}-{ftype}.gguf"
        if not path.exists():
            subprocess.run([args.llama_python, "-c", QUANTIZE, str(f16), str(path), ftype], check=True,
                           capture_output=True)
        done = subprocess.run([sys.executable, str(bench), "--model", str(path), "--llama-python",
                               args.llama_python, "--activations", "int8", "--no-lookup", "--repeat",
                               str(args.repeat)], check=True, capture_output=True, text=True)
        result = json.loads(done.stdout)
        ours, theirs = result["loomlab"]["int8"], result["llama_cpp"]
        print(json.dumps({"type": ftype, "tensor_types": describe(path).types_text,
                          "loomlab_decode": ours["decode_tokens_per_s"],
                          "llama_cpp_decode": theirs["decode_tokens_per_s"],
                          "ratio": result["ratios"]["int8"]["decode"],
                          "loomlab_rss_mib": ours["peak_rss_mib"],
                          "llama_cpp_rss_mib": theirs["peak_rss_mib"]}), flush=True)


if __name__ == "__main__":
    main()
