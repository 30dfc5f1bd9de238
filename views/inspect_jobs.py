"""The Inspect panel's computations, each run on a job's thread: one function per view builds
the job's work from the inputs the view shows (:class:`Inputs`) and returns what it shows
(:class:`Shown`), with the texts of the tokens it names, so the GUI thread never asks the
tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from loomlab.core.errors import InspectError
from loomlab.core.inspect import Inspector

from .inspect_views import shown_token
from .workers import Job


@dataclass(frozen=True)
class Inputs:
    """What a view is computed from: the sequence, the selected position, the target as typed
    ("" for the model's own top prediction there) and the view's own settings."""

    generation: int
    ids: tuple[int, ...]
    position: int
    target_text: str
    extra: tuple = ()


@dataclass
class Shown:
    """A view's result, what it was computed from and the target it resolved to."""

    inputs: Inputs
    target: int
    result: Any
    parts: dict = field(default_factory=dict)  # attention: its pattern and attending arrays



def _target(ins: Inspector, inputs: Inputs, known: int | None, job: Job) -> int:
    """The target: typed text as its one token, else the model's top prediction at the position."""
    if inputs.target_text:
        return ins.token_id(inputs.target_text)
    if known is not None:
        return known
    return ins.attribution(list(inputs.ids), None, inputs.position, cancel=job.is_cancelled).token


def _with_names(ins: Inspector, shown: Shown, ids) -> Shown:
    unique = sorted({int(i) for i in ids})
    shown.parts["names"] = dict(zip(unique, ins.token_texts(unique), strict=True))
    return shown


def _attention_work(ins: Inspector, inputs: Inputs, known, cached):
    def work(job: Job) -> Shown:
        job.report("attention patterns", 0, 0)
        fresh = cached is None
        patterns, thumbnails = (ins.patterns(list(inputs.ids), cancel=job.is_cancelled), None) if fresh \
            else cached[1:]
        if thumbnails is None:
            thumbnails = patterns.thumbnails()
        layer, head = inputs.extra
        parts = {"thumbnails": thumbnails, "pattern": patterns.head(layer, head),
                 "attending": patterns.attending_to(inputs.position)}
        return Shown(inputs, -1, patterns, parts)

    return work


def _lens_work(ins: Inspector, inputs: Inputs, known, cached):
    def work(job: Job) -> Shown:
        job.report("logit lens", 0, 0)
        target = _target(ins, inputs, known, job)
        lens = ins.lens(list(inputs.ids), target=target, progress=lambda d, t: job.report("logit lens", d, t),
                        cancel=job.is_cancelled)
        return _with_names(ins, Shown(inputs, target, lens), [*lens.top_ids.ravel(), target])

    return work


def _attribution_work(ins: Inspector, inputs: Inputs, known, cached):
    def work(job: Job) -> Shown:
        job.report("attribution", 0, 0)
        target = ins.token_id(inputs.target_text) if inputs.target_text else known
        a = ins.attribution(list(inputs.ids), target, inputs.position, cancel=job.is_cancelled)
        return _with_names(ins, Shown(inputs, a.token, a), [a.token])

    return work


def _ablation_work(ins: Inspector, inputs: Inputs, known, cached):
    ablations, new_tokens = inputs.extra

    def work(job: Job) -> Shown:
        job.report("ablation", 0, 0)
        target = _target(ins, inputs, known, job)
        result = ins.ablation(list(inputs.ids[:inputs.position + 1]), ablations, target=target,
                              new_tokens=new_tokens, progress=lambda d, t: job.report("ablation", d, t),
                              cancel=job.is_cancelled)
        return _with_names(ins, Shown(inputs, target, result),
                           [*result.greedy_before, *result.greedy_after, target])

    return work


def _patching_work(ins: Inspector, inputs: Inputs, known, cached):
    corrupted_text, site = inputs.extra

    def work(job: Job) -> Shown:
        job.report("patching", 0, 0)
        corrupted = ins.prompt_ids(corrupted_text)
        if len(corrupted) != len(inputs.ids):
            raise InspectError(f"the corrupted prompt is {len(corrupted)} tokens and the clean sequence "
                               f"{len(inputs.ids)}: patching needs them equally long (corrupted: "
                               f"{' '.join(shown_token(t) for t in ins.token_texts(corrupted))})")
        target = _target(ins, inputs, known, job)
        end = inputs.position + 1
        grid = ins.patching(list(inputs.ids[:end]), corrupted[:end], site=site, answer=target,
                            progress=lambda d, t: job.report("patching", d, t), cancel=job.is_cancelled)
        return _with_names(ins, Shown(inputs, target, grid), [grid.answer, grid.wrong])

    return work


WORK = {"attention": _attention_work, "lens": _lens_work, "attribution": _attribution_work,
         "ablation": _ablation_work, "patching": _patching_work}
