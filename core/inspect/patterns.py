"""Which positions each attention head looks at: the weights after the softmax, per layer and head.

:func:`attention_patterns` runs the prompt once and keeps each layer's queries and keys (after
the Q/K norms and RoPE); a layer's ``[heads, T, T]`` weights are formed from them when asked, so
a 512-token prompt on a 30-layer model holds 47 MB of queries and keys, not the 280 MB all
patterns would take at once.
"""

from __future__ import annotations

import numpy as np

from ..backend import to_host
from ..cancel import Cancel
from ..errors import InspectError
from .attention_weights import attention_weights
from .trace import Progress, Tracer, one_sequence


class AttentionPatterns:
    """Every head's attention weights over one sequence ``tokens`` (query rows, key columns)."""

    def __init__(self, tracer: Tracer, tokens: list[int], queries: list, keys: list):
        self.tracer = tracer
        self.tokens = tokens
        self._queries, self._keys = queries, keys

    @property
    def n_layers(self) -> int:
        return self.tracer.n_layers

    @property
    def n_heads(self) -> int:
        return self.tracer.n_heads

    def layer(self, layer: int) -> np.ndarray:
        """Layer ``layer``'s weights ``[heads, T, T]`` (row: the query's position, column: the key's);
        each row sums to 1 over the positions the query sees."""
        self.tracer.check_layer(layer)
        block = self.tracer.blocks[layer]
        return to_host(attention_weights(block.attention, self._queries[layer], self._keys[layer]))[0]

    def head(self, layer: int, head: int) -> np.ndarray:
        """One head's weights ``[T, T]``."""
        self.tracer.check_layer(layer, head)
        return self.layer(layer)[head]

    def attending_to(self, key: int, query: int | None = None) -> np.ndarray:
        """``[layers, heads]``: the weight each head puts on position ``key``, from position
        ``query``'s row, or averaged over the queries that can see it (``key`` onwards) when None."""
        T = len(self.tokens)
        if not 0 <= key < T or (query is not None and not key <= query < T):
            raise InspectError(f"position {key} (query {query}) is outside the sequence's 0..{T - 1} "
                               "or after its query")
        rows = slice(key, T) if query is None else slice(query, query + 1)
        return np.stack([self.layer(i)[:, rows, key].mean(axis=1) for i in range(self.n_layers)])

    def thumbnails(self, size: int = 32) -> np.ndarray:
        """``[layers, heads, n, n]`` with ``n = min(T, size)``: each pattern's cells max-pooled into
        an ``n x n`` grid (the layer x head overview; a thin diagonal stays visible)."""
        T = len(self.tokens)
        n = min(T, size)
        edges = np.linspace(0, T, n + 1).astype(int)
        out = np.empty((self.n_layers, self.n_heads, n, n), np.float32)
        for i in range(self.n_layers):
            weights = self.layer(i)
            rows = np.maximum.reduceat(weights, edges[:-1], axis=1)
            out[i] = np.maximum.reduceat(rows, edges[:-1], axis=2)
        return out


def attention_patterns(net, ids, *, progress: Progress | None = None,
                       cancel: Cancel = None) -> AttentionPatterns:
    """The attention weights of every layer and head of ``net`` over token ids ``ids`` (one
    sequence); ``progress(blocks done, blocks)``."""
    tracer = Tracer(net)
    x = one_sequence(tracer, ids)
    trace = tracer.run(x, keep=("q", "k"), cancel=cancel, progress=progress)
    layers = range(tracer.n_layers)
    return AttentionPatterns(tracer, [int(t) for t in x[0]], [trace["q", i] for i in layers],
                             [trace["k", i] for i in layers])
