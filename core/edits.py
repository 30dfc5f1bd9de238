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

    def __setitem__(self, index, value):
        bump()
        super().__setitem__(index, value)

    def __delitem__(self, index):
        bump()
        super().__delitem__(index)

    def __iadd__(self, other):
        bump()
        return super().__iadd__(other)

    def __imul__(self, n):
        bump()
        return super().__imul__(n)

    def append(self, value):
        bump()
        super().append(value)

    def extend(self, values):
        bump()
        super().extend(values)

    def insert(self, index, value):
        bump()
        super().insert(index, value)

    def remove(self, value):
        bump()
        super().remove(value)

    def pop(self, index=-1):
        bump()
        return super().pop(index)

    def clear(self):
        bump()
        super().clear()

    def sort(self, *args, **kwargs):
        bump()
        super().sort(*args, **kwargs)

    def reverse(self):
        bump()
        super().reverse()
