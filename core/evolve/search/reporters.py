"""Reporters: what an evolution run tells the world, as neat-python's reporter hooks.

Every hook is a no-op by default, so a reporter implements only what it needs (a console line, a
statistics table, the GUI's live plots, a progress bar). Hooks are called from the thread that
runs the evolution.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from typing import TextIO


@dataclass(frozen=True)
class GenerationStats:
    """One evaluated generation: its fitness figures and species sizes (``{id: members}``)."""

    generation: int
    best: float
    mean: float
    std: float
    worst: float
    species: dict[int, int] = field(default_factory=dict)

    @classmethod
    def of(cls, generation: int, fitness: list[float], species: dict[int, int]) -> GenerationStats:
        n = len(fitness)
        mean = math.fsum(fitness) / n
        std = math.sqrt(math.fsum((f - mean) ** 2 for f in fitness) / n)
        return cls(generation, max(fitness), mean, std, min(fitness), dict(species))

    def to_dict(self) -> dict:
        return {"generation": self.generation, "best": self.best, "mean": self.mean, "std": self.std,
                "worst": self.worst, "species": {str(k): v for k, v in self.species.items()}}

    @classmethod
    def from_dict(cls, d: dict) -> GenerationStats:
        return cls(d["generation"], d["best"], d["mean"], d["std"], d["worst"],
                   {int(k): v for k, v in d["species"].items()})

    def summary(self, population: int) -> str:
        """Loom's summary line, plus the species count when there are species."""
        line = (f"Gen {self.generation} | best={self.best:.4f}  avg={self.mean:.4f}  "
                f"worst={self.worst:.4f}  pop={population}")
        return line + (f"  species={len(self.species)}" if len(self.species) > 1 else "")


class Reporter:
    """The hooks of a run; override the ones you need."""

    def start_generation(self, generation: int) -> None: ...

    def post_evaluate(self, generation: int, fitness: list[float]) -> None: ...

    def end_generation(self, stats: GenerationStats, population: int) -> None: ...

    def species_changed(self, generation: int, sizes: dict[int, int]) -> None: ...

    def found_solution(self, generation: int, fitness: float) -> None: ...

    def checkpointed(self, run_id: int, generation: int) -> None: ...


class ConsoleReporter(Reporter):
    """Prints the summary line of every generation, and the solution when one is found."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stdout

    def end_generation(self, stats: GenerationStats, population: int) -> None:
        print(stats.summary(population), file=self.stream, flush=True)

    def found_solution(self, generation: int, fitness: float) -> None:
        print(f"Solved in generation {generation}: fitness {fitness:.4f}", file=self.stream, flush=True)


class StatisticsReporter(Reporter):
    """Keeps every generation's :class:`GenerationStats` (best/mean/std fitness, species sizes)."""

    def __init__(self):
        self.history: list[GenerationStats] = []

    def end_generation(self, stats: GenerationStats, population: int) -> None:
        self.history.append(stats)

    def best_fitness(self) -> list[float]:
        return [s.best for s in self.history]

    def mean_fitness(self) -> list[float]:
        return [s.mean for s in self.history]
