"""The KV cache of one sequence in one attention layer, and the run context that carries a batch's
caches to the attention layers."""

from __future__ import annotations

import math

import numpy as np

from ...backend import host_dtype
from ...errors import LoomConfigError, LoomShapeError
from ...network import Run, VolumetricNetwork


class KVCache:
    """Keys and values of one sequence in one attention layer, ``[n_kv_heads, capacity, head_dim]``.

    The buffers are allocated for ``capacity`` positions up front and grow in steps of
    :attr:`step` up to ``max_size`` (the model's context); more raises :class:`LoomShapeError`.
    ``dtype`` "float16" halves the memory and the attention kernel's reads; :attr:`keys` and
    :attr:`values` then hold the float16 bits as ``uint16`` (what the numba kernel reads).
    :attr:`keys` is a transposed view of a ``[n_kv_heads, head_dim, capacity]`` buffer: the kernel
    then computes the scores of all positions as one vector loop per dimension.

    ``xp``, a device backend's namespace (a device-bound array_api_strict, CuPy), keeps the buffers
    on its device instead: plain ``[n_kv_heads, capacity, head_dim]`` arrays of float32, or of the
    device's own float16, written by slice assignment and never copied to the host.
    """

    step = 256
    dtypes = ("float32", "float16")

    def __init__(self, n_kv_heads: int, head_dim: int, max_size: int, capacity: int = 0,
                 dtype: str = "float32", xp=np):
        if dtype not in self.dtypes:
            raise LoomConfigError(f"KV cache dtype must be one of {', '.join(self.dtypes)}; got {dtype!r}")
        if xp is not np and not hasattr(xp, dtype):
            raise LoomConfigError(f"KV cache dtype {dtype!r}: the device's array namespace ({xp.__name__}) "
                                  "has no such type; use float32")
        self.dtype = dtype
        self.xp = xp
        self.max_size = max_size
        self.offset = 0
        self.keys, self.values = self._buffers(n_kv_heads, min(max(capacity, 0), max_size), head_dim)

    @property
    def device(self):
        """The device the buffers live on; None for host (numpy) buffers."""
        return None if self.xp is np else self.keys.device

    def _buffers(self, n_kv_heads: int, capacity: int, head_dim: int) -> tuple[np.ndarray, np.ndarray]:
        if self.xp is not np:
            xp, storage = self.xp, getattr(self.xp, self.dtype)
            return (xp.zeros((n_kv_heads, capacity, head_dim), dtype=storage),
                    xp.zeros((n_kv_heads, capacity, head_dim), dtype=storage))
        storage = np.float32 if self.dtype == "float32" else np.uint16
        keys = np.zeros((n_kv_heads, head_dim, capacity), storage).transpose(0, 2, 1)
        return keys, np.zeros((n_kv_heads, capacity, head_dim), storage)

    def _stored(self, a: np.ndarray) -> np.ndarray:
        if self.dtype == "float32":
            return a
        if self.xp is not np:
            return self.xp.astype(a, self.xp.float16)
        return np.asarray(a, np.float16).view(np.uint16)

    def _fetched(self, a: np.ndarray) -> np.ndarray:
        if self.dtype == "float32":
            return a
        if self.xp is not np:  # attention reads float32 (LLMKernels.attend)
            return self.xp.astype(a, self.xp.float32)
        return a.view(np.float16)

    def update_and_fetch(self, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Append ``k``/``v`` ``[n_kv_heads, T, head_dim]``; return every position's keys and values
        so far (float32 or float16 views, valid until the next update)."""
        end = self.reserve(k.shape[1])
        self.keys[:, self.offset:end, :] = self._stored(k)
        self.values[:, self.offset:end, :] = self._stored(v)
        self.offset = end
        return self._fetched(self.keys[:, :end, :]), self._fetched(self.values[:, :end, :])

    def reserve(self, n: int) -> int:
        """Make room for ``n`` more positions (growing the buffers); returns the offset after them.

        Raises:
            LoomShapeError: they would exceed the context length.
        """
        end = self.offset + n
        if end > self.max_size:
            raise LoomShapeError(f"{end} positions exceed the context length {self.max_size}")
        if end > self.keys.shape[1]:
            self._grow(end)
        return end

    @property
    def on_host_float32(self) -> bool:
        """Whether the buffers are host float32 ones, what :meth:`host_buffers` describes."""
        return self.dtype == "float32" and self.xp is np

    def host_buffers(self) -> tuple[int, int, int]:
        """``(address of the keys' [n_kv_heads, head_dim, capacity] buffer, address of the values',
        capacity)`` of a float32 host cache (:attr:`on_host_float32`), what
        :func:`~.attention_kernel.append_and_attend` writes and reads; valid until the buffers grow.
        Kept per buffer (a decode step asks every layer's cache, and ``ctypes.data`` costs ~1 us)."""
        known = self.__dict__.get("_host")
        if known is None or known[0] is not self.values:
            known = self._host = (self.values, (self.keys.base.ctypes.data, self.values.ctypes.data,
                                                self.keys.shape[1]))
        return known[1]

    def _grow(self, needed: int) -> None:
        capacity = min(self.max_size, -(-needed // self.step) * self.step)
        keys, values = self._buffers(self.keys.shape[0], capacity, self.keys.shape[2])
        keys[:, :self.offset, :] = self.keys[:, :self.offset, :]
        values[:, :self.offset, :] = self.values[:, :self.offset, :]
        self.keys, self.values = keys, values

    def fork(self, n: int) -> KVCache:
        """A new cache holding copies of the first ``n`` positions (a prefix cache hands these
        out: the stored sequence stays intact while the copy grows)."""
        n = min(self.offset, max(int(n), 0))
        clone = KVCache(self.keys.shape[0], self.keys.shape[2], self.max_size, n, self.dtype, self.xp)
        clone.keys[:, :n, :] = self.keys[:, :n, :]
        clone.values[:, :n, :] = self.values[:, :n, :]
        clone.offset = n
        return clone

    def trim(self, n: int) -> int:
        """Forget the last ``n`` positions; returns how many were dropped."""
        n = min(self.offset, max(int(n), 0))
        self.offset -= n
        return n

    @property
    def nbytes(self) -> int:
        # the array API has no nbytes: size times the item size of the storage type
        return 2 * math.prod(self.keys.shape) * host_dtype(self.keys.dtype).itemsize


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
