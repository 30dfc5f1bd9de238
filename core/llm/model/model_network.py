"""What every model network shares: a row of cells built from a file, that file kept open.

:class:`~.causal_lm.CausalLM` (a decoder) and :class:`~.encoder.Encoder` (an embedding model)
both lay their layers out on a ``1 x 1 x len(layers) x 1`` grid, hold the
:class:`~loomlab.core.llm.files.weights_source.WeightSource` whose mapping their weights view, and
take token ids as :func:`token_rows`.
"""

from __future__ import annotations

import numpy as np

from ...errors import LoomShapeError
from ...layers.base import Layer
from ...network import VolumetricNetwork
from .model_args import ModelArgs


class ModelNetwork(VolumetricNetwork):
    """``layers`` in order on one row of cells, with the file's settings ``args``."""

    def __init__(self, args: ModelArgs, layers: list[Layer]):
        super().__init__(1, 1, len(layers), 1, precision="fast")
        for i, layer in enumerate(layers):
            self[0, 0, i, 0] = layer
        self.args = args
        self.source = None  # the WeightSource whose mapping the weights view, when loaded from a file

    def close(self) -> None:
        """Close the model file; its mapping goes away once this network's weights are dropped."""
        if self.source is not None:
            self.source.close()


def token_rows(ids) -> np.ndarray:
    """Token ids as ``[B, T]`` with ``T >= 1`` (a ``[T]`` sequence becomes one row)."""
    ids = np.asarray(ids)
    x = ids[None] if ids.ndim == 1 else ids
    if x.ndim != 2 or x.shape[1] == 0:
        raise LoomShapeError(f"token ids must be [B, T] with T >= 1, got shape {ids.shape}")
    return x
