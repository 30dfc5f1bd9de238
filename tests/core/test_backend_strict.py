"""Every layer family under array-api-strict, the backend that refuses what CuPy would refuse.

Oracles: Loom's golden outputs (tests/data, as on numpy), numpy's own forward and backward on the
same network (float32 tolerance), and central finite differences (tests/core/gradcheck.py). The
strict backend computes on the simulated ``device1``: any implicit host conversion, non-standard
call or mixing of devices in the layer code raises there, so a pass here is that proof.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pytest

from loomlab.core import load_network, make_layer
from loomlab.core.backend import get_backend
from loomlab.core.errors import LoomConfigError
from loomlab.core.network import VolumetricNetwork

from .goldens import case_input, goldens
from .gradcheck import assert_gradients, single

pytest.importorskip("array_api_strict", reason="the strict backend needs array-api-strict (dev extra)")

BACKENDS = ["numpy", "strict"]
CASES = goldens()["forward"]  # every layer family, containers, a grid and the 20 morphed dtypes


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_golden_forward_on_every_backend(case, backend):
    net = load_network(json.dumps(case["network"]), backend=backend)
    y = net.forward(case_input(case))
    assert isinstance(y, np.ndarray) == (backend == "numpy")  # strict output stays on its device
    np.testing.assert_allclose(net.backend.to_numpy(y).ravel(), np.asarray(case["output"], np.float32),
                               rtol=1e-5, atol=1e-6)


def _layer_cases():
    """(id, layer factory, input shape, input kind): one or more small layers per family."""
    r = np.random.default_rng(3)

    def dense(n_in, n_out, act):
        return make_layer("Dense", input_height=n_in, output_height=n_out, activation=act, rng=r,
                          init_scale=0.8)

    def conv(kind, sizes_in, sizes_out, **kw):
        fields = {"CNN1": (("input_height",), ("output_height",)),
                  "CNN3": (("input_depth", "input_height", "input_width"),
                           ("output_depth", "output_height", "output_width")),
                  "ConvTransposed2D": (("input_height", "input_width"), ("output_height", "output_width")),
                  "ConvTransposed3D": (("input_depth", "input_height", "input_width"),
                                       ("output_depth", "output_height", "output_width"))}[kind]
        sizes = dict(zip(fields[0], sizes_in, strict=True)) | dict(zip(fields[1], sizes_out, strict=True))
        return lambda: make_layer(kind, input_channels=2, filters=2, rng=r, init_scale=0.7, **sizes, **kw)

    def gated_parallel():
        par = make_layer("Parallel", combine_mode="filter",
                         children=[dense(3, 3, "Tanh"), dense(3, 3, "Silu")])
        par.gate = dense(3, 2, "Linear")
        return par

    activations = ["ReLU", "Silu", "Gelu", "Tanh", "Sigmoid", "LeakyReLU", "ReLU2", "Linear"]
    return [
        *((f"dense_{act.lower()}", (lambda a=act: dense(5, 4, a)), (3, 5), "normal") for act in activations),
        ("rmsnorm", lambda: make_layer("RMSNorm", input_height=4, output_height=4, rng=r, init_scale=1.0),
         (3, 4), "normal"),
        ("layernorm", lambda: make_layer("LayerNorm", input_height=4, output_height=4, rng=r,
                                         init_scale=1.0), (3, 4), "normal"),
        ("swiglu", lambda: make_layer("SwiGLU", input_height=4, output_height=5, rng=r, init_scale=0.7),
         (3, 4), "normal"),
        ("embedding", lambda: make_layer("Embedding", vocab_size=5, embedding_dim=3, activation="Tanh",
                                         rng=r, init_scale=1.0), (1, 5), "ids"),
        ("mha_gqa", lambda: make_layer("MultiHeadAttention", d_model=8, num_heads=4, num_kv_heads=2,
                                       rng=r, init_scale=0.5), (1, 3, 8), "normal"),
        ("rnn", lambda: make_layer("RNN", input_height=3, output_height=4, seq_length=3, rng=r,
                                   init_scale=0.6), (2, 3, 3), "normal"),
        ("lstm", lambda: make_layer("LSTM", input_height=3, output_height=4, seq_length=3, rng=r,
                                    init_scale=0.6), (2, 3, 3), "normal"),
        ("cnn2", lambda: make_layer("CNN2", input_channels=2, filters=3, kernel_size=2, stride=1,
                                    padding=1, input_height=3, input_width=3, output_height=4,
                                    output_width=4, activation="Tanh", rng=r, init_scale=0.7),
         (2, 2, 3, 3), "normal"),
        ("convt1d", lambda: make_layer("ConvTransposed1D", input_channels=2, filters=2, kernel_size=3,
                                       stride=2, padding=1, input_width=3, output_width=5,
                                       activation="Sigmoid", rng=r, init_scale=0.7), (2, 2, 3), "normal"),
        ("cnn1", conv("CNN1", (5,), (3,), kernel_size=3, stride=1, activation="Silu"), (2, 2, 5), "normal"),
        ("cnn3", conv("CNN3", (3, 3, 3), (2, 2, 2), kernel_size=2, stride=1), (1, 2, 3, 3, 3), "normal"),
        ("convt2d", conv("ConvTransposed2D", (2, 2), (3, 3), kernel_size=2, stride=1, activation="Tanh"),
         (2, 2, 2, 2), "normal"),
        ("convt3d", conv("ConvTransposed3D", (2, 2, 2), (3, 3, 3), kernel_size=2, stride=1),
         (1, 2, 2, 2, 2), "normal"),
        ("kmeans_prob", lambda: make_layer("KMeans", input_height=4, num_clusters=3, activation="Sigmoid",
                                           rng=r, init_scale=1.0), (1, 4), "normal"),
        ("kmeans_feat", lambda: make_layer("KMeans", input_height=4, num_clusters=3, output_mode="features",
                                           kmeans_temperature=1.5, rng=r, init_scale=1.0), (1, 4), "normal"),
        ("softmax_sparse", lambda: make_layer("Softmax", softmax_type="Sparse"), (2, 5), "normal"),
        ("softmax_entmax", lambda: make_layer("Softmax", softmax_type="Entmax", entmax_alpha=1.5),
         (2, 5), "normal"),
        ("softmax_grid", lambda: make_layer("Softmax", softmax_type="Grid", softmax_rows=2, softmax_cols=3),
         (2, 3), "normal"),
        ("softmax_masked", lambda: make_layer("Softmax", softmax_type="Masked", temperature=0.7,
                                              mask=[True, False, True, True]), (2, 3), "normal"),
        ("softmax_hierarchical", lambda: make_layer("Softmax", softmax_type="Hierarchical",
                                                    hierarchy_levels=[2, 3]), (2, 3), "normal"),
        ("parallel_filter", gated_parallel, (1, 3), "normal"),
        ("parallel_avg", lambda: make_layer("Parallel", combine_mode="avg",
                                            children=[dense(3, 2, "Tanh"), dense(3, 2, "Silu")]),
         (2, 3), "normal"),
        ("parallel_concat", lambda: make_layer("Parallel", combine_mode="concat",
                                               children=[dense(3, 2, "Tanh"), dense(3, 3, "Silu")]),
         (2, 3), "normal"),
        ("sequential_residual", lambda: make_layer("Sequential", children=[
            dense(3, 3, "Tanh"), make_layer("Residual"), dense(3, 3, "Sigmoid"), make_layer("Residual")]),
         (2, 3), "normal"),
    ]


LAYER_CASES = _layer_cases()


def _input(shape, kind, seed=0):
    rng = np.random.default_rng(seed)
    if kind == "ids":  # token ids, one outside the vocabulary (a zero row, no gradient)
        return np.array([[0.5, 2.5, 2.5, 9.5, 4.5]])
    return rng.standard_normal(shape)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,factory,shape,kind", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_gradients_match_finite_differences_on_every_backend(name, factory, shape, kind, backend):
    net = single(factory(), backend)
    assert_gradients(net, _input(shape, kind), prepare=net.reset_state, max_params=120)


@pytest.mark.parametrize("device", ["strict", "strict-no-float64"])
@pytest.mark.parametrize("name,factory,shape,kind", LAYER_CASES, ids=[c[0] for c in LAYER_CASES])
def test_strict_forward_and_backward_equal_numpys_in_float32(name, factory, shape, kind, device):
    layer = factory()
    x = _input(shape, kind, seed=1).astype(np.float32)
    results = []
    for backend in ("numpy", device):
        net = single(layer, backend)
        net.precision = "fast"  # float32 end to end, as a GPU runs it
        net.reset_state()
        net.zero_grad()
        y = net.forward(x, train=True)
        gy = np.random.default_rng(2).standard_normal(y.shape).astype(np.float32)
        gx = net.backward(gy)
        grads = [la.grad for la in net.weighted_layers()]
        results.append((net.backend.to_numpy(y), net.backend.to_numpy(gx), grads))
    (y0, gx0, g0), (y1, gx1, g1) = results
    np.testing.assert_allclose(y1, y0, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(gx1, gx0, rtol=2e-4, atol=2e-5)
    for a, b in zip(g1, g0, strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-5)


def test_strict_arrays_live_on_the_simulated_device_and_refuse_implicit_host_copies():
    strict = get_backend("strict")
    net = single(make_layer("Dense", input_height=3, output_height=2, rng=np.random.default_rng(0)),
                 strict)
    y = net.forward(np.ones((1, 3), np.float32))
    assert str(y.device) == str(strict.device) and "device1" in repr(y.device)
    with pytest.raises(RuntimeError, match="device1"):
        np.asarray(y)  # what CuPy refuses too: the host copy must be asked for
    np.testing.assert_allclose(strict.to_numpy(y), get_backend("numpy").to_numpy(
        single(net[0, 0, 0, 0]).forward(np.ones((1, 3), np.float32))), rtol=1e-6)


def test_mixing_devices_raises():
    import array_api_strict as xps

    net = single(make_layer("Dense", input_height=3, output_height=2, rng=np.random.default_rng(0)),
                 "strict")
    other = xps.asarray(np.ones((1, 3), np.float32), device=xps.Device("device2"))
    with pytest.raises(ValueError, match="different devices"):
        net.forward(other)  # weights on device1, input on device2


def test_no_float64_device_runs_in_float32_and_refuses_loom_precision_by_name():
    layers = [make_layer("Dense", input_height=4, output_height=4, activation="Gelu",
                         rng=np.random.default_rng(1)),
              make_layer("MultiHeadAttention", d_model=4, num_heads=2, rng=np.random.default_rng(2)),
              make_layer("RMSNorm", input_height=4, output_height=4, weights=np.ones(4))]
    x = np.random.default_rng(3).standard_normal((3, 4)).astype(np.float32)

    def grid(backend):
        net = VolumetricNetwork(1, 1, 3, 1, backend=backend, precision="fast")
        for i, la in enumerate(layers):
            net[0, 0, i, 0] = la
        return net

    net = grid("strict-no-float64")
    assert not net.backend.has_float64
    y = net.forward(x, train=True)
    net.backward(np.ones(y.shape, np.float32))
    np.testing.assert_allclose(net.backend.to_numpy(y), grid("numpy").forward(x), rtol=1e-5, atol=1e-6)
    net.precision = "loom"
    with pytest.raises(LoomConfigError, match="precision 'loom' computes in float64.*precision='fast'"):
        net.forward(x)


def test_load_network_runs_a_network_on_the_strict_backend():
    case = next(c for c in CASES if c["name"] == "transformer_block")
    net = load_network(json.dumps(case["network"]), backend="strict")
    assert net.backend.name == "strict"
    np.testing.assert_allclose(net.backend.to_numpy(net.forward(case_input(case))).ravel(), case["output"],
                               rtol=1e-5, atol=1e-6)


def test_without_the_package_the_strict_backend_names_the_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "array_api_strict", None)  # makes the import fail
    with pytest.raises(LoomConfigError, match=r"'strict' backend needs array-api-strict.*pip install"):
        get_backend("strict")
