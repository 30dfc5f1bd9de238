"""A process-wide count of edits to layers, their configurations, children and weights.

Why: a compiled decode step (:mod:`.llm.fused_decode`) holds a network's weights in its own
layout and must notice, before every token, whether anything it was built from changed. Reading
every layer's switches took ~250 us a token once the step had streamed the weights through the
caches (SmolLM2: ~270 layers). Instead every change bumps :data:`last` (any attribute set on a
:class:`~.layers.base.Layer`, its :class:`~.layers.base.LayerConfig` or its
:class:`~.weights.WeightStore`, any change to a layer's ``children`` list), and a watcher compares
one number; only when it moved does it look at the layers themselves (a change elsewhere, such
as another network training, then costs one full comparison, not a rebuild).
"""

from __future__ import annotations

import itertools

_counter = itertools.count(1)  # next() is atomic in CPython: two threads never get one number
last = 0  # the latest edit's number


def bump() -> None:
    """Record an edit."""
    global last
    last = next(_counter)


class EditedList(list):
    """A list that records an edit whenever it changes (a layer's children)."""

    __slots__ = ()


def _recording(name: str):
    change = getattr(list, name)

    def method(self, *args, **kwargs):
        bump()
        return change(self, *args, **kwargs)

    method.__name__ = name
    return method


# every list method that changes the list (``a += b`` and ``a *= n`` included)
for _name in ("__setitem__", "__delitem__", "__iadd__", "__imul__", "append", "extend", "insert", "remove",
              "pop", "clear", "sort", "reverse"):
    setattr(EditedList, _name, _recording(_name))
