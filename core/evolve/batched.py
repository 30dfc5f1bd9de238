"""Many networks through one forward: members of one shape share one batched matmul per layer.

A population evolved from one genome is mostly networks of the same shape: a chain of Dense
layers with the same sizes and activations. :func:`forward_stacked` stacks such members' weights
(``[N, out, in]`` per layer) and runs the whole group with one ``matmul`` and one activation per
layer; members of other shapes form groups of their own, and a member this module cannot batch
(any enabled layer that is not a plain Dense, observers attached) runs its own
:meth:`VolumetricNetwork.forward`. Each member's output equals its own ``forward`` to float32
rounding: the same dtypes, the same row reading (spec §5.2) and the same activation code.

A member's result never depends on which other members it was batched with (numpy's stacked
``matmul`` multiplies each ``[out, in]`` slice on its own), so fitness computed from a chunk of
a population is bit-identical to fitness computed from the whole of it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..activations import activate
from ..layers.dense import Dense
from ..network import VolumetricNetwork, compute_dtypes

# (backend name, precision, ((n_in, n_out, activation id) per enabled layer))
GroupKey = tuple[str, str, tuple[tuple[int, int, int], ...]]


def forward_many(nets: Sequence[VolumetricNetwork], x, *,
                 catch: type[BaseException] | tuple[type[BaseException], ...] = ()) -> list:
    """Each network's output for input ``x``, in order, as its own ``forward(x)`` would give it.

    A member whose pass raises one of the ``catch`` exception types gets that exception in its
    slot instead of an output; any other exception propagates.
    """
    out: list = [None] * len(nets)
    for members, result in forward_stacked(nets, x, catch=catch):
        for k, i in enumerate(members):
            out[i] = result if isinstance(result, BaseException) else result[k]
    return out


def forward_stacked(nets: Sequence[VolumetricNetwork], x, *,
                    catch: type[BaseException] | tuple[type[BaseException], ...] = ()) -> list[tuple]:
    """The outputs of ``nets`` for input ``x``, group by group: a list of ``(members, result)``
    where ``members`` are indices into ``nets`` and ``result`` stacks their outputs along a new
    first axis (``[len(members), *output shape]``), or is the ``catch`` exception the single
    member in ``members`` raised. Callers that score a population vectorise over ``result``.
    """
    groups: dict[GroupKey, list[int]] = {}
    results: list[tuple] = []
    for i, net in enumerate(nets):
        key = group_key(net)
        if key is None:
            results.append(([i], _own_forward(net, x, catch)))
        else:
            groups.setdefault(key, []).append(i)
    for key, members in groups.items():
        stacked = _group_forward([nets[i] for i in members], x, key)
        if stacked is None:  # the sizes do not chain for this input: each member raises its own error
            results.extend(([i], _own_forward(nets[i], x, catch)) for i in members)
        else:
            results.append((members, stacked))
    return results


def group_key(net: VolumetricNetwork) -> GroupKey | None:
    """What members must share to be batched together, or None when ``net`` must run alone.

    Disabled layers are skipped by forward, so they are left out of the key; a layer's dtype
    is not in it either, as the stack holds the weights dequantized from each member's dtype.
    Remote-link children appended to a Dense (spec §7.4, ConnectionAdd) are ignored by Dense's
    forward, so they do not stop batching.
    """
    if net.observers:  # observers want one event per layer and member
        return None
    dims = []
    for layer in net.cells:
        if layer is None:
            return None
        cfg = layer.cfg
        if cfg.is_disabled:
            continue
        if type(layer) is not Dense:
            return None
        dims.append((cfg.input_height, cfg.output_height, cfg.act_id))
    return (net.backend.name, net.precision, tuple(dims))


def _own_forward(net: VolumetricNetwork, x, catch):
    try:
        return net.forward(x)[None]
    except catch as e:
        return e


def _group_forward(nets: list[VolumetricNetwork], x, key: GroupKey):
    """The stacked outputs ``[N, B, out]`` of same-keyed ``nets``, or None if the layer sizes do not
    chain for ``x`` (each member's own forward then raises its LoomShapeError)."""
    _, precision, dims = key
    backend = nets[0].backend
    xp = backend.xp
    x = xp.asarray(x)
    act, compute = compute_dtypes(x.dtype, precision)
    h = x.astype(act)
    if not dims:  # every layer disabled: forward returns the input as it is
        out = xp.broadcast_to(h, (len(nets), *h.shape)).copy()
    else:
        h = _first_rows(h, dims[0][0])
        if h is None:
            return None
        layers = [[la for la in net.cells if not la.cfg.is_disabled] for net in nets]
        for j, (n_in, n_out, act_id) in enumerate(dims):
            h = _rows(h, n_in) if j else h
            if h is None:
                return None
            w = xp.stack([ls[j].params(xp, compute) for ls in layers]).reshape(-1, n_out, n_in)
            h = activate(act_id, h.astype(compute, copy=False) @ w.transpose(0, 2, 1)).astype(act, copy=False)
        out = h
    for net in nets:
        net.count_pass()
    return out


def _first_rows(x, n_in: int):
    """Dense's reading of the network input (``batch_rows``): ``B = shape[0]`` rows of ``n_in``."""
    batch = x.shape[0] if x.ndim else 1
    if batch <= 0 or x.size < batch * n_in:
        return None
    return x.reshape(-1)[: batch * n_in].reshape(batch, n_in)


def _rows(h, n_in: int):
    """``batch_rows`` applied to each member of a stack ``[N, B, width]``."""
    n, batch, width = h.shape
    if width == n_in:
        return h
    if width < n_in:
        return None
    return h.reshape(n, -1)[:, : batch * n_in].reshape(n, batch, n_in)


def as_numpy(a) -> np.ndarray:
    """A result of :func:`forward_stacked` in host memory (CuPy arrays are copied back)."""
    return a.get() if hasattr(a, "get") else np.asarray(a)
