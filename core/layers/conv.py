"""CNN1 / CNN2 / CNN3: ``pre[b,f,o] = Σ_c Σ_k x[b,c,o·s+k−p]·K[f,c,k]``, no bias (spec §5.4.6–7).

The window geometry here is shared with ConvTransposed (``conv_transposed.py``): both relate a
*source* grid to a grid of window *positions* by ``src = pos·stride + k − padding`` on every axis,
skipping sources outside the grid (zero padding). A convolution gathers windows from its input;
a transposed convolution scatters into its output, the exact adjoint, so each family's input
gradient is the other family's forward.
"""

from __future__ import annotations

import math
from typing import ClassVar

from ..activations import activate, derivative
from ..backend import array_module
from ..errors import LoomFormatError, LoomShapeError
from .base import Layer, register
from .scatter import scatter_add


class WindowMap:
    """Flat source index of every (kernel offset, position) pair and whether it is inside.

    ``idx`` and ``mask`` have shape ``[k^n, P]`` (kernel offsets and positions row-major), so
    the gathered windows line up with the flat kernel layout ``K[..][k1..kn]``.
    """

    def __init__(self, xp, src: tuple[int, ...], pos: tuple[int, ...], k: int, stride: int,
                 padding: int):
        n = len(src)
        idx, valid = 0, True
        for a in range(n):
            along = xp.arange(k)[:, None] + stride * xp.arange(pos[a])[None, :] - padding
            shape = [1] * (2 * n)
            shape[a], shape[n + a] = k, pos[a]
            along = xp.reshape(along, tuple(shape))
            valid = valid & (along >= 0) & (along < src[a])
            idx = idx * src[a] + along
        self.xp = xp
        self.kp, self.P, self.S = k**n, math.prod(pos), math.prod(src)
        self.mask = xp.reshape(valid, (self.kp, self.P))
        self.idx = xp.where(self.mask, xp.reshape(idx, (self.kp, self.P)), 0)

    def gather(self, t):
        """im2col: ``t[B, R, S]`` -> windows ``[B, R·k^n, P]`` (outside sources read as 0)."""
        xp, (B, R) = self.xp, t.shape[:2]
        windows = xp.reshape(xp.take(t, xp.reshape(self.idx, (-1,)), axis=2), (B, R, self.kp, self.P))
        cols = xp.astype(xp.where(self.mask, windows, 0), t.dtype, copy=False)
        return xp.reshape(cols, (B, R * self.kp, self.P))

    def scatter(self, cols, R: int):
        """col2im, the adjoint of :meth:`gather`: ``[B, R·k^n, P]`` summed into ``[B, R, S]``."""
        xp, B = self.xp, cols.shape[0]
        vals = xp.where(self.mask, xp.reshape(cols, (B * R, self.kp, self.P)), 0)
        # Windows overlap (always with stride 0), so targets repeat: duplicates must be summed.
        out = scatter_add(xp, xp.reshape(self.idx, (-1,)), xp.reshape(vals, (B * R, -1)), self.S)
        return xp.astype(xp.reshape(out, (B, R, self.S)), cols.dtype, copy=False)


class SpatialLayer(Layer):
    """What every convolution family shares: sizes, checks, batching and the activation.

    A family names the config fields of its input and output spatial sizes (outermost first);
    the output sizes are taken as configured, never computed (spec §5.2).
    """

    weighted = True
    in_fields: ClassVar[tuple[str, ...]] = ()
    out_fields: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def param_count(cls, cfg) -> int:
        return cfg.filters * cfg.input_channels * max(cfg.kernel_size, 1) ** len(cls.in_fields)

    @property
    def kernel(self) -> int:
        return max(self.cfg.kernel_size, 1)  # kernel_size 0 counts as 1 (spec §3.5)

    @property
    def in_sizes(self) -> tuple[int, ...]:
        return tuple(getattr(self.cfg, f) for f in self.in_fields)

    @property
    def out_sizes(self) -> tuple[int, ...]:
        return tuple(getattr(self.cfg, f) for f in self.out_fields)

    def check(self, path: str) -> None:
        c = self.cfg
        for name in ("input_channels", "filters", *self.in_fields, *self.out_fields):
            if getattr(c, name) <= 0:
                raise LoomFormatError(path, f"{self.type_name} needs {name} > 0, got {getattr(c, name)}")
        for name in ("kernel_size", "stride", "padding"):
            if getattr(c, name) < 0:
                raise LoomFormatError(path, f"{self.type_name} needs {name} >= 0, got {getattr(c, name)}")

    def describe_shapes(self):
        return [self.cfg.input_channels, *self.in_sizes], [self.cfg.filters, *self.out_sizes]

    def batched(self, x):
        """``x`` as ``[B, C, prod(in_sizes)]``; B is however many whole samples ``x`` holds."""
        per = self.cfg.input_channels * math.prod(self.in_sizes)
        if x.size == 0 or x.size % per:
            raise LoomShapeError(f"{self.type_name}: input of shape {tuple(x.shape)} is not a whole "
                                 f"number of [{self.cfg.input_channels}, "
                                 f"{', '.join(map(str, self.in_sizes))}] samples")
        return array_module(x).reshape(x, (x.size // per, self.cfg.input_channels, -1))

    def activated(self, pre):
        """``act(pre)`` for ``pre[B, F, prod(out_sizes)]``, shaped ``[B, F, *out_sizes]``."""
        xp = array_module(pre)
        return xp.reshape(activate(self.cfg.act_id, pre), (pre.shape[0], self.cfg.filters, *self.out_sizes))

    def pre_grad(self, gy, pre):
        return array_module(gy).reshape(gy, pre.shape) * derivative(self.cfg.act_id, pre)


class Convolution(SpatialLayer):
    """Gather form: each output position reads one window of the input (im2col)."""

    def forward(self, x, ctx, skip=None):
        xb = self.batched(x)
        wmap = WindowMap(ctx.xp, self.in_sizes, self.out_sizes, self.kernel, self.cfg.stride,
                         self.cfg.padding)
        kmat = ctx.xp.reshape(self.params(ctx.xp, x.dtype), (self.cfg.filters, -1))  # [F, C·k^n]
        cols = wmap.gather(xb)
        pre = kmat @ cols
        cache = (cols, pre, kmat, wmap, x.shape) if ctx.train else None
        return self.activated(pre), cache

    def backward(self, cache, gy, ctx):
        cols, pre, kmat, wmap, x_shape = cache
        gpre = self.pre_grad(gy, pre)
        self.add_grad(ctx.xp.tensordot(gpre, cols, axes=([0, 2], [0, 2])))
        return ctx.xp.reshape(wmap.scatter(kmat.T @ gpre, self.cfg.input_channels), x_shape)


@register
class CNN1(Convolution):
    """``[B, C, L] -> [B, F, outL]`` with L = input_height, outL = output_height."""

    type_name = "CNN1"
    in_fields = ("input_height",)
    out_fields = ("output_height",)


@register
class CNN2(Convolution):
    type_name = "CNN2"
    in_fields = ("input_height", "input_width")
    out_fields = ("output_height", "output_width")


@register
class CNN3(Convolution):
    type_name = "CNN3"
    in_fields = ("input_depth", "input_height", "input_width")
    out_fields = ("output_depth", "output_height", "output_width")
