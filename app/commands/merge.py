"""``loomlab merge``: merge two language models into an HF folder (headless, no Qt)."""

from __future__ import annotations

from ..cli import CliError, progress_bar


def register(sub) -> None:
    merge = sub.add_parser("merge", help="merge two models of one architecture into an HF folder",
                           description="Merge two language models of one architecture and shape (built-in "
                                       "aliases, .gguf files or HF folders) into an HF folder that "
                                       "'loomlab chat DIR' loads.")
    merge.add_argument("a", help="first model (its config and tokenizer go into the result)")
    merge.add_argument("b", help="second model")
    merge.add_argument("-o", "--output", required=True, metavar="DIR",
                       help="folder to write the merged model to")
    merge.add_argument("--method", choices=("linear", "slerp", "task"), default="linear",
                       help="linear: (1-t)A + tB; slerp: along the arc between them; "
                            "task: BASE + wA (A - BASE) + wB (B - BASE) (default linear)")
    t = merge.add_mutually_exclusive_group()
    t.add_argument("--t", type=float, help="weight of B for linear and slerp, in [0, 1] (default 0.5)")
    t.add_argument("--t-schedule", metavar="T1,T2,...",
                   help="values spread evenly over the blocks, first to last (one per block, or fewer "
                        "to interpolate); the embedding takes the first, the head the last")
    merge.add_argument("--base", help="the model A and B were tuned from (task only)")
    merge.add_argument("--weights", metavar="WA,WB", help="task vector weights (task only; default 1,1)")
    merge.add_argument("--force", action="store_true",
                       help="replace the output folder even if it holds files Loom Lab did not write "
                            "(never an input or a folder holding one)")
    merge.set_defaults(handler=cmd_merge)


def cmd_merge(args) -> int:
    from loomlab.core.llm.quality.merge import merge_models

    if args.method == "task":
        if args.base is None:
            raise CliError("--method task needs --base (the model A and B were tuned from)")
        if args.t is not None or args.t_schedule is not None:
            raise CliError("--t and --t-schedule are for linear and slerp; task takes --weights")
        weights = _numbers(args.weights, "--weights") if args.weights is not None else [1.0, 1.0]
        options = dict(base=args.base, weights=weights)
    else:
        if args.base is not None or args.weights is not None:
            raise CliError(f"--base and --weights are for --method task, not {args.method}")
        t = _numbers(args.t_schedule, "--t-schedule") if args.t_schedule is not None else args.t
        options = dict(t=0.5 if t is None else t)
    out = merge_models(args.a, args.b, args.output, method=args.method, progress=progress_bar,
                       force=args.force, **options)
    print(f"merged {args.a} and {args.b} ({args.method}) into {out}")
    return 0


def _numbers(text: str, option: str) -> list[float]:
    try:
        return [float(v) for v in text.split(",")]
    except ValueError:
        raise CliError(f"{option} takes numbers separated by commas, got {text!r}") from None
