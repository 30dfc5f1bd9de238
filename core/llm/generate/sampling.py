"""Choosing the next token: logit processors and samplers (mlx-lm style composition).

``make_sampler(temperature, top_k, top_p, min_p)`` returns ``sample(logits, rng) -> id``;
temperature 0 is argmax (first maximum), so greedy runs are deterministic.
``make_logits_processor(repetition_penalty, presence_penalty, frequency_penalty, window)``
returns ``process(logits, history) -> logits``. :class:`SamplingParams` validates everything
before any work starts.
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from ...backend import array_module, to_host, widest_float
from ...errors import LoomConfigError
from .constrain import grammar_of

Sampler = Callable[[np.ndarray, np.random.Generator], int]
Processor = Callable[[np.ndarray, Sequence[int]], np.ndarray]


@dataclass(frozen=True)
class SamplingParams:
    """Every knob of generation, checked on creation (LoomConfigError names the bad one)."""

    temperature: float = 0.0
    top_k: int = 0  # 0 = off
    top_p: float = 1.0  # 1 = off
    min_p: float = 0.0  # 0 = off
    repetition_penalty: float = 1.0  # 1 = off; HF's rule: positive logits / p, negative * p
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    penalty_window: int = 64  # how many recent tokens the penalties look at
    max_tokens: int = 256
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    logprobs: int = 0  # how many top alternatives to report per token (0 = none)
    # output must match this JSON schema / regex / grammar (OpenAI's shapes: constrain.py)
    response_format: Mapping | None = None

    def __post_init__(self):
        _check("temperature", self.temperature, lambda v: v >= 0, ">= 0")
        _check_int("top_k", self.top_k, 0)
        _check("top_p", self.top_p, lambda v: 0 < v <= 1, "in (0, 1]")
        _check("min_p", self.min_p, lambda v: 0 <= v < 1, "in [0, 1)")
        _check("repetition_penalty", self.repetition_penalty, lambda v: v > 0, "> 0")
        _check("presence_penalty", self.presence_penalty, lambda v: True, "a finite number")
        _check("frequency_penalty", self.frequency_penalty, lambda v: True, "a finite number")
        _check_int("penalty_window", self.penalty_window, 1)
        _check_int("max_tokens", self.max_tokens, 0)
        _check_int("logprobs", self.logprobs, 0)
        if isinstance(self.stop, str) or not all(isinstance(s, str) and s for s in self.stop):
            raise LoomConfigError("stop must be a sequence of non-empty strings")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise LoomConfigError(f"seed must be an integer, got {self.seed!r}")
        grammar_of(self.response_format)  # compiled here so a bad one fails before any work

    @property
    def penalized(self) -> bool:
        """Whether any logit penalty is on (else :meth:`processor` returns the logits as they are)."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0 or self.frequency_penalty != 0

    def sampler(self) -> Sampler:
        return make_sampler(self.temperature, self.top_k, self.top_p, self.min_p)

    def processor(self) -> Processor:
        return make_logits_processor(self.repetition_penalty, self.presence_penalty,
                                     self.frequency_penalty, self.penalty_window)


def _check(name: str, value, ok, what: str) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or not ok(value):
        raise LoomConfigError(f"{name} must be {what}, got {value!r}")


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise LoomConfigError(f"{name} must be an integer >= {low}, got {value!r}")


def make_sampler(temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 min_p: float = 0.0) -> Sampler:
    """A function ``(logits, rng) -> token id``."""
    if temperature == 0:
        return lambda logits, rng: int(np.argmax(logits))

    def sample(logits: np.ndarray, rng: np.random.Generator) -> int:
        probs = filtered_probs(logits, temperature, top_k, top_p, min_p)
        return int(rng.choice(probs.size, p=probs))

    return sample


def filtered_probs(logits: np.ndarray, temperature: float, top_k: int = 0, top_p: float = 1.0,
                   min_p: float = 0.0) -> np.ndarray:
    """Sampling distribution after temperature, top-k, top-p (nucleus) and min-p filtering. The
    maximum is taken off before dividing, so a tiny temperature (1e-320) tends to argmax instead
    of overflowing to inf - inf = NaN."""
    z = np.asarray(logits, np.float64)
    with np.errstate(over="ignore"):  # to -inf: the limit meant
        z = (z - z.max()) / temperature
    probs = softmax(z)
    keep = np.ones(probs.size, bool)
    if 0 < top_k < probs.size:
        keep &= probs >= np.partition(probs, -top_k)[-top_k]
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]  # mass of the tokens ranked above
        nucleus = np.zeros(probs.size, bool)
        nucleus[order[before < top_p]] = True  # the smallest prefix reaching top_p
        keep &= nucleus
    if min_p > 0:
        keep &= probs >= min_p * probs.max()
    probs = np.where(keep, probs, 0.0)
    return probs / probs.sum()


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def log_softmax(logits: np.ndarray) -> np.ndarray:
    z = np.asarray(logits, np.float64)
    m = z.max()
    return z - m - math.log(np.exp(z - m).sum())


_scratch = threading.local()


def log_softmax_terms(logits: np.ndarray) -> tuple[float, float]:
    """``(m, L)`` with ``(z - m) - L`` the log-probability of a logit ``z`` (float64, ``m`` the
    maximum): for the few log-probabilities a generated token reports, within 1e-6 of
    :func:`log_softmax`'s entry. float32 logits are exponentiated in float32 (numpy's SIMD exp,
    a few ulp) and summed in float64, into one scratch buffer per thread: a vocabulary-sized
    float64 exp was 0.35 ms of a ~9 ms SmolLM2 token on an AVX2 CPU, this is 0.1 ms."""
    z = np.asarray(logits).reshape(-1)
    wide = z.dtype != np.float32
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.size != z.size or buf.dtype != (np.float64 if wide else np.float32):
        buf = _scratch.buf = np.empty(z.size, np.float64 if wide else np.float32)
    m = np.max(z)
    np.subtract(z, m, out=buf, dtype=buf.dtype)
    np.exp(buf, out=buf)
    return float(m), math.log(np.add.reduce(buf, dtype=np.float64))


def argmax_id(logits) -> int:
    """The index of the first maximum of a row of logits on any backend, as a Python int: on a
    device the argmax runs there and only the chosen id comes over (one transfer of 1 element)."""
    return int(array_module(logits).argmax(logits))


def device_logprobs(logits, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-probability of ``token`` and the ``k`` most likely tokens with theirs, reduced on
    the device of the row ``logits``, in one transfer of ``2k + 1`` numbers (``token``'s, the k
    values, the k ids). Alternatives come largest first, ties by index, non-finite ones left out,
    as :func:`log_softmax_terms` and :func:`~.decoding.top_k` give them on the host; float64
    where the device has it (ids below 2**24 are exact in float32 too)."""
    xp = array_module(logits)
    wide = widest_float(xp, logits.device)
    z = xp.astype(logits, wide)
    m = xp.max(z)
    log_total = xp.log(xp.sum(xp.exp(z - m)))
    top = xp.argsort(z, descending=True, stable=True)[:k]
    ids = xp.concat([xp.asarray([token], dtype=top.dtype), top])
    values = to_host(xp.concat([(xp.take(z, ids) - m) - log_total, xp.astype(top, wide)])).tolist()
    n = top.shape[0]
    alternatives = [(int(i), lp) for i, lp in zip(values[n + 1:], values[1:n + 1], strict=True)
                    if math.isfinite(lp)]
    return values[0], alternatives


def make_logits_processor(repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
                          frequency_penalty: float = 0.0, window: int = 64) -> Processor:
    """Penalties over the last ``window`` tokens of ``history`` (prompt and output)."""
    if repetition_penalty == 1.0 and presence_penalty == 0 and frequency_penalty == 0:
        return lambda logits, history: logits

    def process(logits: np.ndarray, history: Sequence[int]) -> np.ndarray:
        counts = Counter(history[-window:])
        if not counts:
            return logits
        out = np.array(logits, dtype=np.float32, copy=True)
        ids = np.fromiter(counts, dtype=np.int64)
        n = np.fromiter(counts.values(), dtype=np.float32)
        seen = out[ids]
        if repetition_penalty != 1.0:
            seen = np.where(seen > 0, seen / repetition_penalty, seen * repetition_penalty)
        out[ids] = seen - presence_penalty - frequency_penalty * n
        return out

    return process
