"""Batched forward of many networks: each member's output against its own forward (the oracle),
on random and NEAT-mutated populations in both precisions; grouping; results independent of
which members are batched together; errors per member."""

import numpy as np
import pytest

from loomlab.core import CallbackObserver, LoomConfigError, LoomError, LoomShapeError, make_layer
from loomlab.core.evolve.search.batched import NetworkStack, forward_many, forward_stacked, group_key

from ...mutants import mlp, mutate


def assert_same_as_forward(nets, x, outs):
    """Equal to each member's own forward up to float32 rounding."""
    assert len(outs) == len(nets)
    for net, y in zip(nets, outs, strict=True):
        ref = net.forward(x)
        assert y.shape == ref.shape and y.dtype == ref.dtype
        scale = max(float(np.abs(ref).max(initial=0)), 1.0)
        np.testing.assert_allclose(y, ref, rtol=2e-6, atol=2e-6 * scale)


def population(rng, n, sizes, *, precision="loom", rate=0.3):
    d = sizes[1]
    return [mutate(mlp(sizes, rng, precision=precision), rng, d, rate) for _ in range(n)]


@pytest.mark.parametrize("precision", ["loom", "fast"])
@pytest.mark.parametrize("batch", [1, 5])
def test_random_mlps_equal_their_own_forward(precision, batch):
    rng = np.random.default_rng(1)
    nets = [mlp([6, 16, 16, 3], rng, act, precision=precision)
            for act in ["Tanh", "ReLU", "Sigmoid", "GELU", "Silu", "LeakyReLU"] for _ in range(5)]
    x = rng.standard_normal((batch, 6)).astype(np.float32)
    stacked = forward_stacked(nets, x)
    assert [len(members) for members, _ in stacked] == [30]  # one shape: one group, 6 activations
    assert_same_as_forward(nets, x, forward_many(nets, x))


@pytest.mark.parametrize("precision", ["loom", "fast"])
def test_mutated_population_equals_own_forward(precision):
    rng = np.random.default_rng(2)
    nets = population(rng, 120, [4, 4, 4, 4], precision=precision)
    x = rng.standard_normal((3, 4)).astype(np.float32)
    outs = forward_many(nets, x, catch=LoomError)
    ok = [(net, y) for net, y in zip(nets, outs, strict=True) if not isinstance(y, Exception)]
    assert len(ok) > 60
    assert_same_as_forward([n for n, _ in ok], x, [y for _, y in ok])
    for net, y in zip(nets, outs, strict=True):
        if isinstance(y, Exception):
            with pytest.raises(type(y)):
                net.forward(x)
    batched = sum(len(m) for m, r in forward_stacked(nets, x, catch=LoomError) if len(m) > 1)
    assert batched > 40  # most mutants are still Dense chains and share a group


def test_results_do_not_depend_on_the_other_members():
    # the same member alone, in a chunk or in the whole population: bit-identical (Dask chunks)
    rng = np.random.default_rng(3)
    nets = population(rng, 60, [2, 8, 1], rate=0.2) + population(rng, 20, [2, 8, 1], precision="fast")
    x = np.array([[0, 0], [0, 1], [1, 0], [1, 1]], np.float32)
    whole = forward_many(nets, x, catch=LoomError)
    chunks = [y for i in range(0, len(nets), 7) for y in forward_many(nets[i:i + 7], x, catch=LoomError)]
    for i, net in enumerate(nets):
        alone = forward_many([net], x, catch=LoomError)[0]
        for other in (chunks[i], whole[i]):
            if isinstance(alone, Exception):
                assert type(other) is type(alone)
            else:
                np.testing.assert_array_equal(other, alone)


def test_grouping_follows_enabled_shapes_not_dtypes():
    rng = np.random.default_rng(4)
    a, b = mlp([3, 5, 2], rng), mlp([3, 5, 2], rng)
    b.cells[0].weights.morph("int8")
    b.cells[0].cfg.dtype = "int8"
    c = mlp([3, 5, 5, 2], rng)
    c.cells[1].cfg.is_disabled = True  # enabled chain 3 -> 5 -> 2, as a and b
    other_act = mlp([3, 5, 2], rng, "ReLU")
    other_size = mlp([3, 4, 2], rng)
    fast = mlp([3, 5, 2], rng, precision="fast")
    assert group_key(a) == group_key(b) == group_key(c)
    assert group_key(other_act) == group_key(a)  # activations differ: one matmul, own activations
    assert len({group_key(n) for n in (a, other_size, fast)}) == 3
    nets = [a, other_act, b, other_size, c, fast]
    x = rng.standard_normal((2, 3)).astype(np.float32)
    assert sorted(sorted(m) for m, _ in forward_stacked(nets, x)) == [[0, 1, 2, 4], [3], [5]]
    assert_same_as_forward(nets, x, forward_many(nets, x))


def test_members_that_cannot_be_batched_run_their_own_forward():
    rng = np.random.default_rng(5)
    norm = mlp([4, 4, 2], rng)
    norm[0, 0, 0, 0] = make_layer("RMSNorm", input_height=4, output_height=4, rng=rng)
    watched = mlp([4, 4, 2], rng)
    events = []
    watched.attach(CallbackObserver(events.append))
    assert group_key(norm) is None and group_key(watched) is None
    nets = [norm, watched, mlp([4, 4, 2], rng)]
    x = rng.standard_normal((2, 4)).astype(np.float32)
    assert_same_as_forward(nets, x, forward_many(nets, x))
    assert len([e for e in events if e.type == "forward"]) == 2 * 2  # 2 layers: forward_many, oracle


def test_input_reading_and_dtypes_match_forward():
    rng = np.random.default_rng(6)
    nets = [mlp([4, 6, 4, 2], rng), mlp([4, 6, 4, 2], rng, precision="fast")]
    for x in (rng.standard_normal((1, 3, 4)),  # B = 1 row of 4 values read from a [1, 3, 4] tensor
              rng.standard_normal((2, 9)),  # rows read from the flat tensor: B = 2 rows of 4
              rng.standard_normal((5, 4))):  # float64 stays float64
        for xx in (x.astype(np.float32), x):
            assert_same_as_forward(nets, xx, forward_many(nets, xx))
    # a chain whose widths shrink below the next layer's input: 4 -> 6 reads, 6 -> 2 then 3 fails
    broken = mlp([4, 6, 2], rng)
    broken.cells.append(None)
    broken.layers_per_cell = 3
    broken[0, 0, 0, 2] = make_layer("Dense", input_height=3, output_height=1, rng=rng)
    x = rng.standard_normal((2, 4)).astype(np.float32)
    with pytest.raises(LoomShapeError):
        forward_many([broken], x)
    (err,) = forward_many([broken], x, catch=LoomShapeError)
    assert isinstance(err, LoomShapeError)
    with pytest.raises(LoomShapeError):
        forward_many(nets, np.zeros((0, 4), np.float32))


def test_all_layers_disabled_returns_the_input():
    rng = np.random.default_rng(7)
    net = mlp([3, 3, 3], rng)
    for layer in net.cells:
        layer.cfg.is_disabled = True
    x = rng.standard_normal((2, 3))
    (y,) = forward_many([net], x.astype(np.float32))
    np.testing.assert_array_equal(y, x.astype(np.float32))
    assert forward_many([], x) == []


def test_batched_pass_counts_as_a_forward():
    rng = np.random.default_rng(8)
    net = mlp([2, 3, 1], rng)
    x = np.ones((1, 2), np.float32)
    net.forward(x, train=True)
    steps = net.step_count
    forward_many([net], x)
    assert net.step_count == steps + 1
    with pytest.raises(LoomConfigError):  # as after forward(train=False): nothing to back-propagate
        net.backward(np.ones((1, 1), np.float32))


def test_a_stack_is_a_snapshot_reused_across_inputs():
    rng = np.random.default_rng(9)
    nets = [mlp([3, 6, 2], rng) for _ in range(4)] + [mlp([3, 6, 2], rng, precision="fast") for _ in range(4)]
    stack = NetworkStack(nets)
    eye = np.eye(3, dtype=np.float32)
    before = [net.forward(eye) for net in nets]
    for x in (rng.standard_normal((2, 3)).astype(np.float32), rng.standard_normal((5, 3))):  # f32, f64
        assert_same_as_forward(nets, x, stack.forward(x))
    nets[0].cells[0].weights.master *= 2  # changed after the stack was made: the stack does not see it
    nets[0].cells[0].weights.touch()
    np.testing.assert_allclose(stack.forward(eye)[0], before[0], rtol=1e-6)
    assert_same_as_forward(nets, eye, NetworkStack(nets).forward(eye))  # a new stack does


@pytest.mark.parametrize("precision", ["loom", "fast"])
@pytest.mark.parametrize("rows", [1, 2, 8, 9, 33])  # the compiled loop up to 8 rows, matmul above
def test_mixed_activations_share_a_group_and_equal_their_own_forward(precision, rows):
    # members of one shape with every activation per layer, interleaved: one group, each member's
    # activation applied to its own slice (members reordered by activation inside the group)
    rng = np.random.default_rng(10)
    acts = ["ReLU", "Silu", "GELU", "Tanh", "Sigmoid", "Linear", "LeakyReLU", "ReLU2"]
    nets = []
    for k in range(40):
        net = mlp([5, 7, 6, 3], rng, precision=precision)
        for j, layer in enumerate(net.cells):
            layer.cfg.activation = acts[(k * (j + 1) + j) % len(acts)]
        nets.append(net)
    x = rng.standard_normal((rows, 5)).astype(np.float32) * 2
    stacked = forward_stacked(nets, x)
    assert len(stacked) == 1 and sorted(stacked[0][0]) == list(range(40))
    assert_same_as_forward(nets, x, forward_many(nets, x))
    assert_same_as_forward(nets, x, NetworkStack(nets).forward(x))


@pytest.mark.parametrize("precision", ["loom", "fast"])
def test_nan_and_signed_zero_pass_through_the_batched_relu_family(precision):
    # an input row of NaN and a zero row (pre-activations -0.0 or 0.0): the same as forward, bit for bit
    # in sign and NaN position (the compiled loop sums in another order, so values to rounding)
    rng = np.random.default_rng(11)
    nets = [mlp([3, 4, 2], rng, act, precision=precision) for act in ("ReLU", "LeakyReLU", "ReLU2", "Tanh")
            for _ in range(3)]
    for net in nets[:6]:
        net.cells[0].weights.master[:] = -np.abs(net.cells[0].weights.master)  # negative: -0.0 from 0 input
        net.cells[0].weights.touch()
    x = np.array([[np.nan, 1, 2], [0, 0, 0], [-0.0, -0.0, -0.0], [1, -2, 3]], np.float32)
    with np.errstate(invalid="ignore"):
        outs = forward_many(nets, x)
        for net, y in zip(nets, outs, strict=True):
            ref = net.forward(x)
            np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
            np.testing.assert_array_equal(np.signbit(y[~np.isnan(y)]), np.signbit(ref[~np.isnan(ref)]))
            np.testing.assert_allclose(y, ref, rtol=2e-6, atol=2e-6)


def test_parallel_and_serial_kernel_give_the_same_bits():
    # 300 members of 64x64 at one row pass the compiled loop's threading threshold together, not
    # alone: every member's bits are the same either way (Dask chunks, bit-identical fitness)
    rng = np.random.default_rng(12)
    nets = [mlp([64, 64, 64], rng, precision=p) for p in ("fast", "loom") for _ in range(150)]
    x = rng.standard_normal((1, 64)).astype(np.float32)
    whole = forward_many(nets, x)
    for i in (0, 149, 150, 299):
        np.testing.assert_array_equal(forward_many([nets[i]], x)[0], whole[i])
    assert_same_as_forward(nets, x, whole)


def test_large_layers_take_the_matmul_and_equal_their_own_forward():
    rng = np.random.default_rng(13)
    nets = [mlp([300, 260, 2], rng, "Tanh", precision=p) for p in ("fast", "loom") for _ in range(2)]
    x = rng.standard_normal((1, 300)).astype(np.float32)
    assert_same_as_forward(nets, x, forward_many(nets, x))


def test_runs_of_equal_activations():
    from loomlab.core.evolve.search.batched import _runs

    assert _runs([]) == []
    assert _runs([3]) == [(0, 1, 3)]
    assert _runs([0, 0, 5, 5, 5, -1]) == [(0, 2, 0), (2, 5, 5), (5, 6, -1)]


ALL_ACTS = ["ReLU", "Silu", "GELU", "Tanh", "Sigmoid", "Linear", "LeakyReLU", "ReLU2"]


@pytest.mark.parametrize("precision", ["loom", "fast"])
@pytest.mark.parametrize("batch", [1, 3])
@pytest.mark.parametrize("act", ALL_ACTS)
def test_fused_kernel_equals_own_forward_per_activation(precision, batch, act):
    # small layers, <= 8 rows: one compiled call runs every layer and activation of each member
    rng = np.random.default_rng(14)
    nets = [mlp([12, 16, 16, 4], rng, act, precision=precision) for _ in range(20)]
    x = (rng.standard_normal((batch, 12)) * 2).astype(np.float32)
    assert_same_as_forward(nets, x, NetworkStack(nets).forward(x))


@pytest.mark.parametrize("precision", ["loom", "fast"])
def test_fused_kernel_alone_chunked_and_whole_give_the_same_bits(precision):
    # 200 members of 32-64-64-8 with per-member activations pass the threading threshold
    # (PARALLEL_MIN_MACS) together, not alone or in chunks of 7: the same bits every way
    rng = np.random.default_rng(15)
    nets = []
    for k in range(200):
        net = mlp([32, 64, 64, 8], rng, precision=precision)
        for j, layer in enumerate(net.cells):
            layer.cfg.activation = ALL_ACTS[(k + j) % len(ALL_ACTS)]
        nets.append(net)
    x = rng.standard_normal((2, 32)).astype(np.float32)
    whole = NetworkStack(nets).forward(x)
    chunks = [y for i in range(0, len(nets), 7) for y in NetworkStack(nets[i:i + 7]).forward(x)]
    for i in range(len(nets)):
        alone = NetworkStack([nets[i]]).forward(x)[0]
        np.testing.assert_array_equal(whole[i], alone)
        np.testing.assert_array_equal(chunks[i], alone)
    if precision == "loom":  # float32 sums here cancel from terms of ~13 to ~0.2: the summation
        assert_same_as_forward(nets, x, whole)  # order alone moves them by ~4e-6 (BLAS vs ours)


def test_small_layers_after_a_large_one_take_the_kernel_per_member():
    # 300x200 takes the matmul; its output feeds the fused kernel (its 200 -> 16 -> 3 layers),
    # each member from its own rows; 9 rows take the matmul for every layer
    rng = np.random.default_rng(16)
    nets = [mlp([300, 200, 16, 3], rng, act, precision=p)
            for act in ("Tanh", "ReLU") for p in ("fast", "loom") for _ in range(2)]
    for rows in (1, 9):
        x = rng.standard_normal((rows, 300)).astype(np.float32)
        assert_same_as_forward(nets, x, forward_many(nets, x))


@pytest.mark.parametrize("precision", ["loom", "fast"])
def test_nan_and_inf_inputs_through_every_fused_activation(precision):
    rng = np.random.default_rng(17)
    nets = [mlp([3, 5, 2], rng, act, precision=precision) for act in ALL_ACTS]
    x = np.array([[np.nan, 1, 2], [np.inf, 0, 0], [-np.inf, 1, 0], [1e30, -1e30, 3]], np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        outs = forward_many(nets, x)
        for net, y in zip(nets, outs, strict=True):
            ref = net.forward(x)
            np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
            np.testing.assert_array_equal(np.isinf(y), np.isinf(ref))
            ok = np.isfinite(ref)
            np.testing.assert_allclose(y[ok], ref[ok], rtol=2e-6, atol=2e-6)


def test_kernel_tanh_is_within_one_float32_ulp():
    from loomlab.core.evolve.search.batched_kernel import _tanh

    tanh = numba_vectorize(_tanh)
    v = np.concatenate([np.linspace(-12, 12, 400_001), np.geomspace(1e-30, 1e-2, 1001),
                        [0.0, -0.0, np.inf, -np.inf, np.nan, 9.0, 9.02, -9.02]])
    with np.errstate(invalid="ignore"):  # +-inf: the rational's inf/inf, not the result, is NaN
        ours, ref = tanh(v).astype(np.float32), np.tanh(v).astype(np.float32)
    ulps = np.abs(ours.view(np.int32).astype(np.int64) - ref.view(np.int32).astype(np.int64))
    assert ulps[~np.isnan(ref)].max() <= 1
    assert np.isnan(ours[np.isnan(ref)]).all()
    np.testing.assert_array_equal(np.signbit(ours[v == 0]), np.signbit(v[v == 0]))  # -0.0 stays -0.0


def numba_vectorize(fn):
    import numba

    return numba.vectorize(["float64(float64)"])(fn.py_func)


@pytest.mark.parametrize("precision", ["loom", "fast"])
def test_rows_through_their_own_members_equal_each_member_alone(precision):
    """forward_rows (a control task's step: each row its own member's observation) gives each row
    the bits of that member's stack alone on that row, in any company and order, and its own
    forward's output to float32 rounding; members that raise get their exception."""
    rng = np.random.default_rng(5)
    nets = population(rng, 60, [4, 6, 6, 2], precision=precision, rate=0.4)
    x = rng.standard_normal((300, 4)).astype(np.float32)
    members = rng.integers(0, len(nets), 300)
    got = {}
    for rows, y in NetworkStack(nets).forward_rows(x, members, catch=LoomError):
        for j, r in enumerate(rows):
            got[int(r)] = y if isinstance(y, BaseException) else y[j]
    assert sorted(got) == list(range(300))
    kinds = set()
    for r, i in enumerate(members):
        nets[i].reset_state()  # an attention layer's KV cache: each row from a fresh state
        try:
            alone = NetworkStack([nets[i]]).forward(x[r:r + 1])[0]
        except LoomError as e:
            assert type(got[r]) is type(e)
            kinds.add("raised")
            continue
        assert got[r].tobytes() == np.asarray(alone).reshape(-1).tobytes()
        nets[i].reset_state()
        ref = nets[i].forward(x[r:r + 1]).reshape(-1)
        np.testing.assert_allclose(got[r], ref, rtol=2e-6, atol=2e-6 * max(float(np.abs(ref).max()), 1.0))
        kinds.add("kernel" if group_key(nets[i]) is not None else "own forward")
    assert {"kernel", "own forward"} <= kinds
    shuffled = rng.permutation(300)
    for rows, y in NetworkStack(nets[::-1]).forward_rows(x[shuffled], len(nets) - 1 - members[shuffled],
                                                         catch=LoomError):
        for j, r in enumerate(rows):
            if not isinstance(y, BaseException):
                assert y[j].tobytes() == got[int(shuffled[r])].tobytes()
