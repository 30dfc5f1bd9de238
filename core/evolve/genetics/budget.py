"""What an evolution run may cost on this machine, estimated from its settings before anything is
built, so that a config asking for more (a population of 10^9, a hidden width of 10^6) is refused
with one error naming the setting instead of hanging or ending in a MemoryError.

A run may use half of the machine's physical memory (:func:`run_budget`). What a member costs
was measured with ``tracemalloc`` over two generations of xor, sine and spirals runs at several
sizes: about 5-8 KiB of Python objects per layer, 20 times its float32 weights (the master, the
stacked copy a batched forward makes, mutation noise, two generations alive at once) and 6 times
its widest activation over the task's data rows.
"""

from __future__ import annotations

import reprlib

from ...errors import LoomConfigError
from ...machine import physical_memory_bytes
from ...units import format_bytes

RUN_MEMORY_SHARE = 2  # a run may use 1/2 of the machine's memory
LAYER_BYTES = 8 << 10  # a layer's Python objects in a member
WEIGHT_BYTES = 20 * 4  # a float32 weight and its copies during a generation
ACTIVATION_BYTES = 6 * 4  # one float32 activation (row x unit) and its temporaries
HUGE = 1 << 60  # sizes past this are said as "over 1024 PiB" (TOML integers have any number of digits)


def run_budget() -> int:
    """The bytes one evolution run may use here."""
    return physical_memory_bytes() // RUN_MEMORY_SHARE


def network_member_bytes(layers: int, weights: int, rows: int, width: int) -> int:
    """About what one network member of ``layers`` layers and ``weights`` weights costs in a run
    whose data has ``rows`` rows and whose widest layer has ``width`` units."""
    return LAYER_BYTES * layers + WEIGHT_BYTES * weights + ACTIVATION_BYTES * rows * width


def check_fits(nbytes: int, what: str) -> None:
    """Raise :class:`LoomConfigError` when ``nbytes`` is more than a run may use; ``what`` names
    the settings that ask for them ("task 'sine' with hidden 100000, depth 2")."""
    if nbytes > run_budget():
        need = f"about {format_bytes(nbytes)}" if nbytes < HUGE else f"over {format_bytes(HUGE)}"
        raise LoomConfigError(f"{what} needs {need}, more than a run may use here "
                              f"({format_bytes(run_budget())}, half of this machine's memory)")


def shown_count(n: int) -> str:
    """``n`` for a message: ``1,000,000``, or cut short when it has too many digits to read."""
    return f"{n:,}" if n < HUGE else reprlib.repr(n)
