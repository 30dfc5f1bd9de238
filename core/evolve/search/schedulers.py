"""The evaluator a scheduler's name asks for: this process, a local Dask cluster, or a remote one.

Kept out of :mod:`.evaluators` (the protocol and the in-process evaluator, which
:mod:`.distributed` builds on) so that imports run one way: evaluators, distributed, this.
"""

from __future__ import annotations

from ...errors import LoomConfigError
from .distributed import DaskEvaluator
from .evaluators import Evaluator, InProcessEvaluator


def make_evaluator(scheduler: str | None = None, **options) -> Evaluator:
    """The evaluator for ``scheduler``.

    ``None`` or ``"inprocess"``: this process (:class:`InProcessEvaluator`, takes no options).
    ``"local"``: a Dask ``LocalCluster`` on loopback started for this evaluator; an address such
    as ``"tcp://host:8786"``: an existing Dask scheduler. Both take the options of
    :class:`loomlab.core.evolve.search.distributed.DaskEvaluator` and need the ``cluster`` extra
    (``pip install 'loomlab[cluster]'``).
    """
    if scheduler is None or scheduler == "inprocess":
        if options:
            raise LoomConfigError(f"the in-process evaluator takes no options, "
                                  f"got {', '.join(sorted(options))}")
        return InProcessEvaluator()
    if not isinstance(scheduler, str) or not scheduler.strip():
        raise LoomConfigError(f"scheduler must be None, 'inprocess', 'local' or a Dask scheduler address "
                              f"such as 'tcp://host:8786', got {scheduler!r}")
    return DaskEvaluator(scheduler, **options)
