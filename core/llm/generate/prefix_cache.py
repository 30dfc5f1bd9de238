"""A bounded store of finished sequences' KV caches, so a new prompt that starts like an earlier
one (the next turn of a chat, a shared system prompt) prefills only what is new."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from ...errors import LoomConfigError
from ..model.kv_cache import KVCache

DEFAULT_BYTES = 256 << 20  # a model's own cache: ~5,000 SmolLM2 positions (46 KB each in float32)


class PrefixCache:
    """KV caches of finished sequences, keyed by their tokens, bounded in bytes, least recently
    used evicted first. :meth:`lookup` serves any common prefix of a stored sequence: keys and
    values at positions below ``n`` depend only on the first ``n`` tokens."""

    def __init__(self, max_bytes: int):
        if max_bytes < 0:
            raise LoomConfigError(f"the prefix cache size must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[int, ...], list[KVCache]] = OrderedDict()
        self.nbytes = 0
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def lookup(self, ids: Sequence[int]) -> tuple[list[KVCache], int] | None:
        """Copies of the caches holding the longest stored prefix of ``ids`` (at most all but the
        last token, whose logits the prefill must compute), and its length; None without one."""
        limit = len(ids) - 1
        best, best_n = None, 0
        for key in self._entries:
            n = min(common_prefix(key, ids), limit)
            if n > best_n:
                best, best_n = key, n
        if best is None:
            return None
        self._entries.move_to_end(best)
        self.hits += 1
        self.hit_tokens += best_n
        return [c.fork(best_n) for c in self._entries[best]], best_n

    def store(self, ids: Sequence[int], caches: list[KVCache]) -> None:
        """Keep ``caches`` (taken over, not copied) as the KV of tokens ``ids``; an entry that is a
        prefix of ``ids`` is dropped (the new one serves everything it did)."""
        key = tuple(ids)
        size = sum(c.nbytes for c in caches)
        if not key or size > self.max_bytes:
            return
        for old in [k for k in self._entries if len(k) <= len(key) and key[:len(k)] == k]:
            self._drop(old)
        self._entries[key] = caches
        self.nbytes += size
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._entries)))

    def clear(self) -> None:
        """Drop every entry (the size and the hit counts stay)."""
        self._entries.clear()
        self.nbytes = 0

    def _drop(self, key) -> None:
        self.nbytes -= sum(c.nbytes for c in self._entries.pop(key))


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    m = min(len(a), len(b))
    differ = np.flatnonzero(np.asarray(a[:m]) != np.asarray(b[:m]))
    return int(differ[0]) if differ.size else m
