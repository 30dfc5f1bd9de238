"""An encoder-only embedding model (the BERT family) as a grid network.

:class:`Encoder` is a :class:`VolumetricNetwork` of one row of cells: the embeddings (word +
token type, + position unless the attention rotates), their LayerNorm, then one ``Sequential`` per block
(``attention, Residual, LayerNorm, MLP, Residual, LayerNorm``: post-norm). ``hidden_states(ids)``
runs the grid over whole sequences; :meth:`Encoder.embed` pools the last hidden states into one
vector per sequence as the model says (:class:`Pooling`).

It computes on the host with numpy; it makes no text (``TextModel`` refuses to generate with it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...backend import Backend, get_backend
from ...errors import LoomConfigError
from ...layers.base import Layer
from ...network import Run
from .model_args import ModelArgs
from .model_network import ModelNetwork, token_rows

MEAN, CLS = "mean", "cls"


@dataclass(frozen=True)
class Pooling:
    """How token states become one embedding: ``mode`` "mean" (over the tokens) or "cls" (the
    first token's state), then scaled to unit L2 length when ``normalize``."""

    mode: str = MEAN
    normalize: bool = False

    def __call__(self, hidden: np.ndarray) -> np.ndarray:
        """``[B, T, d]`` states of whole sequences -> ``[B, d]`` embeddings (float32)."""
        pooled = hidden.mean(axis=1) if self.mode == MEAN else hidden[:, 0, :]
        if self.normalize:  # as torch's F.normalize: x / max(|x|, 1e-12)
            norm = np.sqrt((pooled * pooled).sum(axis=-1, keepdims=True))
            pooled = pooled / np.maximum(norm, np.float32(1e-12))
        return np.asarray(pooled, np.float32)


class Encoder(ModelNetwork):
    """An encoder-only model laid out on a ``1 x 1 x (blocks + 2) x 1`` grid; ``pooling`` says how
    :meth:`embed` pools."""

    def __init__(self, args: ModelArgs, layers: list[Layer], pooling: Pooling):
        super().__init__(args, layers)
        self.pooling = pooling

    @property
    def on_device(self) -> bool:
        return False

    def place(self, backend: str | Backend) -> None:
        """Accept the host's numpy backend; an encoder does not run on a device yet."""
        backend = backend if isinstance(backend, Backend) else get_backend(backend)
        if backend.xp is not np:
            raise LoomConfigError(f"embedding models run on the CPU (numpy) only, not on the "
                                  f"{backend.name!r} backend")
        self.backend = backend

    def hidden_states(self, ids) -> np.ndarray:
        """The last block's output for token ids ``[B, T]`` (or ``[T]``), each row one whole
        sequence: ``[B, T, hidden]``. Observers see every layer."""
        x = token_rows(ids)
        run = Run(self, train=False)
        for layer in self.cells:
            if not layer.cfg.is_disabled:
                x, _ = run.call(layer, x)
        self.step_count += 1
        return x

    def embed(self, ids) -> np.ndarray:
        """One embedding per row of token ids ``[B, T]``, pooled as :attr:`pooling` says: ``[B, hidden]``."""
        return self.pooling(self.hidden_states(ids))
