"""One way to ask "should long work stop?": every cancellable engine call takes a ``cancel``.

``cancel`` is None (never stop), a callable returning True to stop, or an event with ``is_set()``
(``threading.Event``, ``multiprocessing.Event``). Engine loops turn it into a plain check once,
with :func:`as_cancel_check`, before any work.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from .errors import LoomConfigError

Cancel = Callable[[], bool] | threading.Event | None


def _never() -> bool:
    return False


def as_cancel_check(cancel: Cancel) -> Callable[[], bool]:
    """A zero-argument check that returns True once ``cancel`` asks to stop.

    Anything else (``cancel=True``, a string) raises :class:`LoomConfigError` here, before the
    work starts, rather than a TypeError in the middle of it.
    """
    if cancel is None:
        return _never
    is_set = getattr(cancel, "is_set", None)
    if callable(is_set):
        return is_set
    if callable(cancel):
        return cancel
    raise LoomConfigError(f"cancel must be None, a callable returning bool or an event with is_set(); "
                          f"got {type(cancel).__name__}")
