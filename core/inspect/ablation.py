"""Ablation: switch components off and see what the model says instead.

A head, an attention half, an MLP half or a whole block is zeroed, replaced by its mean over the
prompt's positions (from the unablated run, fixed while the continuation grows), or, for a
block, disabled with Loom's ``is_disabled`` (the residual passes through). The result is the
target token's log-probability at the prompt's last position before and after, and the greedy
continuation before and after, each token chosen by a full forward of the sequence so far under
the same ablation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..backend import array_module, to_host
from ..cancel import Cancel, as_cancel_check
from ..errors import InspectError, LoomCancelled
from .lens import log_sum_exp
from .trace import Tracer, one_sequence

KINDS = ("head", "attention", "mlp", "block")
MODES = ("zero", "mean", "disable")
# the site whose value each kind of ablation replaces
_SITES = {"head": ("z",), "attention": ("attn_out",), "mlp": ("mlp_out",), "block": ("attn_out", "mlp_out")}

Progress = Callable[[int, int], None]  # (forward passes done, in all)


@dataclass(frozen=True)
class Ablation:
    """One component switched off: ``kind`` in :data:`KINDS`, its ``layer`` (and ``head``), how
    (``mode`` in :data:`MODES`; "disable" is a block's, Loom's ``is_disabled``)."""

    kind: str
    layer: int
    head: int | None = None
    mode: str = "zero"

    def check(self, tracer: Tracer) -> None:
        if self.kind not in KINDS:
            raise InspectError(f"ablation kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.mode not in MODES:
            raise InspectError(f"ablation mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.mode == "disable" and self.kind != "block":
            raise InspectError("only a block can be disabled (Loom's is_disabled); zero or mean the others")
        if (self.kind == "head") != (self.head is not None):
            raise InspectError("a head ablation names its head, and only a head ablation does")
        tracer.check_layer(self.layer, self.head)

    def label(self) -> str:
        where = f"L{self.layer}" + (f"H{self.head}" if self.head is not None else "")
        return f"{self.kind} {where} {self.mode}"


@dataclass
class AblationResult:
    """The target's log-probability after the prompt and the greedy continuation, before and
    after the ablations."""

    ablations: tuple[Ablation, ...]
    tokens: list[int]
    target: int
    logprob_before: float
    logprob_after: float
    greedy_before: list[int]
    greedy_after: list[int]

    @property
    def delta(self) -> float:
        return self.logprob_after - self.logprob_before

    @property
    def changed(self) -> list[bool]:
        """Per continuation token, whether the ablated run chose another."""
        return [a != b for a, b in zip(self.greedy_before, self.greedy_after, strict=True)]


def ablate(net, ids, ablations: Sequence[Ablation], *, target: int | None = None, new_tokens: int = 8,
           progress: Progress | None = None, cancel: Cancel = None) -> AblationResult:
    """Run one sequence ``ids`` with and without ``ablations``; ``target`` defaults to the model's
    own top prediction after the prompt."""
    tracer = Tracer(net)
    x = one_sequence(tracer, ids)
    ablations = tuple(ablations)
    for a in ablations:
        a.check(tracer)
    if new_tokens < 0:
        raise InspectError(f"new_tokens must be >= 0, got {new_tokens}")
    stop = as_cancel_check(cancel)
    total, done = 2 * (1 + new_tokens), 0
    keep = {site for a in ablations if a.mode == "mean" for site in _SITES[a.kind]}
    clean = tracer.run(x, keep=keep, cancel=cancel)
    edit, skip = _edits(ablations, clean)
    runs = {}
    for name, kwargs in (("before", {}), ("after", {"edit": edit, "skip": skip})):
        seq, chosen, first = list(x[0]), [], None
        for step in range(new_tokens + 1):
            if stop():
                raise LoomCancelled("the ablation was cancelled")
            trace = tracer.run(np.array([seq]), cancel=cancel, **kwargs)
            logits = to_host(tracer.logits(trace.final[:, -1:, :]))[0, 0]
            if step == 0:
                first = logits
            if step < new_tokens:
                chosen.append(int(np.argmax(logits)))
                seq.append(chosen[-1])
            done += 1
            if progress is not None:
                progress(done, total)
        runs[name] = (first, chosen)
    if target is None:
        target = int(np.argmax(runs["before"][0]))
    vocab = tracer.embedding.cfg.vocab_size
    if not 0 <= target < vocab:
        raise InspectError(f"target token {target} is outside the vocabulary 0..{vocab - 1}")
    before, after = (float(logits[target] - log_sum_exp(logits)[0])
                     for logits in (runs[n][0].astype(np.float64) for n in ("before", "after")))
    return AblationResult(ablations, [int(t) for t in x[0]], target, before, after,
                          runs["before"][1], runs["after"][1])


def _edits(ablations: tuple[Ablation, ...], clean) -> tuple[Callable, set[int]]:
    """The edit that applies every zero / mean ablation, and the blocks Loom's switch skips."""
    skip = {a.layer for a in ablations if a.mode == "disable"}
    by_site: dict[tuple[str, int], list[Ablation]] = {}
    for a in ablations:
        if a.mode != "disable":
            for site in _SITES[a.kind]:
                by_site.setdefault((site, a.layer), []).append(a)

    def edit(site: str, layer: int, value):
        todo = by_site.get((site, layer))
        if not todo:
            return value
        xp = array_module(value)
        value = xp.asarray(value, copy=True)
        for a in todo:
            part = (..., a.head, slice(None)) if a.kind == "head" else (...,)
            if a.mode == "zero":
                value[part] = 0.0
            else:  # the mean over the prompt's positions of the unablated run
                mean = xp.mean(clean[site, layer][0, ...], axis=0)
                value[part] = mean[a.head, :] if a.kind == "head" else mean
        return value

    return edit, skip
