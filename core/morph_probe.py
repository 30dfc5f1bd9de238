"""How far a morphed network has drifted from its unmorphed self (the Morph panel's measures).

Small networks are compared on a probe input by the relative drift of their outputs (the number
``net morph-report`` prints, :func:`~loomlab.core.morph.output_drift`);
language models by their next-token distributions over a probe text: the KL divergence
KL(reference || current) at every position and how often the most likely token is the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .morph import output_drift
from .network import VolumetricNetwork


# ----- small networks ----------------------------------------------------------------------------
def net_outputs(net: VolumetricNetwork, probe: np.ndarray) -> np.ndarray:
    """The network's output on ``probe`` as float64 numpy."""
    return np.asarray(net.backend.to_numpy(net.forward(probe)), dtype=np.float64)


def net_drift(reference_outputs: np.ndarray, net: VolumetricNetwork, probe: np.ndarray) -> float:
    """Relative drift of ``net``'s outputs on ``probe`` from ``reference_outputs``:
    ``||y - y_ref|| / ||y_ref||``, the definition ``net morph-report`` uses."""
    return output_drift(reference_outputs, net_outputs(net, probe))


# ----- language models ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeResult:
    """A probe text's token ids and the logits predicted after each of them."""

    ids: np.ndarray  # [T] int64
    logits: np.ndarray  # [T, vocab] float32: row t predicts token t + 1


def llm_probe(model: Any, text: str, max_tokens: int = 64) -> ProbeResult:
    """Next-token logits at every position of ``text`` (at most ``max_tokens`` tokens, the
    model's BOS included when it wants one) from one full-sequence forward pass.

    ``model`` is a :class:`~loomlab.core.llm.generate.textmodel.TextModel` (its ``tokenizer`` and ``net``).
    """
    ids = np.asarray(model.tokenizer.encode(text, add_special_tokens=True)[:max_tokens], dtype=np.int64)
    if ids.size == 0:
        raise ValueError("the probe text has no tokens")
    logits = model.net.step(ids[None], None, last_only=False)[0]
    return ProbeResult(ids, np.asarray(logits, dtype=np.float32))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """``log softmax`` over the last axis, in float64."""
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def compare(reference: ProbeResult, current: ProbeResult) -> dict[str, float]:
    """Per-position KL(reference || current) of the next-token distributions (mean and max, in
    nats) and the fraction of positions whose most likely token agrees."""
    if not np.array_equal(reference.ids, current.ids) or reference.logits.shape != current.logits.shape:
        raise ValueError("the two probes were not run on the same tokens")
    log_p, log_q = log_softmax(reference.logits), log_softmax(current.logits)
    kl = np.sum(np.exp(log_p) * (log_p - log_q), axis=-1)
    agree = np.argmax(reference.logits, axis=-1) == np.argmax(current.logits, axis=-1)
    return {"kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "top1_agreement": float(agree.mean())}
