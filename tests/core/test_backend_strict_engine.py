"""The engine beyond single layers under array-api-strict: training, observers' statistics, target
propagation, the systolic step mesh and batched population evaluation.

Oracle: the same computation on numpy (whose numerics the engine's own tests pin to Loom), equal
within float32 tolerance. ``strict`` runs on the simulated ``device1`` (implicit host copies and
non-standard calls raise), ``strict-no-float64`` on a device without float64, in precision "fast".
Host transfers are counted by wrapping array_api_strict's ways off a device.
"""

from __future__ import annotations

import numpy as np
import pytest

from loomlab.core import make_layer
from loomlab.core.backend import get_backend
from loomlab.core.network import VolumetricNetwork
from loomlab.core.observe import CallbackObserver, LayerStats
from loomlab.core.train import TrainConfig, evaluate, train

pytest.importorskip("array_api_strict", reason="the strict backend needs array-api-strict (dev extra)")

STRICT = ["strict", "strict-no-float64"]


def _mlp(backend, seed=1):
    r = np.random.default_rng(seed)
    net = VolumetricNetwork(1, 1, 3, 1, backend=backend, precision="fast")
    net[0, 0, 0, 0] = make_layer("Dense", input_height=3, output_height=5, activation="Tanh", rng=r)
    net[0, 0, 1, 0] = make_layer("RMSNorm", input_height=5, output_height=5, rng=r, init_scale=1.0)
    net[0, 0, 2, 0] = make_layer("Dense", input_height=5, output_height=2, activation="Sigmoid", rng=r)
    return net


def _batches(n=3, seed=2):
    r = np.random.default_rng(seed)
    return [(r.standard_normal((4, 3)).astype(np.float32), r.random((4, 2))) for _ in range(n)]


def _masters(net):
    return [la.weights.master.copy() for la in net.weighted_layers()]


class TransferCounter:
    """Counts every way an array_api_strict array leaves its device for the host: ``to_device``
    onto the CPU device (what ``to_host`` does), Python scalar conversions (float, int, bool) and
    DLPack export (``np.from_dlpack``). ``np.asarray`` of a device array raises by itself."""

    def __init__(self, monkeypatch):
        import array_api_strict

        self.transfers: list[int] = []  # elements per transfer
        array_cls = type(array_api_strict.asarray(0.0))
        cpu = array_api_strict.Device()
        to_device = array_cls.to_device

        def counted_to_device(a, device, /, *, stream=None):
            if device == cpu and a.device != cpu:
                self.transfers.append(int(np.prod(a.shape)))
            return to_device(a, device, stream=stream)

        monkeypatch.setattr(array_cls, "to_device", counted_to_device)
        for dunder in ("__float__", "__int__", "__bool__", "__index__", "__complex__", "__dlpack__"):
            original = getattr(array_cls, dunder)

            def counted(a, *args, _f=original, **kwargs):
                if a.device != cpu:
                    self.transfers.append(int(np.prod(a.shape)))
                return _f(a, *args, **kwargs)

            monkeypatch.setattr(array_cls, dunder, counted)

    def during(self, fn) -> list[int]:
        start = len(self.transfers)
        fn()
        return self.transfers[start:]


# ----- training -------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", STRICT)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
@pytest.mark.parametrize("loss", ["mse", "crossentropy", "softmax_crossentropy"])
def test_training_on_strict_equals_numpy(loss, optimizer, backend):
    config = TrainConfig(epochs=3, loss=loss, optimizer=optimizer, learning_rate=0.05, gradient_clip=0.5)
    nets = {b: _mlp(b) for b in ("numpy", backend)}
    histories = {b: train(net, _batches(), config) for b, net in nets.items()}
    np.testing.assert_allclose(histories[backend], histories["numpy"], rtol=1e-5)
    assert histories["numpy"][-1] != histories["numpy"][0]  # the weights did move
    for a, b in zip(_masters(nets[backend]), _masters(nets["numpy"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    x, t = _batches(1, seed=5)[0]
    assert evaluate(nets[backend], [(x, t)], loss) == pytest.approx(evaluate(nets["numpy"], [(x, t)], loss),
                                                                    rel=1e-5)


@pytest.mark.parametrize("backend", STRICT)
def test_the_loss_and_its_gradient_stay_on_the_device(backend, monkeypatch):
    counter = TransferCounter(monkeypatch)
    net = _mlp(backend)
    x, t = _batches(1)[0]
    y = net.forward(x, train=True)
    from loomlab.core.train import _loss, get_loss

    crossed = counter.during(lambda: _loss(get_loss("mse"), y, t))
    assert crossed == []  # the loss, y and dL/dy stay; the training step brings the loss home
    loss, grad = _loss(get_loss("mse"), y, t)
    assert str(loss.device) == str(grad.device) == str(net.backend.device) and loss.shape == ()
    ref_loss, ref_grad = _loss(get_loss("mse"), net.backend.to_numpy(y), t)
    assert float(net.backend.to_numpy(loss)) == pytest.approx(ref_loss, rel=1e-6)
    np.testing.assert_allclose(net.backend.to_numpy(grad), ref_grad, rtol=1e-6)


@pytest.mark.parametrize("backend", STRICT)
@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_a_training_step_sends_the_host_one_transfer_of_the_loss_and_a_finite_flag(optimizer, backend,
                                                                                  monkeypatch):
    counter = TransferCounter(monkeypatch)
    net, ref = _mlp(backend), _mlp("numpy")
    config = TrainConfig(epochs=2, optimizer=optimizer, learning_rate=0.05,
                         weight_decay=0.01 if optimizer == "adamw" else 0.0)
    crossed = counter.during(lambda: train(net, _batches(3), config))
    # per step one transfer of [loss, all gradients finite]: no activation, no dL/dy, no gradient,
    # no master, no AdamW moment
    assert crossed == [2] * 6
    layers = net.weighted_layers()
    assert all(la.weights.on_device and str(la.device_grad.device) == str(net.backend.device)
               for la in layers)
    train(ref, _batches(3), config)
    for layer, host in zip(layers, ref.weighted_layers(), strict=True):
        # reading the master is the explicit way home: one copy of the layer's weights, then none
        assert counter.during(lambda la=layer: la.weights.master) == [host.weights.master.size]
        assert counter.during(lambda la=layer: la.weights.master) == []
        np.testing.assert_allclose(layer.weights.master, host.weights.master, rtol=1e-4, atol=1e-6)


def test_a_master_changed_on_the_host_is_what_the_device_trains_on_next():
    """A host change after device training (a DNA splice, a mutation) wins over the device copy."""
    nets = {b: _mlp(b) for b in ("numpy", "strict")}
    config = TrainConfig(epochs=1, optimizer="adamw", learning_rate=0.05)
    for net in nets.values():
        train(net, _batches(2), config)
        first, *others = net.weighted_layers()
        first.weights.master = first.weights.master * np.float32(1.5)  # a new host master
        for layer in others:
            np.multiply(layer.weights.master, np.float32(1.5), out=layer.weights.master)  # in place
            layer.weights.touch()
        train(net, _batches(2, seed=9), config)
    for a, b in zip(_masters(nets["strict"]), _masters(nets["numpy"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert _masters(nets["numpy"])[0] @ _masters(nets["numpy"])[0] > 0


def test_training_goes_on_where_the_backend_moves_and_a_mid_update_read_is_not_kept():
    nets = {b: _mlp(b) for b in ("numpy", "strict")}
    config = TrainConfig(epochs=1, optimizer="adamw", learning_rate=0.05)
    for net in nets.values():
        train(net, _batches(2), config)
        net.backend = get_backend("numpy")  # the device masters come home and numpy trains them
        train(net, _batches(2, seed=9), config)
    assert not any(la.weights.on_device for la in nets["strict"].weighted_layers())
    for a, b in zip(_masters(nets["strict"]), _masters(nets["numpy"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    store = _mlp("strict")[0, 0, 0, 0].weights
    on_device = store.master_on(get_backend("strict").xp)
    assert store.master.sum() != 0  # a reader (the GUI) between master_on and the update's end
    on_device *= 0.0
    store.after_update("float32")
    np.testing.assert_array_equal(store.master, 0.0)


def test_a_morphed_layer_trains_on_the_device_through_its_host_master():
    """Quantizing is host code: a morphed layer's master comes home each update (float32 ones do not)."""
    nets = {b: _mlp(b) for b in ("numpy", "strict")}
    for net in nets.values():
        net[0, 0, 0, 0].weights.morph("uint8")
        net[0, 0, 0, 0].cfg.dtype = "uint8"
        train(net, _batches(2), TrainConfig(epochs=2, learning_rate=0.05))
    morphed = nets["strict"][0, 0, 0, 0].weights
    assert not morphed.on_device and nets["strict"][0, 0, 2, 0].weights.on_device
    for a, b in zip(_masters(nets["strict"]), _masters(nets["numpy"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    assert morphed.master.min() >= 0  # spec §4.8's clamp of an unsigned type ran
    np.testing.assert_array_equal(morphed.native["uint8"], nets["numpy"][0, 0, 0, 0].weights.native["uint8"])


# ----- observers ------------------------------------------------------------------------------

def _observed_pass(backend):
    net = _mlp(backend)
    events = []
    net.attach(CallbackObserver(events.append))
    x, _ = _batches(1)[0]
    y = net.forward(x, train=True)
    net.backward(np.ones(y.shape, np.float32))
    return events


@pytest.mark.parametrize("backend", STRICT)
def test_observer_statistics_on_strict_equal_the_host_kernels(backend):
    host, device = _observed_pass("numpy"), _observed_pass(backend)
    assert len(device) == len(host) == 6  # three layers, forward and backward
    for d, h in zip(device, host, strict=True):
        assert (d.type, d.z, d.y, d.x, d.l, d.stats.active, d.stats.total) == \
               (h.type, h.z, h.y, h.x, h.l, h.stats.active, h.stats.total)
        np.testing.assert_allclose([d.stats.avg, d.stats.std, d.stats.min, d.stats.max],
                                   [h.stats.avg, h.stats.std, h.stats.min, h.stats.max], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", STRICT)
def test_observer_statistics_cross_as_one_small_transfer_per_layer_event(backend, monkeypatch):
    counter = TransferCounter(monkeypatch)
    x, _ = _batches(1)[0]
    bare = _mlp(backend)
    without = counter.during(lambda: bare.forward(x))
    observed = _mlp(backend)
    events = []
    observed.attach(CallbackObserver(events.append))
    with_obs = counter.during(lambda: observed.forward(x))
    assert len(events) == 3
    extra = list(with_obs)
    for n in without:
        extra.remove(n)
    assert extra == [5] * len(events)  # avg, std, min, max, active: never the activations


def test_device_statistics_of_a_large_tensor_equal_the_host_kernel():
    a = np.random.default_rng(4).standard_normal((64, 257)).astype(np.float32)
    a[a > 2.5] = 0.0  # some inactive elements
    host = LayerStats.of(a)
    for name in STRICT:
        device = LayerStats.of(get_backend(name).xp.asarray(a))
        assert (device.active, device.total) == (host.active, host.total)
        np.testing.assert_allclose([device.avg, device.std, device.min, device.max],
                                   [host.avg, host.std, host.min, host.max], rtol=1e-4, atol=1e-6)
    empty = get_backend("strict").xp.zeros((0, 3))
    assert LayerStats.of(empty) == LayerStats()


# ----- target propagation ---------------------------------------------------------------------

@pytest.mark.parametrize("backend", STRICT)
def test_target_propagation_on_strict_equals_numpy(backend):
    from loomlab.core.targetprop import TweenConfig, link_metrics, tween_train

    config = TweenConfig(epochs=3, batch_size=2, learning_rate=0.1)
    nets = {b: _mlp(b) for b in ("numpy", backend)}
    results = {b: tween_train(net, _batches(), config) for b, net in nets.items()}
    np.testing.assert_allclose(results[backend].losses, results["numpy"].losses, rtol=1e-5)
    assert results["numpy"].losses[-1] < results["numpy"].losses[0]
    for a, b in zip(_masters(nets[backend]), _masters(nets["numpy"]), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)
    x, t = _batches(1, seed=6)[0]
    links = {b: link_metrics(net, x, t, config) for b, net in nets.items()}
    assert links[backend].keys() == links["numpy"].keys() == {0, 1, 2}
    for cell, ref in links["numpy"].items():
        assert (links[backend][cell].budget, links[backend][cell].gap) == \
               pytest.approx((ref.budget, ref.gap), rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("backend", STRICT)
def test_a_tween_step_sends_the_host_only_reduced_numbers(backend, monkeypatch):
    from loomlab.core.targetprop import TweenConfig, tween_train

    counter = TransferCounter(monkeypatch)
    net = _mlp(backend)
    x, t = _batches(1)[0]
    crossed = counter.during(lambda: tween_train(net, [(x, t)], TweenConfig(epochs=1, batch_size=4)))
    sizes = [la.weights.master.size for la in net.weighted_layers()]  # 15, 5, 10
    assert crossed == [3, 3, 3,  # one [norms, dot, mean square] per executed layer
                       1,  # the step's squared error
                       *sizes]  # each layer's local update gradient (Layer.grad), for the host master


# ----- the systolic step mesh -----------------------------------------------------------------

def _ring(backend):
    """Cells 1 -> 2 (disabled) -> 3 -> 0 -> 1: cell 0 reads the later cell 3 (a feedback loop)."""
    r = np.random.default_rng(7)

    def dense(n_in, n_out, act, **cfg):
        return make_layer("Dense", input_height=n_in, output_height=n_out, activation=act, rng=r,
                          init_scale=0.8, **cfg)

    net = VolumetricNetwork(1, 1, 1, 4, backend=backend, precision="fast")
    for i, layer in enumerate([dense(2, 3, "Tanh", is_remote_link=True, target_l=3), dense(3, 4, "Tanh"),
                               dense(4, 4, "Tanh", is_disabled=True), dense(4, 2, "Sigmoid")]):
        net[0, 0, 0, i] = layer
    return net


@pytest.mark.parametrize("backend", STRICT)
def test_step_mesh_forward_and_bptt_on_strict_equal_numpy(backend):
    from loomlab.core.systolic import StepMesh

    r = np.random.default_rng(8)
    schedule = [r.standard_normal((2, 3)).astype(np.float32), None, None, None,
                r.standard_normal((2, 3)).astype(np.float32), None, None, None, None]
    weights = [None, None] + [r.standard_normal((2, 2)).astype(np.float32) for _ in range(7)]
    runs = {}
    for b in ("numpy", backend):
        net = _ring(b)
        mesh = StepMesh(net, record_history=True)
        outs = []
        for x in schedule:
            if x is not None:
                mesh.set_input(x)
            mesh.tick()
            outs.append([None if s is None else net.backend.to_numpy(s) for s in mesh.slots])
        net.zero_grad()
        g_inputs = [net.backend.to_numpy(g) for g in mesh.backward(weights)]
        runs[b] = outs, g_inputs, [la.grad for la in net.weighted_layers() if not la.cfg.is_disabled]
    (o0, gi0, gw0), (o1, gi1, gw1) = runs["numpy"], runs[backend]
    for tick0, tick1 in zip(o0, o1, strict=True):
        assert [s is None for s in tick1] == [s is None for s in tick0]
        for a, b in zip(tick1, tick0, strict=True):
            if b is not None:
                assert a.dtype == np.float32
                np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    assert all(np.abs(g).max() > 1e-3 for g in gi0)  # both inputs reach the loss
    for a, b in zip([*gi1, *gw1], [*gi0, *gw0], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# ----- batched population evaluation ----------------------------------------------------------

def _population(backend, n=60):
    """Mutated float32 MLPs (mixed activations, morphed dtypes, disabled layers), the same on
    every call, placed on ``backend``."""
    from .mutants import mlp, mutate

    rng = np.random.default_rng(2)
    nets = [mutate(mlp([4, 4, 4, 4], rng, precision="fast"), rng, 4, 0.3) for _ in range(n)]
    for net in nets:
        net.backend = get_backend(backend)
    return nets


@pytest.mark.parametrize("backend", STRICT)
@pytest.mark.parametrize("rows", [1, 3])
def test_batched_population_on_strict_equals_numpy(backend, rows):
    from loomlab.core.errors import LoomError
    from loomlab.core.evolve.search.batched import as_numpy, forward_many, forward_stacked

    x = np.random.default_rng(3).standard_normal((rows, 4)).astype(np.float32)
    host, device = _population("numpy"), _population(backend)
    ref, got = forward_many(host, x, catch=LoomError), forward_many(device, x, catch=LoomError)
    assert sum(not isinstance(y, Exception) for y in ref) > 30
    for a, b in zip(got, ref, strict=True):
        if isinstance(b, Exception):
            assert type(a) is type(b)
            continue
        assert str(a.device) == str(device[0].backend.device)  # outputs stay on the device
        np.testing.assert_allclose(as_numpy(a), b, rtol=2e-5, atol=2e-6)
    groups = [(m, r) for m, r in forward_stacked(device, x, catch=LoomError) if len(m) > 1]
    assert sum(len(m) for m, _ in groups) > 20  # most members really share a batched matmul
    for members, result in groups:
        np.testing.assert_allclose(as_numpy(result), np.stack([ref[i] for i in members]), rtol=2e-5,
                                   atol=2e-6)


@pytest.mark.parametrize("backend", STRICT)
def test_task_fitness_of_a_population_on_strict_equals_numpy(backend, monkeypatch):
    from loomlab.core.evolve.search.tasks import get_task

    task = get_task("xor", precision="fast")
    seed = task.seed_network()
    host = []
    for k in range(12):
        net = type(seed)(1, 1, 1, len(seed.cells), precision="fast")
        for i, layer in enumerate(task.seed_network().cells):
            layer.weights.master *= np.float32(1 + 0.1 * k)
            layer.weights.touch()
            net[0, 0, 0, i] = layer
        host.append(net)
    fitness = task.evaluate(host)
    for net in host:
        net.backend = get_backend(backend)
    counter = TransferCounter(monkeypatch)
    on_device = []
    assert counter.during(lambda: on_device.extend(task.evaluate(host))) == [12 * 4]  # one group's outputs
    np.testing.assert_allclose(on_device, fitness, rtol=1e-5)
    assert len(set(np.round(fitness, 6))) > 1  # the members really differ
