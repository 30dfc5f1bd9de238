"""What the language-model path needs from a device beyond the array API
(:class:`~loomlab.core.backend.DeviceKernels`), and the array-API fallback.

A language model on a device backend (``load_model(..., backend="strict")``, CuPy) uploads every
layer's matrices once, through :meth:`LLMKernels.upload`, and multiplies them and attends with
:meth:`LLMKernels.linear` and :meth:`LLMKernels.attend`; everything else (norms, RoPE,
activations, residual adds, the KV caches, greedy choice) is array-API code on the backend's
namespace. A backend with kernels of its own (the CuPy backend: GGUF blocks multiplied in place,
a decode attention kernel) names their class in ``Backend.llm_kernels``; any other gets this
class, the array-API fallback: matrices dequantized to float32 once, ``x @ W.T``, attention as
masked matrix products.
"""

from __future__ import annotations

import numpy as np

from ...backend import Backend, DeviceKernels


class LLMKernels:
    """:class:`~loomlab.core.backend.DeviceKernels` by the array API: the fallback (strict, and
    any backend without its own kernels) and the base class of a backend's own."""

    def __init__(self, backend: Backend):
        self.backend = backend
        self.xp = backend.xp

    def upload(self, m) -> object:
        """A layer matrix (a QuantMatrix, or a float32 numpy array ``[out, in]``) made
        device-resident. Fallback: the dequantized float32 ``[out, in]`` on the device."""
        return self.table(m)

    def table(self, m):
        """A matrix as the float32 array ``[out, in]`` on the device that rows are gathered from
        (an embedding table that is not also the head's upload)."""
        # the backend's namespace puts new arrays on its device (strict's is bound to it, CuPy's
        # current device), as the rest of the engine relies on
        return self.xp.asarray(self.host_float32(m))

    def host_float32(self, m) -> np.ndarray:
        """A matrix as a float32 numpy array ``[out, in]`` (dequantized by the CPU kernels)."""
        return np.asarray(m if isinstance(m, np.ndarray) else m.dequantize(), dtype=np.float32)

    def linear(self, x, m):
        """``x [T, in]`` float32 on the device times the uploaded matrix ``m`` transposed:
        ``[T, out]`` float32 on the device."""
        return x @ self.xp.matrix_transpose(m)

    def attend(self, q, keys, values, start: int, window: int | None, scale: float,
               softcap: float | None = None):
        """:func:`loomlab.core.llm.kernels.attention_kernel.attend`'s semantics on device arrays: ``q [T, H,
        hd]``, ``keys`` and ``values [Hkv, S, hd]`` float32 (positions ``0..S-1``), queries at
        positions ``start..start+T-1``, scores soft-capped at ``softcap`` (None: uncapped);
        returns ``[T, H*hd]`` float32 on the device.

        Fallback: scores of each KV head's query group as one matrix product, the causal (and
        sliding-window) mask, a softmax over the keys, a product with the values. It sums in
        another order than the CPU kernel, so it agrees with it to float32 rounding, not bits.
        """
        xp = self.xp
        T, H, hd = q.shape
        n_kv = keys.shape[0]
        group, S = H // n_kv, start + T  # keys past the last query's position are never seen
        keys, values = keys[:, :S, :], values[:, :S, :]
        # [Hkv, group * T, hd]: query head h = kv * group + g reads KV head kv, as GQA pairs them
        qg = xp.reshape(xp.permute_dims(q, (1, 0, 2)), (n_kv, group * T, hd))
        scores = xp.reshape((qg @ xp.matrix_transpose(keys)) * scale, (n_kv, group, T, S))
        if softcap is not None:
            scores = xp.tanh(scores / softcap) * softcap
        positions = xp.arange(start, S)[:, None]  # [T, 1] against the keys' [S]
        seen = xp.arange(S)[None, :]
        visible = seen <= positions
        if window is not None:
            visible = visible & (seen > positions - window)
        scores = xp.where(visible, scores, -xp.inf)
        weights = xp.exp(scores - xp.max(scores, axis=-1, keepdims=True))
        weights = weights / xp.sum(weights, axis=-1, keepdims=True)
        out = xp.reshape(weights, (n_kv, group * T, S)) @ values  # [Hkv, group * T, hd]
        return xp.reshape(xp.permute_dims(xp.reshape(out, (H, T, hd)), (1, 0, 2)), (T, H * hd))


def kernels_for(backend: Backend) -> DeviceKernels:
    """The backend's own language-model kernels, or the array-API fallback."""
    make = backend.llm_kernels if backend.llm_kernels is not None else LLMKernels
    return make(backend)
