"""Target propagation ("tween"), Loom's second trainer (spec §9.3), chain-rule mode.

One tween step on ``(x, t)``:

1. Forward through the grid in flat order, recording every executed layer's output and backward
   token (disabled layers copy their input through and get no target).
2. Targets, top-down: the last layer's output target is ``t`` itself. The output error ``t - y``
   is back-propagated with the layers' own backward; the layer inputs' gradients ``gradIn`` give
   the target of each earlier layer's output, ``clamp(input + gradIn * gradient_scale, ±clamp)``.
3. Link metrics per layer, between its forward output and its target:
   budget ``(cos(fwd, target) + 1) / 2`` (cos = 0 when either is all zeros), gap ``RMS(fwd - target)``.
4. Local updates: a layer whose budget is below 0.2 is left alone (its momentum is not applied
   either). Otherwise ``g = -dL/dw`` of ``L = ½‖layer(input) - target‖²``, computed by the
   layer's own backward, with ``rate = lr * (0.5 + 0.5*budget) * depth_scale_factor**k`` where
   ``k`` is the layer's distance from the output in executed layers (0 for the last), so layers
   whose signal passed through more Jacobians get proportionally larger steps. Then per weighted
   layer ``v = m*v + (1-m) * rate * g`` and ``w += v`` on the float32 master.
   (Where no clamp bites, a hidden layer's ``g`` is ``gradient_scale`` times the backprop
   gradient of ``½‖y - t‖²``; the last layer's is that gradient itself.)

Loom's layer-wise mode (per-type heuristic targets; its Dense reads ``W`` as ``[in][out]``,
contradicting the forward layout) is not implemented: ``use_chain_rule=False`` is rejected.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from .backend import host_floats, widest_float
from .cancel import Cancel, as_cancel_check
from .errors import LoomConfigError, LoomShapeError
from .layers.base import Layer
from .network import Trace, VolumetricNetwork
from .train import fitted_target, require_value

Batch = tuple[np.ndarray, np.ndarray]

# Spec §9.3: a layer whose output points away from its target (cos < -0.6) is not updated.
MIN_BUDGET = 0.2


@dataclass
class TweenConfig:
    """Loom's ``TweenConfig`` (spec §9.3) plus ``epochs``.

    ``batch_size`` rows (axis 0) of each given batch form one tween step; the last step of a batch
    may hold fewer rows.
    """

    epochs: int = 10
    batch_size: int = 1
    use_chain_rule: bool = True
    gradient_scale: float = 0.1
    depth_scale_factor: float = 1.1
    momentum: float = 0.9
    learning_rate: float = 0.01
    activation_clamp: float = 10.0

    def __post_init__(self) -> None:
        _require_int("epochs", self.epochs, 0)
        _require_int("batch_size", self.batch_size, 1)
        if self.use_chain_rule is not True:
            raise LoomConfigError("only use_chain_rule=True is implemented: Loom's layer-wise "
                                  "heuristic targets contradict its own Dense layout")
        require_value("learning_rate", self.learning_rate, lambda v: v >= 0, "a finite number >= 0")
        require_value("momentum", self.momentum, lambda v: 0 <= v < 1, "in [0, 1)")
        for name in ("gradient_scale", "depth_scale_factor", "activation_clamp"):
            require_value(name, getattr(self, name), lambda v: v > 0, "a finite number > 0")


def _require_int(name: str, value, low: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise LoomConfigError(f"{name} must be an integer >= {low}, got {value!r}")


@dataclass
class LinkMetric:
    """How well a layer's forward output agrees with its propagated target."""

    budget: float
    gap: float


@dataclass
class TweenResult:
    """Per-epoch mse losses and link metrics (mean over the epoch's steps, keyed by flat cell
    index of each executed grid layer); ``cancelled`` when ``cancel`` stopped training, in which
    case only finished epochs are listed."""

    losses: list[float] = field(default_factory=list)
    links: list[dict[int, LinkMetric]] = field(default_factory=list)
    cancelled: bool = False


def _targets(rec: Trace, t, config: TweenConfig) -> list:
    """Output target of every executed layer: ``t`` for the last, propagated ones before it."""
    xp, s, c = rec.run.xp, config.gradient_scale, config.activation_clamp
    targets = [None] * len(rec.tokens)
    if not targets:
        return targets
    targets[-1] = t
    delta = t - xp.astype(rec.output, rec.compute)
    for j in range(len(targets) - 1, 0, -1):
        delta = rec.run.back(rec.tokens[j], delta)
        targets[j - 1] = xp.clip(xp.astype(rec.outputs[j - 1], rec.compute) + s * delta, -c, c)
    return targets


def _link(xp, fwd, target) -> LinkMetric:
    """Reduced on the device in its widest float; the three sums cross to the host in one
    transfer, because the update decides in Python whether the layer's budget allows a step."""
    if math.prod(fwd.shape) == 0:
        return LinkMetric(0.5, 0.0)
    wide = widest_float(xp, fwd.device)
    a, b = (xp.reshape(xp.astype(v, wide), (-1,)) for v in (fwd, target))
    norms, dot, mean_sq = host_floats(xp.linalg.vector_norm(a) * xp.linalg.vector_norm(b), a @ b,
                                      xp.mean(xp.square(a - b)))
    cos = dot / norms if norms > 0 else 0.0
    return LinkMetric((cos + 1) / 2, math.sqrt(mean_sq))


def _prepare(net: VolumetricNetwork, x, target, config: TweenConfig):
    """Recorded forward, target tensor (in compute dtype), per-layer targets and link metrics."""
    rec = net.trace(x)
    xp = rec.run.xp
    t = xp.asarray(fitted_target(target, rec.output), dtype=rec.compute)  # cast on the way there
    targets = _targets(rec, t, config)
    links = [_link(rec.run.xp, y, tgt) for y, tgt in zip(rec.outputs, targets, strict=True)]
    return rec, t, targets, links


def link_metrics(net: VolumetricNetwork, x, target,
                 config: TweenConfig | None = None) -> dict[int, LinkMetric]:
    """Link budget and gap of every executed grid layer (keyed by flat cell index) for one
    sample or batch; uses ``config``'s gradient_scale and activation_clamp. Nothing is updated."""
    config = config if config is not None else TweenConfig()
    rec, _, _, links = _prepare(net, x, target, config)
    net.zero_grad()  # the target pass added chain-rule gradients nobody asked for
    return dict(zip(rec.cells, links, strict=True))


class _Momentum:
    """Per-layer velocity: ``v = m*v + (1-m)*step`` then ``w += v``, only for layers stepped."""

    def __init__(self, momentum: float):
        self.momentum = momentum
        self.velocity: dict[Layer, np.ndarray] = {}

    def apply(self, steps: dict[Layer, np.ndarray]) -> None:
        m = self.momentum
        for layer, step in steps.items():
            v = m * self.velocity.get(layer, 0.0) + (1 - m) * step
            self.velocity[layer] = v
            layer.weights.master += v.astype(np.float32)
            layer.weights.touch()


def _tween_step(net: VolumetricNetwork, x, target, config: TweenConfig,
                momentum: _Momentum) -> tuple[float, int, dict[int, LinkMetric]]:
    """One step; returns the pre-update sum of squared errors, the element count and links."""
    rec, t, targets, links = _prepare(net, x, target, config)
    xp = rec.run.xp
    sse, = host_floats(xp.sum(xp.square(xp.astype(rec.output, widest_float(xp, t.device)) - t)))
    weighted = net.weighted_layers()
    net.zero_grad()
    steps: dict[Layer, np.ndarray] = {}
    depth = len(rec.tokens)
    for j, (token, link) in enumerate(zip(rec.tokens, links, strict=True)):
        if link.budget < MIN_BUDGET:
            continue
        rate = config.learning_rate * (0.5 + 0.5 * link.budget) \
            * config.depth_scale_factor ** (depth - 1 - j)
        rec.run.back(token, xp.astype(rec.outputs[j], rec.compute) - targets[j])
        for layer in weighted:  # remote links may route a layer's gradient into another cell
            if layer.grad is not None:
                steps[layer] = steps.get(layer, 0.0) - rate * layer.grad
                layer.grad = None
    if math.isfinite(sse) and all(np.isfinite(s).all() for s in steps.values()):
        momentum.apply(steps)
    return sse, math.prod(rec.output.shape), dict(zip(rec.cells, links, strict=True))


def _steps(batches: Sequence[Batch], size: int):
    for x, t in batches:
        if len(x) == 0:
            raise LoomShapeError("a batch holds no rows")
        for i in range(0, len(x), size):
            yield x[i:i + size], t[i:i + size]


def tween_train(net: VolumetricNetwork, batches: Sequence[Batch], config: TweenConfig | None = None,
                on_epoch: Callable[[int, float], None] | None = None, cancel: Cancel = None) -> TweenResult:
    """Train ``net`` by target propagation on ``(x, target)`` batches (``[B, ...]`` arrays).

    Epoch loss = Loom's mse over every output element of the epoch, each step measured before
    its own update. A step whose loss or update is NaN/Inf changes no weight. ``on_epoch(epoch,
    loss)`` runs after each epoch; ``cancel`` (callable or ``threading.Event``) is checked before
    every step.
    """
    config = config if config is not None else TweenConfig()
    batches = list(batches)
    if config.epochs and not batches:
        raise LoomConfigError("tween_train() needs at least one batch")
    momentum = _Momentum(config.momentum)
    stop = as_cancel_check(cancel)
    result = TweenResult()
    for epoch in range(config.epochs):
        sse, count, sums, steps = 0.0, 0, {}, 0
        for x, t in _steps(batches, config.batch_size):
            if stop():
                result.cancelled = True
                return result
            step_sse, n, links = _tween_step(net, x, t, config, momentum)
            sse, count, steps = sse + step_sse, count + n, steps + 1
            for cell, link in links.items():
                b, g = sums.get(cell, (0.0, 0.0))
                sums[cell] = (b + link.budget, g + link.gap)
        result.losses.append(sse / max(count, 1))
        result.links.append({c: LinkMetric(b / steps, g / steps) for c, (b, g) in sums.items()})
        if on_epoch is not None:
            on_epoch(epoch, result.losses[-1])
    return result
