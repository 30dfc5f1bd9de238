"""``loomlab inspect``: look inside a language model over one prompt (no Qt).

The headless side of the Inspect panel (core/inspect): attention patterns, the logit lens, direct
logit attribution, ablation and activation patching, as tables or one JSON object.
"""

from __future__ import annotations

import json
import sys

from ..cli import CliError, add_backend_option, print_table, progress, progress_bar, token_ids

WHATS = ("patterns", "lens", "attribution", "ablation", "patching")


def register(sub) -> None:
    p = sub.add_parser(
        "inspect",
        help="attention patterns, logit lens, attribution, ablation, patching",
        description="Look inside a language model over one prompt, on the exact path (float32 activations).",
    )
    p.add_argument("model", help="a built-in alias (smollm2-135m, gemma3-270m), a .gguf file or an HF folder")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="prompt text (the model's BOS added where it wants one)")
    src.add_argument("--ids", help="prompt token ids, e.g. 1,2,3")
    p.add_argument("--what", choices=WHATS, default="lens", help="which inspection (default lens)")
    target = p.add_mutually_exclusive_group()
    target.add_argument(
        "--target",
        metavar="TOKEN",
        help="the target token as text (one token, e.g. ' Paris'; default: the model's top prediction)",
    )
    target.add_argument("--target-id", type=int, metavar="ID", help="the target token as an id")
    p.add_argument(
        "--position",
        type=int,
        default=-1,
        help="attribution: the position whose next-token logit is split (default -1, the last)",
    )
    p.add_argument("--layer", type=int, help="patterns: print this layer's heads in full")
    p.add_argument("--head", type=int, help="patterns: with --layer, only this head")
    p.add_argument(
        "--top",
        type=int,
        default=5,
        help="lens: top tokens kept (default 5); attribution: components printed (JSON has all)",
    )
    p.add_argument(
        "--ablate",
        action="append",
        default=[],
        metavar="KIND:LAYER[:HEAD]",
        help="ablation: a component (head:3:1, attention:3, mlp:3, block:3); repeatable",
    )
    p.add_argument(
        "--mode",
        choices=("zero", "mean", "disable"),
        default="zero",
        help="ablation: zero, mean over the prompt's positions, or disable (a block: Loom's "
        "is_disabled) (default zero)",
    )
    p.add_argument(
        "--new-tokens",
        type=int,
        default=8,
        help="ablation: greedy continuation length before and after (default 8)",
    )
    p.add_argument("--corrupted", help="patching: the corrupted prompt (as many tokens as --prompt)")
    p.add_argument(
        "--site",
        choices=("resid_pre", "attn_out", "mlp_out", "z"),
        default="resid_pre",
        help="patching: what is copied from the clean run (default resid_pre; z: one head)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object with every number")
    add_backend_option(p)
    p.set_defaults(handler=cmd_inspect)


def cmd_inspect(args) -> int:
    from loomlab.core.inspect import Inspector
    from loomlab.core.llm.generate.textmodel import load_model

    ablations = [_ablation(spec, args.mode) for spec in args.ablate]
    if args.what == "ablation" and not ablations:
        raise CliError("--what ablation needs at least one --ablate KIND:LAYER[:HEAD]")
    if args.what == "patching" and args.corrupted is None:
        raise CliError("--what patching needs --corrupted TEXT")
    with load_model(args.model, progress=progress_bar, backend=args.backend) as model:
        inspector = Inspector(model)
        ids = inspector.prompt_ids(args.prompt if args.prompt is not None else token_ids(args.ids))
        target = inspector.token_id(args.target) if args.target is not None else args.target_id
        texts = inspector.token_texts(ids)
        result = _run(inspector, args, ids, target, ablations)
        out = {
            "model": model.name,
            "what": args.what,
            "tokens": ids,
            "token_texts": texts,
            **result.as_json(inspector),
        }
    if args.json:
        print(json.dumps(out))
    else:
        result.print(inspector, texts, args)
    return 0


def _run(inspector, args, ids, target, ablations):
    if args.what == "patterns":
        return _Patterns(inspector.patterns(ids))
    if args.what == "lens":
        return _Lens(
            inspector.lens(ids, target=target, k=args.top, progress=lambda d, t: progress(d, t, "lens"))
        )
    if args.what == "attribution":
        return _Attribution(inspector.attribution(ids, target, args.position))
    if args.what == "ablation":
        return _Ablation(
            inspector.ablation(
                ids,
                ablations,
                target=target,
                new_tokens=args.new_tokens,
                progress=lambda d, t: progress(d, t, "forward"),
            )
        )
    corrupted = inspector.prompt_ids(args.corrupted)
    return _Patching(
        inspector.patching(
            ids, corrupted, site=args.site, answer=target, progress=lambda d, t: progress(d, t, "layers")
        )
    )


def _ablation(spec: str, mode: str):
    from loomlab.core.inspect import KINDS, Ablation

    parts = spec.split(":")
    try:
        numbers = [int(p) for p in parts[1:]]
    except ValueError:
        numbers = []
    if (
        parts[0] not in KINDS
        or len(numbers) != (2 if parts[0] == "head" else 1)
        or len(parts) != 1 + len(numbers)
    ):
        raise CliError(f"--ablate {spec!r}: expected head:LAYER:HEAD or attention|mlp|block:LAYER")
    return Ablation(parts[0], numbers[0], numbers[1] if parts[0] == "head" else None, mode)


def _rounded(a, digits: int = 6):
    import numpy as np

    return np.round(np.asarray(a, dtype=np.float64), digits).tolist()


class _Patterns:
    def __init__(self, patterns):
        self.p = patterns

    def as_json(self, inspector) -> dict:
        return {
            "layers": self.p.n_layers,
            "heads": self.p.n_heads,
            "patterns": [_rounded(self.p.layer(i)) for i in range(self.p.n_layers)],
        }

    def print(self, inspector, texts, args) -> None:
        if args.layer is not None:
            heads = range(self.p.n_heads) if args.head is None else [args.head]
            layer = (
                self.p.layer(args.layer) if args.head is None else self.p.head(args.layer, args.head)[None]
            )
            for h, weights in zip(heads, layer, strict=True):
                print(f"layer {args.layer} head {h} (rows: queries, columns: keys)")
                print_table(
                    ("", *map(repr, texts)),
                    [(repr(t), *(f"{w:.2f}" for w in row)) for t, row in zip(texts, weights, strict=True)],
                )
            return
        last = len(texts) - 1
        rows = []
        for i in range(self.p.n_layers):
            weights = self.p.layer(i)[:, last, :]
            rows.append(
                (str(i), *(f"{int(w.argmax())} {texts[int(w.argmax())]!r} {w.max():.2f}" for w in weights))
            )
        print("where the last token looks: each head's most attended position, its token and weight")
        print_table(("layer", *(f"head {h}" for h in range(self.p.n_heads))), rows)


class _Lens:
    def __init__(self, lens):
        self.lens = lens

    def as_json(self, inspector) -> dict:
        lens = self.lens
        return {
            "target": lens.target,
            "target_text": inspector.token_texts([lens.target])[0],
            "rows": lens.row_names,
            "top_ids": lens.top_ids.tolist(),
            "top_probs": _rounded(lens.top_probs),
            "target_probs": _rounded(lens.target_probs),
            "target_ranks": lens.target_ranks.tolist(),
        }

    def print(self, inspector, texts, args) -> None:
        lens = self.lens
        shown = range(max(0, len(texts) - 8), len(texts))  # the last 8 positions (JSON has all)
        target = inspector.token_texts([lens.target])[0]
        print(
            f"top-1 token (probability) after each block; target {target!r}: probability and rank at the "
            f"last position"
        )
        rows = []
        for j, name in enumerate(lens.row_names):
            tops = inspector.token_texts([int(lens.top_ids[j, p, 0]) for p in shown])
            rows.append(
                (
                    name,
                    *(f"{t!r} {lens.top_probs[j, p, 0]:.2f}" for t, p in zip(tops, shown, strict=True)),
                    f"{lens.target_probs[j, -1]:.3f} #{lens.target_ranks[j, -1]}",
                )
            )
        print_table(("", *(repr(texts[p]) for p in shown), "target"), rows)


class _Attribution:
    def __init__(self, attribution):
        self.a = attribution

    def as_json(self, inspector) -> dict:
        a = self.a
        return {
            "position": a.position,
            "target": a.token,
            "target_text": inspector.token_texts([a.token])[0],
            "logit": a.logit,
            "embed": a.embed,
            "heads": _rounded(a.heads),
            "attn_bias": _rounded(a.attn_bias),
            "mlp": _rounded(a.mlp),
            "total": a.total(),
        }

    def print(self, inspector, texts, args) -> None:
        a = self.a
        target = inspector.token_texts([a.token])[0]
        print(
            f"logit of {target!r} after position {a.position} ({texts[a.position]!r}): {a.logit:.4f}; "
            f"the components sum to {a.total():.4f}"
        )
        rows = [
            (kind, "" if layer < 0 else str(layer), "" if head is None else str(head), f"{share:+.4f}")
            for kind, layer, head, share in a.components()[: max(args.top, 1) * 4]
        ]
        print_table(("component", "layer", "head", "share"), rows)


class _Ablation:
    def __init__(self, result):
        self.r = result

    def as_json(self, inspector) -> dict:
        r = self.r
        return {
            "ablations": [a.label() for a in r.ablations],
            "target": r.target,
            "target_text": inspector.token_texts([r.target])[0],
            "logprob_before": r.logprob_before,
            "logprob_after": r.logprob_after,
            "greedy_before": r.greedy_before,
            "greedy_after": r.greedy_after,
            "changed": r.changed,
        }

    def print(self, inspector, texts, args) -> None:
        r = self.r
        target = inspector.token_texts([r.target])[0]
        print(f"ablated: {', '.join(a.label() for a in r.ablations)}")
        print(
            f"log p({target!r}) after the prompt: {r.logprob_before:.4f} -> {r.logprob_after:.4f} "
            f"({r.delta:+.4f})"
        )
        before, after = inspector.token_texts(r.greedy_before), inspector.token_texts(r.greedy_after)
        before, after = ([t.replace("\n", "\\n") for t in texts] for texts in (before, after))
        print("before: " + "".join(before))
        print("after:  " + "".join(f"[{t}]" if c else t for t, c in zip(after, r.changed, strict=True)))
        print("(tokens in [brackets] changed)", file=sys.stderr)


class _Patching:
    def __init__(self, grid):
        self.g = grid

    def as_json(self, inspector) -> dict:
        g = self.g
        return {
            "site": g.site,
            "corrupted": g.corrupted,
            "answer": g.answer,
            "wrong": g.wrong,
            "answer_text": inspector.token_texts([g.answer])[0],
            "wrong_text": inspector.token_texts([g.wrong])[0],
            "clean_diff": g.clean_diff,
            "corrupted_diff": g.corrupted_diff,
            "diffs": _rounded(g.diffs),
            "restored": _rounded(g.restored),
        }

    def print(self, inspector, texts, args) -> None:
        g = self.g
        answer, wrong = inspector.token_texts([g.answer, g.wrong])
        print(
            f"logit difference {answer!r} - {wrong!r}: clean {g.clean_diff:.4f}, "
            f"corrupted {g.corrupted_diff:.4f}; "
            f"restored share when {g.site} is copied from the clean run"
        )
        columns = (
            [f"head {h}" for h in range(g.diffs.shape[1])] if g.site == "z" else [repr(t) for t in texts]
        )
        rows = [(str(i), *(f"{round(v, 2) + 0.0:.2f}" for v in row)) for i, row in enumerate(g.restored)]
        print_table(("layer", *columns), rows)
