"""A decode step of a decoder-only language model as one compiled call, for the int8 mode.

Why: through the grid, Python drives every block of an int8 step (norms, projections, RoPE,
attention, residuals) and each of a token's ~200 matrix products is a launch of numba's thread
team; for a small model that is a large part of the token (docs/kernels.md).
llama.cpp runs a token as one graph. Here one parallel region runs the whole step: each thread
takes its share of every matrix's rows, and the threads meet at a spinning barrier
(:mod:`~loomlab.core.llm.kernels.spin_barrier`) between the steps that need each other's
results (six per block). What every thread needs whole and is cheap (the residual stream and its
RMSNorm) each thread computes for itself, the same bits in each; so does the 8-bit quantization
of a single row, while several rows (a batch, a verification) are quantized a share each into
shared buffers, with a meeting after (four more per block, cheaper than every thread quantizing
every row).

Same bits as the grid: every number is computed by the functions the int8 mode's layers call
(``rms_norm_rows``, ``quantize_grouped`` / Q8_K, the repacked rows' products, RoPE's products
and sums, ``attend_chunk``, :mod:`~loomlab.core.llm.kernels.mlp_kernel`), in the same order;
the tests compare the logits of whole generations bit for bit. So the grid stays the definition,
and this is only taken when it would compute the same thing: T new tokens for each of B
sequences, at most MAX_ROWS rows in all (a decode step alone or batched, a speculative
verification, a short prompt: the products take the rows together), the int8 mode, float32 host
caches, no observer listening (they see every layer's output, which this step never makes), and
the network still a decoder of the layouts :func:`_decoder_blocks` knows (llama, mistral,
qwen2/3, gemma2/3, phi3 once split, granite, smollm3; not olmo2's norms after each half alone)
with every matrix in a format with an integer kernel (re-checked whenever :class:`_Watch` sees a
cell, child, switch or weight change). Anything else returns None and the caller runs the grid.

Layout handed to the compiled step (:class:`FusedDecoder`): per block i, matrices ``7 i + j``
for j in :data:`MATRICES` (the LM head last) as the repacked rows' addresses and sizes with their
kinds and row counts, vectors ``13 i + j`` for j in :data:`VECTORS` as slices of one array (empty
where the model has none: a filler bias, no Q/K norm; the final norm last), and by kind number
the address of each kind's product function
(:mod:`~loomlab.core.llm.kernels.quant_int8_products`): the step itself is compiled once for
every format, and a model compiles only its own formats' products.
"""

from __future__ import annotations

import threading
from operator import attrgetter

import numba
import numpy as np
from numba import get_thread_id, njit, prange

from ... import edits
from ...layers.containers import Residual, Sequential
from ..kernels.attention_kernel import attend_chunk, cache_views, chunks_of, uncounted
from ..kernels.mlp_kernel import GATED_ACTIVATIONS, gated_range
from ..kernels.norm_kernel import rms_norm_rows
from ..kernels.quant import ROW_CHUNK, pace
from ..kernels.quant_int8 import int8_enabled, quantize_q8_k, repacked, supports
from ..kernels.quant_int8_products import KINDS, call_product_at, product_address
from ..kernels.quant_int8_rows import quantize_grouped
from ..kernels.quant_int8_superblocks import is_superblock_kind
from ..kernels.quant_int8_tiles import TILE, TILES_AT_ONCE, is_tiled
from ..kernels.spin_barrier import PAD, abort, counters, meet
from .kv_cache import KVCache
from .llm_layers import LLMAttention, LLMEmbedding, LLMGatedMLP, LLMHead, LLMRMSNorm, MatrixStore
from .rope import rotate_head

F32 = np.float32
MATRICES = ("wq", "wk", "wv", "wo", "gate", "up", "down")
VECTORS = ("attn_norm", "ffn_norm", "bq", "bk", "bv", "bo", "b_gate", "b_up", "b_down", "q_norm", "k_norm",
           "attn_post_norm", "ffn_post_norm")
_NM, _NV = len(MATRICES), len(VECTORS)
_WQ, _WK, _WV, _WO, _GATE, _UP, _DOWN = range(_NM)
_ANORM, _FNORM, _BQ, _BK, _BV, _BO, _BGATE, _BUP, _BDOWN, _QNORM, _KNORM, _APOST, _FPOST = range(_NV)
# A thread's share of a matrix is multiplied in pieces of about this many bytes (see _product):
# the pieces keep 2-3 rows' passes over a piece in the L2 cache; for one row the piece size
# measured alike, the kernels prefetching as they stream (docs/kernels.md).
PIECE_BYTES = 65536
# Rows (sequences x new tokens) a step may have: decode, speculative verification and batches.
# Every thread keeps its own residual stream and norms all rows itself, so a long prompt is left
# to the grid, which computes them once for all threads.
MAX_ROWS = 64


# ---------------------------------------------------------------------------------------------
# The compiled step.


@njit(inline="always")
def _share(n, tid, threads):
    """Thread ``tid``'s part ``[lo, hi)`` of ``n`` items."""
    return n * tid // threads, n * (tid + 1) // threads


@njit(cache=True, nogil=True)
def _activations(B, n):
    """One thread's buffers for B rows of n values: the grouped Q8_1 set and the Q8_K set (when
    n is whole super-blocks)."""
    nk = n if n % 256 == 0 else 256
    grouped = (np.empty((B, n), np.int8), np.empty((B, n // 32), F32), np.empty((B, n // 32), F32),
               np.zeros((B, n // 8), np.int32))
    q8_k = (np.empty((B, nk), np.int8), np.empty((B, nk // 256), F32), np.empty((B, nk // 32), F32),
            np.empty((B, nk // 16), np.int32), np.zeros((B, nk // 4), np.int32),
            np.empty((B, nk // 32), np.int32))
    return grouped, q8_k


@njit(cache=True, nogil=True)
def _quantize(x, acts, kinds, first, count):
    """Rows ``x[B, n]`` quantized for matrices ``first .. first + count - 1`` (grouped Q8_1 for the
    32-weight formats, Q8_K for the super-blocks, each only if one of them needs it)."""
    grouped, k = acts
    need_g = need_k = False
    for m in range(first, first + count):
        if is_superblock_kind(kinds[m]):
            need_k = True
        else:
            need_g = True
    if need_g:
        quantize_grouped(x, grouped[0], grouped[1], grouped[2], grouped[3])
    if need_k:
        quantize_q8_k(x, k[0], k[1], k[2], k[3], k[4], k[5])


def _acts_by_dtype(R: int, widths) -> tuple:
    """:func:`_activations` sets of R rows for each width, handed to the parallel region as
    three tuples by dtype (int8, float32, int32: numba's region takes tuples of arrays of one
    type, not nested ones), each set's arrays in its order; :func:`_acts_set` takes one back."""
    arrays = [a for n in widths for part in _activations(R, n) for a in part]
    return tuple(tuple(a for a in arrays if a.dtype == t) for t in (np.int8, F32, np.int32))


@njit(inline="always")
def _acts_set(i8, f32, i32, j):
    """The j-th set of :func:`_acts_by_dtype`'s tuples: a set is (int8, float32, float32,
    int32) grouped, then (int8, float32, float32, int32, int32, int32) Q8_K."""
    return ((i8[2 * j], f32[4 * j], f32[4 * j + 1], i32[4 * j]),
            (i8[2 * j + 1], f32[4 * j + 2], f32[4 * j + 3], i32[4 * j + 1], i32[4 * j + 2], i32[4 * j + 3]))


@njit(inline="always")
def _rows_of(acts, r0, r1):
    """Rows r0 .. r1 - 1 of an :func:`_activations` set."""
    g, k = acts
    return ((g[0][r0:r1], g[1][r0:r1], g[2][r0:r1], g[3][r0:r1]),
            (k[0][r0:r1], k[1][r0:r1], k[2][r0:r1], k[3][r0:r1], k[4][r0:r1], k[5][r0:r1]))


@njit(inline="always")
def _quantize_for(x, acts, kinds, first, count, split, tid, threads, flags, epoch):
    """``x`` quantized into ``acts`` for matrices ``first ..``: by this thread whole into its
    own buffers, or (``split``) each thread its share of the rows into shared ones, then a
    meeting. Returns the epoch after it, or -1 when the region was abandoned."""
    count = np.int64(count)  # not the callers' literal 1, 2 or 3: one compilation for all
    if not split:
        _quantize(x, acts, kinds, first, count)
        return epoch
    r0, r1 = _share(x.shape[0], tid, threads)
    if r1 > r0:
        _quantize(x[r0:r1], _rows_of(acts, r0, r1), kinds, first, count)
    epoch += 1
    return epoch if meet(flags, tid, threads, epoch) else -1


@njit(cache=True, nogil=True)
def _product(m, mats, kinds, rows, fns, acts, tid, threads, out):
    """This thread's rows of matrix m times the quantized rows in ``acts``, into ``out[B, rows]``,
    by its kind's product function (``fns[kind]``, an address: :mod:`~loomlab.core.llm.kernels.
    quant_int8_products`)."""
    kind, n = kinds[m], rows[m]
    tiled = is_tiled(kind)
    if tiled:  # whole tiles to each thread
        lo, hi = _share(n // TILE, tid, threads)
        lo, hi = lo * TILE, hi * TILE
    else:
        lo, hi = _share(n, tid, threads)
    address, row_bytes = mats[m, 0], mats[m, 1] // n
    grouped, k = acts
    # in pieces of PIECE_BYTES: with 2 or 3 rows the row kernels pass over a piece once per row,
    # the later passes finding it in the L2 cache (tiled: whole passes' tiles)
    unit = TILES_AT_ONCE * TILE if tiled else ROW_CHUNK
    step = max(unit, PIECE_BYTES // row_bytes // unit * unit)
    fn = fns[kind]
    for r0 in range(lo, hi, step):
        r1 = min(hi, r0 + step)
        if is_superblock_kind(kind):
            call_product_at(fn, address, n, row_bytes, r0, r1, k[0], k[1], k[4], k[5], out)
        else:
            call_product_at(fn, address, n, row_bytes, r0, r1, grouped[0], grouped[1], grouped[2], grouped[3],
                            out)


@njit(inline="always")
def _vec(vecs, i):
    """Vector i of the layout (module doc): a view of ``vecs = (values, offsets)``."""
    return vecs[0][vecs[1][i]:vecs[1][i + 1]]


@njit(inline="always")
def _plus(a, lo, hi, b):
    """``a[:, lo:hi] += b[lo:hi]`` unless b is empty (no bias)."""
    if b.size:
        for r in range(a.shape[0]):
            for i in range(lo, hi):
                a[r, i] = a[r, i] + b[i]


@njit(cache=True, nogil=True)
def _add_residual(x, y, bias, post_norm, eps, resid):
    """``x += norm((y + bias) * resid)`` over rows ``[B, d]``: the bias and the post-norm
    (gemma's) where the block has them, ``resid`` granite's residual multiplier (1 elsewhere: a
    product by 1 is exact). ``y`` is shared, so each thread normalizes into its own rows."""
    B, d = x.shape
    rows = np.empty((B, d), F32)
    for r in range(B):
        for j in range(d):
            rows[r, j] = (y[r, j] + bias[j] if bias.size else y[r, j]) * resid
    if post_norm.size:
        rms_norm_rows(rows, post_norm, eps, rows)
    for r in range(B):
        for j in range(d):
            x[r, j] = rows[r, j] + x[r, j]


@njit(inline="always")
def _project_into_stream(x, h, acts, split, m, mats, kinds, rows, fns, tid, threads, out, bias, post_norm,
                         eps, resid, flags, epoch):
    """``x += post_norm((h @ W_m.T + bias) * resid)`` (attention's output projection, the MLP's
    down): a meeting (every thread has written its part of h), h quantized (:func:`_quantize_for`),
    this thread's rows of the product, a meeting (every thread adds all of them), the residual
    add. Returns the last meeting's epoch, or -1 when the region was abandoned."""
    epoch += 1
    if not meet(flags, tid, threads, epoch):
        return -1
    epoch = _quantize_for(h, acts, kinds, m, 1, split, tid, threads, flags, epoch)
    if epoch < 0:
        return -1
    _product(m, mats, kinds, rows, fns, acts, tid, threads, out)
    epoch += 1
    if not meet(flags, tid, threads, epoch):
        return -1
    _add_residual(x, out, bias, post_norm, eps, resid)
    return epoch


@njit(cache=True, nogil=True)
def _rotated(src, bias, gamma, eps, cos, sin, interleaved, dst, scratch):
    """One head: ``src`` + bias, its RMSNorm (gamma non-empty), RoPE at cos/sin -> ``dst``;
    the grid's operations in its order."""
    hd = src.size
    for i in range(hd):
        scratch[0, i] = src[i] + bias[i] if bias.size else src[i]
    if gamma.size:
        rms_norm_rows(scratch, gamma, eps, scratch)
    rotate_head(scratch[0], cos, sin, interleaved, dst)


@njit(cache=True, nogil=True)
def _step_worker(tid, threads, flags, x0, mats, kinds, rows, fns, vecs, dims, eps, qk_eps, scale, resid,
                 softcap, interleaved, act, windows, cos, sin, caches, starts, T, last_only, shared, acts_i8,
                 acts_f32, acts_i32):
    """Thread ``tid``'s part of one step of B sequences of T new tokens each (module doc):
    ``x0[B * T, d]`` their embeddings (row ``b * T + t``), ``starts[B]`` each sequence's first
    new position, ``caches[L, B, 3]`` their KV buffers, ``cos``/``sin`` ``[L, B * T, head_dim /
    2]``; the head over every row, or each sequence's last (``last_only``). False if the region
    was abandoned. With several rows and threads the threads quantize a matrix's input a share
    of the rows each into shared buffers (``acts_*``: sets for the model, attention and MLP
    widths) and meet; with one row each quantizes it itself, which costs no meeting."""
    d, H, Hkv, hd, ffn, L = dims[0], dims[1], dims[2], dims[3], dims[4], dims[5]
    R = x0.shape[0]
    # the arrays every thread reads and writes, as views without a reference count (uncounted's
    # doc): slicing counted ones bounces their counts' cache line between the cores
    qb, kb, vb, att = uncounted(shared[0]), uncounted(shared[1]), uncounted(shared[2]), uncounted(shared[3])
    ob, gb, ub, hb = uncounted(shared[4]), uncounted(shared[5]), uncounted(shared[6]), uncounted(shared[7])
    db, logits, cos, sin = uncounted(shared[8]), uncounted(shared[10]), uncounted(cos), uncounted(sin)
    qr = uncounted(shared[9]).reshape((R, H, hd))  # the rotated query heads, all threads' for all
    x = x0.copy()  # this thread's copy of the residual stream [R, d]
    xn = np.empty((R, d), F32)
    split = R > 1 and threads > 1
    if split:
        a_d = _acts_set(acts_i8, acts_f32, acts_i32, 0)
        a_att = _acts_set(acts_i8, acts_f32, acts_i32, 1)
        a_ffn = _acts_set(acts_i8, acts_f32, acts_i32, 2)
    else:
        a_d, a_att, a_ffn = _activations(R, d), _activations(R, H * hd), _activations(R, ffn)
    scratch = np.empty((1, hd), F32)
    group = H // Hkv
    # (KV head, row) pairs, head-major: a key's cache line holds 16 positions, so two threads writing
    # rows of the same head would pass its 64 lines back and forth
    kv0, kv1 = _share(R * Hkv, tid, threads)
    h0, h1 = _share(R * H, tid, threads)  # (row, query head) pairs
    chunks = chunks_of(T, group, (R // T) * Hkv, threads)
    u0, u1 = _share((R // T) * Hkv * chunks, tid, threads)  # (sequence, KV head, query chunk)
    f0, f1 = _share(ffn, tid, threads)
    epoch = 0
    for i in range(L):
        m, v = _NM * i, _NV * i
        # attention: Q, K, V of the normed rows
        rms_norm_rows(x, _vec(vecs, v + _ANORM), eps, xn)
        epoch = _quantize_for(xn, a_d, kinds, m + _WQ, 3, split, tid, threads, flags, epoch)
        if epoch < 0:
            return False
        _product(m + _WQ, mats, kinds, rows, fns, a_d, tid, threads, qb)
        _product(m + _WK, mats, kinds, rows, fns, a_d, tid, threads, kb)
        _product(m + _WV, mats, kinds, rows, fns, a_d, tid, threads, vb)
        epoch += 1
        if not meet(flags, tid, threads, epoch):
            return False
        # this thread's KV heads into the caches, its query heads rotated
        bk, bv = uncounted(_vec(vecs, v + _BK)), uncounted(_vec(vecs, v + _BV))
        bq = uncounted(_vec(vecs, v + _BQ))
        k_norm, q_norm = uncounted(_vec(vecs, v + _KNORM)), uncounted(_vec(vecs, v + _QNORM))
        for item in range(kv0, kv1):
            kv, r = item // R, item % R
            b = r // T
            cap, o, p = caches[i, b, 2], kv * hd, starts[b] + r % T
            keys_t, values = cache_views(caches[i, b, 0], caches[i, b, 1], Hkv, hd, cap)
            _rotated(kb[r, o:o + hd], bk[o:o + hd] if bk.size else bk, k_norm, qk_eps,
                     cos[i, r], sin[i, r], interleaved, keys_t[kv, :, p], scratch)
            for j in range(hd):
                values[kv, p, j] = vb[r, o + j] + bv[o + j] if bv.size else vb[r, o + j]
        for item in range(h0, h1):
            r, h = item // H, item % H
            o = h * hd
            _rotated(qb[r, o:o + hd], bq[o:o + hd] if bq.size else bq, q_norm, qk_eps,
                     cos[i, r], sin[i, r], interleaved, qr[r, h], scratch)
        epoch += 1
        if not meet(flags, tid, threads, epoch):
            return False
        for unit in range(u0, u1):
            b, kv, k = unit // (Hkv * chunks), unit // chunks % Hkv, unit % chunks
            keys_t, values = cache_views(caches[i, b, 0], caches[i, b, 1], Hkv, hd, caches[i, b, 2])
            attend_chunk(qr[b * T:(b + 1) * T], att[b * T:(b + 1) * T], k, chunks, kv, keys_t, values,
                         starts[b], windows[i], scale, softcap)
        epoch = _project_into_stream(x, att, a_att, split, m + _WO, mats, kinds, rows, fns, tid, threads, ob,
                                     _vec(vecs, v + _BO), _vec(vecs, v + _APOST), eps, resid, flags, epoch)
        if epoch < 0:
            return False
        # the MLP; each thread activates the gate/up columns it computed
        rms_norm_rows(x, _vec(vecs, v + _FNORM), eps, xn)
        epoch = _quantize_for(xn, a_d, kinds, m + _GATE, 2, split, tid, threads, flags, epoch)
        if epoch < 0:
            return False
        _product(m + _GATE, mats, kinds, rows, fns, a_d, tid, threads, gb)
        _product(m + _UP, mats, kinds, rows, fns, a_d, tid, threads, ub)
        _plus(gb, f0, f1, _vec(vecs, v + _BGATE))
        _plus(ub, f0, f1, _vec(vecs, v + _BUP))
        for r in range(R):
            gated_range(act, gb[r], ub[r], hb[r], f0, f1)
        epoch = _project_into_stream(x, hb, a_ffn, split, m + _DOWN, mats, kinds, rows, fns, tid, threads, db,
                                     _vec(vecs, v + _BDOWN), _vec(vecs, v + _FPOST), eps, resid, flags, epoch)
        if epoch < 0:
            return False
    if last_only and T > 1:  # each sequence's last row alone, quantized by each thread itself
        x = np.ascontiguousarray(x[T - 1::T])
        xn, a_d, split = np.empty_like(x), _activations(x.shape[0], d), False
    rms_norm_rows(x, _vec(vecs, _NV * L), eps, xn)
    if _quantize_for(xn, a_d, kinds, _NM * L, 1, split, tid, threads, flags, epoch) < 0:
        return False
    _product(_NM * L, mats, kinds, rows, fns, a_d, tid, threads, logits)
    return True


@njit(cache=True, nogil=True, parallel=True)
def _step_parallel(threads, flags, x0, mats, kinds, rows, fns, vecs, dims, eps, qk_eps, scale, resid,
                   softcap, interleaved, act, windows, cos, sin, caches, starts, T, last_only, shared,
                   acts_i8, acts_f32, acts_i32):
    """The step on ``threads`` threads, one iteration each; a thread that is not the one its
    index names (a threading layer that runs two iterations on one thread) abandons the region
    rather than wait for itself."""
    for t in prange(threads):
        tid = np.int64(t)  # prange counts in uint64: the one-thread call's int64, one compilation
        if get_thread_id() != tid:
            abort(flags, threads)
        else:
            _step_worker(tid, threads, flags, x0, mats, kinds, rows, fns, vecs, dims, eps, qk_eps, scale,
                         resid, softcap, interleaved, act, windows, cos, sin, caches, starts, T, last_only,
                         shared,
                         acts_i8, acts_f32, acts_i32)


# ---------------------------------------------------------------------------------------------
# The network as the compiled step reads it.


def _decoder_blocks(net) -> list[tuple] | None:
    """``(attention norm, attention, its post-norm, MLP norm, MLP, its post-norm)`` of each block
    (a post-norm None where the block has none) of a network laid out as
    ``layer_builders.decoder_block`` lays out llama / mistral / qwen (``[norm, attention]``,
    ``[norm, MLP]``) and gemma3 (each half with a norm after it too); None for any other layout
    (a cell replaced, disabled or linked elsewhere; another architecture's block)."""
    cells = net.cells
    if len(cells) < 3 or not (isinstance(cells[0], LLMEmbedding) and isinstance(cells[-2], LLMRMSNorm)
                              and isinstance(cells[-1], LLMHead)):
        return None
    if any(la.cfg.is_disabled or la.cfg.is_remote_link for cell in cells for la in cell.walk()):
        return None  # the grid skips a disabled layer and runs a link's target: not this layout
    blocks = []
    for block in cells[1:-2]:
        if type(block) is not Sequential or len(block.children) != 4 or \
                any(type(block.children[k]) is not Residual or block.children[k].children for k in (1, 3)):
            return None
        halves = [_half(block.children[k], core) for k, core in ((0, LLMAttention), (2, LLMGatedMLP))]
        if None in halves:
            return None
        blocks.append((*halves[0], *halves[1]))
    return blocks


def _half(part, core) -> tuple | None:
    """``(norm, core layer, post-norm or None)`` of a Sequential ``[norm, core]`` or ``[norm, core,
    norm]``; None for anything else."""
    kids = part.children
    if type(part) is not Sequential or len(kids) not in (2, 3) or type(kids[0]) is not LLMRMSNorm \
            or type(kids[1]) is not core or (len(kids) == 3 and type(kids[2]) is not LLMRMSNorm):
        return None
    return kids[0], kids[1], kids[2] if len(kids) == 3 else None


class _Watch:
    """What a network's fused layout (or its absence) depends on: the cells, the containers'
    children, each layer's switches, dtype and weight store, and each store's version and block
    encoding (by identity: the encodings seen are kept alive, so no other object takes their
    ids). Compared only when :data:`loomlab.core.edits.last` moved (or the cells changed): a
    comparison reads ~270 layers for SmolLM2, ~250 us a token with the caches cold after a step."""

    _switches = attrgetter("cfg.is_disabled", "cfg.is_remote_link", "cfg.dtype", "weights")
    _children = attrgetter("children")
    _encoded = attrgetter("encoded")
    _version = attrgetter("version")

    def __init__(self, net):
        self.net = net
        self.seen = edits.last  # read first: an edit during the reading below is seen next time
        self.layers = list(net.all_layers())
        self.containers = [la for la in self.layers if la.children]
        self.stores = [la.weights for la in self.layers if isinstance(la.weights, MatrixStore)]
        self._kept = [st.encoded for st in self.stores]
        self.state = self._state()

    def _state(self) -> list:
        return [list(self.net.cells), list(map(list, map(self._children, self.containers))),
                list(map(self._switches, self.layers)), list(map(self._version, self.stores)),
                list(map(id, map(self._encoded, self.stores)))]

    def current(self) -> bool:
        """Whether the network is still what it was when this watch began."""
        if edits.last == self.seen and self.net.cells == self.state[0]:
            return True
        seen = edits.last
        if self._state() != self.state:
            return False
        self.seen = seen
        return True


class FusedDecoder:
    """A :class:`~.causal_lm.CausalLM`'s weights in the compiled step's layout (module doc);
    :func:`fused_step` keeps it beside the :class:`_Watch` that says when to gather it again."""

    def __init__(self, net, blocks: list[tuple]):
        self.embedding = net.cells[0]
        mats, kinds, rows, vecs = [], [], [], []
        empty = np.zeros(0, F32)

        def vector(store, name):
            m = store.current("float32").get(name)
            return empty if m is None or store.is_filler(name, m) else np.array(m, F32).reshape(-1)

        for attn_norm, attn, attn_post, mlp_norm, mlp, mlp_post in blocks:
            w = {**attn.weights.current(attn.cfg.dtype), **mlp.weights.current(mlp.cfg.dtype)}
            norms = {"attn_norm": attn_norm, "ffn_norm": mlp_norm, "attn_post_norm": attn_post,
                     "ffn_post_norm": mlp_post}
            for name in MATRICES:
                kind, packed = repacked(w[name])
                mats.append(packed)
                kinds.append(kind)
                rows.append(w[name].shape[0])
            for name in VECTORS:
                if name in norms:
                    vecs.append(empty if norms[name] is None else vector(norms[name].weights, "gamma"))
                else:
                    vecs.append(vector(mlp.weights if name.startswith("b_") else attn.weights, name))
        head = net.cells[-1].weights.current("float32")["weight"]
        kind, packed = repacked(head)
        mats.append(packed)
        kinds.append(kind)
        rows.append(head.shape[0])
        vecs.append(vector(net.cells[-2].weights, "gamma"))
        # the step reads each matrix by address (the repacked arrays kept alive here) and the
        # vectors from one array: numba's typed lists compiled their methods anew in every process
        self.packed = mats
        self.mats = np.array([(p.ctypes.data, p.nbytes) for p in mats], np.int64)
        self.vecs = (np.concatenate([empty, *vecs]), np.cumsum([0] + [v.size for v in vecs], dtype=np.int64))
        self.kinds, self.rows = np.array(kinds, np.int64), np.array(rows, np.int64)
        # each kind's product function by kind number (compiled now for the kinds this model has)
        self.fns = np.zeros(KINDS, np.int64)
        for kind in set(kinds):
            self.fns[kind] = product_address(kind)
        attns = [b[1] for b in blocks]
        s = attns[0].spec
        self.attentions = attns
        ffn = blocks[0][4].cfg.output_height
        self.dims = np.array([head.shape[1], s.n_heads, s.n_kv_heads, s.head_dim, ffn, len(blocks)], np.int64)
        self.eps = F32(blocks[0][0].eps)
        self.qk_eps = F32(s.norm_eps)
        self.scale = F32(attns[0].score_scale)
        self.resid = F32(attns[0].spec.output_scale)  # granite's residual multiplier
        self.softcap = F32(s.softcap or 0)  # attend_chunk's: 0 uncapped
        self.head = net.cells[-1]
        self.interleaved = s.rope.interleaved
        self.act = blocks[0][4].cfg.act_id
        self.windows = np.array([a.spec.window or 0 for a in attns], np.int64)
        self.vocab = head.shape[0]
        by_rope: dict[int, tuple] = {}
        for i, a in enumerate(attns):
            by_rope.setdefault(id(a.spec.rope), (a.spec.rope, []))[1].append(i)
        self.ropes = list(by_rope.values())
        self._kept = threading.local()

    @staticmethod
    def fits(net, blocks: list[tuple]) -> bool:
        """Whether the compiled step computes this decoder as the grid would: every matrix with
        an integer kernel, the layers in float32 on the host, one norm eps, and the attention
        shape, RoPE layout, score scale and soft cap, activation and output multiplier (one for both
        halves) alike in every block, Q/K norms (if any) head by head."""
        leaves = [la for block in blocks for la in block if la is not None] + [net.cells[0], *net.cells[-2:]]
        if not blocks or any(la.device_copy is not None or la.cfg.dtype != "float32" for la in leaves):
            return False

        def shape(block) -> tuple:
            attn, mlp = block[1], block[4]
            a = attn.spec
            norms = {la.eps for la in block if isinstance(la, LLMRMSNorm)}
            return (len(norms), *norms, a.n_heads, a.n_kv_heads, a.head_dim, a.norm_eps, a.rope.interleaved,
                    attn.score_scale, a.softcap, a.output_scale, mlp.output_scale, mlp.cfg.act_id)

        first = shape(blocks[0])
        for block in blocks:
            w = {**block[1].weights.current("float32"), **block[4].weights.current("float32")}
            if shape(block) != first or not all(supports(w[name]) for name in MATRICES):
                return False
            if any(w[name].shape != (block[1].spec.head_dim,) for name in ("q_norm", "k_norm") if name in w):
                return False  # olmo2's norms over all heads: the step norms each head
        head = net.cells[-1].weights.current("float32")["weight"]
        return (first[:2] == (1, net.cells[-2].eps) and first[-3] == first[-2]
                and first[-1] in GATED_ACTIVATIONS and supports(head))

    def step(self, tokens: np.ndarray, caches: list[list[KVCache]], last_only: bool) -> np.ndarray | None:
        """Logits of the integer ``tokens[B, T]``, each row continuing its sequence in
        ``caches[b]`` (one per attention layer, moved on by T positions): ``[B, vocab]`` for each
        sequence's last token when ``last_only``, else ``[B, T, vocab]``; or None where the
        compiled step does not apply (caches not float32 host ones, a sequence's caches at
        different offsets) or its region was abandoned: the caller then runs the grid, which
        rewrites what this wrote."""
        B, T = tokens.shape
        starts = []
        for row in caches:
            start = row[0].offset
            for c in row:
                if c.offset != start or not c.on_host_float32:
                    return None
            starts.append(start)
        for row in caches:
            for c in row:
                c.reserve(T)
        # [layers, sequences, 3], after reserve: growth moves the buffers
        addresses = np.array([[c.host_buffers() for c in row] for row in caches], np.int64).transpose(1, 0, 2)
        x0, _ = self.embedding.forward(tokens, None)
        cos, sin = self._angles(tuple(starts), T)
        pace()
        threads = numba.get_num_threads()
        flags = counters(threads)
        shared, acts = self._scratch(B * T, B if last_only else B * T)
        args = (flags, x0.reshape(B * T, -1), self.mats, self.kinds, self.rows, self.fns, self.vecs,
                self.dims, self.eps, self.qk_eps, self.scale, self.resid, self.softcap, self.interleaved,
                self.act,
                self.windows, cos, sin, np.ascontiguousarray(addresses), np.array(starts, np.int64), T,
                last_only, shared, *acts)
        if threads == 1:
            _step_worker(0, 1, *args)
        else:
            _step_parallel(threads, *args)
        if flags[threads * PAD]:
            return None
        for row in caches:
            for c in row:
                c.offset += T
        logits = self.head.finished(shared[-1])  # granite's scaling, gemma2's cap: the grid head's own
        return logits if last_only else logits.reshape(B, T, -1)

    def _scratch(self, R: int, heads: int) -> tuple:
        """The step's shared arrays for R rows and the shared activation buffers of the model,
        attention and MLP widths (by dtype, :func:`_acts_set`): kept per calling thread and row
        count (a step allocating ten arrays cost more than its barriers), the logits of
        ``heads`` rows new each step (the caller keeps them)."""
        kept = self._kept.__dict__.setdefault("rows", {})
        rows = kept.get(R)
        if rows is None:
            if len(kept) >= 8:  # batch sizes vary while serving
                kept.clear()
            d, H, Hkv, hd, ffn, _ = (int(n) for n in self.dims)
            # q k v att o gate up h down, the rotated queries
            widths = (H * hd, Hkv * hd, Hkv * hd, H * hd, d, ffn, ffn, ffn, d, H * hd)
            acts = _acts_by_dtype(R, (d, H * hd, ffn))
            rows = kept[R] = (tuple(np.empty((R, n), F32) for n in widths), acts)
        return (*rows[0], np.empty((heads, self.vocab), F32)), rows[1]

    def _angles(self, starts: tuple[int, ...], T: int) -> tuple[np.ndarray, np.ndarray]:
        """Each attention layer's RoPE cos and sin at each row's position: ``[layers, sequences *
        T, head_dim / 2]`` (one computation per distinct RoPE, as the grid's layers share it)."""
        R = len(starts) * T
        cos = np.empty((len(self.attentions), R, int(self.dims[3]) // 2), F32)
        sin = np.empty_like(cos)
        for rope, layers in self.ropes:
            c, s = rope.angles(starts, T)
            cos[layers], sin[layers] = c.reshape(R, -1), s.reshape(R, -1)
        return cos, sin


def fused_step(net, ids: np.ndarray, caches, last_only: bool = True) -> np.ndarray | None:
    """``net.step(ids, caches)``'s logits by the compiled step, or None where it does not apply
    (module doc): integer ``ids`` ``[B, T]`` (at most MAX_ROWS in all) and each sequence's caches,
    in the int8 mode, nothing observing; ``last_only`` as ``CausalLM.step``'s. The layout is
    gathered on first use and again after the network changes."""
    if ids.ndim != 2 or ids.size > MAX_ROWS or ids.dtype.kind not in "iu" or caches is None \
            or len(caches) != ids.shape[0] or not int8_enabled():
        return None  # (float ids: the grid's embedding checks they hold integers)
    known = net.__dict__.get("_fused_decoder")
    if known is None or not known[0].current():
        blocks = _decoder_blocks(net)
        known = net.__dict__["_fused_decoder"] = (
            _Watch(net), FusedDecoder(net, blocks) if blocks and FusedDecoder.fits(net, blocks) else None)
    return None if known[1] is None else known[1].step(ids, caches, last_only)
