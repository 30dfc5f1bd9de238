"""Rotary position embedding: the frequencies a model's settings ask for, and the rotation itself."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numba import njit


@dataclass(frozen=True)
class RopeConfig:
    """RoPE frequencies: ``base`` and transformers' scaling types default, linear and llama3."""

    base: float = 10000.0
    kind: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_context: int = 8192

    def inv_freq(self, head_dim: int, freq_factors: np.ndarray | None = None) -> np.ndarray:
        """``inv_freq[head_dim // 2]`` in float32, computed as transformers does; GGUF's llama3
        models carry ``freq_factors`` (``rope_freqs``) that divide it instead."""
        exponents = np.arange(0, head_dim - 1, 2).astype(np.float32) / np.float32(head_dim)
        inv = (1.0 / np.float32(self.base) ** exponents).astype(np.float32)
        if freq_factors is not None:
            return (inv / np.asarray(freq_factors, dtype=np.float32)).astype(np.float32)
        if self.kind == "linear":
            return (inv / np.float32(self.factor)).astype(np.float32)
        if self.kind == "llama3":
            return self._llama3(inv)
        return inv

    def _llama3(self, inv: np.ndarray) -> np.ndarray:
        """Llama 3.1's long-context rule: low frequencies slowed by ``factor``, a smooth blend between."""
        wavelen = 2 * math.pi / inv
        low_wavelen = self.original_context / self.low_freq_factor
        high_wavelen = self.original_context / self.high_freq_factor
        scaled = np.where(wavelen > low_wavelen, inv / self.factor, inv)
        smooth = (self.original_context / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor)
        blended = (1 - smooth) * scaled / self.factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        return np.where(medium, blended, scaled).astype(np.float32)


@dataclass(frozen=True, eq=False)
class Rope:
    """Rotary position embedding with per-pair inverse frequencies ``inv_freq[head_dim // 2]``.

    ``interleaved`` rotates pairs ``(0,1), (2,3), ...``: GGUF stores llama's Q/K rows permuted so
    that this equals transformers' half-split rotation of the original rows.
    """

    inv_freq: np.ndarray
    interleaved: bool = False

    def __call__(self, starts: tuple[int, ...], T: int, *vs: np.ndarray) -> list[np.ndarray]:
        """Rotate each ``v[B, T, heads, head_dim]``, batch row b at positions ``starts[b] ..
        starts[b] + T - 1`` (a sequence continuing from its cache's offset)."""
        cos, sin = self.angles(starts, T)
        return [self._rotate(v, cos, sin) for v in vs]

    def angles(self, starts: tuple[int, ...], T: int) -> tuple[np.ndarray, np.ndarray]:
        """cos and sin of the float32 angles, as transformers computes them. Every attention layer
        of a decode step asks for the same positions: the last answer is kept, keyed by
        ``(starts, T)`` (one tuple, swapped whole, so threads sharing the model never see half of
        one)."""
        key = (starts, T)
        last = self.__dict__.get("_last")
        if last is not None and last[0] == key:
            return last[1], last[2]
        positions = np.array(starts)[:, None] + np.arange(T)
        angle = positions.astype(np.float32)[:, :, None, None] * self.inv_freq
        cos, sin = np.cos(angle), np.sin(angle)
        cos.flags.writeable = sin.flags.writeable = False  # shared by the layers that ask next
        self.__dict__["_last"] = (key, cos, sin)  # a frozen dataclass: its cache goes in by the dict
        return cos, sin

    def on_device(self, starts: tuple[int, ...], T: int, xp, *vs) -> list:
        """:meth:`__call__` for device arrays ``v[B, T, heads, head_dim]`` of namespace ``xp``:
        the same float32 angles, computed on the host as the numpy path does them and uploaded
        once per step (every layer of the step shares them), then the same products and sums
        (no fused multiply-add on strict's numpy; a GPU may fuse and differ in the last bit)."""
        key = (starts, T)
        last = self.__dict__.get("_last_device")
        if last is None or last[0] != key or last[1] is not xp:
            cos, sin = self.angles(starts, T)
            last = self.__dict__["_last_device"] = (key, xp, xp.asarray(cos), xp.asarray(sin))
        cos, sin = last[2], last[3]
        return [self._rotate_xp(xp, v, cos, sin) for v in vs]

    def _rotate_xp(self, xp, v, cos, sin):
        half = self.inv_freq.size
        if self.interleaved:  # pairs (0,1), (2,3) ...: rotate, then interleave the halves again
            a, b = v[..., 0:2 * half:2], v[..., 1:2 * half:2]
            return xp.reshape(xp.stack([a * cos - b * sin, b * cos + a * sin], axis=-1), v.shape)
        a, b = v[..., :half], v[..., half:2 * half]
        return xp.concat([a * cos - b * sin, b * cos + a * sin], axis=-1)

    def _rotate(self, v: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        half = self.inv_freq.size
        if v.dtype == np.float32 and v.shape[-1] == 2 * half and v.ndim == 4:
            out = np.empty(v.shape, np.float32)
            _rotate_pairs(np.ascontiguousarray(v), cos, sin, self.interleaved, out)
            return out
        if self.interleaved:
            a, b = v[..., 0:2 * half:2], v[..., 1:2 * half:2]
            out = np.empty_like(v)
            out[..., 0:2 * half:2] = a * cos - b * sin
            out[..., 1:2 * half:2] = b * cos + a * sin
            return out
        a, b = v[..., :half], v[..., half:2 * half]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], axis=-1)


@njit(cache=True, nogil=True)
def _rotate_pairs(v, cos, sin, interleaved, out):
    """:meth:`Rope._rotate` in one compiled call (the numpy form is ~10 small array operations per
    tensor, ~8 us a layer of decode): the same float32 products and sums in the same order (no
    fused multiply-add without fastmath), so the same bits. ``cos``/``sin`` are ``[B, T, 1, half]``."""
    B, T, heads, _ = v.shape
    for b in range(B):
        for t in range(T):
            for h in range(heads):
                rotate_head(v[b, t, h], cos[b, t, 0], sin[b, t, 0], interleaved, out[b, t, h])


@njit(inline="always")
def rotate_head(v, cos, sin, interleaved, out):
    """One head's vector ``v[head_dim]`` rotated at one position's ``cos``/``sin`` ``[half]``
    into ``out`` (the compiled decode step calls it too, so both give these bits)."""
    half = cos.shape[0]
    for i in range(half):
        c, s = cos[i], sin[i]
        ia, ib = (2 * i, 2 * i + 1) if interleaved else (i, half + i)
        x0, x1 = v[ia], v[ib]
        out[ia] = x0 * c - x1 * s
        out[ib] = x1 * c + x0 * s
