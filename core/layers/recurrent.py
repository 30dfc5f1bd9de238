"""Recurrent layers: RNN (spec §5.4.9) and LSTM (spec §5.4.10), with backpropagation through time.

Both read ``[B, seq_length, in]`` with ``B = shape[0]`` and the sequence length from the
configuration (not from the tensor), write ``[B, seq_length, H]`` and ignore the activation field.
Time steps run in a Python loop; batch and hidden units are vectorised.
"""

from __future__ import annotations

from ..activations import sigmoid
from ..backend import array_module
from ..errors import LoomFormatError, LoomShapeError
from .base import Layer, register, rows_to_input


def _read_sequences(x, seq: int, n_in: int, what: str):
    """``x`` as ``[B, seq, in]``: Loom reads row ``x[b, t]`` at ``b*seq*in + t*in`` of the flat data."""
    batch = x.shape[0] if x.ndim else 1
    need = batch * seq * n_in
    if x.size < need:
        raise LoomShapeError(f"{what}: input of shape {tuple(x.shape)} holds {x.size} values, fewer "
                             f"than [B={batch}, seq_length={seq}, in={n_in}] = {need}")
    xp = array_module(x)
    return xp.reshape(xp.reshape(x, (-1,))[:need], (batch, seq, n_in))


class _Recurrent(Layer):
    """What RNN and LSTM share: sizes, checks, shapes and the sequence reading."""

    weighted = True
    n_gates = 1

    @classmethod
    def param_count(cls, cfg) -> int:
        H, n_in = cfg.output_height, cfg.input_height
        return cls.n_gates * (H * n_in + H * H + H)

    def check(self, path: str) -> None:
        c = self.cfg
        if c.input_height <= 0 or c.output_height <= 0 or c.seq_length <= 0:
            raise LoomFormatError(path, f"{self.type_name} needs input_height, output_height and "
                                        f"seq_length > 0, got {c.input_height}, {c.output_height}, "
                                        f"{c.seq_length}")

    def describe_shapes(self):
        c = self.cfg
        return [c.seq_length, c.input_height], [c.seq_length, c.output_height]

    def _gate_weights(self, xp, dtype):
        """Stacked gate matrices ``Wih[G*H][in]``, ``Whh[G*H][H]``, ``b[G*H]`` (gate-major rows)."""
        H, n_in, G = self.cfg.output_height, self.cfg.input_height, self.n_gates
        blocks = xp.reshape(self.params(xp, dtype), (G, H * n_in + H * H + H))
        w_ih = xp.reshape(blocks[:, : H * n_in], (G * H, n_in))
        w_hh = xp.reshape(blocks[:, H * n_in: H * n_in + H * H], (G * H, H))
        return w_ih, w_hh, xp.reshape(blocks[:, H * n_in + H * H:], (G * H,))

    def _add_gate_grads(self, xp, g_ih, g_hh, g_b) -> None:
        """Add gradients of the stacked matrices back in the flat per-gate block layout."""
        G = self.n_gates
        self.add_grad(xp.concat([xp.reshape(g, (G, -1)) for g in (g_ih, g_hh, g_b)], axis=1))

    def _inputs(self, x):
        return _read_sequences(x, self.cfg.seq_length, self.cfg.input_height, self.type_name)


@register
class RNN(_Recurrent):
    """Elman RNN: ``h_t = tanh(b + Wih x_t + Whh h_{t-1})``, ``h_0 = 0``; output all ``h_t``."""

    type_name = "RNN"

    def forward(self, x, ctx, skip=None):
        xp = ctx.xp
        xs = self._inputs(x)
        B, T = xs.shape[:2]
        w_ih, w_hh, b = self._gate_weights(xp, x.dtype)
        px = xs @ w_ih.T + b  # input projections of every step at once
        hs = xp.zeros((B, T + 1, w_hh.shape[0]), dtype=x.dtype)  # hs[:, t, :] = h_{t-1}
        for t in range(T):
            hs[:, t + 1, :] = xp.tanh(px[:, t, :] + hs[:, t, :] @ w_hh.T)
        cache = (xs, hs, w_ih, w_hh, x.shape) if ctx.train else None
        return xp.asarray(hs[:, 1:, :], copy=True), cache

    def backward(self, cache, gy, ctx):
        xp = ctx.xp
        xs, hs, w_ih, w_hh, x_shape = cache
        T = xs.shape[1]
        gy = xp.reshape(gy, hs[:, 1:, :].shape)
        gpre = xp.zeros_like(gy)
        g_hh = xp.zeros_like(w_hh)
        gh = xp.zeros_like(hs[:, 0, :])
        for t in reversed(range(T)):
            h = hs[:, t + 1, :]
            gp = (gy[:, t, :] + gh) * (1 - h * h)
            g_hh += gp.T @ hs[:, t, :]
            gh = gp @ w_hh
            gpre[:, t, :] = gp
        g_ih = xp.tensordot(gpre, xs, axes=([0, 1], [0, 1]))  # sum over b, t of gpre[h] xs[i]
        self._add_gate_grads(xp, g_ih, g_hh, xp.sum(gpre, axis=(0, 1)))
        return rows_to_input(gpre @ w_ih, x_shape, xp)  # the inverse of _read_sequences too


@register
class LSTM(_Recurrent):
    """LSTM with gates in Loom's order i, f, g, o: ``c = f*c_prev + i*g``, ``h = o*tanh(c)``."""

    type_name = "LSTM"
    n_gates = 4

    def forward(self, x, ctx, skip=None):
        xp = ctx.xp
        xs = self._inputs(x)
        B, T = xs.shape[:2]
        H = self.cfg.output_height
        w_ih, w_hh, b = self._gate_weights(xp, x.dtype)
        px = xs @ w_ih.T + b
        hs = xp.zeros((B, T + 1, H), dtype=x.dtype)  # hs[:, t, :] = h_{t-1}, cs likewise
        cs = xp.zeros_like(hs)
        gates = xp.empty((B, T, 4 * H), dtype=x.dtype)  # activated i, f, g, o per step
        for t in range(T):
            p = px[:, t, :] + hs[:, t, :] @ w_hh.T
            a = sigmoid(p)
            a[:, 2 * H: 3 * H] = xp.tanh(p[:, 2 * H: 3 * H])
            i, f, g, o = (a[:, k * H: (k + 1) * H] for k in range(4))
            cs[:, t + 1, :] = f * cs[:, t, :] + i * g
            hs[:, t + 1, :] = o * xp.tanh(cs[:, t + 1, :])
            gates[:, t, :] = a
        cache = (xs, hs, cs, gates, w_ih, w_hh, x.shape) if ctx.train else None
        return xp.asarray(hs[:, 1:, :], copy=True), cache

    def backward(self, cache, gy, ctx):
        xp = ctx.xp
        xs, hs, cs, gates, w_ih, w_hh, x_shape = cache
        T, H = xs.shape[1], self.cfg.output_height
        gy = xp.reshape(gy, hs[:, 1:, :].shape)
        gpre = xp.zeros_like(gates)
        g_hh = xp.zeros_like(w_hh)
        gh = xp.zeros_like(hs[:, 0, :])
        gc = xp.zeros_like(gh)
        for t in reversed(range(T)):
            i, f, g, o = (gates[:, t, k * H: (k + 1) * H] for k in range(4))
            tc = xp.tanh(cs[:, t + 1, :])
            dh = gy[:, t, :] + gh
            dc = gc + dh * o * (1 - tc * tc)
            gp = xp.concat([dc * g * i * (1 - i), dc * cs[:, t, :] * f * (1 - f),
                                 dc * i * (1 - g * g), dh * tc * o * (1 - o)], axis=1)
            g_hh += gp.T @ hs[:, t, :]
            gh = gp @ w_hh
            gc = dc * f
            gpre[:, t, :] = gp
        g_ih = xp.tensordot(gpre, xs, axes=([0, 1], [0, 1]))  # sum over b, t of gpre[g] xs[i]
        self._add_gate_grads(xp, g_ih, g_hh, xp.sum(gpre, axis=(0, 1)))
        return rows_to_input(gpre @ w_ih, x_shape, xp)  # the inverse of _read_sequences too
