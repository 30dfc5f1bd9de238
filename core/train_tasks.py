"""Small training tasks that fit any network, for a quick training run by hand.

The task follows the network's sizes: XOR for a 2 -> 1 network, sine regression for 1 -> 1, and
otherwise learning a fixed random linear map of the input (which every network can approximate
at least in part, so the loss has somewhere to go). Cross-entropy losses get class targets: the
one-hot argmax of the same target rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .errors import LoomConfigError
from .network import VolumetricNetwork
from .run_inputs import input_spec, sample_input
from .train import Batch, get_loss

SINE_POINTS = 32
LINEAR_MAP_BATCHES = 4
LINEAR_MAP_BATCH_SIZE = 8
CLASS_LOSSES = ("crossentropy", "softmax_crossentropy")


@dataclass(frozen=True)
class TrainingTask:
    """A named set of ``(x, target)`` batches; ``description`` is what a person is told."""

    name: str
    description: str
    batches: list[Batch]


def make_task(net: VolumetricNetwork, seed: int = 0, loss: str = "mse") -> TrainingTask:
    """The task for ``net`` (see the module's docstring), its data drawn from ``seed``.

    Runs ``net`` forward once on a sample, to learn the output's shape.
    """
    get_loss(loss)
    spec = input_spec(net)
    rng = np.random.default_rng(seed)
    probe = sample_input(net, rng, 1)
    out_size = _output(net, probe).size // probe.shape[0]
    if spec.kind == "vector" and spec.shape == (2,) and out_size == 1:
        task = _xor()
    elif spec.kind == "vector" and spec.shape == (1,) and out_size == 1:
        task = _sine()
    else:
        task = _linear_map(net, rng, spec.vocab)
    return _for_loss(task, loss)


def _xor() -> TrainingTask:
    x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
    t = np.array([[0], [1], [1], [0]], np.float32)
    return TrainingTask("xor", "XOR: 4 points (0/1, 0/1) -> 0/1, one batch", [(x, t)])


def _sine() -> TrainingTask:
    x = np.linspace(-np.pi, np.pi, SINE_POINTS, dtype=np.float32).reshape(-1, 1)
    return TrainingTask("sine", f"sine regression: y = sin(x) at {SINE_POINTS} points in [-π, π], one batch",
                        [(x, np.sin(x))])


def _linear_map(net: VolumetricNetwork, rng: np.random.Generator, vocab: int) -> TrainingTask:
    """Targets ``features(x) @ M`` with one fixed ``M ~ N(0, 1/n_in)``, shaped like the output."""
    xs = [sample_input(net, rng, LINEAR_MAP_BATCH_SIZE) for _ in range(LINEAR_MAP_BATCHES)]
    out_shape = _output(net, xs[0]).shape  # every batch has the same shape
    rows = xs[0].shape[0]
    n_in, n_out = xs[0].size // rows, int(np.prod(out_shape)) // rows
    m = rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)
    scale = vocab if vocab else 1  # token ids scaled into [0, 1), as values of one size
    batches = [(x, (x.reshape(rows, -1) / scale @ m).astype(np.float32).reshape(out_shape)) for x in xs]
    return TrainingTask("linear-map", f"reproduce a fixed random linear map of the input: "
                        f"{rows * len(xs)} seeded samples in {len(xs)} batches", batches)


def _for_loss(task: TrainingTask, loss: str) -> TrainingTask:
    if loss not in CLASS_LOSSES:
        return task
    if task.batches[0][1].shape[-1] < 2:
        raise LoomConfigError(f"{loss} needs at least 2 outputs per row to pick a class from; this "
                              f"task ({task.name}) has 1: use mse")
    batches = [(x, _one_hot_argmax(t)) for x, t in task.batches]
    return TrainingTask(task.name, task.description + "; class = the largest target value (one-hot)", batches)


def _one_hot_argmax(t: np.ndarray) -> np.ndarray:
    hot = np.zeros_like(t)
    np.put_along_axis(hot, t.argmax(axis=-1)[..., None], 1, axis=-1)
    return hot


def _output(net: VolumetricNetwork, x: np.ndarray) -> np.ndarray:
    return net.backend.to_numpy(net.forward(x))
