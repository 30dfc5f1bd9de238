"""``loomlab quant-report`` and ``loomlab quantize``: language models in other formats (no Qt).

``quant-report`` gives the numbers of llama.cpp's ``llama-perplexity --kl-divergence``
(core/llm/quality/drift.py): perplexity of the model as loaded and morphed, KL divergence statistics, RMS
Δp and "same top p", and per layer on request (each layer morphed alone, ranked by KL).
``quantize`` morphs a model by a recipe and saves it as a GGUF file that llama.cpp runs
(core/llm/quality/gguf_export.py), as ``llama-quantize`` does.
"""

from __future__ import annotations

import json
import sys
from functools import partial
from pathlib import Path

from ..cli import CliError, add_backend_option, print_table, progress, progress_bar

DEFAULT_RECIPE = "int8"
RECIPE_HELP = ("one format for every matrix (Q4_K, Q8_0 ... GGUF's block formats) or every weighted "
               "layer (int8, float16 ... Loom's dtypes); a preset, llama.cpp's file type (Q4_K_M, "
               "preset:Q4_0 ...); or a JSON file: {layer or tensor name, pattern "
               "(blk.*.attn_v) or index: format} (\"*\" for the rest, a format or a preset) or a "
               "list with one format per weighted layer")


IMATRIX_HELP = ("an importance matrix (`loomlab imatrix`, or llama-imatrix's .gguf / .dat): block "
                "formats are quantized weighted by it, as llama-quantize --imatrix does")


def register(sub) -> None:
    p = sub.add_parser("quant-report",
                       help="output drift of a morphed language model (llama.cpp's --kl-divergence numbers)")
    p.add_argument("model", help="a built-in alias (smollm2-135m, gemma3-270m), a .gguf file or an HF folder")
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"{RECIPE_HELP} (default {DEFAULT_RECIPE})")
    p.add_argument("--probe", metavar="FILE",
                   help="the text to measure on (default: an English text shipped with Loom Lab, ~1,300 "
                        "tokens); at least 512 tokens and two chunks")
    p.add_argument("--ctx", type=int, default=None,
                   help="tokens per chunk; the second half of each is scored "
                        "(default 256; llama.cpp's is 512)")
    p.add_argument("--per-layer", action="store_true",
                   help="also morph each of the recipe's layers alone and rank them by KL (which layers are "
                        "sensitive)")
    p.add_argument("--top", type=int, default=0,
                   help="with --per-layer: print only the N most sensitive layers")
    p.add_argument("--imatrix", metavar="FILE", help=IMATRIX_HELP)
    p.add_argument("--json", action="store_true", help="print one JSON object")
    add_backend_option(p)
    p.set_defaults(handler=cmd_quant_report)

    q = sub.add_parser("quantize", help="morph a language model by a recipe and save it as GGUF "
                                        "(llama-quantize)")
    q.add_argument("model", help="a built-in alias (smollm2-135m, gemma3-270m) or a .gguf file")
    q.add_argument("output", help="the GGUF file to write (replaced only once it is complete)")
    q.add_argument("--recipe", required=True, help=RECIPE_HELP)
    q.add_argument("--imatrix", metavar="FILE", help=IMATRIX_HELP)
    q.add_argument("--json", action="store_true", help="print what was written as one JSON object")
    q.set_defaults(handler=cmd_quantize)


def cmd_quant_report(args) -> int:
    from loomlab.core.llm.generate.textmodel import load_model
    from loomlab.core.llm.quality.drift import DEFAULT_CTX, measure_drift
    from loomlab.core.llm.quality.recipe import morph_planned

    if args.top < 0:
        raise CliError(f"--top must be >= 0, got {args.top}")
    probe = _read_probe(args.probe) if args.probe is not None else None
    importance = _importance(args.imatrix)
    morph = morph_planned if importance is None else partial(morph_planned, importance=importance)
    with load_model(args.model, progress=progress_bar, backend=args.backend, first_run="wait") as model:
        report = measure_drift(model, args.recipe, probe, ctx=DEFAULT_CTX if args.ctx is None else args.ctx,
                              per_layer=args.per_layer, morph=morph, progress=progress)
    if args.json:
        print(json.dumps({**report.as_dict(), "backend": model.backend.name}, indent=2))
    else:
        _print_report(report, args.recipe, args.top, model.backend.name)
    return 0


def cmd_quantize(args) -> int:
    from loomlab.core.io.atomic import destination
    from loomlab.core.llm.generate.textmodel import load_model
    from loomlab.core.llm.quality.gguf_export import check_recipe_plan, export_gguf
    from loomlab.core.llm.quality.recipe import apply_recipe, fallback_summary, plan_recipe

    destination(args.output)  # a device, FIFO or folder is refused before the model loads
    importance = _importance(args.imatrix)
    with load_model(args.model, progress=progress_bar, first_run="wait") as model:
        # a bad recipe, or one GGUF cannot store (int8 ...), stops here, before any morphing
        plan = plan_recipe(model.net, args.recipe)
        check_recipe_plan(plan)
        if plan.fallbacks:
            print(fallback_summary(plan.fallbacks), file=sys.stderr)
        apply_recipe(model.net, plan, progress=lambda done, total, name: progress(done, total, "morph"),
                     importance=importance)
        result = export_gguf(model, args.output, progress=progress_bar, ftype=plan.file_type)
    summary = {"path": str(result.path), "bytes": result.nbytes, "tensors": result.tensors,
               "changed_tensors": result.changed, "file_type": result.file_type,
               "weight_bytes": plan.bytes, "fallbacks": [str(f) for f in plan.fallbacks]}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        from loomlab.core.units import format_bytes

        print(f"{result.path}: {format_bytes(result.nbytes)}, {result.tensors} tensors "
              f"({result.changed} in new encodings), file type {result.file_type}")
    return 0


def _importance(path: str | None):
    """``--imatrix``'s file as what recipes take: a GGUF tensor name -> its importance vector, None
    for a tensor the file has no entry for (quantized unweighted, as llama-quantize does)."""
    if path is None:
        return None
    from loomlab.core.llm.quality.imatrix import read_imatrix

    im = read_imatrix(path)
    return lambda name: im.importance(name) if name in im.in_sum2 else None


def _read_probe(path: str) -> str:
    try:
        return Path(path).read_text("utf-8")
    except OSError as e:
        raise CliError(f"cannot read the probe file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise CliError(f"the probe file {path} is not UTF-8 text") from None


def _print_report(report, recipe: str, top: int, backend: str) -> None:
    s = report.stats
    what = (f"{len(report.recipe)} of {report.weighted_layers} weighted layers morphed"
            if report.recipe else "no layer changes")
    print(f"{report.model}: recipe {recipe} ({what})")
    print(f"probe: {report.tokens} tokens, {report.chunks} chunks of {report.ctx}, "
          f"{s.positions} positions scored ({report.seconds:.1f} s on {backend})")
    from loomlab.core.units import format_bytes, format_size_change

    print(f"weights: {format_bytes(report.bytes_base)} -> {format_bytes(report.bytes)} "
          f"({format_size_change(report.bytes_base, report.bytes)})")
    if report.fallbacks:
        print(f"llama.cpp's fallbacks, {len(report.fallbacks)} tensors whose rows are not whole blocks:")
        for line in report.fallbacks:
            print(f"  {line}")
    print()
    print("====== Perplexity statistics ======")
    print(f"Mean PPL(Q)                   : {s.ppl_morphed:10.6f} ± {s.ppl_morphed_unc:10.6f}")
    print(f"Mean PPL(base)                : {s.ppl_base:10.6f} ± {s.ppl_base_unc:10.6f}")
    print(f"Cor(ln(PPL(Q)), ln(PPL(base))): {100 * s.ppl_correlation:6.2f}%")
    print(f"Mean ln(PPL(Q)/PPL(base))     : {s.ln_ppl_ratio:10.6f} ± {s.ln_ppl_ratio_unc:10.6f}")
    print(f"Mean PPL(Q)/PPL(base)         : {s.ppl_ratio:10.6f} ± {s.ppl_ratio_unc:10.6f}")
    print(f"Mean PPL(Q)-PPL(base)         : {s.ppl_diff:10.6f} ± {s.ppl_diff_unc:10.6f}")
    print()
    print("====== KL divergence statistics ======")
    print(f"Mean    KLD: {s.kl_mean:10.6f} ± {s.kl_mean_unc:10.6f}")
    print(f"Maximum KLD: {s.kl_max:10.6f}")
    print(f"99.9%   KLD: {s.kl_p999:10.6f}")
    print(f"99.0%   KLD: {s.kl_p99:10.6f}")
    print(f"95.0%   KLD: {s.kl_p95:10.6f}")
    print(f"90.0%   KLD: {s.kl_p90:10.6f}")
    print(f"Median  KLD: {s.kl_median:10.6f}")
    print()
    print("====== Token probability statistics ======")
    print(f"Mean    Δp: {100 * s.dp_mean:6.3f} ± {100 * s.dp_mean_unc:5.3f} %")
    print(f"RMS Δp    : {100 * s.rms_dp:6.3f} ± {100 * s.rms_dp_unc:5.3f} %")
    print(f"Same top p: {100 * s.same_top:6.3f} ± {100 * s.same_top_unc:5.3f} %")
    if report.layers:
        layers = report.layers[:top] if top else report.layers
        print()
        print(f"====== Per layer: each morphed alone, by KL mean "
              f"({len(layers)} of {len(report.layers)}) ======")
        header = ("rank", "layer", "format", "KL mean", "KL 99%", "KL max", "same top", "PPL(Q)/PPL(base)")
        print_table(header, [(str(rank), la.name, la.format, f"{la.stats.kl_mean:.6f}",
                              f"{la.stats.kl_p99:.6f}", f"{la.stats.kl_max:.6f}",
                              f"{100 * la.stats.same_top:.2f}%", f"{la.stats.ppl_ratio:.6f}")
                             for rank, la in enumerate(layers, 1)])
