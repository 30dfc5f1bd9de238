"""Evolution runs over the genetics below: Loom's population loop, speciation, stagnation and
reproduction as injected components, the built-in tasks and the batched forward of same-shaped
networks they evaluate with, evaluators (in process or on Dask), reporters, checkpoints, run
configs, and runs in a child process with live events.

The middle floor of :mod:`loomlab.core.evolve`: it imports genetics and never the llm floor,
but for one edge by name (the ``quant-recipe`` task, see the package's docstring).
"""
