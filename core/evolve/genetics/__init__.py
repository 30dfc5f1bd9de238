"""The genetics of evolution, Loom-exact (same seed, same draws, same children as Loom): Go's
``math/rand`` (:mod:`.gorand`), model DNA and its comparison (:mod:`.dna`), splicing two networks
(:mod:`.splicing`), NEAT mutation and its config (:mod:`.neat`) and the genome a run breeds
(:mod:`.genome`), with what they share (cloning, value checks, the memory a run may use).

The ground floor of :mod:`loomlab.core.evolve`: it imports nothing from the floors above.
"""
