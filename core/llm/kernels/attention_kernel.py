"""Causal GQA attention as one numba kernel whose result for a query does not depend on the others.

``attend`` computes, for the query at position ``p = start + t`` and head ``h`` (KV head
``h // (H / Hkv)``), ``softmax(scale * q . k_s) @ v_s`` over the keys it sees (``lo..p``, ``lo`` set
by the sliding window); with a soft cap ``c`` (gemma2) each score ``s`` is ``tanh(s / c) * c``
first, as transformers caps them before the mask and the softmax. Every (query, head) pair runs
the same float operations in the same order whatever T is: each score a sum over d in order
(the keys are stored head_dim-major, so a vector holds 16 keys' sums and no lanes are ever
summed), the max, the exponentials (a polynomial, vectorized) and their sum in ``LANES`` float32
lanes summed in order (as the matmul kernels in :mod:`.quant` do), then the weighted sum of the
value rows, each head dim a lane. numpy's version (``qg @ keys.T``, a masked softmax, ``@
values``) summed differently by shape: a position's output changed in the last bits with the
number of queries sharing the step, and greedy output then differed with and without prefix
caching or speculative decoding.

The scores and the weighted sums are LLVM vector code (:func:`_scores_kernel`,
:func:`_values_kernel`): up to ``GROUP`` queries of one KV head (its group's heads, a step's
rows) share one pass over its keys and values, and each pass keeps its sums in registers, a fused
multiply-add a term. Attention is bound by reading the cache and by those multiply-adds, and
numba's own loops (a query at a time, sums stored and reloaded every four terms) were slower at
both (docs/kernels.md).

Keys and values are float32, or float16 stored as their ``uint16`` bits (numba cannot type
float16), converted exactly as they are loaded (:func:`.quant_int8_rows.half_to_float`).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import carray, get_num_threads, njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from ...errors import LoomShapeError
from .kernel_hints import prefetch_until, wide_vectors
from .quant import KERNEL_OPTIONS
from .quant_int8_rows import fmuladd, half_to_float, splat
from .quantize import from_bits

F32 = np.float32
LANES = 16  # float32 lanes of the exponentials' sum: one AVX-512 register
KV_DTYPES = (np.dtype(np.float32), np.dtype(np.uint16))  # float16 travels as its bits
_I32, _I64, _F32 = ir.IntType(32), ir.IntType(64), ir.FloatType()


@njit(inline="always")
def _u(i):
    """An unsigned index: numba skips its negative-index wraparound, which hides from LLVM that
    consecutive ``i`` read consecutive addresses (and keeps the loop scalar)."""
    return np.uint64(i)


@njit(inline="always")
def exp_poly(x):
    """e**x (cephes' expf: x = n ln2 + r, a degree-7 polynomial in r, times 2**n built from
    bits), within 2 ulp for x in [-87, 88]; numba's exp calls libm once per element, this one
    vectorizes. Below -87 it gives e**-87 (~1e-38: a weight that vanishes beside the max's 1),
    above 88 e**88 (~1.7e38; 2**n would overflow the exponent's bits)."""
    x = min(max(x, F32(-87.0)), F32(88.0))
    t = x * F32(1.44269504088896341) + F32(0.5)
    i = np.int32(t)  # floor(t) by conversion (exact here): numba's np.floor is a call, no vector op
    n = F32(i) - (F32(1.0) if F32(i) > t else F32(0.0))
    r = x - n * F32(0.693359375) + n * F32(2.12194440e-4)
    y = F32(1.9875691500e-4) * r + F32(1.3981999507e-3)
    y = y * r + F32(8.3334519073e-3)
    y = y * r + F32(4.1665795894e-2)
    y = y * r + F32(1.6666665459e-1)
    y = y * r + F32(5.0000001201e-1)
    y = y * (r * r) + r + F32(1)
    return y * from_bits((np.int64(n) + 127) << 23)


_VF = ir.VectorType(_F32, LANES)
_STRIPE = 4  # vectors a kernel pass sums at once: four independent sums hide an add's latency
_SPAN = _STRIPE * LANES  # scores a pass computes, head dims a pass outputs


def _lane_indices(builder, first):
    """``first + j`` in lane j."""
    iota = ir.Constant(ir.VectorType(_I64, LANES), list(range(LANES)))
    return builder.add(splat(builder, first, LANES), iota)


def _lanes_below(builder, first, limit):
    """The mask of lanes j with ``first + j < limit``."""
    return builder.icmp_signed("<", _lane_indices(builder, first), splat(builder, limit, LANES))


def _masked(builder, name, vt, args):
    fn = cgutils.get_or_insert_function(
        builder.module, ir.FunctionType(vt if name == "load" else ir.VoidType(), [a.type for a in args]),
        f"llvm.masked.{name}.v{LANES}{'f32' if vt.element == _F32 else 'i16'}.p0")
    return builder.call(fn, args)


def _load(builder, base, at, mask):
    """LANES float32 elements of ``base`` from element ``at`` (float16 bits converted exactly),
    the lanes ``mask`` leaves out read as 0 without touching memory."""
    vt = ir.VectorType(base.type.pointee, LANES)
    where = builder.bitcast(builder.gep(base, [at], inbounds=True), vt.as_pointer())
    v = _masked(builder, "load", vt, [where, _I32(1), mask, ir.Constant(vt, [0] * LANES)])
    return v if vt.element == _F32 else half_to_float(builder, v)


def _larger(builder, a, b):
    """Lane by lane ``b if b > a else a`` (``max(a, b)``: a NaN in b is passed over)."""
    return builder.select(builder.fcmp_ordered(">", b, a), b, a)


def _sums(builder, count, k, terms):
    """``k`` vector sums, each starting at 0 and adding the products ``x * y`` of the pairs
    ``terms(i)`` lists (the i-th of each sum) for i = 0 .. count - 1 in order, each as one fused
    multiply-add where the CPU has them; ``terms(i)`` may also give a mask, where the sum keeps
    its value on the lanes it leaves out."""
    accs = [cgutils.alloca_once_value(builder, ir.Constant(_VF, [0.0] * LANES)) for _ in range(k)]
    with cgutils.for_range(builder, count) as loop:
        for acc, (x, y, keep) in zip(accs, terms(loop.index), strict=True):
            old = builder.load(acc)
            new = fmuladd(builder, x, y, old)
            builder.store(new if keep is None else builder.select(keep, new, old), acc)
    return [builder.load(acc) for acc in accs]


def _element_at(builder, base, i):
    """Element ``i`` from pointer ``base`` (an array's ``.data``)."""
    return builder.load(builder.gep(base, [i], inbounds=True))


def _passes(builder, count):
    """How many passes of _SPAN elements cover ``count``."""
    return builder.udiv(builder.add(count, _I64(_SPAN - 1)), _I64(_SPAN))


def _bounds(builder, los, ps, lo, G):
    """Each of the G queries' first and last positions (arrays ``los``, ``ps``) less ``lo``."""
    return [tuple(builder.sub(_element_at(builder, a.data, _I64(g)), lo) for a in (los, ps))
            for g in range(G)]


def _within(builder, i, bounds):
    """Whether ``i`` (a scalar or vector) lies in ``bounds`` (first, last), both included."""
    return builder.and_(builder.icmp_signed(">=", i, bounds[0]), builder.icmp_signed("<=", i, bounds[1]))


def _pass_lanes(builder, index, limit):
    """The first elements of the _STRIPE vectors of pass ``index`` (_SPAN elements a pass), and
    the masks of their lanes below ``limit``."""
    firsts = [builder.add(builder.mul(index, _I64(_SPAN)), _I64(LANES * u)) for u in range(_STRIPE)]
    return firsts, [_lanes_below(builder, f, limit) for f in firsts]


def _stripe(builder, base, at, firsts, masks):
    """The pass's _STRIPE vectors of the row at element ``at`` of ``base``."""
    row = builder.gep(base, [at], inbounds=True)
    return [_load(builder, row, f, mask) for f, mask in zip(firsts, masks, strict=True)]


def _largest_lane(builder, v):
    """The largest of a vector's lanes (:func:`_larger`'s, halves against halves: the largest is
    the same in any order)."""
    half = LANES // 2
    while half:
        low, high = (ir.Constant(ir.VectorType(_I32, half), list(range(first, first + half)))
                     for first in (0, half))
        v = _larger(builder, builder.shuffle_vector(v, v, low), builder.shuffle_vector(v, v, high))
        half //= 2
    return builder.extract_element(v, _I32(0))


def _scores_kernel(G: int):
    """``scores(qs, keys_t, kv, lo, n, los, ps, scale, w, tops)``: for queries g < G (``qs[g]``,
    query g seeing positions ``los[g] .. ps[g]``), ``w[g, i] = scale * (sum over d in order of
    qs[g, d] * keys_t[kv, d, lo + i])`` for i < n, and ``tops[g]`` the largest of its own
    (NaN passed over, as ``max`` does). Each key is a vector lane (a score's sum never crosses
    lanes), _SPAN keys a pass, every key vector read once for the G queries. ``w`` rows hold n
    rounded up to _SPAN (lanes past n get 0)."""
    @intrinsic
    def scores(typingctx, qs, keys_t, kv, lo, n, los, ps, scale, w, tops):
        def codegen(context, builder, sig, args):
            qa, ka, la, pa, wa, ta = (context.make_array(sig.args[i])(context, builder, args[i])
                                      for i in (0, 1, 5, 6, 8, 9))
            kv, lo, n, scale = args[2], args[3], args[4], splat(builder, args[7], LANES)
            hd = cgutils.unpack_tuple(builder, qa.shape, 2)[1]
            cap = cgutils.unpack_tuple(builder, ka.shape, 3)[2]
            width = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            base = builder.gep(ka.data, [builder.add(builder.mul(builder.mul(kv, hd), cap), lo)],
                               inbounds=True)  # keys_t[kv, 0, lo]
            queries = [builder.gep(qa.data, [builder.mul(_I64(g), hd)], inbounds=True) for g in range(G)]
            sees = [tuple(splat(builder, b, LANES) for b in pair) for pair in _bounds(builder, la, pa, lo, G)]
            lowest = ir.Constant(_VF, [float("-inf")] * LANES)
            top = [cgutils.alloca_once_value(builder, lowest) for _ in range(G)]
            with cgutils.for_range(builder, _passes(builder, n)) as p:
                firsts, masks = _pass_lanes(builder, p.index, n)

                def terms(d):
                    keys = _stripe(builder, base, builder.mul(d, cap), firsts, masks)
                    qd = [splat(builder, _element_at(builder, q, d), LANES) for q in queries]
                    return [(qd[g], key, None) for g in range(G) for key in keys]

                totals = _sums(builder, hd, G * _STRIPE, terms)
                for g in range(G):
                    for u, f in enumerate(firsts):
                        score = builder.fmul(totals[g * _STRIPE + u], scale)
                        at = builder.add(builder.mul(_I64(g), width), f)
                        where = builder.bitcast(builder.gep(wa.data, [at], inbounds=True), _VF.as_pointer())
                        builder.store(score, where, align=4)
                        seen = _within(builder, _lane_indices(builder, f), sees[g])
                        largest = _larger(builder, builder.load(top[g]), builder.select(seen, score, lowest))
                        builder.store(largest, top[g])
            for g in range(G):
                builder.store(_largest_lane(builder, builder.load(top[g])),
                              builder.gep(ta.data, [_I64(g)], inbounds=True))
            return context.get_dummy_value()
        return types.none(qs, keys_t, types.int64, types.int64, types.int64, los, ps, types.float32, w,
                          tops), codegen
    return scores


def _values_kernel(G: int):
    """``weigh(w, values, kv, lo, n, los, ps, totals, out, at)``: for queries g < G, the
    ``hd`` floats at ``out``'s element ``at[g]`` get ``(sum over i in order of w[g, i] *
    values[kv, lo + i]) / totals[g]`` over the positions ``lo + i`` in ``los[g] .. ps[g]``, each
    head dim a vector lane, _SPAN of them a pass, every value vector read once for the G
    queries."""
    @intrinsic
    def weigh(typingctx, w, values, kv, lo, n, los, ps, totals, out, at):
        def codegen(context, builder, sig, args):
            wa, va, la, pa, sa, oa, aa = (context.make_array(sig.args[i])(context, builder, args[i])
                                          for i in (0, 1, 5, 6, 7, 8, 9))
            kv, lo, n = args[2], args[3], args[4]
            cap, hd = cgutils.unpack_tuple(builder, va.shape, 3)[1:]
            width = cgutils.unpack_tuple(builder, wa.shape, 2)[1]
            base = builder.gep(va.data, [builder.mul(builder.add(builder.mul(kv, cap), lo), hd)],
                               inbounds=True)  # values[kv, lo, 0]
            sees = _bounds(builder, la, pa, lo, G)
            weights = [builder.gep(wa.data, [builder.mul(_I64(g), width)], inbounds=True) for g in range(G)]
            with cgutils.for_range(builder, _passes(builder, hd)) as p:
                firsts, masks = _pass_lanes(builder, p.index, hd)

                def terms(i):
                    vs = _stripe(builder, base, builder.mul(i, hd), firsts, masks)
                    out = []
                    for g in range(G):
                        wi = splat(builder, _element_at(builder, weights[g], i), LANES)
                        keep = splat(builder, _within(builder, i, sees[g]), LANES)
                        out += [(wi, v, keep) for v in vs]
                    return out

                accs = _sums(builder, n, G * _STRIPE, terms)
                for g in range(G):
                    total = splat(builder, _element_at(builder, sa.data, _I64(g)), LANES)
                    start = _element_at(builder, aa.data, _I64(g))
                    for u, (f, mask) in enumerate(zip(firsts, masks, strict=True)):
                        where = builder.bitcast(builder.gep(oa.data, [builder.add(start, f)], inbounds=True),
                                                _VF.as_pointer())
                        _masked(builder, "store", _VF,
                                [builder.fdiv(accs[g * _STRIPE + u], total), where, _I32(4), mask])
            return context.get_dummy_value()
        return types.none(w, values, types.int64, types.int64, types.int64, los, ps, totals, out, at), codegen
    return weigh


GROUP = 4  # queries of a KV head that share one pass over its keys and values


def _by_count(kernel):
    """``call(count, ...)``: the ``kernel(G)`` (a G-query kernel of ten arguments) for G = count,
    1 .. GROUP."""
    k1, k2, k3, k4 = (kernel(g) for g in range(1, GROUP + 1))

    @njit(inline="always")
    def call(count, a, b, c, d, e, f, g, h, i, j):
        if count == 1:
            k1(a, b, c, d, e, f, g, h, i, j)
        elif count == 2:
            k2(a, b, c, d, e, f, g, h, i, j)
        elif count == 3:
            k3(a, b, c, d, e, f, g, h, i, j)
        else:
            k4(a, b, c, d, e, f, g, h, i, j)
    return call


_scores_for, _values_for = _by_count(_scores_kernel), _by_count(_values_kernel)


@njit(inline="always")
def _prefetch_cache(keys_t, values, kv, lo, n):
    """Ask for the keys and values of positions ``lo .. lo + n - 1`` of KV head ``kv`` before a
    pass reads them. In a decode step they come from memory (the weights streamed between two
    layers' attention evict them), and the keys are ``hd`` rows a whole cache row apart, which
    the hardware prefetchers do not follow: a Gemma 3 unit (256 head dims, 60 positions) took
    44 us from memory against 9 from the cache."""
    hd, cap = keys_t.shape[1], keys_t.shape[2]
    for d in range(hd):
        at = ((kv * hd + d) * cap + lo) * keys_t.itemsize
        prefetch_until(keys_t, at, at + n * keys_t.itemsize)
    at = (kv * cap + lo) * hd * values.itemsize
    prefetch_until(values, at, at + n * hd * values.itemsize)


@njit(inline="always")
def _capped(score, softcap):
    """A score soft-capped: ``tanh(score / softcap) * softcap`` (transformers' order)."""
    return np.tanh(score / softcap) * softcap


@njit(inline="always")
def _attend_group(qs, count, los, ps, keys_t, values, kv, scale, softcap, out, at):
    """Queries ``qs[:count]`` of KV head ``kv`` (query g at position ``ps[g]`` sees keys
    ``los[g] .. ps[g]``) over ``keys_t[Hkv, hd, S]`` (head_dim-major: a score is a sum over d in
    order, the keys of a pass one vector each) and ``values[Hkv, S, hd]``, into the ``hd``
    floats at element ``at[g]`` of ``out``. One pass over the keys and values for all of them;
    each query's result has the bits it gets alone: its scores and weighted sums take the same
    operations in the same order, and the lanes of its exponentials' sum start at its first key.
    ``softcap`` > 0 caps each of its scores (:func:`_capped`) and takes the largest of those."""
    lo, hi = los[0], ps[0]
    for g in range(1, count):
        lo, hi = min(lo, los[g]), max(hi, ps[g])
    n = hi + 1 - lo
    _prefetch_cache(keys_t, values, kv, lo, n)
    w = np.empty((GROUP, n + (-n) % _SPAN + LANES), F32)
    tops, totals = np.empty(GROUP, F32), np.empty(GROUP, F32)
    _scores_for(count, qs, keys_t, kv, lo, n, los, ps, scale, w, tops)
    for g in range(count):
        s0, m, top = los[g] - lo, ps[g] + 1 - los[g], tops[g]
        row = w[g]
        if softcap > 0:
            top = F32(-np.inf)
            for i in range(s0, s0 + m):
                row[_u(i)] = _capped(row[_u(i)], softcap)
                top = max(top, row[_u(i)])
        for i in range(s0, s0 + m, LANES):  # whole vectors (the lanes past the query's keys unread)
            for j in range(LANES):
                row[_u(i + j)] = exp_poly(row[_u(i + j)] - top)
        lanes = np.zeros(LANES, F32)  # the exponentials' sum: lane j takes keys j, j + L, ...
        for c in range(0, m - m % LANES, LANES):
            for j in range(LANES):
                lanes[j] += row[_u(s0 + c + j)]
        for i in range(m - m % LANES, m):
            lanes[i % LANES] += row[s0 + i]
        total = F32(0)
        for j in range(LANES):
            total += lanes[j]
        totals[g] = total
    _values_for(count, w, values, kv, lo, n, los, ps, totals, out, at)


@njit(inline="always")
def chunks_of(T, group, heads, threads):
    """How many chunks a KV head's T * group queries are cut into: enough for GROUP queries
    each, and enough for ``threads`` units of work over the ``heads`` KV heads of all sequences
    (a one-row Gemma 3 step has one KV head: its four queries in one unit kept one thread busy
    and the other waiting), never more than one query each."""
    total = T * group
    return min(total, max(-(-total // GROUP), -(-threads // heads)))


@njit(inline="always")
def attend_chunk(q, out, k, chunks, kv, keys_t, values, start, window, scale, softcap):
    """Chunk ``k`` of ``chunks`` of KV head ``kv``'s queries in ``q[T, H, hd]`` (positions
    ``start ..``; row-major (t, head), chunks of near-equal size), into ``out[T, H * hd]``;
    ``softcap`` 0: scores uncapped."""
    T, H, hd = q.shape
    group = H // keys_t.shape[0]
    total = T * group
    g0, g1 = k * total // chunks, (k + 1) * total // chunks
    qs = np.empty((GROUP, hd), F32)
    los, ps, at = np.empty(GROUP, np.int64), np.empty(GROUP, np.int64), np.empty(GROUP, np.int64)
    for g in range(g1 - g0):
        t, h = (g0 + g) // group, kv * group + (g0 + g) % group
        for d in range(hd):
            qs[g, d] = q[t, h, d]
        ps[g] = start + t
        los[g] = max(0, ps[g] - window + 1) if window > 0 else 0
        at[g] = t * out.shape[1] + h * hd
    _attend_group(qs, g1 - g0, los, ps, keys_t, values, kv, scale, softcap, out, at)


@njit(**KERNEL_OPTIONS)
def _attend(q, keys_t, values, start, window, scale, softcap, threads, out):
    T, H, hd = q.shape
    Hkv = keys_t.shape[0]
    chunks = chunks_of(T, H // Hkv, Hkv, threads)
    for item in prange(Hkv * chunks):
        wide_vectors()
        attend_chunk(q, out, item % chunks, chunks, item // chunks, keys_t, values, start, window, scale,
                     softcap)


@intrinsic
def _f32_pointer(typingctx, address):
    """An int64 address as a float32 pointer (a buffer the caller keeps alive)."""
    def codegen(context, builder, sig, args):
        return builder.inttoptr(args[0], ir.PointerType(ir.FloatType()))
    return types.CPointer(types.float32)(types.int64), codegen


@njit(inline="always")
def uncounted(a):
    """A view of the float32 C-contiguous array ``a`` that carries no reference count (as
    :func:`cache_views`' do), for arrays the caller keeps alive. Slicing a counted array changes
    its count atomically; when the threads of a parallel region slice the same shared array (a
    row of the queries, a position's cos), its count's cache line bounces between the cores at
    every slice."""
    return carray(_f32_pointer(a.ctypes.data), a.shape)


@njit(inline="always")
def cache_views(address_k, address_v, Hkv, hd, cap):
    """A float32 host cache's buffers from their addresses (``KVCache.host_buffers``): the keys
    ``[Hkv, hd, cap]`` (head_dim-major) and the values ``[Hkv, cap, hd]``."""
    return (carray(_f32_pointer(address_k), (Hkv, hd, cap)),
            carray(_f32_pointer(address_v), (Hkv, cap, hd)))


@njit(**KERNEL_OPTIONS)
def _append_and_attend(q, k, v, buffers, starts, window, scale, softcap, threads, out):
    """Each sequence b's new keys and values ``k/v[b]`` written into its cache buffers at
    ``starts[b]..`` (``buffers[b]``: addresses of keys ``[Hkv, hd, cap]`` and values
    ``[Hkv, cap, hd]``, and cap), then every (sequence, query, head) as :func:`_attend` does it."""
    B, T, H, hd = q.shape
    Hkv = k.shape[2]
    for b in prange(B):
        cap = buffers[b, 2]
        keys_t, values = cache_views(buffers[b, 0], buffers[b, 1], Hkv, hd, cap)
        for t in range(T):
            for kv in range(Hkv):
                for d in range(hd):
                    keys_t[kv, d, starts[b] + t] = k[b, t, kv, d]
                    values[kv, starts[b] + t, d] = v[b, t, kv, d]
    chunks = chunks_of(T, H // Hkv, B * Hkv, threads)
    for item in prange(B * Hkv * chunks):
        wide_vectors()
        b, kv, k = item // (Hkv * chunks), item // chunks % Hkv, item % chunks
        keys_t, values = cache_views(buffers[b, 0], buffers[b, 1], Hkv, hd, buffers[b, 2])
        attend_chunk(q[b], out[b], k, chunks, kv, keys_t, values, starts[b], window, scale, softcap)


def append_and_attend(q, k, v, caches, starts: tuple[int, ...], window: int | None,
                      scale: float, softcap: float | None = None) -> np.ndarray:
    """A decode step's attention for B sequences in one call: ``k``/``v`` ``[B, T, Hkv, hd]``
    appended to each sequence's float32 host cache (room reserved here), then :func:`attend`'s
    result for each, ``[B, T, H * hd]``, the same bits as B calls of it. ``q``, ``k``, ``v``
    float32 C-contiguous; ``starts[b]`` is cache b's offset before the append (it moves here);
    ``softcap`` as :func:`attend`'s."""
    B, T = q.shape[:2]
    for c in caches:
        c.reserve(T)
    buffers = np.array([c.host_buffers() for c in caches], np.int64)  # after reserve: growth moves them
    out = np.empty((B, T, q.shape[2] * q.shape[3]), F32)
    _append_and_attend(q, k, v, buffers, np.array(starts, np.int64), 0 if window is None else window,
                       F32(scale), _cap(softcap), get_num_threads(), out)
    for c in caches:
        c.offset += T
    return out


def check_attend_args(q, keys, values, start: int, window: int | None,
                      softcap: float | None = None) -> tuple[int, int, int]:
    """:func:`attend`'s argument checks, for any array with ``shape`` and ``dtype`` (the GPU
    kernel's device arrays too); returns q's ``(T, H, hd)``.

    Raises:
        LoomShapeError: shapes, dtypes, heads or positions do not fit together.
    """
    qs, ks, vs = (tuple(getattr(a, "shape", ())) for a in (q, keys, values))
    if len(qs) != 3 or len(ks) != 3 or ks != vs:
        raise LoomShapeError(f"attend needs q [T, H, hd] and keys/values [Hkv, S, hd] alike; got "
                             f"{qs}, {ks}, {vs}")
    (T, H, hd), (Hkv, S, khd) = qs, ks
    if khd != hd or Hkv == 0 or H % Hkv:
        raise LoomShapeError(f"attend: {H} query heads of {hd} need a divisor of them as KV heads "
                             f"of the same size; got {Hkv} of {khd}")
    if np.dtype(keys.dtype) not in KV_DTYPES or np.dtype(values.dtype) != np.dtype(keys.dtype):
        raise LoomShapeError(f"attend: keys/values must both be float32 or float16 bits (uint16); got "
                             f"{keys.dtype} and {values.dtype}")
    if start < 0 or start + T > S:
        raise LoomShapeError(f"attend: queries at {start}..{start + T - 1} need keys up to there; "
                             f"{S} positions given")
    if window is not None and window < 1:
        raise LoomShapeError(f"attend: a window must hold at least the query itself; got {window}")
    if softcap is not None and not 0 < softcap < np.inf:
        raise LoomShapeError(f"attend: a soft cap must be a positive number; got {softcap}")
    return T, H, hd


def attend(q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int, window: int | None,
           scale: float, softcap: float | None = None) -> np.ndarray:
    """Causal attention of queries ``q[T, H, hd]`` at positions ``start..start+T-1``.

    Args:
        q: float32 queries, ``H`` a multiple of the KV heads.
        keys, values: ``[Hkv, S, hd]`` float32, or float16 as ``uint16`` bits; positions
            ``0..start+T-1`` are read (``S`` may be a cache's larger capacity).
        start: position of the first query.
        window: positions a query sees, itself included (sliding-window layers); None: all before it.
        scale: the score scale (``head_dim ** -0.5`` for most models).
        softcap: each scaled score ``s`` becomes ``tanh(s / softcap) * softcap`` (gemma2's
            attention logit soft-capping); None: uncapped.

    Returns:
        float32 ``[T, H * hd]``; row t has the same bits as ``attend(q[t:t+1], ..., start + t, ...)``.

    Raises:
        LoomShapeError: shapes, dtypes, heads or positions do not fit together.
    """
    q = np.ascontiguousarray(q, dtype=F32)
    check_attend_args(q, keys, values, start, window, softcap)
    # a KVCache's keys are a transposed view of a head_dim-major buffer: no copy here
    return attend_checked(q, np.ascontiguousarray(keys.transpose(0, 2, 1)), np.ascontiguousarray(values),
                          int(start), window, scale, softcap)


def _cap(softcap: float | None) -> np.float32:
    """The kernels' soft cap: 0 for none."""
    return F32(0 if softcap is None else softcap)


def attend_checked(q, keys_t, values, start: int, window: int | None, scale: float,
                   softcap: float | None = None) -> np.ndarray:
    """:func:`attend` for a caller that has made its checks (a decode step's attention layer on
    its own caches, ~30 a token): ``q`` float32 C-contiguous, ``keys_t`` the keys as
    ``[Hkv, hd, S]`` and ``values`` ``[Hkv, S, hd]``, both C-contiguous (a KVCache's buffers)."""
    T, H, hd = q.shape
    out = np.empty((T, H * hd), F32)
    _attend(q, keys_t, values, start, 0 if window is None else window, F32(scale), _cap(softcap),
            get_num_threads(), out)
    return out
