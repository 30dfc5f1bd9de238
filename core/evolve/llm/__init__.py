"""Evolution meets language models: DNA sketches of large models and the comparison table built
on them (:mod:`.sketch`, :mod:`.dna_table`), a quantization recipe as a genome
(:mod:`.recipe_genome`) and the ``quant-recipe`` task that evolves it (:mod:`.recipe_task`).

The top floor of :mod:`loomlab.core.evolve`: it imports the floors below and
:mod:`loomlab.core.llm`. Merges of language models are no evolution and live in
:mod:`loomlab.core.llm.quality.merge`.
"""
