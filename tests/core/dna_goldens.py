"""Loom's DNA comparisons (tests/data/evolve-goldens-seed1.json) as ours must equal them: Loom scores
identical layers 1 +- float32 rounding (1.0000001, 0.99999994), ours exactly 1, and the overall
overlap is the mean of those."""

from __future__ import annotations

import numpy as np

IDENTICAL_WITHIN = 4 * 2.0**-24  # Loom's float32 dot of a unit vector with itself lands this close to 1


def loom_overlap(overlap: float) -> np.float32:
    """One of Loom's overlaps, exactly 1 where it scores identical layers (in these pairs only
    identical layers come that close)."""
    value = np.float32(overlap)
    return np.float32(1) if abs(float(value) - 1) <= IDENTICAL_WITHIN else value


def loom_result(result: dict) -> dict:
    """Loom's ``CompareNetworks`` result with identical layers scored exactly 1 and the overall
    overlap their mean as Loom takes it (a float32 running sum over the layers, one division)."""
    layers = {k: loom_overlap(v) for k, v in result["LayerOverlaps"].items()}
    total = np.float32(0)
    for v in layers.values():
        total = np.float32(total + v)
    overall = total / np.float32(len(layers)) if layers else np.float32(0)
    shifts = [{**s, "Overlap": loom_overlap(s["Overlap"])} for s in result["LogicShifts"]]
    return {"OverallOverlap": overall, "LayerOverlaps": layers, "LogicShifts": shifts}
