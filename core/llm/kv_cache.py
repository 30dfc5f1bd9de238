"""The KV cache of one sequence in one attention layer, and the run context that carries a batch's
caches to the attention layers."""

from __future__ import annotations

import numpy as np

from ..errors import LoomShapeError
from ..network import Run, VolumetricNetwork


class KVCache:
    """Keys and values of one sequence in one attention layer, ``[n_kv_heads, capacity, head_dim]``.

    The buffers are allocated for ``capacity`` positions up front and grow in steps of
    :attr:`step` up to ``max_size`` (the model's context); more raises :class:`LoomShapeError`.
    """

    step = 256

    def __init__(self, n_kv_heads: int, head_dim: int, max_size: int, capacity: int = 0):
        capacity = min(max(capacity, 0), max_size)
        self.keys = np.zeros((n_kv_heads, capacity, head_dim), dtype=np.float32)
        self.values = np.zeros_like(self.keys)
        self.max_size = max_size
        self.offset = 0

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append ``k``/``v`` ``[n_kv_heads, T, head_dim]``; return every position's keys and values
        so far (views, valid until the next update)."""
        end = self.offset + k.shape[1]
        if end > self.max_size:
            raise LoomShapeError(f"{end} positions exceed the context length {self.max_size}")
        if end > self.keys.shape[1]:
            self._grow(end)
        self.keys[:, self.offset:end] = k
        self.values[:, self.offset:end] = v
        self.offset = end
        return self.keys[:, :end], self.values[:, :end]

    def _grow(self, needed: int) -> None:
        capacity = min(self.max_size, -(-needed // self.step) * self.step)
        keys = np.zeros((self.keys.shape[0], capacity, self.keys.shape[2]), dtype=np.float32)
        values = np.zeros_like(keys)
        keys[:, :self.offset] = self.keys[:, :self.offset]
        values[:, :self.offset] = self.values[:, :self.offset]
        self.keys, self.values = keys, values

    def fork(self, n: int) -> KVCache:
        """A new cache holding copies of the first ``n`` positions (a prefix cache hands these
        out: the stored sequence stays intact while the copy grows)."""
        n = min(self.offset, max(int(n), 0))
        clone = KVCache(self.keys.shape[0], self.keys.shape[2], self.max_size, n)
        clone.keys[:, :n] = self.keys[:, :n]
        clone.values[:, :n] = self.values[:, :n]
        clone.offset = n
        return clone

    def trim(self, n: int) -> int:
        """Forget the last ``n`` positions; returns how many were dropped."""
        n = min(self.offset, max(int(n), 0))
        self.offset -= n
        return n

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


class CachedRun(Run):
    """A forward pass that continues sequences, as the LLM attention layers see it.

    ``caches[b]`` is batch row ``b``'s list of caches, one per attention layer (what
    ``CausalLM.make_cache()`` returns); None runs every row as a fresh sequence from position 0.
    The caches ride on the run context because containers pass only ``(x, ctx)`` to their
    children: the core layer interface stays the one Loom networks use, and core layers never
    look at this field.
    """

    def __init__(self, net: VolumetricNetwork, caches: list[list[KVCache]] | None):
        super().__init__(net, train=False)
        self.caches = caches

    def layer_caches(self, index: int, batch: int) -> list[KVCache] | None:
        """Attention layer ``index``'s cache of each of the ``batch`` rows; None without caches."""
        if self.caches is None:
            return None
        if len(self.caches) != batch:
            raise LoomShapeError(f"{len(self.caches)} caches for a batch of {batch} sequences")
        return [c[index] for c in self.caches]
