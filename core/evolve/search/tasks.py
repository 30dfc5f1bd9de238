"""Built-in evolution tasks over networks: XOR, sine regression and two-spirals (and the
``quant-recipe`` task, whose members are a language model's per-layer dtypes: :mod:`.llm.recipe_task`).

A task holds fixed data and turns a population of networks into fitness values (higher is better).
Everything a task depends on is in its ``params`` (JSON-able), so ``get_task(task.name,
**task.params)`` rebuilds an equal task on another process or machine, and evaluation draws no
random numbers: the same networks get bit-identical fitness in-process or on a Dask worker, in one
call or split in chunks (see :mod:`.batched`).

Evaluation runs every member through :func:`.batched.forward_stacked` (same-shaped members in one
batched matmul per layer). Evolution makes odd networks (other layer types, sizes that do not fit
the data, overflowing weights), and such a member must not end the run: a member whose forward
raises :class:`LoomError`, whose output is not finite or is not ``rows x outputs`` values in
``rows`` rows, gets the task's ``floor`` fitness. Scores below the floor are raised to it, so the
floor is the lowest fitness a task gives.

Fitness of each task (outputs ``y`` of the network, targets ``t``):

* ``xor``: 4 points (0/1, 0/1) -> 0/1, neat-python's ``4 - sum((y - t)^2)``, solved at 3.9;
  floor 0 (every output wrong by 1). Its :meth:`~NetworkTask.neat_config` is Loom's default with
  Dense layers only: Loom's default lets NEAT turn a layer into any of 17 types, re-initialised
  at ``d_model`` x ``d_model``, which cannot take XOR's 2 inputs or give its 1 output, so about a
  fifth of all children scored the floor (and, speciated, each founded a species of its own).
  Without a bias the seed network still represents XOR: ``relu(x1 - x2) + relu(x2 - x1)``, or
  ``sum v_j tanh(c_j (x1 + x2))`` with ``c = (1, 2)``, ``v = (-5.94, 5.73)``.
* ``sine``: ``points`` inputs evenly spaced over [-pi, pi], target ``sin(x)``; fitness ``-mean((y -
  t)^2)``, solved at -0.01; floor -1 (an output of zero scores -0.5).
* ``spirals``: Lang and Witbrock's two spirals, ``points`` per spiral over three turns, scaled into
  [-1, 1]; one output whose sign is the class (+ for the first spiral, - for the second, 0 is
  wrong); fitness is the fraction classified right, solved at 0.95; floor 0.

Seed networks are chains of Dense layers (Loom's Dense has no bias): ``inputs -> hidden (x depth)
-> outputs`` with weights uniform in ``[-init_scale, init_scale)`` drawn from ``seed``. No bias is
needed: XOR's (0, 0) -> 0 and the odd symmetry of sine and of the spirals (the second spiral is
the first one negated) suit networks without one.

Networks are evaluated at their own ``precision``; seed networks get the task's. Loom JSON and
``.loom`` files do not carry a precision, so an evaluator that rebuilds members from bytes sets it
from ``task.params["precision"]``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import reprlib
from abc import ABC, abstractmethod
from collections.abc import Sequence
from importlib import import_module
from typing import Any, ClassVar

import numpy as np

from ...enums import ACTIVATIONS, LAYER_TYPES, lookup
from ...errors import LoomConfigError, LoomError
from ...layers.base import make_layer
from ...network import PRECISIONS, VolumetricNetwork
from ..genetics.budget import check_fits, network_member_bytes, shown_count
from ..genetics.neat import NEATConfig
from ..genetics.values import check_number
from .batched import as_numpy, forward_stacked

# Parameters every task takes (the shape and start of its seed network, and when it is solved);
# each task adds its own and may change these defaults.
COMMON_PARAMS: dict[str, Any] = {
    "hidden": 4, "depth": 1, "activation": "Tanh", "output_activation": "Linear",
    "seed": 0, "init_scale": 0.5, "precision": "loom", "threshold": None,
}


class Task(ABC):
    """A fitness function: members in, one fitness each out, in order (higher is better).

    ``params`` (JSON-able) rebuild an equal task (``get_task(task.name, **task.params)``);
    ``fitness_threshold`` (None: never) is where a run counts as solved. Members are networks
    (:class:`NetworkTask`) unless the task brings its own genome (``task.genome(config)``, see
    :func:`.run.task_genome`).
    """

    name: ClassVar[str]
    params: dict[str, Any]
    fitness_threshold: float | None
    #: whether :meth:`evaluate` takes ``progress`` and ``cancel`` keywords and reports each member
    #: (a task whose members take seconds each); else a call is one step
    member_by_member: ClassVar[bool] = False

    @abstractmethod
    def evaluate(self, members: Sequence[Any]) -> list[float]:
        """Fitness of each member, in order."""

    @abstractmethod
    def member_bytes(self, config: NEATConfig | None = None) -> int:
        """About how much memory one member costs in a run mutated by ``config`` (see
        :mod:`.genetics.budget`), so that a run too large for this machine is refused before it starts."""

    def solved(self, fitness: float) -> bool:
        return self.fitness_threshold is not None and fitness >= self.fitness_threshold

    # ----- value semantics ---------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.params == self.params

    def __hash__(self) -> int:
        return hash((self.name, json.dumps(self.params, sort_keys=True)))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.params.items())})"


class NetworkTask(Task):
    """A fitness function over networks grown from a seed network of Dense layers.

    Subclasses set ``name``, ``floor``, ``defaults`` (their params and defaults, over
    :data:`COMMON_PARAMS`), ``n_inputs`` and ``n_outputs``, say how many ``rows`` a member is
    evaluated on, and :meth:`evaluate`; :meth:`check_param` validates a parameter of their own.
    """

    floor: float
    defaults: ClassVar[dict[str, Any]]
    n_inputs: int
    n_outputs: int
    #: NEATConfig fields :meth:`neat_config` sets over Loom's default (none: Loom's default)
    neat_overrides: ClassVar[dict[str, Any]] = {}

    def __init__(self, **params: Any):
        known = {**COMMON_PARAMS, **self.defaults}
        unknown = sorted(set(params) - set(known))
        if unknown:
            raise LoomConfigError(f"task {self.name!r} has no parameter {unknown[0]!r}; "
                                  f"its parameters: {', '.join(sorted(known))}")
        self.params: dict[str, Any] = {k: self.check_param(k, params.get(k, v)) for k, v in known.items()}
        self.fitness_threshold: float | None = self.params["threshold"]
        sizes = ", ".join(f"{k} {shown_count(self.params[k])}" for k in ("hidden", "depth", "points")
                          if k in self.params)
        check_fits(self.member_bytes(), f"task {self.name!r} with {sizes}: one member")

    def check_param(self, key: str, value: Any) -> Any:
        """``value`` of parameter ``key``, validated and in its plain JSON type (a
        :class:`LoomConfigError` naming it otherwise)."""
        return _checked(self.name, key, value)

    @property
    @abstractmethod
    def rows(self) -> int:
        """How many rows of input a member is evaluated on at a time."""

    # ----- the task's contract -----------------------------------------------------
    def seed_network(self) -> VolumetricNetwork:
        """The starting genome: Dense ``n_inputs -> hidden (x depth) -> n_outputs``."""
        p = self.params
        sizes = [self.n_inputs] + [p["hidden"]] * p["depth"] + [self.n_outputs]
        net = VolumetricNetwork(1, 1, 1, len(sizes) - 1, precision=p["precision"])
        rng = np.random.default_rng(p["seed"])
        for i, (n_in, n_out) in enumerate(zip(sizes, sizes[1:], strict=False)):
            last = i == len(sizes) - 2
            net[0, 0, 0, i] = make_layer("Dense", input_height=n_in, output_height=n_out, rng=rng,
                                         init_scale=p["init_scale"],
                                         activation=p["output_activation" if last else "activation"])
        return net

    def member_bytes(self, config: NEATConfig | None = None) -> int:
        """One member: its seed network (counted from the parameters, not built) and, when
        ``config`` lets NEAT re-initialise layers, the largest layer it builds."""
        h, depth, n_in, n_out = self.params["hidden"], self.params["depth"], self.n_inputs, self.n_outputs
        weights = n_in * h + (depth - 1) * h * h + h * n_out if depth else n_in * n_out
        width = max(n_in, n_out, h if depth else 0)
        if config is not None and config.node_mutate_rate > 0:
            weights += config.largest_new_layer()[1]
            width = max(width, 2 * config.d_model, config.default_num_clusters)  # SwiGLU, KMeans
        return network_member_bytes(depth + 1, weights, self.rows, width)

    def neat_config(self, seed: int | None = None) -> NEATConfig:
        """The NEAT mutation settings this task evolves well with: Loom's default for the seed
        network's width (``seed`` None draws a random seed), with the task's overrides
        (:attr:`neat_overrides`; see the module's docstring)."""
        width = max(self.params["hidden"] if self.params["depth"] else 0, self.n_outputs)
        return dataclasses.replace(NEATConfig.default(width, seed), **self.neat_overrides)


class DatasetTask(NetworkTask):
    """A network task with fixed, deterministic data: subclasses build ``inputs`` (``rows x
    n_inputs``) and ``targets`` in :meth:`_data`, and score stacked outputs in :meth:`_score`."""

    @functools.cached_property
    def _dataset(self) -> tuple[np.ndarray, np.ndarray]:
        return self._data()  # built on first use: a run too large is refused before this

    @property
    def inputs(self) -> np.ndarray:
        return self._dataset[0]

    @property
    def targets(self) -> np.ndarray:
        return self._dataset[1]

    @abstractmethod
    def _data(self) -> tuple[np.ndarray, np.ndarray]:
        """``(inputs, targets)``: float32 ``rows x n_inputs`` and ``rows x n_outputs``."""

    @abstractmethod
    def _score(self, y: np.ndarray) -> np.ndarray:
        """Fitness of each member from its outputs, ``y`` float64 ``[members, rows * n_outputs]``."""

    def evaluate(self, nets: Sequence[VolumetricNetwork]) -> list[float]:
        """Fitness of each network, in order (see the module's docstring for the floor)."""
        fitness = np.full(len(nets), self.floor)
        # overflow to inf/nan is an expected outcome of evolved weights, scored as the floor
        with np.errstate(all="ignore"):
            for members, result in forward_stacked(nets, self.inputs, catch=LoomError):
                if not isinstance(result, BaseException):
                    fitness[members] = self._fitness(as_numpy(result))
        return [float(f) for f in fitness]

    def _fitness(self, y: np.ndarray) -> np.ndarray | float:
        rows = self.inputs.shape[0]
        if y.ndim < 2 or y.shape[1] != rows or y[0].size != rows * self.n_outputs:
            return self.floor
        y = y.reshape(len(y), -1).astype(np.float64)
        score = self._score(y)
        ok = np.isfinite(y).all(axis=1) & np.isfinite(score)
        return np.where(ok, np.maximum(score, self.floor), self.floor)


class XorTask(DatasetTask):
    name = "xor"
    floor = 0.0
    defaults = {"threshold": 3.9}
    n_inputs, n_outputs = 2, 1
    # Dense layers only: any other layer type NEAT switches a layer to is built at d_model x
    # d_model, which does not chain with 2 inputs and 1 output, so that member scores the floor
    neat_overrides = {"allowed_layer_types": (LAYER_TYPES["dense"].id,)}
    rows = 4

    def _data(self):
        x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
        return x, np.array([[0], [1], [1], [0]], np.float32)

    def _score(self, y):
        return 4.0 - ((y - self.targets.reshape(1, -1)) ** 2).sum(axis=1)


class SineTask(DatasetTask):
    name = "sine"
    floor = -1.0
    defaults = {"points": 32, "hidden": 8, "threshold": -0.01}
    n_inputs, n_outputs = 1, 1

    @property
    def rows(self) -> int:
        return self.params["points"]

    def _data(self):
        x = np.linspace(-np.pi, np.pi, self.params["points"], dtype=np.float32).reshape(-1, 1)
        return x, np.sin(x)

    def _score(self, y):
        return -((y - self.targets.reshape(1, -1)) ** 2).mean(axis=1)


class SpiralsTask(DatasetTask):
    name = "spirals"
    floor = 0.0
    defaults = {"points": 97, "hidden": 16, "depth": 2, "threshold": 0.95}
    n_inputs, n_outputs = 2, 1

    @property
    def rows(self) -> int:
        return 2 * self.params["points"]

    def _data(self):
        # Lang & Witbrock (1988): 97 points per spiral at angle i*pi/16 and radius 6.5*(104-i)/104;
        # other point counts keep the three turns and the radii from 6.5 down to 6.5*8/104
        n = self.params["points"]
        i = np.arange(n) * (96 / max(n - 1, 1))
        angle, radius = i * np.pi / 16, (104 - i) / 104
        first = np.stack([radius * np.sin(angle), radius * np.cos(angle)], axis=1)
        x = np.concatenate([first, -first]).astype(np.float32)
        labels = np.concatenate([np.ones(n), -np.ones(n)]).astype(np.float32)
        return x, labels.reshape(-1, 1)

    def _score(self, y):
        return (np.sign(y) == self.targets.reshape(1, -1)).mean(axis=1)


TASKS: dict[str, type[Task]] = {cls.name: cls for cls in (XorTask, SineTask, SpiralsTask)}
# Tasks whose module loads the language-model runtime, imported by name when asked for: the one
# edge from this floor up to the llm floor, out of import-linter's sight (see the package's
# docstring), so that a run of a network task never loads that runtime.
LAZY_TASKS = {"quant-recipe": ("loomlab.core.evolve.llm.recipe_task", "RecipeTask"),
              "gguf-recipe": ("loomlab.core.evolve.llm.format_task", "GGUFRecipeTask"),
              **{name: ("loomlab.core.evolve.control.control_task", "CONTROL_TASKS") for name in
                 ("cartpole", "acrobot", "mountaincar", "mountaincar-continuous", "pendulum", "lunarlander",
                  "gym")}}


def get_task(name: str, **params: Any) -> Task:
    """The built-in task ``name`` with ``params`` over its defaults.

    An unknown name or parameter, or a value of the wrong type or range, raises
    :class:`LoomConfigError` naming it and what is valid.
    """
    if not isinstance(name, str):
        raise LoomConfigError(f"a task is named by a string such as 'xor', got {reprlib.repr(name)}")
    cls = TASKS.get(name)
    if cls is None and name in LAZY_TASKS:
        module, attr = LAZY_TASKS[name]
        cls = getattr(import_module(module), attr)
        if isinstance(cls, dict):  # a module's table of tasks by name
            cls = cls[name]
    if cls is None:
        raise LoomConfigError(f"unknown task {name!r}; built-in tasks: "
                              f"{', '.join(sorted([*TASKS, *LAZY_TASKS]))}")
    return cls(**params)


def _checked(task: str, key: str, value: Any) -> Any:
    """``value`` of parameter ``key``, validated and in its plain JSON type."""
    where = f"task {task!r} parameter {key!r}"
    if key in ("activation", "output_activation"):
        entry = lookup(ACTIVATIONS, value) if isinstance(value, str) else None
        if entry is None:
            names = sorted({e.name for e in ACTIVATIONS.values()})
            raise LoomConfigError(f"{where}: {reprlib.repr(value)} is not an activation; "
                                  f"one of {', '.join(names)}")
        return entry.name
    if key == "precision":
        if not isinstance(value, str) or value not in PRECISIONS:
            raise LoomConfigError(f"{where}: {reprlib.repr(value)} is not one of {', '.join(PRECISIONS)}")
        return value
    if key == "threshold":
        return None if value is None else check_number(where, value)
    if key == "init_scale":
        scale = check_number(where, value)
        if scale <= 0:
            raise LoomConfigError(f"{where} must be > 0, got {reprlib.repr(value)}")
        return scale
    # the remaining parameters are counts (hidden, depth, points) and the seed
    if not isinstance(value, int | np.integer) or isinstance(value, bool):
        raise LoomConfigError(f"{where} must be an integer, got {reprlib.repr(value)}")
    low = {"depth": 0, "seed": 0}.get(key, 1)
    if value < low:
        raise LoomConfigError(f"{where} must be >= {low}, got {value}")
    return int(value)
