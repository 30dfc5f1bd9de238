"""The logit lens: what the model would predict if the residual stream stopped after each block.

Row ``j`` of a :class:`LogitLens` is the residual entering block ``j`` (row 0: the embeddings; the
last row: the final residual, the model's own prediction) through the final norm and the output
head, softmaxed over the vocabulary. Rows are unembedded a chunk at a time and only the top ``k``
and the target's probability and rank are kept, so a long prompt never holds a ``layers x T x
vocab`` array.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..backend import array_module, to_host
from ..cancel import Cancel, as_cancel_check
from ..errors import InspectError, LoomCancelled
from .trace import Tracer, one_sequence

Progress = Callable[[int, int], None]  # (rows of the lens done, rows in all: layers + 1 times T)


@dataclass
class LogitLens:
    """Per row (embeddings, then after each block) and position: the top ``k`` tokens and their
    probabilities, and the target token's probability and rank (0: the top token)."""

    tokens: list[int]
    target: int
    top_ids: np.ndarray  # [layers + 1, T, k] int64
    top_probs: np.ndarray  # [layers + 1, T, k] float32, descending
    target_probs: np.ndarray  # [layers + 1, T]
    target_ranks: np.ndarray  # [layers + 1, T] int64

    @property
    def row_names(self) -> list[str]:
        """``"embed"``, then ``"block 0"`` .. (the residual after that block)."""
        return ["embed", *(f"block {i}" for i in range(self.top_ids.shape[0] - 1))]


def logit_lens(net, ids, *, target: int | None = None, k: int = 5, chunk: int = 128,
               progress: Progress | None = None, cancel: Cancel = None) -> LogitLens:
    """The logit lens of ``net`` over one sequence ``ids``; ``target`` defaults to the model's own
    top prediction after the last position."""
    tracer = Tracer(net)
    stop = as_cancel_check(cancel)
    x = one_sequence(tracer, ids)
    vocab = tracer.embedding.cfg.vocab_size
    if target is not None and not 0 <= target < vocab:
        raise InspectError(f"target token {target} is outside the vocabulary 0..{vocab - 1}")
    if not 1 <= k <= vocab:
        raise InspectError(f"k must be 1..{vocab}, got {k}")
    trace = tracer.run(x, keep=("resid_pre",), cancel=cancel)
    L, T = tracer.n_layers, x.shape[1]
    if target is None:
        target = int(np.argmax(to_host(tracer.logits(trace.final[:, -1:, :]))[0, -1]))
    shape = (L + 1, T)
    top_ids, top_probs = np.empty((*shape, k), np.int64), np.empty((*shape, k), np.float32)
    target_probs, target_ranks = np.empty(shape, np.float32), np.empty(shape, np.int64)
    # every row's residual in one stack, unembedded ``chunk`` rows at a time: a quantized head is
    # dequantized once per call, so few large calls beat one per row
    xp = array_module(trace.final)
    stack = xp.concat([trace["resid_pre", j][0, ...] for j in range(L + 1)], axis=0)
    flat = [a.reshape(-1, *a.shape[2:]) for a in (top_ids, top_probs, target_probs, target_ranks)]
    total = stack.shape[0]
    for at in range(0, total, chunk):
        if stop():
            raise LoomCancelled("the logit lens was cancelled")
        rows = slice(at, min(at + chunk, total))
        logits = to_host(tracer.logits(stack[rows, ...]))
        lse = log_sum_exp(logits)
        top = np.argpartition(logits, -k, axis=-1)[:, -k:]
        top_logits = np.take_along_axis(logits, top, -1)
        order = np.argsort(-top_logits, axis=-1, kind="stable")
        flat[0][rows] = np.take_along_axis(top, order, -1)
        flat[1][rows] = np.exp(np.take_along_axis(top_logits, order, -1) - lse)
        flat[2][rows] = np.exp(logits[:, target] - lse[:, 0])
        flat[3][rows] = (logits > logits[:, target:target + 1]).sum(-1)
        if progress is not None:
            progress(rows.stop, total)
    return LogitLens([int(t) for t in x[0]], target, top_ids, top_probs, target_probs, target_ranks)


def log_sum_exp(logits: np.ndarray) -> np.ndarray:
    """``log(sum(exp(logits)))`` over the last axis (kept as an axis of 1), the maximum taken
    out first: a token's probability is ``exp(logit - log_sum_exp)``."""
    m = logits.max(axis=-1, keepdims=True)
    return m + np.log(np.exp(logits - m).sum(axis=-1, keepdims=True))
