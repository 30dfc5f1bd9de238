"""Model DNA, splicing and evolution (spec §6, §7), one module per concern.

Loom-exact parts (same seed, same draws, same children as Loom): :mod:`.gorand` (Go's
``math/rand``), :mod:`.dna` (signatures and comparison), :mod:`.splice`, :mod:`.neat` (config and
mutation) and :mod:`.population`. Beyond Loom: runs with speciation, checkpoints and reporters,
batched evaluation of many networks, a Dask evaluator, built-in tasks, LLM sketches and merges.
"""
