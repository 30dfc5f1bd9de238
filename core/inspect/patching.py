"""Activation patching: which component, at which layer and position, carries the difference
between a clean prompt and a corrupted one.

Both prompts (equal lengths) run once. Then for each cell of the grid the corrupted prompt runs
again from that layer on, with one value copied in from the clean run: the residual entering a
block at one position (``resid_pre``), what the attention or MLP half adds at one position
(``attn_out``, ``mlp_out``; grids of layers x positions), or one head's values at every position
(``z``; a grid of layers x heads). The measure is the logit difference at the last position
between the clean answer and the corrupted one, reported as the restored share
``(patched - corrupted) / (clean - corrupted)``: 1 where the copied value alone restores the
clean behaviour, 0 where it does nothing.

A layer's cells run as one batch (one sequence per cell) from that layer on, from the corrupted
run's residual there, so a grid costs about half a forward per cell.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..backend import array_module, to_host
from ..cancel import Cancel, as_cancel_check
from ..errors import InspectError, LoomCancelled
from .trace import Tracer, one_sequence

PATCH_SITES = ("resid_pre", "attn_out", "mlp_out", "z")

Progress = Callable[[int, int], None]  # (layers done, layers in all)


@dataclass
class PatchGrid:
    """The patched logit differences of every cell (``[layers, positions]``, or ``[layers,
    heads]`` for ``z``) between ``answer`` and ``wrong`` at the last position."""

    site: str
    clean: list[int]
    corrupted: list[int]
    answer: int
    wrong: int
    clean_diff: float
    corrupted_diff: float
    diffs: np.ndarray

    @property
    def restored(self) -> np.ndarray:
        """Each cell's share of the clean logit difference restored (NaN where the prompts'
        differences are equal and there is nothing to restore)."""
        gap = self.clean_diff - self.corrupted_diff
        with np.errstate(divide="ignore", invalid="ignore"):
            return (self.diffs - self.corrupted_diff) / gap if gap else np.full_like(self.diffs, np.nan)


def patch(net, clean_ids, corrupted_ids, *, site: str = "resid_pre", answer: int | None = None,
          wrong: int | None = None, batch: int = 16, progress: Progress | None = None,
          cancel: Cancel = None) -> PatchGrid:
    """The patching grid of ``site`` (one of :data:`PATCH_SITES`). ``answer`` defaults to the
    clean run's top token after the last position, ``wrong`` to the corrupted run's (its second
    choice in the clean run when both agree)."""
    if site not in PATCH_SITES:
        raise InspectError(f"patching site {site!r} is not one of {', '.join(PATCH_SITES)}")
    if batch < 1:
        raise InspectError(f"batch must be >= 1, got {batch}")
    tracer = Tracer(net)
    clean, corrupted = one_sequence(tracer, clean_ids), one_sequence(tracer, corrupted_ids)
    if clean.shape != corrupted.shape:
        raise InspectError(f"the clean and corrupted prompts must be equally long to patch between "
                           f"them: {clean.shape[1]} and {corrupted.shape[1]} tokens")
    stop = as_cancel_check(cancel)
    keep = {site, "resid_pre"}
    clean_run = tracer.run(clean, keep=keep, cancel=cancel)
    corrupted_run = tracer.run(corrupted, keep=keep, cancel=cancel)
    answer, wrong = _answers(tracer, clean_run, corrupted_run, answer, wrong)
    tokens = (answer, wrong)

    def diff_of(final) -> np.ndarray:
        logits = tracer.token_logits(final[:, -1, :], tokens)
        return (logits[:, 0] - logits[:, 1]).astype(np.float64)

    L, T = tracer.n_layers, clean.shape[1]
    cells = tracer.n_heads if site == "z" else T
    diffs = np.empty((L, cells))
    for i in range(L):
        for at in range(0, cells, batch):
            if stop():
                raise LoomCancelled("the patching grid was cancelled")
            members = list(range(at, min(at + batch, cells)))
            resid = _repeat(corrupted_run["resid_pre", i], len(members))
            edit = _patcher(site, i, members, clean_run[site, i])
            diffs[i, members] = diff_of(tracer.run(resid=resid, start=i, edit=edit, cancel=cancel).final)
        if progress is not None:
            progress(i + 1, L)
    return PatchGrid(site, [int(t) for t in clean[0]], [int(t) for t in corrupted[0]], answer, wrong,
                     float(diff_of(clean_run.final)[0]), float(diff_of(corrupted_run.final)[0]), diffs)


def _answers(tracer: Tracer, clean_run, corrupted_run, answer, wrong) -> tuple[int, int]:
    vocab = tracer.embedding.cfg.vocab_size
    clean_logits = to_host(tracer.logits(clean_run.final[:, -1:, :]))[0, 0]
    if answer is None:
        answer = int(np.argmax(clean_logits))
    if wrong is None:
        wrong = int(np.argmax(to_host(tracer.logits(corrupted_run.final[:, -1:, :]))[0, 0]))
        if wrong == answer:
            wrong = int(np.argsort(-clean_logits, kind="stable")[1])
    for name, token in (("answer", answer), ("wrong", wrong)):
        if not 0 <= token < vocab:
            raise InspectError(f"{name} token {token} is outside the vocabulary 0..{vocab - 1}")
    if answer == wrong:
        raise InspectError("the answer and the wrong token are the same token")
    return answer, wrong


def _repeat(value, n: int):
    """``n`` copies of a one-sequence value ``[1, ...]`` as a batch ``[n, ...]``."""
    xp = array_module(value)
    return xp.concat([value] * n, axis=0)


def _patcher(site: str, layer: int, members: list[int], clean_value):
    """The edit that copies ``clean_value`` into batch row ``b`` at cell ``members[b]``: that
    position (or, for ``z``, that head at every position) at ``site`` of ``layer``."""

    def edit(name: str, i: int, value):
        if name != site or i != layer:
            return value
        xp = array_module(value)
        value = xp.asarray(value, copy=True)
        for b, cell in enumerate(members):
            if site == "z":
                value[b, :, cell, :] = clean_value[0, :, cell, :]
            else:
                value[b, cell, :] = clean_value[0, cell, :]
        return value

    return edit
