"""The population kernel (gpu/population_cuda.py) in numba's CUDA simulator, against the numpy
path of :mod:`loomlab.core.evolve.search.batched` (a stacked ``matmul`` per layer, then each member's
:func:`~loomlab.core.activations.activate`) and against the CPU kernel it mirrors
(:func:`loomlab.core.evolve.search.batched_kernel.forward`).

Tolerance: rtol 2e-5 with atol 2e-6. Each layer's dot products (at most 40 terms here) are
float32 sums in different orders, at most 2 * 40 * 2^-24 (5e-6) of ``sum |w x|`` apart, and each
activation's rounding differs by at most 2 ulp (2.4e-7); through three layers whose activations
change an error by a factor below 2 (ReLU2: 2|v|, |v| < 1 here) that stays under 2e-5 of the
output's scale. A wrong weight offset or activation changes outputs by 1e-2 or more. Computing in
float64 ("loom" precision) the sides agree to float32 rounding of each layer: rtol 1e-6.
"""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core.activations import GELU, LEAKY_RELU, LINEAR, RELU, RELU2, SIGMOID, SILU, TANH, activate
from loomlab.core.errors import LoomConfigError, LoomShapeError
from loomlab.core.evolve.search import batched_kernel

pytestmark = pytest.mark.cuda_simulator
THREADS = 32  # the simulator runs every GPU thread as a Python thread: one warp per block
ACTS = [RELU, SILU, GELU, TANH, SIGMOID, LEAKY_RELU, RELU2, LINEAR]


def population(dims, n_members, seed):
    """Packed weights ``[N, total]``, ``layers`` rows ``(in, out, offset)`` and activation ids
    ``[N, L]`` cycling through every activation (each member a different mix)."""
    rng = np.random.default_rng(seed)
    sizes = [a * b for a, b in dims]
    offsets = np.cumsum([0, *sizes])
    layers = np.array([(a, b, offsets[j]) for j, (a, b) in enumerate(dims)], np.int64)
    w = (rng.standard_normal((n_members, offsets[-1])) * 0.4).astype(np.float32)
    acts = np.array([[ACTS[(3 * n + j) % len(ACTS)] for j in range(len(dims))] for n in range(n_members)],
                    np.int8)
    return w, layers, acts


def numpy_path(h, w, layers, acts, compute):
    """What batched._Group.forward does without the kernel: per layer a stacked matmul in
    ``compute``, then each member's activation, rounded to float32."""
    n_members = len(w)
    x = h if h.ndim == 3 else np.broadcast_to(h, (n_members, *h.shape))
    x = x.reshape(n_members, -1)[:, : h.shape[-2] * layers[0, 0]].reshape(n_members, h.shape[-2], -1)
    for j, (n_in, n_out, at) in enumerate(layers):
        W = w[:, at:at + n_in * n_out].reshape(n_members, n_out, n_in).astype(compute)
        pre = x.astype(compute) @ W.transpose(0, 2, 1)
        x = np.stack([activate(int(acts[n, j]), pre[n]) for n in range(n_members)]).astype(np.float32)
    return x


# (layer sizes, members, input rows B, shared input or per member of a wider width, compute)
CASES = [
    ([(6, 8), (8, 3)], 5, 1, "shared", np.float32),
    ([(6, 8), (8, 3)], 5, 1, "shared", np.float64),
    ([(5, 40), (40, 7), (7, 4)], 4, 2, "per-member", np.float32),
    ([(4, 4)], 3, 3, "per-member", np.float64),
]


@pytest.mark.parametrize(("dims", "n_members", "B", "inputs", "compute"), CASES,
                         ids=[f"{'-'.join(str(a) for a, _ in c[0])}-{c[0][-1][1]}-N{c[1]}-B{c[2]}-{c[3]}-"
                              f"{np.dtype(c[4]).name}" for c in CASES])
def test_population_matches_numpy_path_and_cpu_kernel(dims, n_members, B, inputs, compute):
    from loomlab.gpu.population_cuda import forward

    w, layers, acts = population(dims, n_members, seed=n_members * 10 + B)
    rng = np.random.default_rng(B)
    n_in = dims[0][0]
    h = (rng.standard_normal((B, n_in)) if inputs == "shared"
         else rng.standard_normal((n_members, B, n_in + 2))).astype(np.float32)  # rows read as batch_rows
    got = forward(h, w, layers, acts, compute, threads=THREADS)
    assert isinstance(got, np.ndarray) and got.dtype == np.float32
    assert got.shape == (n_members, B, dims[-1][1])
    rtol, atol = (2e-5, 2e-6) if compute is np.float32 else (1e-6, 1e-7)
    np.testing.assert_allclose(got, numpy_path(h, w, layers, acts, compute), rtol=rtol, atol=atol)
    np.testing.assert_allclose(got, batched_kernel.forward(h, w, layers, acts, compute), rtol=rtol, atol=atol)


def test_weights_on_the_device_give_device_output():
    from numba import cuda

    from loomlab.gpu.population_cuda import forward

    w, layers, acts = population([(3, 4), (4, 2)], 2, seed=5)
    h = np.linspace(-1, 1, 3, dtype=np.float32)[None]
    got = forward(cuda.to_device(h), cuda.to_device(w), layers, acts, np.float32, threads=THREADS)
    assert not isinstance(got, np.ndarray)
    np.testing.assert_allclose(got.copy_to_host(), numpy_path(h, w, layers, acts, np.float32),
                               rtol=2e-5, atol=2e-6)


def test_bad_input_is_named():
    from loomlab.gpu.population_cuda import MAX_WIDTH, forward

    w, layers, acts = population([(3, 4), (4, 2)], 2, seed=6)
    h = np.zeros((1, 3), np.float32)
    with pytest.raises(LoomConfigError, match="float32 or float64; got float16"):
        forward(h, w, layers, acts, np.float16)
    with pytest.raises(LoomShapeError, match=r"acts \(1, 2\)"):
        forward(h, w, layers, acts[:1], np.float32)
    with pytest.raises(LoomShapeError, match="reach past the 19 weights"):
        forward(h, w[:, :19], layers, acts, np.float32)
    with pytest.raises(LoomShapeError, match="narrower than the first layer's 3 inputs"):
        forward(h[:, :2], w, layers, acts, np.float32)
    with pytest.raises(LoomShapeError, match=f"exceed {MAX_WIDTH} floats"):
        forward(np.zeros((MAX_WIDTH, 3), np.float32), w, layers, acts, np.float32)
    with pytest.raises(LoomShapeError, match=r"\[N=2, B, width\]; got \(3, 1, 3\)"):
        forward(np.zeros((3, 1, 3), np.float32), w, layers, acts, np.float32)
