"""Deep copies of networks and layers: a child of splicing or mutation owns every config, weight
store and nested layer, so changing it never changes a parent."""

from __future__ import annotations

import dataclasses

from ...layers.base import Layer
from ...network import VolumetricNetwork


def clone_network(net: VolumetricNetwork) -> VolumetricNetwork:
    """A copy of ``net`` with its own layers (observers and run state are not copied)."""
    out = VolumetricNetwork(*net.shape, backend=net.backend, precision=net.precision)
    for coord, layer in net.layers():
        out[coord] = clone_layer(layer)
    return out


def clone_layer(layer: Layer) -> Layer:
    cfg = dataclasses.replace(layer.cfg, mask=_copied(layer.cfg.mask),
                              hierarchy_levels=_copied(layer.cfg.hierarchy_levels))
    weights = None if layer.weights is None else layer.weights.copy()
    out = type(layer)(cfg, weights, [clone_layer(c) for c in layer.children])
    out.children_key = layer.children_key
    gate = getattr(layer, "gate", None)
    if gate is not None:
        out.gate = clone_layer(gate)
    return out


def _copied(values: list | None) -> list | None:
    return None if values is None else list(values)
