"""The numbers each Inspect view shows, as plain rows: what its CSV and JSON exports hold.

One small pure function per view, over the headless results of :mod:`loomlab.core.inspect` and
the token texts; no Qt. The column names are the CLI's words: layer, head, position, target,
restored share.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from loomlab.core.inspect import AblationResult, Attribution, LogitLens, PatchGrid

Rows = list[dict[str, Any]]
TokenName = Callable[[int], str]  # a token id -> its text


def component_label(kind: str, layer: int, head: int | None) -> str:
    """A component of an :class:`Attribution` as the bar chart names it: ``embed``, ``L3 H2``,
    ``L3 bias`` (the attention output's bias), ``L3 MLP``."""
    if kind == "embed":
        return "embed"
    if kind == "head":
        return f"L{layer} H{head}"
    return f"L{layer} " + {"attn_bias": "bias", "mlp": "MLP"}[kind]


def pattern_rows(weights: np.ndarray, layer: int, head: int, texts: Sequence[str]) -> Rows:
    """One head's attention pattern ``[query, key]``: a row per query and key it can see."""
    T = weights.shape[0]
    return [{"what": "pattern", "layer": layer, "head": head, "query position": q, "query token": texts[q],
             "key position": k, "key token": texts[k], "weight": float(weights[q, k])}
            for q in range(T) for k in range(q + 1)]


def attending_rows(weights: np.ndarray, position: int, texts: Sequence[str]) -> Rows:
    """The weight each head ``[layers, heads]`` puts on ``position`` (averaged over the queries
    that see it)."""
    return [{"what": "attending", "layer": i, "head": h, "query position": "", "query token": "",
             "key position": position, "key token": texts[position], "weight": float(weights[i, h])}
            for i in range(weights.shape[0]) for h in range(weights.shape[1])]


def lens_rows(lens: LogitLens, texts: Sequence[str], name: TokenName) -> Rows:
    """Per layer (``embed``, ``block 0`` ...) and position: the top token, its probability, and
    the target's probability and rank."""
    rows = []
    for j, layer in enumerate(lens.row_names):
        for t in range(len(lens.tokens)):
            rows.append({"layer": layer, "position": t, "token": texts[t],
                         "top token": name(int(lens.top_ids[j, t, 0])),
                         "probability": float(lens.top_probs[j, t, 0]),
                         "target": name(lens.target), "target probability": float(lens.target_probs[j, t]),
                         "target rank": int(lens.target_ranks[j, t])})
    return rows


def attribution_rows(attribution: Attribution) -> Rows:
    """Every component's share of the target's logit, largest magnitude first."""
    return [{"component": component_label(kind, layer, head), "kind": kind,
             "layer": "" if layer < 0 else layer, "head": "" if head is None else head, "share": share}
            for kind, layer, head, share in attribution.components()]


def ablation_rows(result: AblationResult, name: TokenName) -> Rows:
    """The greedy continuation before and after the ablations, step by step."""
    return [{"step": i, "before": name(a), "after": name(b), "changed": a != b}
            for i, (a, b) in enumerate(zip(result.greedy_before, result.greedy_after, strict=True))]


def ablation_summary(result: AblationResult, name: TokenName) -> dict[str, Any]:
    return {"ablations": [a.label() for a in result.ablations], "target": name(result.target),
            "target logprob before": result.logprob_before, "target logprob after": result.logprob_after,
            "logprob delta": result.delta}


def patching_rows(grid: PatchGrid, texts: Sequence[str]) -> Rows:
    """Each cell's restored share (and patched logit difference): layers x positions, or layers x
    heads for the ``z`` site."""
    restored, by_head = grid.restored, grid.site == "z"
    rows = []
    for i in range(grid.diffs.shape[0]):
        for c in range(grid.diffs.shape[1]):
            where = {"head": c} if by_head else {"position": c, "token": texts[c]}
            rows.append({"site": grid.site, "layer": i, **where, "restored share": _number(restored[i, c]),
                         "logit difference": float(grid.diffs[i, c])})
    return rows


def patching_summary(grid: PatchGrid, name: TokenName) -> dict[str, Any]:
    return {"site": grid.site, "answer": name(grid.answer), "wrong": name(grid.wrong),
            "clean logit difference": grid.clean_diff, "corrupted logit difference": grid.corrupted_diff}


def to_csv(rows: Rows) -> str:
    """``rows`` (dicts with the same keys) as CSV text with a header line."""
    out = io.StringIO()
    if rows:
        writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return out.getvalue()


def to_json(view: str, inputs: dict[str, Any], rows: Rows, summary: dict[str, Any] | None = None) -> str:
    """A view's export: what it was computed from, an optional summary, and its rows."""
    doc: dict[str, Any] = {"view": view, "inputs": inputs}
    if summary:
        doc["summary"] = summary
    doc["rows"] = rows
    return json.dumps(doc, indent=1, ensure_ascii=False, allow_nan=False)


def _number(v: float) -> float | None:
    """NaN (nothing to restore) as None: JSON has no NaN."""
    return None if not np.isfinite(v) else float(v)
