"""Training: losses, optimizers and Loom's training loop (spec §9.1).

``train(net, batches, TrainConfig(...))`` runs Loom's ``Train``: per batch a recorded forward, the
loss and dL/dy on the final output, backward, and an update of every weighted layer's float32
master. With the defaults (``optimizer="sgd"``) the numbers match Loom: plain SGD with a
per-element gradient clamp. AdamW is this project's addition.

Everything of a step stays on the output's device: the loss and dL/dy, the parameter gradients
(``Layer.device_grad``), the float32 masters the optimizers update (``WeightStore.master_on``) and
AdamW's moments. What crosses to the host per step is one transfer of two numbers, the loss and
whether every gradient is finite: the loop decides on both in Python (Loom's rules below). A
float32 layer's master comes home only when something reads it (``WeightStore.master``); a morphed
layer's comes home each update, as quantizing is host code.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from .backend import array_module, assign_cast, host_floats, widest_float
from .cancel import Cancel, as_cancel_check
from .errors import LoomConfigError, LoomShapeError
from .layers.base import Layer
from .network import VolumetricNetwork

LossFn = Callable[[object, object], tuple[object, object]]  # (y, t) on one device -> (loss, dL/dy)
Batch = tuple[np.ndarray, np.ndarray]


# ----- losses: (y, t) -> (loss, dL/dy); y is the network's output, dL/dy comes back in y.dtype ---
# Each loss computes on y's device (numpy, CuPy or array-api-strict) in the widest float it has,
# float64 as Loom on the host. Both results stay there: the loss is a 0-d array (on numpy a
# np.float64, which is a float); the caller brings it to the host with what else it needs.

def mse(y, t) -> tuple[object, object]:
    """Loom's "mse": ``sum((y-t)^2)/N`` over every element; the difference is taken in y.dtype."""
    xp, wide, t = _operands(y, t)
    d = y - xp.astype(t, y.dtype)
    n = _size(d)
    return xp.sum(xp.square(xp.astype(d, wide))) / n, d * (2 / n)


def crossentropy(y, t) -> tuple[object, object]:
    """Loom's "crossentropy" on probabilities y: ``-sum(t*ln(y+1e-10))/N`` (y <= 0 gives NaN)."""
    xp, wide, t = _operands(y, t)
    y_wide = xp.astype(y, wide)
    n = _size(y)
    with np.errstate(invalid="ignore", divide="ignore"):  # Loom lets y <= 0 produce NaN/Inf
        loss = -xp.sum(t * xp.log(y_wide + 1e-10)) / n
        grad = -t / (y_wide + 1e-10) / n
    return loss, xp.astype(grad, y.dtype)


def softmax_crossentropy(y, t) -> tuple[object, object]:
    """Softmax over the last axis of raw outputs, then CE averaged over rows.

    ``t`` holds one distribution per row (one-hot or soft); the gradient ``(p - t)/rows`` assumes
    each row of ``t`` sums to 1.
    """
    xp, wide, t = _operands(y, t)
    z = xp.astype(y, wide)
    z = z - xp.max(z, axis=-1, keepdims=True)
    log_p = z - xp.log(xp.sum(xp.exp(z), axis=-1, keepdims=True))
    rows = _size(y) // y.shape[-1]
    return -xp.sum(t * log_p) / rows, xp.astype((xp.exp(log_p) - t) / rows, y.dtype)


def _operands(y, t):
    """``(xp, wide, t)``: y's namespace, the widest float of its device, and t there in that float."""
    xp = array_module(y)
    wide = widest_float(xp, y.device)
    return xp, wide, xp.asarray(t if _beside(t, y) else np.asarray(t), dtype=wide)


def _beside(t, y) -> bool:
    """Whether ``t`` is already an array of ``y``'s kind (else it is host data to copy over)."""
    return type(t) is type(y)


def _size(a) -> int:
    return math.prod(a.shape)


LOSSES: dict[str, LossFn] = {
    "mse": mse,
    "crossentropy": crossentropy,
    "softmax_crossentropy": softmax_crossentropy,
}


def get_loss(name: str) -> LossFn:
    """The loss registered as ``name`` (Loom silently returns loss 0 for unknown names; we raise)."""
    try:
        return LOSSES[name]
    except (KeyError, TypeError):
        raise LoomConfigError(f"unknown loss {name!r}; expected one of {sorted(LOSSES)}") from None


# ----- optimizers: step(layers) updates each layer's float32 master from its gradient ---------
# on the gradient's device: the master there (WeightStore.master_on), the moments beside it.

def clip(g, limit: float):
    """Loom's gradient clip: clamp each element to [-limit, limit]; ``limit <= 0`` means off."""
    return array_module(g).clip(g, -limit, limit) if limit > 0 else g


class SGD:
    """Loom's update: ``w -= lr * clip(g)`` in float32, no momentum."""

    def __init__(self, learning_rate: float, gradient_clip: float = 0.0):
        self.learning_rate = learning_rate
        self.gradient_clip = gradient_clip

    def step(self, layers: Sequence[Layer]) -> None:
        for layer in _with_grad(layers):
            xp = array_module(layer.device_grad)
            w = layer.weights.master_on(xp)  # updated in place, where it lives
            # a Python float times a float32 array is float32 maths (as np.float32(lr) would be)
            w -= self.learning_rate * xp.astype(clip(layer.device_grad, self.gradient_clip), xp.float32)
            layer.weights.after_update(layer.cfg.dtype)  # spec §4.8 for non-float32 layers


@dataclass
class _Moments:
    m: object  # on the gradient's device, in its float
    v: object
    t: int = 0


class AdamW:
    """Adam with bias correction and decoupled weight decay (Loshchilov & Hutter).

    ``w -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w)`` with the moments of the
    clipped gradient; state is kept per layer, and a layer's step count advances only when it
    has a gradient.
    """

    def __init__(self, learning_rate: float, gradient_clip: float = 0.0, weight_decay: float = 0.0,
                 beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8):
        self.learning_rate = learning_rate
        self.gradient_clip = gradient_clip
        self.weight_decay = weight_decay
        self.beta1, self.beta2, self.eps = beta1, beta2, eps
        self.state: dict[Layer, _Moments] = {}

    def step(self, layers: Sequence[Layer]) -> None:
        b1, b2 = self.beta1, self.beta2
        for layer in _with_grad(layers):
            xp = array_module(layer.device_grad)
            g = clip(layer.device_grad, self.gradient_clip)
            s = self.state.get(layer)
            if s is None:
                s = self.state[layer] = _Moments(xp.zeros_like(g), xp.zeros_like(g))
            s.t += 1
            s.m = b1 * s.m + (1 - b1) * g
            s.v = b2 * s.v + (1 - b2) * g * g
            m_hat, v_hat = s.m / (1 - b1 ** s.t), s.v / (1 - b2 ** s.t)
            master = layer.weights.master_on(xp)
            w = xp.astype(master, g.dtype)  # the gradient's float: float64 where the device has it
            w -= self.learning_rate * (m_hat / (xp.sqrt(v_hat) + self.eps) + self.weight_decay * w)
            assign_cast(master, w)
            layer.weights.after_update(layer.cfg.dtype)  # spec §4.8 for non-float32 layers


def _with_grad(layers: Sequence[Layer]):
    return (la for la in layers if la.weights is not None and la.device_grad is not None)


def _gradients_finite(layers: Sequence[Layer], like):
    """A 0-d array beside ``like`` (in its dtype): 1 when every layer's gradient is finite, else 0.
    Reduced on the device, so only this number crosses."""
    xp = array_module(like)
    grads = [la.device_grad for la in layers if la.device_grad is not None]
    if not grads:
        return xp.ones((), dtype=like.dtype)
    return xp.astype(xp.all(xp.stack([xp.all(xp.isfinite(g)) for g in grads])), like.dtype)


# ----- configuration ----------------------------------------------------------------------

@dataclass
class TrainConfig:
    """Training settings; Loom's ``TrainingConfig`` fields plus the AdamW ones.

    ``gradient_clip`` > 0 clamps each gradient element (Loom's GradientClip, not a norm clip).
    ``weight_decay``, ``beta1``, ``beta2`` and ``eps`` belong to AdamW; SGD is Loom's plain rule,
    so a weight decay with ``optimizer="sgd"`` is rejected rather than ignored.
    """

    epochs: int = 10
    learning_rate: float = 0.01
    loss: str = "mse"
    gradient_clip: float = 0.0
    optimizer: str = "sgd"
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if not isinstance(self.epochs, int) or isinstance(self.epochs, bool) or self.epochs < 0:
            raise LoomConfigError(f"epochs must be a non-negative integer, got {self.epochs!r}")
        for name in ("learning_rate", "gradient_clip", "weight_decay"):
            require_value(name, getattr(self, name), lambda v: v >= 0, "a finite number >= 0")
        for name in ("beta1", "beta2"):
            require_value(name, getattr(self, name), lambda v: 0 <= v < 1, "in [0, 1)")
        require_value("eps", self.eps, lambda v: v > 0, "a finite number > 0")
        get_loss(self.loss)
        if self.optimizer not in OPTIMIZERS:
            raise LoomConfigError(f"unknown optimizer {self.optimizer!r}; "
                                  f"expected one of {sorted(OPTIMIZERS)}")
        if self.optimizer == "sgd" and self.weight_decay > 0:
            raise LoomConfigError("weight_decay needs optimizer='adamw' (Loom's SGD has none)")

    def make_optimizer(self) -> SGD | AdamW:
        return OPTIMIZERS[self.optimizer](self)


def require_value(name: str, value, ok: Callable[[float], bool], what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not ok(value):
        raise LoomConfigError(f"{name} must be {what}, got {value!r}")


OPTIMIZERS: dict[str, Callable[[TrainConfig], SGD | AdamW]] = {
    "sgd": lambda c: SGD(c.learning_rate, c.gradient_clip),
    "adamw": lambda c: AdamW(c.learning_rate, c.gradient_clip, c.weight_decay, c.beta1, c.beta2,
                             c.eps),
}


# ----- the loop -----------------------------------------------------------------------------

class TrainResult(list):
    """The per-epoch loss history (a plain ``list[float]``) plus ``cancelled``.

    ``cancelled`` is True when ``cancel`` stopped training; the list then holds the epochs that
    finished.
    """

    cancelled: bool = False

    @property
    def losses(self) -> list[float]:
        return list(self)


def train(net: VolumetricNetwork, batches: Sequence[Batch], config: TrainConfig | None = None,
          on_epoch: Callable[[int, float], None] | None = None, cancel: Cancel = None) -> TrainResult:
    """Train ``net`` on ``(x, target)`` batches; returns the epoch loss history.

    Loom's rules per batch: a NaN/Inf loss stops the epoch's remaining batches; a NaN/Inf
    gradient skips the update and the batch's loss. Epoch loss = sum of the added batch losses /
    number of batches. ``x``'s dtype picks the activation precision as in ``net.forward``
    (float32 is Loom's). ``on_epoch(epoch_index, loss)`` runs after each epoch; ``cancel`` (a
    callable returning bool, or a ``threading.Event``) is checked before every batch.
    """
    config = config if config is not None else TrainConfig()
    batches = list(batches)
    if config.epochs and not batches:
        raise LoomConfigError("train() needs at least one batch")
    loss_fn = get_loss(config.loss)
    optimizer = config.make_optimizer()
    stop = as_cancel_check(cancel)
    history = TrainResult()
    for epoch in range(config.epochs):
        total = 0.0
        for x, target in batches:
            if stop():
                history.cancelled = True
                return history
            loss = _train_batch(net, x, target, loss_fn, optimizer)
            if not math.isfinite(loss):
                break
            total += loss
        history.append(total / len(batches))
        if on_epoch is not None:
            on_epoch(epoch, history[-1])
    return history


def _train_batch(net: VolumetricNetwork, x, target, loss_fn: LossFn, optimizer) -> float:
    """One step; returns the loss to add (0 when the update was skipped, NaN/Inf to stop).

    Backward runs before the loss is looked at, so that the loss and the gradients' finiteness
    cross to the host in one transfer; a NaN/Inf loss still updates nothing.
    """
    net.zero_grad()
    loss, grad = _loss(loss_fn, net.forward(x, train=True), target)
    net.backward(grad)
    layers = net.weighted_layers()
    loss, finite = host_floats(loss, _gradients_finite(layers, loss))
    if not math.isfinite(loss):
        return loss
    if not finite:
        return 0.0
    optimizer.step(layers)
    return loss


def evaluate(net: VolumetricNetwork, batches: Sequence[Batch], loss: str = "mse") -> float:
    """Mean loss over ``batches`` without recording or updating anything."""
    loss_fn = get_loss(loss)
    batches = list(batches)
    if not batches:
        raise LoomConfigError("evaluate() needs at least one batch")
    # every batch's loss stays on the device until one transfer brings them all
    return sum(host_floats(*(_loss(loss_fn, net.forward(x), t)[0] for x, t in batches))) / len(batches)


def _loss(loss_fn: LossFn, y, target) -> tuple[float, object]:
    """The loss on the output's device; a host target is copied there once, y never leaves."""
    return loss_fn(y, fitted_target(target, y))


def fitted_target(target, y):
    """``target`` in ``y``'s shape: an array of ``y``'s kind reshaped on its device, host data on
    the host (its float64 may not exist on the device: the caller casts it on the way there).

    Raises:
        LoomShapeError: the target does not hold as many values as ``y``.
    """
    t = target if _beside(target, y) else np.asarray(target)
    if _size(t) != _size(y):
        raise LoomShapeError(f"target of shape {t.shape} does not fit output of shape {y.shape}")
    return array_module(y).reshape(t, y.shape) if _beside(t, y) else t.reshape(y.shape)
