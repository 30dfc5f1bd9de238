"""Loom's systolic step mesh (spec §9.2): a clock-stepped run of a network's grid cells.

Every grid cell owns one output slot (flat-index order). On each tick all cells compute at once
from the slots the previous tick left (double buffering), so a signal advances one cell per tick.
A cell reads the slot before it; a top-level remote-link cell reads its target's slot instead,
which allows feedback loops (recurrence). A cell whose input slot is empty, or holds a tensor
that does not fit its layer, is skipped and keeps its slot. With history recorded,
:meth:`StepMesh.backward` is back-propagation through time over every tick since the last
:meth:`StepMesh.reset`.

>>> mesh = StepMesh(net, record_history=True)
>>> mesh.set_input(x)
>>> y = mesh.run(3)                 # the last slot after 3 ticks
>>> gx, = mesh.backward(dl_dy)     # dL/dx; weight gradients are added to each layer's grad
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from .errors import LoomConfigError, LoomShapeError
from .layers.base import Layer
from .network import Run, VolumetricNetwork, compute_dtypes


@dataclass
class _TickRecord:
    """What one recorded tick did, for backward.

    ``steps[idx] = (source slot, token)``: the slot cell ``idx`` read and the :class:`Run` token
    of its layer call, or None when the cell passed a value through (disabled cell, or a skipped
    cell keeping its own slot, whose source is then ``idx`` itself).
    """

    steps: list[tuple[int, object]]
    injection: int | None  # which set_input this tick read in slot 0, if one came before it
    shapes: list[tuple[int, ...] | None]  # slot shapes after the tick (None = still empty)


class StepMesh:
    """Clock-stepped execution of ``net``'s grid cells with Loom's step semantics.

    The grid's layer objects are used live (weight updates are seen); the mesh's own state is
    the slots, the tick count and, with ``record_history``, what backward needs. Activations
    follow :meth:`VolumetricNetwork.forward`: slots hold the input's float dtype (float64 input
    stays float64) and layers compute in float64 under the network's "loom" precision.
    """

    def __init__(self, net: VolumetricNetwork, record_history: bool = False):
        self.net = net
        self.record_history = record_history
        self._sources()  # reject an empty cell or an off-grid remote target now, not mid-run
        self.reset()

    # ----- state -------------------------------------------------------------------
    def reset(self) -> None:
        """Empty every slot and forget the history and the tick count."""
        self._slots: list = [None] * len(self.net.cells)
        self._history: list[_TickRecord] = []
        self._input_shapes: list[tuple[int, ...]] = []
        self._pending: int | None = None
        self._act = self.net.backend.xp.float32
        self.ticks = 0

    @property
    def slots(self) -> list:
        """The output slot of every cell in flat order (None where nothing arrived yet)."""
        return list(self._slots)

    def output(self, idx: int = -1):
        """The slot of cell ``idx`` (negative counts from the end); None while it is empty."""
        return self._slots[self._slot_index(idx)]

    def set_input(self, x) -> None:
        """Write ``x`` into slot 0; cells 0 and 1 read it on the next tick (spec §9.2)."""
        xp = self.net.backend.xp
        x = xp.asarray(x)
        self._act, _ = compute_dtypes(x.dtype, self.net.precision, xp)
        self._slots[0] = xp.astype(x, self._act)
        if self.record_history:
            self._pending = len(self._input_shapes)
            self._input_shapes.append(tuple(x.shape))

    # ----- forward -----------------------------------------------------------------
    def tick(self) -> None:
        """Advance one clock step: every cell computes from the previous tick's slots."""
        run = Run(self.net, self.record_history)
        compute = self._compute_dtype()
        nxt = list(self._slots)  # a skipped cell keeps its slot's value
        steps: list[tuple[int, object]] = []
        for idx, (layer, src) in enumerate(zip(self.net.cells, self._sources(), strict=True)):
            value, step = self._cell_step(run, idx, layer, src, compute)
            steps.append(step)
            if value is not None:
                nxt[idx] = value
        self._slots = nxt
        if self.record_history:
            shapes = [None if s is None else tuple(s.shape) for s in nxt]
            self._history.append(_TickRecord(steps, self._pending, shapes))
        self._pending = None
        self.ticks += 1

    def _cell_step(self, run: Run, idx: int, layer: Layer, src: int, compute):
        """A cell's new slot value (None: it keeps its slot) and its ``(source, token)`` step."""
        x = self._slots[src]
        if x is None:
            return None, (idx, None)
        if layer.cfg.is_disabled:
            return x, (src, None)
        try:
            y, token = run.call(layer, run.xp.astype(x, compute, copy=False))
        except LoomShapeError:
            # Loom feeds cell 1 the raw input on tick 1 and cell 0 its own output later; these
            # fit only where widths agree, so a misfit counts as an input that has not arrived
            return None, (idx, None)
        return run.xp.astype(y, self._act, copy=False), (src, token)

    def run(self, n_ticks: int):
        """Run ``n_ticks`` ticks; returns the last slot (None if nothing reached it)."""
        if not isinstance(n_ticks, int) or isinstance(n_ticks, bool) or n_ticks < 0:
            raise LoomConfigError(f"n_ticks must be a non-negative integer, got {n_ticks!r}")
        for _ in range(n_ticks):
            self.tick()
        return self.output()

    # ----- backward (BPTT) ---------------------------------------------------------
    def backward(self, grad, idx: int = -1) -> list:
        """Back-propagate through every recorded tick; returns dL/dx for each :meth:`set_input`.

        ``grad`` is dL/d(slot ``idx``) after the last tick, or a list/tuple with one entry per
        recorded tick (dL/d(slot ``idx``) after that tick, None where the loss does not look).
        Each cell's input gradient goes to the slot it read on the previous tick; weight
        gradients summed over ticks are added to each layer's ``grad`` (zero them first with
        ``net.zero_grad()``). An input overwritten before any tick read it gets zeros.
        """
        if not self.record_history:
            raise LoomConfigError("backward() needs StepMesh(..., record_history=True)")
        if not self._history:
            raise LoomConfigError("backward() needs at least one recorded tick")
        xp = self.net.backend.xp
        out = self._slot_index(idx)
        loss_grads = self._per_tick(grad)
        run = Run(self.net, train=True)
        g_slots: list = [None] * len(self._slots)
        g_inputs: list = [None] * len(self._input_shapes)
        for t in range(len(self._history) - 1, -1, -1):
            record = self._history[t]
            if loss_grads[t] is not None:
                g_slots[out] = _add(g_slots[out], self._slot_grad(loss_grads[t], record, out, t))
            g_slots = self._back_one_tick(run, record, g_slots)
            if record.injection is not None:
                # slot 0 held the injected tensor, not cell 0's previous output, during this tick
                g_inputs[record.injection] = _add(g_inputs[record.injection], g_slots[0])
                g_slots[0] = None
        return [xp.zeros(shape, dtype=self._act) if g is None else xp.astype(g, self._act, copy=False)
                for g, shape in zip(g_inputs, self._input_shapes, strict=True)]

    @staticmethod
    def _back_one_tick(run: Run, record: _TickRecord, g_after: list) -> list:
        """Gradients w.r.t. the slots before a tick from those w.r.t. the slots after it."""
        g_before: list = [None] * len(g_after)
        for idx, (src, token) in enumerate(record.steps):
            g = g_after[idx]
            if g is None:
                continue
            if token is not None:
                g = run.back(token, g)
            g_before[src] = _add(g_before[src], g)
        return g_before

    def _per_tick(self, grad) -> list:
        n = len(self._history)
        if isinstance(grad, (list, tuple)):
            if len(grad) != n:
                raise LoomConfigError(f"got {len(grad)} per-tick gradients for {n} recorded ticks")
            return list(grad)
        return [None] * (n - 1) + [grad]

    def _slot_grad(self, g, record: _TickRecord, out: int, t: int):
        shape = record.shapes[out]
        if shape is None:
            raise LoomConfigError(f"slot {out} was still empty after tick {t + 1}; it has no gradient")
        xp = self.net.backend.xp
        g = xp.asarray(g, dtype=self._compute_dtype())  # a float64 host gradient may not fit the device
        if math.prod(g.shape) != math.prod(shape):
            raise LoomShapeError(f"gradient of shape {tuple(g.shape)} does not fit slot {out} "
                                 f"of shape {shape} after tick {t + 1}")
        return xp.reshape(g, shape)

    # ----- helpers -----------------------------------------------------------------
    def _compute_dtype(self):
        return compute_dtypes(self._act, self.net.precision, self.net.backend.xp)[1]

    def _slot_index(self, idx: int) -> int:
        n = len(self._slots)
        if not isinstance(idx, int) or not -n <= idx < n:
            raise LoomConfigError(f"slot index {idx!r} is outside 0..{n - 1}")
        return idx % n

    def _sources(self) -> list[int]:
        """The slot each cell reads: its remote target, else the previous cell's (cell 0: its own)."""
        return [self._source(idx, layer) for idx, layer in enumerate(self.net.cells)]

    def _source(self, idx: int, layer: Layer | None) -> int:
        if layer is None:
            raise LoomConfigError(f"grid cell {self.net.coord(idx)} holds no layer")
        cfg = layer.cfg
        # a disabled cell passes the previous slot through even when it is a remote link
        if cfg.is_remote_link and not cfg.is_disabled:
            try:
                return self.net.index(cfg.target)
            except IndexError:
                raise LoomConfigError(f"remote link of cell {self.net.coord(idx)} targets "
                                      f"{cfg.target}, outside the grid {self.net.shape}") from None
        return max(idx - 1, 0)


def _add(acc, g):
    return g if acc is None else acc + g
