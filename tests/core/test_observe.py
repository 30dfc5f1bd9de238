"""Observers (Loom's PolyLayerEvent / LayerStats), blueprint and memory accounting."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest

from loomlab.core import (
    AggregatingObserver,
    CallbackObserver,
    ConsoleObserver,
    LayerStats,
    VolumetricNetwork,
    load_network,
    make_layer,
    observe,
)

from .goldens import case_input, forward_case


def two_layer_net():
    net = VolumetricNetwork(1, 1, 1, 2)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=3, output_height=2, activation="Tanh",
                                 weights=[0.1, 0.2, 0.3, -0.4, 0.5, -0.6])
    net[0, 0, 0, 1] = make_layer("Parallel", combine_mode="add", children=[
        make_layer("Dense", input_height=2, output_height=2, weights=[1, 0, 0, 1]), make_layer("Residual")])
    return net


def test_layer_stats_follow_looms_float32_formula():
    a = np.array([0.5, -2.0, 0.0, 1e-7, 3.25], np.float32)
    s = LayerStats.of(a)
    f = a.astype(np.float32)
    avg = np.float32(f.sum() / 5)
    assert s.avg == pytest.approx(float(avg))
    assert s.std == pytest.approx(float(np.sqrt(np.float32((f * f).sum() / 5) - avg * avg)), rel=1e-6)
    assert (s.min, s.max, s.active, s.total) == (-2.0, 3.25, 3, 5)
    assert LayerStats.of(np.zeros(0)) == LayerStats()


def loom_stats(values) -> tuple:
    """Loom's ComputeLayerStats as written (spec §8.2): one float32 loop in index order."""
    f = [np.float32(v) for v in np.asarray(values).reshape(-1)]
    total = squares = np.float32(0)
    lo = hi = f[0]
    active = 0
    for v in f:
        total, squares = np.float32(total + v), np.float32(squares + v * v)
        lo, hi = min(lo, v), max(hi, v)
        active += bool(abs(v) > np.float32(1e-6))
    avg = np.float32(total / np.float32(len(f)))
    var = np.float32(np.float32(squares / np.float32(len(f))) - avg * avg)
    std = np.float32(np.sqrt(max(var, np.float32(0))))
    return float(avg), float(std), float(lo), float(hi), active, len(f)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_layer_stats_accumulate_in_looms_order(dtype):
    rng = np.random.default_rng(3)
    a = (rng.standard_normal((7, 300)) * 10).astype(dtype)[:, ::2]  # strided: copied, not misread
    a[0, 0] = 0.0
    s = LayerStats.of(a)
    # exact, not approximate: sums in index order, as Loom's loop (numpy's pairwise sums differ)
    assert (s.avg, s.std, s.min, s.max, s.active, s.total) == loom_stats(a)


def test_forward_and_backward_events_carry_positions_and_stats():
    net = two_layer_net()
    events = []
    net.attach(CallbackObserver(events.append))
    x = np.array([[1, 2, 3]], np.float32)
    y = net.forward(x, train=True)
    net.backward(np.ones_like(y))
    fwd = [(e.l, e.path, e.layer_type) for e in events if e.type == "forward"]
    # children run (and report) before their container finishes
    assert fwd == [(0, "", 0), (1, "parallel_branches[0]", 0), (1, "parallel_branches[1]", 18), (1, "", 16)]
    first = events[0]
    h = np.tanh(np.array([1.4000001, -1.2]))
    assert first.stats.avg == pytest.approx(h.mean(), rel=1e-6) and first.stats.total == 2
    bwd = [e for e in events if e.type == "backward"]
    assert [(e.l, e.path) for e in bwd][0] == (1, "")
    assert bwd[0].stats.avg == 1.0 and bwd[0].step_count == 1


def test_no_statistics_are_computed_without_observers(monkeypatch):
    net = two_layer_net()
    monkeypatch.setattr(observe.LayerStats, "of", classmethod(lambda cls, a: pytest.fail("stats computed")))
    net.forward(np.ones((1, 3), np.float32))
    obs = net.attach(CallbackObserver(lambda e: None))
    net.detach(obs)
    net.forward(np.ones((1, 3), np.float32))


class FakeClock:
    """Seconds that advance by ``tick`` each time they are read."""

    def __init__(self, tick: float):
        self.now, self.tick = 0.0, tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now


def test_a_rate_limited_observer_sees_whole_passes_and_skipped_ones_cost_nothing(monkeypatch):
    net = two_layer_net()
    events = []
    # 3 passes a second, one pass every 0.125 s (clock 0.125, 0.25, ... 0.875): the first pass in
    # each third of a second is due, passes 0, 2 and 5
    net.attach(CallbackObserver(events.append, max_rate_hz=3, clock=FakeClock(0.125)))
    computed = []
    of = observe.LayerStats.of.__func__
    monkeypatch.setattr(observe.LayerStats, "of",
                        classmethod(lambda cls, a: computed.append(1) or of(cls, a)))
    for _ in range(7):
        y = net.forward(np.ones((1, 3), np.float32), train=True)
        net.backward(np.ones_like(y))
    forward_steps = sorted({e.step_count for e in events if e.type == "forward"})
    assert forward_steps == [0, 2, 5]
    # each sampled pass is whole: 4 forward events, and the backward of the same pass
    for step in forward_steps:
        assert sum(e.type == "forward" and e.step_count == step for e in events) == 4
        assert sum(e.type == "backward" and e.step_count == step + 1 for e in events) == 4
    assert len(computed) == len(events) == 3 * 8


class SharedClock:
    """One clock read by several observers: it advances only when the test says so."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_observers_at_one_rate_share_their_passes_and_stats_are_computed_once(monkeypatch):
    net = two_layer_net()
    clock = SharedClock()
    first, second = [], []
    net.attach(CallbackObserver(first.append, max_rate_hz=10, clock=clock))
    clock.now = 0.04  # the second starts part-way through a 0.1 s slot
    net.attach(CallbackObserver(second.append, max_rate_hz=10, clock=clock))
    computed = []
    of = observe.LayerStats.of.__func__
    monkeypatch.setattr(observe.LayerStats, "of",
                        classmethod(lambda cls, a: computed.append(1) or of(cls, a)))
    for i in range(12):  # a pass every 0.03 s from 0.04 s: slots of 0.1 s hold 3 or 4 passes
        clock.now = 0.04 + 0.03 * i
        net.forward(np.ones((1, 3), np.float32))
    steps = sorted({e.step_count for e in first})
    # the first pass in each slot: 0.04, 0.10, 0.22, 0.31 (steps 0, 2, 6, 9), not 0.1 s after
    # each observer's own previous pass
    assert steps == [0, 2, 6, 9]
    assert sorted({e.step_count for e in second}) == steps
    assert len(computed) == len(first) == len(second) == 4 * 4  # once per event, for both


def test_rate_limits_are_validated():
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="max_rate_hz"):
            CallbackObserver(print, max_rate_hz=bad)


def test_aggregating_observer_windows_and_ring_buffer():
    agg = AggregatingObserver(window=2, capacity=3)
    net = two_layer_net()
    net.attach(agg)
    outs = []
    for i in range(8):
        outs.append(net.forward(np.full((1, 3), i - 4, np.float32)))
    key = ("forward", 0, 0, 0, 1, "")
    hist = agg.history(key)
    assert len(hist) == 3  # 8 events -> 4 windows, ring keeps the last 3
    last = [LayerStats.of(o) for o in outs[-2:]]
    assert hist[-1].avg == pytest.approx((last[0].avg + last[1].avg) / 2)
    assert hist[-1].max == max(0.0, last[0].max, last[1].max)
    assert hist[-1].min == min(0.0, last[0].min, last[1].min)
    assert hist[-1].active == (last[0].active + last[1].active) // 2


def test_console_observer_prints_looms_lines():
    buf = io.StringIO()
    net = two_layer_net()
    net.attach(ConsoleObserver(buf))
    net.forward(np.array([[1, 2, 3]], np.float32))
    assert buf.getvalue().splitlines()[0] == "[FWD] (0,0,0,0) Dense: avg=0.0258 max=0.8854 active=2/2"


def test_blueprint_and_memory_accounting():
    net = load_network(json.dumps(forward_case("transformer_block")["network"]))
    rows = net.blueprint()
    assert [r.type for r in rows] == ["RMSNorm", "MultiHeadAttention", "RMSNorm", "SwiGLU"]
    d, kv, ffn = 16, 8, 32
    mha = 2 * d * d + 2 * kv * d + d + 2 * kv + d
    assert [r.parameters for r in rows] == [d, mha, d, 3 * d * ffn + 2 * ffn + d]
    assert net.parameter_count() == sum(r.parameters for r in rows)
    assert net.memory_bytes() == 4 * net.parameter_count() == net.memory_by_dtype()["float32"]
    assert net.forward(case_input(forward_case("transformer_block"))).shape == (3, 16)  # SwiGLU: [R, d]


def test_memory_counts_packed_bytes_per_dtype():
    from loomlab.core.enums import dtype_nbytes

    assert [dtype_nbytes(d, 9) for d in ("float64", "float16", "int8", "int4", "ternary", "binary")] == \
        [72, 18, 9, 5, 3, 2]
