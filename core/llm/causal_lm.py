"""A decoder-only language model as a grid network.

:class:`CausalLM` is a :class:`VolumetricNetwork` of one row of cells: the embedding, one
``Sequential`` per transformer block (``[norm, attention], Residual, [norm, MLP], Residual``),
the final norm and the LM head. ``net.forward(ids)`` runs the whole grid on ``[B, T]`` ids;
``net.step(ids, caches)`` is the decode path through the same layers with a KV cache per sequence.
"""

from __future__ import annotations

import numpy as np

from ..errors import LoomShapeError
from ..layers.base import Layer
from ..network import VolumetricNetwork
from .kv_cache import CachedRun, KVCache
from .llm_layers import LLMAttention
from .model_args import ModelArgs
from .quant import single_threaded_blas


class CausalLM(VolumetricNetwork):
    """A decoder-only language model laid out on a ``1 x 1 x (layers + 3) x 1`` grid."""

    def __init__(self, args: ModelArgs, layers: list[Layer]):
        super().__init__(1, 1, len(layers), 1, precision="fast")
        for i, layer in enumerate(layers):
            self[0, 0, i, 0] = layer
        self.args = args
        self.attention_layers = [la for la in self.all_layers() if isinstance(la, LLMAttention)]
        self.source = None  # the WeightSource whose mapping the weights view, when loaded from a file

    def close(self) -> None:
        """Close the model file; its mapping goes away once this network's weights are dropped."""
        if self.source is not None:
            self.source.close()

    def make_cache(self, capacity: int = 0, dtype: str = "float32") -> list[KVCache]:
        """One sequence's KV caches (one per attention layer), preallocated for ``capacity`` positions;
        ``dtype`` "float16" halves their memory (see :class:`KVCache`)."""
        return [KVCache(a.spec.n_kv_heads, a.spec.head_dim, self.args.context_length, capacity, dtype)
                for a in self.attention_layers]

    def step(self, ids, caches: list[list[KVCache]] | None = None, *, last_only: bool = True) -> np.ndarray:
        """Logits for token ids ``[B, T]`` (or ``[T]``), continuing each row's sequence in ``caches``.

        Returns ``[B, vocab]`` for the last position when ``last_only`` (the head then runs on one
        row per sequence), else ``[B, T, vocab]``. Observers see every layer, as in ``forward``.
        """
        x = _token_rows(ids)
        if caches is not None and any(len(c) != len(self.attention_layers) for c in caches):
            raise LoomShapeError(f"each sequence needs {len(self.attention_layers)} KV caches (make_cache())")
        run = CachedRun(self, caches)
        head = self.cells[-1]
        with single_threaded_blas():
            x = _call_cells(run, self.cells[:-1], x)
            if not head.cfg.is_disabled:
                x, _ = run.call(head, x[:, -1] if last_only else x)
        self.step_count += 1
        return x

    def hidden_states(self, ids) -> np.ndarray:
        """Every layer but the LM head over token ids ``[B, T]`` as fresh sequences: ``[B, T, hidden]``
        after the final norm. Observers see those layers; the step count does not move."""
        with single_threaded_blas():
            return _call_cells(CachedRun(self, None), self.cells[:-1], _token_rows(ids))


def _token_rows(ids) -> np.ndarray:
    """Token ids as ``[B, T]`` with ``T >= 1`` (a ``[T]`` sequence becomes one row)."""
    ids = np.asarray(ids)
    x = ids[None] if ids.ndim == 1 else ids
    if x.ndim != 2 or x.shape[1] == 0:
        raise LoomShapeError(f"token ids must be [B, T] with T >= 1, got shape {ids.shape}")
    return x


def _call_cells(run: CachedRun, cells: list[Layer], x):
    for layer in cells:
        if not layer.cfg.is_disabled:
            x, _ = run.call(layer, x)
    return x
