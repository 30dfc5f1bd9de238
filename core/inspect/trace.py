"""A causal language model's forward pass with its inside exposed, at the sites interpretability
tools name (TransformerLens's hook points):

===============  ======================  ===================================================
site             shape                   what
===============  ======================  ===================================================
``resid_pre``    ``[B, T, d]``           the residual stream entering block ``l`` (``l = L``:
                                         the final residual, before the final norm)
``z``            ``[B, T, heads, hd]``   each head's mix of values, before the output projection
``attn_out``     ``[B, T, d]``           what the attention half adds to the residual (after
                                         any post-norm and multiplier)
``mlp_out``      ``[B, T, d]``           what the MLP (or mixture of experts) half adds
``attn_raw``     ``[B, T, d]``           the attention layer's output, before any post-norm
``q`` / ``k``    ``[B, T, heads, hd]``   queries and keys after the Q/K norms and RoPE
``attn_in``      ``[B, T, d]``           the attention layer's input (after the pre-norm)
``mlp_in``       ``[B, T, d]``           the MLP (or experts') layer's input (after the pre-norm)
===============  ======================  ===================================================

A :class:`Tracer` runs the model's own layers (norms, MLPs, experts; the attention layer's own
projections, norms and RoPE) in the block order every decoder here is built in
(:func:`~loomlab.core.llm.model.layer_builders.decoder_block`), with the attention weights formed
explicitly (:mod:`.attention_weights`). An ``edit(site, layer, value)`` may replace a value on
the way (ablation, patching); ``keep`` names the sites whose values the :class:`Trace` keeps.
Each row of a batch is a fresh sequence from position 0, on the exact (float32 activations) path
unless the calling thread asked for another; a model placed on a device computes there.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..backend import array_module, to_host
from ..cancel import Cancel, as_cancel_check
from ..errors import InspectError, LoomCancelled
from ..layers.base import Layer
from ..layers.containers import Residual, Sequential
from ..llm.model.causal_lm import CausalLM
from ..llm.model.kv_cache import CachedRun
from ..llm.model.llm_layers import LLMAttention, LLMEmbedding, LLMHead, LLMRMSNorm, dense
from ..llm.model.model_network import token_rows
from .attention_weights import attention_weights, mix_values

SITES = ("resid_pre", "z", "attn_out", "mlp_out", "attn_raw", "q", "k", "attn_in", "mlp_in")

Edit = Callable[[str, int, object], object]  # (site, layer, value) -> the value to go on with
Progress = Callable[[int, int], None]  # (done, in all)


@dataclass(frozen=True, eq=False)
class Block:
    """One decoder block as the tracer walks it: the attention half's layers (pre-norms, the
    attention, post-norms), the MLP half's, and the block's own container (Loom's switch)."""

    container: Layer
    attention_half: tuple[Layer, ...]
    attention: LLMAttention
    mlp_half: tuple[Layer, ...]

    @property
    def mlp(self) -> Layer:
        """The MLP half's own layer (a gated MLP, or the mixture of experts): its first that is not
        a norm."""
        return next(layer for layer in self.mlp_half if not isinstance(layer, LLMRMSNorm))

    @property
    def post_norms(self) -> tuple[Layer, ...]:
        """The layers between the attention and the residual add (gemma's, olmo2's post-norms)."""
        return self.attention_half[self.attention_half.index(self.attention) + 1:]


@dataclass
class Trace:
    """One traced forward: the kept sites' values by ``(site, layer)`` and the final residual."""

    values: dict[tuple[str, int], object] = field(default_factory=dict)
    final: object = None

    def __getitem__(self, key: tuple[str, int]):
        if key not in self.values:
            raise KeyError(f"{key} was not kept (keep= names the sites a trace keeps)")
        return self.values[key]


class Tracer:
    """Walks ``net``'s blocks site by site. Raises :class:`InspectError` for a network that is not
    a decoder-only language model laid out as the runtime builds them."""

    def __init__(self, net):
        if not isinstance(net, CausalLM):
            kind = "an embedding model (an encoder)" if hasattr(net, "args") else type(net).__name__
            raise InspectError(f"inspection follows a causal language model's next-token predictions; "
                               f"this network is {kind}")
        self.net = net
        cells = net.cells
        if not (isinstance(cells[0], LLMEmbedding) and isinstance(cells[-2], LLMRMSNorm)
                and isinstance(cells[-1], LLMHead)):
            raise InspectError("the network is not laid out as embedding, blocks, final norm, head")
        self.embedding, self.final_norm, self.head = cells[0], cells[-2], cells[-1]
        self.blocks = [_block(i, cell) for i, cell in enumerate(cells[1:-2])]
        first = self.blocks[0].attention.spec
        self.n_heads, self.head_dim = first.n_heads, first.head_dim

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def check_ids(self, ids) -> np.ndarray:
        """``ids`` as ``[B, T]`` checked against the vocabulary and the context length."""
        x = token_rows(ids)
        vocab = self.embedding.cfg.vocab_size
        if x.size and (x.min() < 0 or x.max() >= vocab):
            raise InspectError(f"token ids must lie in the vocabulary 0..{vocab - 1}; "
                               f"got {int(x.min())}..{int(x.max())}")
        if x.shape[1] > self.net.args.context_length:
            raise InspectError(f"{x.shape[1]} tokens exceed the model's context length "
                               f"{self.net.args.context_length}")
        return x

    def run(self, ids=None, *, resid=None, start: int = 0, stop: int | None = None,
            edit: Edit | None = None, keep: Collection[str] = (), skip: Collection[int] = (),
            cancel: Cancel = None, progress: Progress | None = None) -> Trace:
        """Token ids ``[B, T]`` through the blocks, or ``resid`` (``[B, T, d]``, the residual
        entering block ``start``) through blocks ``start..``, up to block ``stop`` (excluded; None:
        the last), ``trace.final`` being the residual after them; blocks in ``skip`` (and any
        whose container Loom's ``is_disabled`` switches off) pass the residual on unchanged.
        :class:`LoomCancelled` between blocks once ``cancel`` asks; ``progress(blocks done,
        blocks)`` after each."""
        cancelled = as_cancel_check(cancel)
        end = self.n_layers if stop is None else stop
        ctx = CachedRun(self.net, None)
        trace = Trace()

        def site(name: str, layer: int, value):
            if edit is not None:
                value = edit(name, layer, value)
            if name in keep:
                trace.values[(name, layer)] = value
            return value

        x = self.embedding.forward(self.check_ids(ids), ctx)[0] if resid is None else resid
        for i in range(0 if resid is None else start, end):
            if cancelled():
                raise LoomCancelled("the inspection was cancelled")
            x = site("resid_pre", i, x)
            block = self.blocks[i]
            if i in skip or block.container.cfg.is_disabled:
                continue
            x = x + site("attn_out", i, self._attention_half(i, block, x, ctx, site))
            x = x + site("mlp_out", i, self._mlp_half(i, block, x, ctx, site))
            if progress is not None:
                progress(i + 1, self.n_layers)
        trace.final = site("resid_pre", end, x) if end == self.n_layers else x
        return trace

    def _attention_half(self, i: int, block: Block, x, ctx, site):
        for layer in block.attention_half:
            if layer.cfg.is_disabled:
                continue
            if layer is not block.attention:
                x = layer.forward(x, ctx)[0]
                continue
            x = site("attn_in", i, x)
            B, T = x.shape[0], x.shape[1]
            q, k, v = layer.queries_keys_values(x, ctx, (0,) * B)
            q, k = site("q", i, q), site("k", i, k)
            z = site("z", i, mix_values(attention_weights(layer, q, k), v))
            x = site("attn_raw", i, layer.output(array_module(z).reshape(z, (B, T, -1)), ctx))
        return x

    def _mlp_half(self, i: int, block: Block, x, ctx, site):
        for layer in block.mlp_half:
            if layer.cfg.is_disabled:
                continue
            if layer is block.mlp:
                x = site("mlp_in", i, x)
            x = layer.forward(x, ctx)[0]
        return x

    # ----- the end of the stream ----------------------------------------------------------
    def logits(self, resid):
        """The head's logits ``[..., vocab]`` (divided, soft-capped as the model does) of residual
        rows ``resid[..., d]`` through the final norm: the model's output for the final residual,
        the logit lens for an earlier one."""
        ctx = CachedRun(self.net, None)
        return self.head.forward(self.final_norm.forward(resid, ctx)[0], ctx)[0]

    def token_logits(self, resid, tokens: Sequence[int]) -> np.ndarray:
        """The logits of ``tokens`` only (``[..., len(tokens)]``, on the host) for residual rows
        ``resid[..., d]``: the final norm, the head's rows of those tokens, its divisor and cap."""
        normed = to_host(self.final_norm.forward(resid, CachedRun(self.net, None))[0])
        rows = self.unembedding(tokens)
        return np.asarray(self.head.finished(normed @ rows.T), dtype=np.float32)

    def unembedding(self, tokens: Sequence[int]) -> np.ndarray:
        """The head's rows ``[len(tokens), d]`` of ``tokens`` as float32 (as the model reads them)."""
        weight = self.head.weights.current(self.head.cfg.dtype)["weight"]
        ids = np.asarray(tokens, dtype=np.int64)
        rows = weight[ids] if isinstance(weight, np.ndarray) else weight.rows(ids)
        return np.asarray(rows, dtype=np.float32)

    def output_matrix(self, i: int) -> np.ndarray:
        """Block ``i``'s attention output projection ``[d, heads * hd]`` as float32 (the matrix
        head ``h``'s columns ``h*hd:(h+1)*hd`` of carry its output into the residual stream)."""
        attention = self.blocks[i].attention
        return dense(attention.weights.current(attention.cfg.dtype)["wo"])

    def check_layer(self, layer: int, head: int | None = None) -> None:
        if not 0 <= layer < self.n_layers:
            raise InspectError(f"layer {layer} does not exist: the model has blocks 0..{self.n_layers - 1}")
        if head is not None and not 0 <= head < self.n_heads:
            raise InspectError(f"head {head} does not exist: the model has heads 0..{self.n_heads - 1}")


def one_sequence(tracer: Tracer, ids) -> np.ndarray:
    """``ids`` as ``[1, T]``, checked (:meth:`Tracer.check_ids`); more than one sequence is refused."""
    x = tracer.check_ids(ids)
    if x.shape[0] != 1:
        raise InspectError(f"an inspection is of one sequence; got {x.shape[0]}")
    return x


def _block(i: int, cell: Layer) -> Block:
    """Block ``i``'s halves, checked to be the decoder block the builders make: a Sequential of
    ``[attention half, Residual, MLP half, Residual]`` with one attention layer in the first half."""
    kids = list(getattr(cell, "children", None) or ())
    if not (isinstance(cell, Sequential) and len(kids) == 4 and isinstance(kids[0], Sequential)
            and isinstance(kids[1], Residual) and isinstance(kids[2], Sequential)
            and isinstance(kids[3], Residual)):
        raise InspectError(f"block {i} is not a decoder block (attention half, residual, MLP half, residual)")
    attention = [la for la in kids[0].children if isinstance(la, LLMAttention)]
    if len(attention) != 1:
        raise InspectError(f"block {i}'s attention half holds {len(attention)} attention layers, not one")
    return Block(cell, tuple(kids[0].children), attention[0], tuple(kids[2].children))
