"""Model DNA, splicing and evolution (spec §6, §7), in three floors that import downward only (an
import-linter layers contract keeps them so):

* :mod:`.genetics`, Loom-exact (same seed, same draws, same children as Loom): Go's ``math/rand``,
  DNA signatures and comparison, splicing, NEAT config and mutation, the genome a run breeds.
* :mod:`.search`, the runs: Loom's population loop (:mod:`.search.population`, Loom-exact too),
  speciation, stagnation and reproduction as components, built-in tasks, batched evaluation of
  many networks, evaluators in process or on Dask, reporters, checkpoints, run configs.
* :mod:`.llm`, evolution of and over language models: DNA sketches, the quantization recipe as a
  genome and its task. (Merges of language models live in :mod:`loomlab.core.llm.quality.merge`.)

Two edges go by name, out of import-linter's sight, both so that what is not used is not loaded:
this package's names (``loomlab.core.evolve.Evolution`` and the others in ``_EXPORTS``) are
imported from their modules on first use, so importing the package loads nothing; and
:func:`.search.tasks.get_task` imports the ``quant-recipe`` task (``LAZY_TASKS``) from
:mod:`.llm.recipe_task` when it is asked for, the one edge from a floor to one above it, so that a
run of a network task never loads the language-model runtime.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# name -> module; imported on first use (sketches bring in the LLM runtime and numba).
# No exported name may also be a floor's name (genetics, search, llm): importing a module sets its
# floor as an attribute of this package, which would then shadow the export.
_EXPORTS = {
    "GoRand": "genetics.gorand",
    "DNA": "genetics.dna", "LayerSignature": "genetics.dna", "DNAComparison": "genetics.dna",
    "LogicShift": "genetics.dna", "extract_dna": "genetics.dna", "compare_dna": "genetics.dna",
    "SpliceConfig": "genetics.splicing", "SpliceResult": "genetics.splicing", "splice": "genetics.splicing",
    "NEATConfig": "genetics.neat", "neat_mutate": "genetics.neat",
    "Genome": "genetics.genome", "NetworkGenome": "genetics.genome",
    "NEATPopulation": "search.population",
    "Evolution": "search.run", "RunResult": "search.run",
    "SpeciationConfig": "search.speciation", "Speciation": "search.speciation",
    "genome_distance": "search.speciation",
    "Reproduction": "search.reproduction", "LoomReproduction": "search.reproduction",
    "SpeciesReproduction": "search.reproduction",
    "Stagnation": "search.stagnation",
    "Reporter": "search.reporters", "ConsoleReporter": "search.reporters",
    "StatisticsReporter": "search.reporters", "GenerationStats": "search.reporters",
    "Task": "search.tasks", "TASKS": "search.tasks", "get_task": "search.tasks",
    "forward_many": "search.batched", "NetworkStack": "search.batched", "forward_stacked": "search.batched",
    "Evaluator": "search.evaluators", "InProcessEvaluator": "search.evaluators",
    "make_evaluator": "search.schedulers",
    "DaskEvaluator": "search.distributed", "ClusterError": "search.distributed",
    "sketch_dna": "llm.sketch", "compare_models": "llm.sketch",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
