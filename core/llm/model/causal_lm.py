"""A decoder-only language model as a grid network.

:class:`CausalLM` is a :class:`VolumetricNetwork` of one row of cells: the embedding, one
``Sequential`` per transformer block (``[norm, attention], Residual, [norm, MLP], Residual``),
the final norm and the LM head. ``net.forward(ids)`` runs the whole grid on ``[B, T]`` ids;
``net.step(ids, caches)`` is the decode path through the same layers with a KV cache per sequence.

:meth:`CausalLM.place` moves the model to a device backend (array_api_strict's simulated devices,
CuPy): every layer's matrices are uploaded once, the KV caches :meth:`make_cache` makes live on
the device, and ``step`` returns the logits there.
"""

from __future__ import annotations

import numpy as np

from ...backend import Backend, get_backend
from ...errors import LoomConfigError, LoomShapeError
from ...layers.base import Layer
from ..kernels.device_kernels import kernels_for
from ..kernels.quant import single_threaded_blas
from .fused_decode import fused_step
from .kv_cache import CachedRun, KVCache
from .llm_layers import InferenceOnly, LLMAttention, Uploads, layer_label
from .model_args import ModelArgs
from .model_network import ModelNetwork, token_rows


class CausalLM(ModelNetwork):
    """A decoder-only language model laid out on a ``1 x 1 x (layers + 3) x 1`` grid."""

    def __init__(self, args: ModelArgs, layers: list[Layer]):
        super().__init__(args, layers)
        self.attention_layers = [la for la in self.all_layers() if isinstance(la, LLMAttention)]

    @property
    def on_device(self) -> bool:
        """Whether the model computes on a device backend (see :meth:`place`)."""
        return self.backend.xp is not np

    def place(self, backend: str | Backend) -> None:
        """Compute on ``backend`` from now on. A backend whose namespace is numpy runs the host
        path (the numba kernels); any other gets every layer's matrices uploaded once, through
        the backend's :class:`~.device_kernels.LLMKernels` (a tied table once for embedding and
        head), and caches made by :meth:`make_cache` on its device. Caches made before stay
        where they are: make new ones."""
        backend = backend if isinstance(backend, Backend) else get_backend(backend)
        uploads = None if backend.xp is np else Uploads(kernels_for(backend))
        # the head first: a tied embedding table then gathers rows from the head's upload
        for layer in reversed(list(self.all_layers())):
            if isinstance(layer, InferenceOnly):
                layer.place(uploads)
        self.backend = backend

    def make_cache(self, capacity: int = 0, dtype: str = "float32") -> list[KVCache]:
        """One sequence's KV caches (one per attention layer), preallocated for ``capacity`` positions;
        ``dtype`` "float16" halves their memory (see :class:`KVCache`). On a device backend their
        buffers are device arrays."""
        return [KVCache(a.spec.n_kv_heads, a.spec.head_dim, self.args.context_length, capacity, dtype,
                        self.backend.xp) for a in self.attention_layers]

    def step(self, ids, caches: list[list[KVCache]] | None = None, *, last_only: bool = True) -> np.ndarray:
        """Logits for token ids ``[B, T]`` (or ``[T]``), continuing each row's sequence in ``caches``.

        Returns ``[B, vocab]`` for the last position when ``last_only`` (the head then runs on one
        row per sequence), else ``[B, T, vocab]``, on the model's device (see :meth:`place`; the
        ids come from the host). Observers see every layer, as in ``forward``.
        """
        x = token_rows(ids)
        if caches is not None and any(len(c) != len(self.attention_layers) for c in caches):
            raise LoomShapeError(f"each sequence needs {len(self.attention_layers)} KV caches (make_cache())")
        if self.on_device:
            self._check_placed(caches)
        run = CachedRun(self, caches)
        if not run.listeners and not self.on_device:  # one compiled call, where it applies
            logits = fused_step(self, x, caches, last_only)
            if logits is not None:
                self.step_count += 1
                return logits
        head = self.cells[-1]
        with single_threaded_blas():
            x = _call_cells(run, self.cells[:-1], x)
            if not head.cfg.is_disabled:
                x, _ = run.call(head, x[:, -1, :] if last_only else x)
        self.step_count += 1
        return x

    def _check_placed(self, caches: list[list[KVCache]] | None) -> None:
        """Refuse a device step over layers or caches of another device (the one clear error,
        rather than the namespace's own about mixed devices deep in a layer)."""
        where = f"the {self.backend.name!r} backend's device ({self.backend.device})"
        for layer in self.all_layers():
            if isinstance(layer, InferenceOnly) and (layer.device_copy is None
                                                     or layer.device_copy.backend != self.backend):
                raise LoomConfigError(f"{layer_label(layer)} is not on "
                                      f"{where}, where the network runs; place the whole network "
                                      "(CausalLM.place)")
        pinned = self.backend.device is not None  # None (CuPy's): the namespace's current device
        for row in caches or ():
            if any(c.xp is not self.backend.xp or (pinned and c.device != self.backend.device) for c in row):
                raise LoomConfigError(f"a KV cache is not on {where}, where the network runs; make the "
                                      "caches after placing the network (make_cache())")

    def hidden_states(self, ids) -> np.ndarray:
        """Every layer but the LM head over token ids ``[B, T]`` as fresh sequences: ``[B, T, hidden]``
        after the final norm. Observers see those layers; the step count does not move."""
        with single_threaded_blas():
            return _call_cells(CachedRun(self, None), self.cells[:-1], token_rows(ids))



def _call_cells(run: CachedRun, cells: list[Layer], x):
    for layer in cells:
        if not layer.cfg.is_disabled:
            x, _ = run.call(layer, x)
    return x
