"""A population of small MLPs evaluated at once on an NVIDIA GPU: the numba-CUDA twin of
:func:`loomlab.core.evolve.search.batched_kernel.forward` (same arguments, same result).

:mod:`loomlab.core.evolve.search.batched` packs a group of same-shaped Dense networks as ``w[N, total]``
(member n's layer j ``[out, in]`` at offset ``layers[j, 2]``) with activation ids ``acts[N, L]``.
Here one thread block runs one member's whole chain: its rows of activations stay in shared
memory between layers (no ``[N, B, out]`` array in device memory between them), each thread
computes outputs ``(b, o)`` of a layer, a dot product of an input row and a weight row in the
compute dtype, and applies the member's activation with the CPU kernel's formulas (tanh from
CUDA's float64 ``tanh`` where the CPU uses a rational fit within 1.1e-10); the block synchronises
between layers. A member's result never depends on the other members.

Results equal the CPU kernel's to float32 rounding (each dot product is summed in another order).
"""

from __future__ import annotations

import functools
import math

import numpy as np

from loomlab.core.activations import GELU, LEAKY_RELU, RELU, RELU2, SIGMOID, SILU, TANH
from loomlab.core.errors import LoomConfigError, LoomShapeError

from .cuda_common import check_threads, cuda, device_input, numba_cuda, on_device, result

F32 = np.float32
THREADS = 64  # per block (one member): one thread per output of a 64-wide layer
MAX_WIDTH = 2048  # floats of one layer's rows (batch x width) in shared memory; two such buffers
_SHARED = 2 * MAX_WIDTH  # a shared array's size must be a literal or a global, not an expression
_GELU_C = math.sqrt(2.0 / math.pi)


def _activation(acc):
    """A device function ``f(act, v)``: Loom activation ``act`` of ``v`` in the dtype ``acc``, with
    :func:`loomlab.core.evolve.search.batched_kernel._activate`'s operations."""
    zero, one = acc(0), acc(1)

    def activate(act, v):
        if act == RELU:
            return zero if v < zero else v  # -0.0 and NaN pass, as Loom's v<0 ? 0 : v
        if act == LEAKY_RELU:
            return v * acc(0.01) if v < zero else v
        if act == RELU2:
            return zero if v < zero else v * v
        if act == TANH:
            return acc(math.tanh(np.float64(v)))
        if act == SIGMOID:
            return one / (one + acc(math.exp(np.float64(-v))))
        if act == SILU:
            return v * (one / (one + acc(math.exp(np.float64(-v)))))
        if act == GELU:
            u = acc(_GELU_C) * (v + acc(0.044715) * acc(np.float64(v) ** 3))
            return acc(0.5) * v * (one + acc(math.tanh(np.float64(u))))
        return v  # Linear, and any id activate() passes through

    return activate


@functools.cache
def _stack_kernel(compute: np.dtype):
    """The kernel accumulating in ``compute`` (float32 or float64)."""
    numba_cuda()
    acc = compute.type
    activate = cuda.jit(device=True)(_activation(acc))

    @cuda.jit
    def stack(x, w, layers, acts, out):
        n = cuda.blockIdx.x
        tid, threads = cuda.threadIdx.x, cuda.blockDim.x
        h = cuda.shared.array(_SHARED, F32)  # the layer's input rows, then its output rows
        n_layers = layers.shape[0]
        batch = out.shape[1] // layers[n_layers - 1, 1]
        xn = n if x.shape[0] > 1 else 0
        for k in range(tid, batch * layers[0, 0], threads):  # rows of n_in, as batch_rows reads them
            h[k] = x[xn, k]
        cuda.syncthreads()
        src, dst = 0, MAX_WIDTH
        for j in range(n_layers):
            n_in, n_out, at = layers[j, 0], layers[j, 1], layers[j, 2]
            for k in range(tid, batch * n_out, threads):
                b = k // n_out
                row_in, row_w = src + b * n_in, at + (k - b * n_out) * n_in
                total = acc(0)
                for i in range(n_in):
                    total += acc(h[row_in + i]) * acc(w[n, row_w + i])
                h[dst + k] = activate(acts[n, j], total)
            cuda.syncthreads()
            src, dst = dst, src
        for k in range(tid, out.shape[1], threads):
            out[n, k] = h[src + k]

    return stack


def forward(h, w, layers: np.ndarray, acts: np.ndarray, compute, *, threads: int = THREADS):
    """The layers ``layers`` (``(in, out, offset)`` rows into ``w``) of every member, with
    activations ``acts[N, L]``, on the device: ``h`` is the input, ``[B, in]`` read by every member
    or ``[N, B, width]``, float32; ``w`` ``[N, total]`` float32 (keep it a device array between
    calls: the weights then stay on the device); the result ``[N, B, out]`` float32, accumulated
    in ``compute`` (float32, or float64 for the "loom" precision). Numpy ``h`` gives numpy back,
    a device array a device array.

    Raises:
        LoomShapeError: the arrays do not fit together, or a layer's rows exceed ``MAX_WIDTH``.
        LoomConfigError: ``compute`` is not float32 or float64; no CUDA device (nor simulator).
    """
    compute = np.dtype(compute)
    if compute not in (np.dtype(np.float32), np.dtype(np.float64)):
        raise LoomConfigError(f"population forward computes in float32 or float64; got {compute}")
    layers, acts = np.asarray(layers, np.int64), np.asarray(acts, np.int8)
    hs = tuple(getattr(h, "shape", ()))
    n_members, batch, width = _check_shapes(hs, tuple(getattr(w, "shape", ())), layers, acts)
    check_threads(threads)
    kernel = _stack_kernel(compute)
    d_x = device_input(h, F32, "the input").reshape(1 if len(hs) == 2 else n_members, batch * width)
    d_w = device_input(w, F32, "the weights")
    d_out = cuda.device_array((n_members, batch * int(layers[-1, 1])), F32)
    if n_members and batch:
        kernel[n_members, threads](d_x, d_w, cuda.to_device(layers), cuda.to_device(acts), d_out)
    return result(d_out.reshape(n_members, batch, int(layers[-1, 1])), host=not on_device(h))


def _check_shapes(hs: tuple, ws: tuple, layers: np.ndarray, acts: np.ndarray) -> tuple[int, int, int]:
    """``(members, input rows, row width)`` for input and weight shapes ``hs``, ``ws``, or the
    :class:`LoomShapeError` that says what does not fit."""
    n_members = ws[0] if len(ws) == 2 else -1
    if (len(ws) != 2 or layers.ndim != 2 or layers.shape[1] != 3 or not len(layers)
            or acts.shape != (n_members, len(layers))):
        raise LoomShapeError(f"population forward needs layers [L, 3] and acts [N, L] for weights "
                             f"[N, total]; got layers {layers.shape}, acts {acts.shape}, weights {ws}")
    if int((layers[:, 2] + layers[:, 0] * layers[:, 1]).max()) > ws[1]:
        raise LoomShapeError(f"population forward: layers {layers.tolist()} reach past the {ws[1]} "
                             f"weights per member")
    if len(hs) not in (2, 3) or (len(hs) == 3 and hs[0] != n_members):
        raise LoomShapeError(f"population forward needs input [B, in] or [N={n_members}, B, width]; got {hs}")
    batch, width = hs[len(hs) - 2], hs[len(hs) - 1]  # from the front: the simulator's shapes refuse [-1]
    if width < layers[0, 0]:
        raise LoomShapeError(f"population forward: input rows of {width} are narrower than the first "
                             f"layer's {layers[0, 0]} inputs")
    if batch * int(max(layers[0, 0], layers[:, 1].max())) > MAX_WIDTH:
        raise LoomShapeError(f"population forward on the GPU holds a layer's rows in shared memory: "
                             f"{batch} rows of up to {int(layers[:, :2].max())} exceed {MAX_WIDTH} floats")
    return n_members, batch, width
