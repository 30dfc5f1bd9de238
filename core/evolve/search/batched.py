"""Many networks through one forward: members of one shape share one batched matmul per layer.

A population evolved from one genome is mostly networks of the same shape: a chain of Dense
layers with the same sizes. A :class:`NetworkStack` stacks such members' weights (``[N, out, in]``
per layer) and runs the whole group with one batched matmul per layer, then each member's own
activation: members whose activations differ share the matmul, and the activation runs once per
run of members with the same activation (members are ordered by activations within a group).
:func:`forward_many` and :func:`forward_stacked` make a stack for a single pass. Members of other
layer sizes form groups of their own, and a member this module cannot batch (any enabled layer
that is not a plain Dense, observers attached) runs its own :meth:`VolumetricNetwork.forward`.
Each member's output equals its own ``forward`` to float32 rounding: the same dtypes, the same
row reading (spec §5.2) and the same activation code (the compiled kernel: the same formulas,
tanh to within one float32 ulp; see :mod:`.batched_kernel`).

On numpy with float32 input read by at most :data:`KERNEL_MAX_ROWS` rows, each run of consecutive
layers of at most :data:`KERNEL_MAX_WEIGHTS` weights runs as one compiled call over all members,
activations included (:mod:`.batched_kernel`); other layers (and other backends or float64 input)
use the array module's stacked ``matmul`` and then each member's activation. Which one runs
depends only on the layer sizes and the input's row count.

A member's result never depends on which other members it was batched with (numpy's stacked
``matmul`` and the compiled loop compute each member's slice on its own), so fitness computed from
a chunk of a population is bit-identical to fitness computed from the whole of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ...activations import activate
from ...backend import array_module, host_dtype, to_host
from ...layers.dense import Dense
from ...network import VolumetricNetwork, compute_dtypes

# (backend name, precision, ((n_in, n_out) per enabled layer))
GroupKey = tuple[str, str, tuple[tuple[int, int], ...]]

# the compiled loop's range (see the module docstring): measured against numpy's stacked matmul
# on 1,000 members, 2 cores: the loop is 1.5-10x faster at 1-2 rows for layers of 2x4 to 64x64,
# even at 8 rows, and BLAS wins from 16 rows and for large matrices (one member's 1024x1024).
KERNEL_MAX_ROWS = 8
KERNEL_MAX_WEIGHTS = 1 << 16
Catch = type[BaseException] | tuple[type[BaseException], ...]


class NetworkStack:
    """Networks prepared for batched forward passes: each group of same-shaped members has its
    weights stacked once, so repeated passes over one population (many inputs, many steps) pay
    only for the batched matmuls.

    The stack is a snapshot: it reads members' structure and weights when it is made; build a
    new one after changing them. Members that cannot be batched run their own ``forward``.
    """

    def __init__(self, nets: Sequence[VolumetricNetwork]):
        self.nets = list(nets)
        self.alone: list[int] = []  # members that run their own forward
        found: dict[GroupKey, tuple[list[int], list[list[Dense]], list[tuple[str, ...]]]] = {}
        for i, net in enumerate(self.nets):
            keyed = _keyed_layers(net)
            if keyed is None:
                self.alone.append(i)
            else:
                members, layers, acts = found.setdefault(keyed[0], ([], [], []))
                members.append(i)
                layers.append(keyed[1])
                acts.append(keyed[2])
        self.groups = [_Group(key, members, layers, acts, self.nets)
                       for key, (members, layers, acts) in found.items()]
        # one group of every member in order: forward returns that stack's rows as they are
        self._whole = len(self.groups) == 1 and self.groups[0].members == list(range(len(self.nets)))
        self._row_groups: tuple | None = None  # forward_rows' grouping, made on first use

    def forward_stacked(self, x, *, catch: Catch = ()) -> list[tuple]:
        """The outputs for input ``x``, group by group: a list of ``(members, result)`` where
        ``members`` are indices into the stack's networks and ``result`` stacks their outputs
        along a new first axis (``[len(members), *output shape]``), or is the ``catch`` exception
        the single member in ``members`` raised. Callers that score a population vectorise over
        ``result``.
        """
        results = [([i], _own_forward(self.nets[i], x, catch)) for i in self.alone]
        for group in self.groups:
            y = group.forward(x)
            if y is None:  # the sizes do not chain for this input: each member raises its own error
                results.extend(([i], _own_forward(self.nets[i], x, catch)) for i in group.members)
                continue
            for net in group.nets:
                net.count_pass()
            results.append((group.members, y))
        return results

    def forward(self, x, *, catch: Catch = ()) -> list:
        """Each network's output for input ``x``, in order, as its own ``forward(x)`` gives it.

        A member whose pass raises one of the ``catch`` exception types gets that exception in
        its slot instead of an output; any other exception propagates.
        """
        stacked = self.forward_stacked(x, catch=catch)
        if self._whole and len(stacked) == 1 and not isinstance(stacked[0][1], BaseException):
            return _unstacked(stacked[0][1])
        out: list = [None] * len(self.nets)
        for members, result in stacked:
            if isinstance(result, BaseException):
                out[members[0]] = result  # a member that raised runs alone
            else:
                for i, y in zip(members, _unstacked(result), strict=True):
                    out[i] = y
        return out

    def forward_rows(self, x, members, *, catch: Catch = ()) -> list[tuple]:
        """Row ``r`` of ``x`` (``[R, width]``, host float32) through network ``members[r]``: each
        member acting on observations of its own (a control task's population, one row per
        member and episode still running). Returns ``(rows, result)`` pairs like
        :meth:`forward_stacked`: ``rows`` index ``x`` and ``result`` is their outputs
        ``[len(rows), out]``, or the ``catch`` exception of a member that raised (its rows).

        A row's result is the same bits whichever rows share the call: same-shaped Dense members
        within the compiled kernel's range run :func:`.batched_kernel.forward_rows`; any other
        member runs its own ``forward`` one row at a time, each from a reset state."""
        from . import batched_kernel

        x = np.ascontiguousarray(x, np.float32)
        members = np.asarray(members, np.int64)
        if self._row_groups is None:
            self._row_groups = self._kernel_groups()
        group_of, slot_of, groups = self._row_groups
        results = []
        where = group_of[members]
        for k, group in enumerate(groups):
            rows = np.flatnonzero(where == k)
            if len(rows) == 0:
                continue
            if x.shape[1] < group.dims[0][0]:  # each member's own forward raises its shape error
                where[rows] = -1
                continue
            _, compute = compute_dtypes(np.float32, group.precision)
            y = batched_kernel.forward_rows(x[rows], group._packed, slot_of[members[rows]],
                                            *group._plans[0], compute)
            results.append((rows, y))
        for i in np.unique(members[where < 0]):
            rows = np.flatnonzero(members == i)
            try:
                results.append((rows, np.concatenate([self._own_row(i, x[r:r + 1])
                                                      for r in rows]).reshape(len(rows), -1)))
            except catch as e:
                results.append((rows, e))
        return results

    def _own_row(self, i: int, row) -> np.ndarray:
        """Member ``i``'s own forward of one row, from a reset state (an attention layer's KV
        cache would otherwise carry one row into the next: another episode, another step)."""
        self.nets[i].reset_state()
        return to_host(self.nets[i].forward(row))

    def _kernel_groups(self) -> tuple[np.ndarray, np.ndarray, list[_Group]]:
        """For :meth:`forward_rows`: each member's group among those the row kernel runs whole
        (numpy, every layer in the kernel's range, sizes chaining; -1: its own forward) and its
        slot in that group's packed weights."""
        group_of = np.full(len(self.nets), -1, np.int64)
        slot_of = np.zeros(len(self.nets), np.int64)
        groups = [g for g in self.groups
                  if g.backend.xp is np and g.dims and g.chains and len(g.segments) == 1 and g.segments[0][2]]
        for k, group in enumerate(groups):
            group_of[group.members] = k
            slot_of[group.members] = np.arange(len(group.members))
        return group_of, slot_of, groups


def forward_many(nets: Sequence[VolumetricNetwork], x, *, catch: Catch = ()) -> list:
    """Each network's output for input ``x`` (see :meth:`NetworkStack.forward`), in one pass."""
    return NetworkStack(nets).forward(x, catch=catch)


def forward_stacked(nets: Sequence[VolumetricNetwork], x, *, catch: Catch = ()) -> list[tuple]:
    """The outputs of ``nets`` for ``x`` group by group (see :meth:`NetworkStack.forward_stacked`)."""
    return NetworkStack(nets).forward_stacked(x, catch=catch)


def group_key(net: VolumetricNetwork) -> GroupKey | None:
    """What members must share to be batched together, or None when ``net`` must run alone."""
    keyed = _keyed_layers(net)
    return None if keyed is None else keyed[0]


def _keyed_layers(net: VolumetricNetwork) -> tuple[GroupKey, list[Dense], tuple[str, ...]] | None:
    """``(group key, enabled layers, their activation names)`` of a network that can be batched,
    else None.

    Disabled layers are skipped by forward, so they are left out of the key; a layer's dtype
    is not in it either, as the stack holds the weights dequantized from each member's dtype.
    Remote-link children appended to a Dense (spec §7.4, ConnectionAdd) are ignored by Dense's
    forward, so they do not stop batching.
    """
    if net.observers:  # observers want one event per layer and member
        return None
    dims, layers, acts = [], [], []
    for layer in net.cells:
        if layer is None:
            return None
        cfg = layer.cfg
        if cfg.is_disabled:
            continue
        if type(layer) is not Dense:
            return None
        dims.append((cfg.input_height, cfg.output_height))
        layers.append(layer)
        acts.append(cfg.activation)
    return (net.backend.name, net.precision, tuple(dims)), layers, tuple(acts)


def _own_forward(net: VolumetricNetwork, x, catch: Catch):
    try:
        return net.forward(x)[None, ...]
    except catch as e:
        return e


class _Group:
    """Same-keyed members: their weights packed ``[N, total]``, each member's layers together
    (layer ``j`` ``[out, in]`` at ``offsets[j]``), members ordered by their activations so that
    each layer's members of one activation are contiguous runs."""

    def __init__(self, key: GroupKey, members: list[int], layers: list[list[Dense]],
                 acts: list[tuple[str, ...]], nets: list[VolumetricNetwork]):
        self.backend = nets[members[0]].backend
        _, self.precision, dims = key
        self.dims = list(dims)
        n = len(members)
        # per layer: (start, stop, activation id) runs over the ordered members; activation names
        # are cheaper to compare than ids, which are looked up once per run
        if acts.count(acts[0]) == n:  # one activation per layer: members stay in order
            self.members = members
            self.runs = [[(0, n, la.cfg.act_id)] for la in layers[0]]
        else:
            order = sorted(range(n), key=acts.__getitem__)  # stable: member order within ties
            self.members = [members[k] for k in order]
            layers = [layers[k] for k in order]
            self.runs = [[(a, b, layers[a][j].cfg.act_id) for a, b, _ in _runs([acts[k][j] for k in order])]
                         for j in range(len(dims))]
        self.nets = [nets[i] for i in self.members]  # counted per pass, without indexing
        # the sizes chain when no layer's output is narrower than the next layer's input
        self.chains = all(out >= n_in for (_, out), (n_in, _) in zip(dims, dims[1:], strict=False))
        sizes = [n_in * n_out for n_in, n_out in dims]
        offsets = np.cumsum([0, *sizes])
        # float32, the weights as each member's forward reads them (float32 values of its dtype);
        # a "loom" matmul on numpy converts them to float64 when first asked (see weights())
        self._packed = np.empty((n, offsets[-1]), np.float32)
        stacks = []
        for j, (n_in, n_out) in enumerate(dims):
            w = self._packed[:, offsets[j]:offsets[j + 1]].reshape(n, n_out, n_in)  # a view
            w[:] = np.concatenate([_weights32(ls[j]) for ls in layers]).reshape(n, n_out, n_in)
            stacks.append(w)
        self._host = {np.dtype(np.float32): stacks}
        self._device: dict[tuple[str, np.dtype], list] = {}
        # runs of consecutive layers the compiled kernel takes (small) or the matmul takes, with
        # the kernel's (in, out, offset) per layer and activation ids per member
        act_ids = np.empty((n, len(dims)), np.int8)
        for j, runs in enumerate(self.runs):
            for a, b, act_id in runs:
                act_ids[a:b, j] = act_id
        self.segments = _runs([k <= KERNEL_MAX_WEIGHTS for k in sizes])
        self._plans = {a: (np.array([(*dims[j], offsets[j]) for j in range(a, b)], np.int64),
                           np.ascontiguousarray(act_ids[:, a:b]))
                       for a, b, small in self.segments if small}

    def weights(self, xp, compute) -> list:
        """The stacks ``[N, out, in]`` in ``compute`` on ``xp`` (converted once, when first asked)."""
        compute = host_dtype(compute)
        if compute not in self._host:  # float64 maths: the float32 stacks converted
            self._host[compute] = [w.astype(compute) for w in self._host[np.dtype(np.float32)]]
        if xp is np:
            return self._host[compute]
        key = (xp.__name__, compute)
        if key not in self._device:
            self._device[key] = [xp.asarray(w) for w in self._host[compute]]
        return self._device[key]

    def forward(self, x):
        """The stacked outputs ``[N, B, out]``, or None if the layer sizes do not chain for ``x``
        (each member's own forward then raises its LoomShapeError)."""
        xp = self.backend.xp
        x = xp.asarray(x)
        act, compute = compute_dtypes(x.dtype, self.precision, xp)
        h = xp.astype(x, act)
        if not self.dims:  # every layer disabled: forward returns the input as it is
            return xp.asarray(xp.broadcast_to(h, (len(self.members), *h.shape)), copy=True)
        h = _first_rows(h, self.dims[0][0])
        if h is None or not self.chains:
            return None
        kernel = xp is np and act is np.float32 and h.shape[0] <= KERNEL_MAX_ROWS
        for start, stop, small in self.segments:
            if small and kernel:
                from . import batched_kernel

                h = batched_kernel.forward(h, self._packed, *self._plans[start], compute)
                continue
            for j in range(start, stop):
                n_in = self.dims[j][0]
                h = _rows(h, n_in) if h.ndim == 3 else h  # the network input is read by every member
                w_t = xp.permute_dims(self.weights(xp, compute)[j], (0, 2, 1))  # [N, in, out]
                pre = xp.astype(h, compute, copy=False) @ w_t
                h = xp.astype(self._activate(xp, j, pre), act, copy=False)
        return h

    def _activate(self, xp, j: int, pre):
        """Each member's activation of layer ``j`` on its slice of ``pre``."""
        runs = self.runs[j]
        if len(runs) == 1:
            return activate(runs[0][2], pre)
        out = xp.empty_like(pre)
        for start, stop, act_id in runs:
            out[start:stop, ...] = activate(act_id, pre[start:stop, ...])
        return out


def _runs(values: list) -> list[tuple[int, int, object]]:
    """``(start, stop, value)`` for each run of equal consecutive ``values``."""
    runs: list[tuple[int, int, int]] = []
    for i, v in enumerate(values):
        if runs and runs[-1][2] == v:
            runs[-1] = (runs[-1][0], i + 1, v)
        else:
            runs.append((i, i + 1, v))
    return runs


def _weights32(layer: Dense) -> np.ndarray:
    """A Dense layer's weights as its forward uses them, in float32 (a float32 layer's master)."""
    if layer.cfg.dtype == "float32":
        return layer.weights.master
    return layer.weights.values(np, np.float32, layer.cfg.dtype)


def _first_rows(x, n_in: int):
    """Dense's reading of the network input (``batch_rows``): ``B = shape[0]`` rows of ``n_in``."""
    xp = array_module(x)
    batch = x.shape[0] if x.ndim else 1
    if batch <= 0 or math.prod(x.shape) < batch * n_in:
        return None
    return xp.reshape(xp.reshape(x, (-1,))[: batch * n_in], (batch, n_in))


def _rows(h, n_in: int):
    """``batch_rows`` applied to each member of a stack ``[N, B, width]`` (``width >= n_in``)."""
    n, batch, width = h.shape
    if width == n_in:
        return h
    xp = array_module(h)
    return xp.reshape(xp.reshape(h, (n, -1))[:, : batch * n_in], (n, batch, n_in))


def _unstacked(stack) -> list:
    """The members' outputs of a stack ``[N, ...]``, one view each."""
    if isinstance(stack, np.ndarray):
        return list(stack)  # iterating makes the views in C: indexing per member cost 0.13 ms a 1,000
    return [stack[i, ...] for i in range(stack.shape[0])]  # the array API defines no iteration


def as_numpy(a) -> np.ndarray:
    """A result of :func:`forward_stacked` in host memory (a device's arrays are copied back)."""
    return to_host(a)
