"""The numbers of an evolution run's settings, checked where they are read: one
:class:`~loomlab.core.errors.LoomConfigError` naming the setting for anything else."""

from __future__ import annotations

import contextlib
import math
import reprlib
from typing import Any

import numpy as np

from ...errors import LoomConfigError


def check_number(where: str, value: Any) -> float:
    """``value`` as a finite float; a bool, a non-number, NaN, an infinity or an integer too large
    for a float (TOML reads any number of digits) raises naming ``where``."""
    number = math.nan
    if not isinstance(value, bool) and isinstance(value, int | float | np.integer | np.floating):
        with contextlib.suppress(OverflowError):
            number = float(value)
    if not math.isfinite(number):
        raise LoomConfigError(f"{where} must be a finite number, got {reprlib.repr(value)}")
    return number
