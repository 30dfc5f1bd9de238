"""Crossover of two networks (Loom's ``SpliceDNA``, spec §7.2): a child of parent A's structure
whose weights are blended, cut at a point, or picked weight by weight from A and B.

The child is a new network: parents are never changed. As Loom, only grid layers are spliced
(weights of nested branches stay A's) and a layer is spliced only where B has a layer of the same
weight count at the same position; the child keeps A's dtypes and scales.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import LoomConfigError
from ...network import VolumetricNetwork
from ...weights import WeightStore
from .clone import clone_network
from .dna import cosine_similarity, extract_dna
from .gorand import GoRand

MODES = ("blend", "point", "uniform")


@dataclass(frozen=True)
class SpliceConfig:
    """How to splice (Loom's ``SpliceConfig``; ``DefaultSpliceConfig`` is the default here).

    Attributes:
        mode: ``"blend"``, ``"point"`` or ``"uniform"``; ``""`` (Loom's zero value) blends.
        blend_alpha: B's share in a blend, unless fitnesses are given.
        split_ratio: where ``point`` cuts each layer's weights (a fraction of their count).
        fitness_a, fitness_b: when their sum is positive, ``blend`` weighs B by its share of the
            fitness, scaled by the layers' similarity, and ``uniform`` picks A's weights with
            probability A's share.
        seed: the generator of ``uniform`` (Loom seeds it from the clock; None: a random seed).
    """

    mode: str = "blend"
    blend_alpha: float = 0.5
    split_ratio: float = 0.5
    fitness_a: float = 0.0
    fitness_b: float = 0.0
    seed: int | None = None

    def __post_init__(self):
        if self.mode not in (*MODES, ""):
            raise LoomConfigError(f"splice mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("blend_alpha", "split_ratio", "fitness_a", "fitness_b"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise LoomConfigError(f"splice {name} must be a finite number, got {v!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise LoomConfigError(f"splice seed must be an integer, got {self.seed!r}")
        # Loom holds BlendAlpha as a float32
        object.__setattr__(self, "blend_alpha", float(np.float32(self.blend_alpha)))

    _LOOM_KEYS = {"mode": "CrossoverMode", "blend_alpha": "BlendAlpha", "split_ratio": "SplitRatio",
                  "fitness_a": "FitnessA", "fitness_b": "FitnessB"}

    def to_loom(self) -> dict:
        return {loom: getattr(self, ours) for ours, loom in self._LOOM_KEYS.items()}

    @classmethod
    def from_loom(cls, obj: Any, seed: int | None = None) -> SpliceConfig:
        """Read Loom's keys; as Loom, a missing key is its zero value (so ``{}`` is alpha 0)."""
        if not isinstance(obj, dict):
            raise LoomConfigError(f"a splice config is an object, got {type(obj).__name__}")
        unknown = set(obj) - set(cls._LOOM_KEYS.values())
        if unknown:
            raise LoomConfigError(f"unknown splice config keys: {', '.join(sorted(unknown))} "
                                  f"(known: {', '.join(cls._LOOM_KEYS.values())})")
        values = {ours: obj.get(loom, "" if ours == "mode" else 0.0) for ours, loom in cls._LOOM_KEYS.items()}
        return cls(**values, seed=seed)


@dataclass
class SpliceResult:
    """The child, each spliced position's similarity of A and B, and how many were similar (> 0)."""

    child: VolumetricNetwork
    similarities: dict[str, float]
    blended_count: int


def splice(a: VolumetricNetwork, b: VolumetricNetwork, config: SpliceConfig | None = None) -> SpliceResult:
    """Loom's ``SpliceDNAWithReport``: a child of ``a`` and ``b`` as ``config`` says.

    ``similarities`` holds every position both parents have (Loom's cosine of their signatures);
    ``blended_count`` counts those above 0.
    """
    config = config or SpliceConfig()
    dna_b = {sig.key: sig for sig in reversed(extract_dna(b).signatures)}  # the first at a key wins
    child = clone_network(a)
    rng = GoRand(config.seed if config.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1)
    similarities: dict[str, float] = {}
    for sig_a in extract_dna(a):
        coord = (sig_a.z, sig_a.y, sig_a.x, sig_a.l)
        other = dna_b.get(sig_a.key)
        if other is None or other.weights.size == 0:
            continue
        # Loom reports every compared position, weightless layers (signature [1]) included
        sim = cosine_similarity(sig_a, other)
        similarities[sig_a.key] = sim
        store, layer_b = child[coord].weights, b.layer_at(coord)
        if store is None or layer_b is None or not isinstance(layer_b.weights, WeightStore) \
                or len(layer_b.weights) != len(store):
            continue
        store.master = _mixed(store.master, layer_b.weights.master, sim, config, rng)
        store.touch()
    return SpliceResult(child, similarities, sum(1 for s in similarities.values() if s > 0))


def _mixed(w_a: np.ndarray, w_b: np.ndarray, sim: float, config: SpliceConfig, rng: GoRand) -> np.ndarray:
    fa, fb = config.fitness_a, config.fitness_b
    by_fitness = fa + fb > 0
    if config.mode == "point":
        split = min(int(w_a.size * config.split_ratio), w_a.size)  # Go's int() truncates
        return np.concatenate([w_a[:split], w_b[split:]])
    if config.mode == "uniform":
        threshold = np.float32(fa / (fa + fb)) if by_fitness else np.float32(0.5)
        return np.where(rng.float32_array(w_a.size) < threshold, w_a, w_b)
    alpha = np.float32(config.blend_alpha)
    if by_fitness:
        alpha = np.float32(fb / (fa + fb)) * (np.float32(0.5) + np.float32(0.5) * np.float32(sim))
    return w_a * (np.float32(1) - alpha) + w_b * alpha
