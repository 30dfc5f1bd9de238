"""Observers of layer activity (Loom's PolyLayerEvent and LayerStats, spec §8).

A network emits one :class:`LayerEvent` per executed layer and direction, but only while at least
one observer wants the pass: with none attached, or none wanting it, no statistics are computed.
An observer with ``max_rate_hz`` sees at most that many passes a second, each one whole (forward
and backward): a live view of a model decoding 70 tokens a second needs a few of them, and the
skipped passes cost nothing.
"""

from __future__ import annotations

import math
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .backend import array_module, to_host, widest_float


@dataclass(frozen=True)
class LayerStats:
    """Loom's ComputeLayerStats over a tensor (float32 arithmetic)."""

    avg: float = 0.0
    std: float = 0.0
    min: float = 0.0
    max: float = 0.0
    active: int = 0
    total: int = 0

    @classmethod
    def of(cls, a) -> LayerStats:
        """Statistics of any array; a device array is reduced where it lives (:func:`_device_stats`)."""
        if not isinstance(a, np.ndarray) and hasattr(a, "__array_namespace__"):  # CuPy, strict
            return cls._of_device(a)
        f = np.ascontiguousarray(a, dtype=np.float32).reshape(-1)
        if f.size == 0:
            return cls()
        return cls(*_float32_stats()(f), f.size)

    @classmethod
    def _of_device(cls, a) -> LayerStats:
        total = math.prod(a.shape)
        if total == 0:
            return cls()
        avg, std, lo, hi, active = to_host(_device_stats(a)).tolist()  # the one transfer: 5 numbers
        return cls(avg, std, lo, hi, int(active), total)


def _device_stats(a):
    """``[avg, std, min, max, active]`` of a device array as one small array on its device.

    The activations stay on the device and only these five numbers cross to the host. Float32
    arithmetic as Loom's, but summed in the namespace's order (pairwise on numpy and CuPy), so
    within float32 rounding of the host kernel rather than bit-equal. ``active`` travels in the
    widest float the device has: exact up to 2**53 elements, or 2**24 on a device without float64.
    """
    xp = array_module(a)
    f = xp.reshape(xp.astype(a, xp.float32, copy=False), (-1,))
    n = f.shape[0]
    avg = xp.sum(f) / n
    var = xp.maximum(xp.sum(f * f) / n - avg * avg, xp.asarray(0.0, dtype=xp.float32))
    wide = widest_float(xp, a.device)
    active = xp.sum(xp.astype(xp.abs(f) > _ACTIVE, wide))
    parts = (avg, xp.sqrt(var), xp.min(f), xp.max(f))
    return xp.stack([*(xp.astype(v, wide) for v in parts), active])


_ACTIVE = 1e-6  # Loom's threshold for an active element (|value| > it), as in stats_kernel


def _float32_stats():
    """The compiled statistics loop, imported on first use (numba costs ``import loomlab.core``
    a second otherwise)."""
    global _stats_kernel
    if _stats_kernel is None:
        from .stats_kernel import float32_stats

        _stats_kernel = float32_stats
    return _stats_kernel


_stats_kernel = None


@dataclass(frozen=True)
class LayerEvent:
    """One layer executed forward or backward (Loom's PolyLayerEvent, plus our ``path``).

    ``path`` locates nested layers: ``""`` for a grid cell, ``"parallel_branches[1]"`` or
    ``"sequential_layers[0].parallel_branches[2]"`` inside containers.
    """

    type: str  # "forward" | "backward"
    z: int
    y: int
    x: int
    l: int  # noqa: E741 - Loom's name for the layer-in-cell coordinate
    layer_type: int
    stats: LayerStats
    step_count: int
    path: str = ""
    mode: str = "cpu"
    model_id: str = ""


# Passes a second the live views (Topology's colours, Telemetry's heatmap) sample: one rate for
# both, so they take the same passes (see Observer.wants) and show the same statistics for a layer,
# computed once. A sampled pass runs layer by layer, not as the fused step, and takes its ~360
# layer statistics: ~30 ms more than a fused SmolLM2 step on 2 cores, so that at 5 a second a
# chat decoded 17-35% slower with Telemetry showing, at 2 a second 3%.
LIVE_SAMPLE_HZ = 2.0


def check_rate(rate_hz: float | None, name: str = "max_rate_hz") -> float | None:
    """``rate_hz`` if it is a valid pass rate (> 0, or None for every pass), else ValueError."""
    if rate_hz is not None and not rate_hz > 0:
        raise ValueError(f"{name} must be > 0 or None, got {rate_hz}")
    return rate_hz


class Observer:
    """Base observer: override :meth:`on_event`.

    ``max_rate_hz`` (None: every pass) limits the passes reported to at most one in each slot of
    ``1 / max_rate_hz`` seconds of ``clock`` (seconds, monotonic), slots counted from the clock's
    zero, so observers at one rate on one clock report the same passes.
    """

    max_rate_hz: float | None = None
    clock: Callable[[], float] = staticmethod(time.monotonic)
    _next_due: float = float("-inf")

    def limit_rate(self, max_rate_hz: float | None, clock: Callable[[], float] | None = None) -> None:
        self.max_rate_hz = check_rate(max_rate_hz)
        if clock is not None:
            self.clock = clock
        self._next_due = float("-inf")

    def wants(self, step: int) -> bool:
        """Whether to report the pass numbered ``step``. The network asks once, before the pass
        runs, so a pass is reported whole or not at all."""
        if self.max_rate_hz is None:
            return True
        now = self.clock()
        if now < self._next_due:
            return False
        # the next slot of a grid of 1/rate-second slots on the clock, not now + 1/rate: two views
        # at the same rate on the same clock then want the same passes, and a pass's statistics
        # are computed once for all who want it (two panels at 10 Hz cost the decode of a language
        # model 9%, not 4.5%, when each sampled passes of its own)
        self._next_due = (math.floor(now * self.max_rate_hz) + 1) / self.max_rate_hz
        return True

    def on_event(self, event: LayerEvent) -> None:  # pragma: no cover - interface
        raise NotImplementedError


class CallbackObserver(Observer):
    """Calls ``fn(event)`` for every event of the passes it wants (see :class:`Observer`)."""

    def __init__(self, fn: Callable[[LayerEvent], None], *, max_rate_hz: float | None = None,
                 clock: Callable[[], float] | None = None):
        self.fn = fn
        self.limit_rate(max_rate_hz, clock)

    def on_event(self, event: LayerEvent) -> None:
        self.fn(event)


class ConsoleObserver(Observer):
    """Prints Loom's console lines (``[FWD] (z,y,x,l) Type: avg=... max=... active=a/t``)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stdout

    def on_event(self, event: LayerEvent) -> None:
        from .enums import LAYER_TYPES, by_id

        s = event.stats
        where = f"({event.z},{event.y},{event.x},{event.l})"
        name = by_id(LAYER_TYPES, event.layer_type).name
        if event.type == "forward":
            line = f"[FWD] {where} {name}: avg={s.avg:.4f} max={s.max:.4f} active={s.active}/{s.total}"
        else:
            line = f"[BWD] {where} {name}: grad_avg={s.avg:.4f} grad_max={s.max:.4f}"
        print(line, file=self.stream)


@dataclass(frozen=True)
class WindowStats:
    """Loom's aggregate of one window of forward events of one layer."""

    avg: float
    std: float
    max: float
    min: float
    active: int
    total: int


class AggregatingObserver(Observer):
    """Aggregates every ``window`` events of each layer (and direction) into a ring buffer.

    Loom's rule: avg and std are means of the events' values, max starts at 0 and takes the
    maximum (min likewise), active is the integer mean, total is the last event's total.
    ``history(key)`` returns up to ``capacity`` windows, oldest first; keys are
    ``(direction, z, y, x, l, path)``.
    """

    def __init__(self, window: int = 1, capacity: int = 256):
        if window < 1 or capacity < 1:
            raise ValueError("window and capacity must be >= 1")
        self.window = window
        self.capacity = capacity
        self._pending: dict[tuple, list[LayerStats]] = {}
        self._rings: dict[tuple, deque[WindowStats]] = {}

    @staticmethod
    def key(event: LayerEvent) -> tuple:
        return (event.type, event.z, event.y, event.x, event.l, event.path)

    def on_event(self, event: LayerEvent) -> None:
        k = self.key(event)
        pending = self._pending.setdefault(k, [])
        pending.append(event.stats)
        if len(pending) < self.window:
            return
        n = len(pending)
        ring = self._rings.setdefault(k, deque(maxlen=self.capacity))
        ring.append(WindowStats(
            avg=sum(s.avg for s in pending) / n,
            std=sum(s.std for s in pending) / n,
            max=max([0.0] + [s.max for s in pending]),
            min=min([0.0] + [s.min for s in pending]),
            active=sum(s.active for s in pending) // n,
            total=pending[-1].total,
        ))
        pending.clear()

    def keys(self) -> list[tuple]:
        return list(self._rings)

    def history(self, key: tuple) -> list[WindowStats]:
        return list(self._rings.get(key, ()))
