"""Model DNA, splicing and evolution (spec §6, §7), one module per concern.

Loom-exact parts (same seed, same draws, same children as Loom): :mod:`.gorand` (Go's
``math/rand``), :mod:`.dna` (signatures and comparison), :mod:`.splicing`, :mod:`.neat` (config and
mutation) and :mod:`.population`. Beyond Loom: runs with speciation, checkpoints and reporters,
batched evaluation of many networks, a Dask evaluator, built-in tasks, LLM sketches (merges of
language models live in :mod:`loomlab.core.llm.quality.merge`).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# name -> module; imported on first use (sketches bring in the LLM runtime and numba).
# No exported name may also be a module's name: importing that module sets the package attribute,
# which then shadows the export (``splice`` lives in ``splicing`` for that reason).
_EXPORTS = {
    "GoRand": "gorand",
    "DNA": "dna", "LayerSignature": "dna", "DNAComparison": "dna", "LogicShift": "dna",
    "extract_dna": "dna", "compare_dna": "dna",
    "SpliceConfig": "splicing", "SpliceResult": "splicing", "splice": "splicing",
    "NEATConfig": "neat", "neat_mutate": "neat",
    "NEATPopulation": "population", "Genome": "genome", "NetworkGenome": "genome",
    "Evolution": "run", "RunResult": "run",
    "SpeciationConfig": "speciation", "Speciation": "speciation", "genome_distance": "speciation",
    "Reproduction": "reproduction", "LoomReproduction": "reproduction", "SpeciesReproduction": "reproduction",
    "Stagnation": "stagnation",
    "Reporter": "reporters", "ConsoleReporter": "reporters", "StatisticsReporter": "reporters",
    "GenerationStats": "reporters",
    "Task": "tasks", "TASKS": "tasks", "get_task": "tasks",
    "forward_many": "batched",
    "Evaluator": "evaluators", "InProcessEvaluator": "evaluators", "make_evaluator": "schedulers",
    "DaskEvaluator": "distributed", "ClusterError": "distributed",
    "NetworkStack": "batched", "forward_stacked": "batched",
    "sketch_dna": "sketch", "compare_models": "sketch",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
