"""LLM variants of the core layers: the file's weights kept as they are, float32 compute, KV caches.

Each class subclasses a core family and keeps its ``type_name`` (Embedding, RMSNorm,
MultiHeadAttention, SwiGLU, Dense), so the grid, the 3-D view, telemetry, morphing and DNA treat a
language model like any other network. They are not ``@register``-ed: Loom JSON still builds the
core classes.

Weights live in a :class:`MatrixStore`: named matrices, each a ``QuantMatrix`` (GGUF blocks read in
place) or a float32 array. The float32 master in Loom's flat layout is only built when something
asks for it (morphing, DNA); until the master changes or the layer is morphed, forward multiplies
with the named matrices directly. The layers are inference-only: backward raises.

Attention continues sequences when its run context is a :class:`~.kv_cache.CachedRun` (the
decode path, ``CausalLM.step``): a list of :class:`~.kv_cache.KVCache` per batch row, one per
attention layer. Under any other run every call is a fresh sequence starting at position 0.

On a device backend (``CausalLM.place``) each layer holds a :class:`DeviceCopy` of its weights,
uploaded once, and its forward runs the array-API form of the same computation on the backend's
namespace, the matrices through the backend's :class:`~.device_kernels.LLMKernels`. A layer asks
whether it has one once per call; the numpy path is otherwise the code it always was.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ... import dtypes
from ...activations import activate
from ...backend import Backend, array_module, to_host
from ...errors import LoomConfigError, LoomShapeError
from ...layers.attention import MultiHeadAttention
from ...layers.base import LayerConfig
from ...layers.dense import Dense
from ...layers.embedding import Embedding
from ...layers.norms import RMSNorm
from ...layers.swiglu import SwiGLU
from ...weights import WeightStore, error_from_sums, error_sums
from ..kernels.attention_kernel import append_and_attend, attend_checked
from ..kernels.block_morph import (
    BLOCK_FORMATS,
    block_elems,
    encode,
    encoding_name,
    is_block_format,
    is_matrix,
    stored_nbytes,
)
from ..kernels.device_kernels import LLMKernels
from ..kernels.mlp_kernel import GATED_ACTIVATIONS, gated
from ..kernels.norm_kernel import rms_norm_rows
from ..kernels.quant import Matrix, float_matmul
from ..kernels.quant_int8 import int8_enabled, int8_product, int8_products, supports
from .kv_cache import CachedRun
from .rope import Rope

# What one matrix can be encoded in by MatrixStore.morph_parts: the block formats, and F16 for a
# matrix whose rows are not whole blocks of 32 (llama.cpp's last fallback, see .recipe).
PART_FORMATS = (*BLOCK_FORMATS, "F16")


def linear(x: np.ndarray, w: Matrix) -> np.ndarray:
    """``x @ w.T`` over the last axis of ``x`` for a float32 array or a quantized matrix ``w[out, in]``."""
    rows = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), dtype=np.float32)
    if isinstance(w, np.ndarray):
        y = float_matmul(w, rows)  # row-invariant: BLAS's row t changes with the rows beside it
    elif int8_enabled() and supports(w):
        # the opt-in llama.cpp-style mode (8-bit activations), prompts too: row-invariant, and
        # faster than dequantize + BLAS (SmolLM2 200-token prefill 422 -> 599 tokens/s, 600: 406 -> 515)
        y = int8_product(w, rows)
    elif rows.shape[0] == 1:  # decode: the fused dequantize-and-multiply kernel
        y = w.matvec(rows[0])[None, :]
    else:
        y = w.matmul(rows)
    return y.reshape(*x.shape[:-1], y.shape[-1])


def linears(x: np.ndarray, ws: tuple[Matrix, ...]) -> list[np.ndarray]:
    """:func:`linear` of one input with several matrices (attention's Q, K, V; the MLP's gate and
    up). In the int8 mode the input is quantized once for all of them (``int8_products``)."""
    if int8_enabled() and all(map(supports, ws)):
        rows = np.ascontiguousarray(x.reshape(-1, x.shape[-1]), dtype=np.float32)
        return [y.reshape(*x.shape[:-1], y.shape[-1]) for y in int8_products(ws, rows)]
    return [linear(x, w) for w in ws]


def plus_bias(y: np.ndarray, store: MatrixStore, w: dict[str, Matrix], name: str) -> np.ndarray:
    """``y + w[name]``, or ``y`` itself while that bias is still a filler of zeros (the model has
    no bias there: transformers adds none, and the add is a few microseconds a layer of decode)."""
    b = w[name]
    return y if store.is_filler(name, b) else y + b


def scaled(y, scale: float):
    """``y * scale`` in float32 (granite's residual multiplier), ``y`` itself for a scale of 1;
    ``y`` a numpy or device array."""
    return y if scale == 1 else y * float(np.float32(scale))


def dense(m: Matrix) -> np.ndarray:
    """A matrix as a float32 array (dequantized when it is a QuantMatrix)."""
    return m if isinstance(m, np.ndarray) else np.asarray(m.dequantize(), dtype=np.float32)


def rms_norm(x: np.ndarray, gamma: np.ndarray, eps: float) -> np.ndarray:
    """``x / sqrt(mean(x^2) + eps) * gamma`` over the last axis, in float32 as transformers does:
    one compiled call with numpy's own operations and bits for float32 arrays (the decode step's
    case, see :mod:`.norm_kernel`), :func:`rms_norm_xp` otherwise."""
    if x.dtype == np.float32 and gamma.dtype == np.float32 and x.flags.c_contiguous and x.size:
        out = np.empty_like(x)
        n = x.shape[-1]
        rms_norm_rows(x.reshape(-1, n), gamma, eps, out.reshape(-1, n))
        return out
    return rms_norm_xp(x, gamma, eps)


def rms_norm_xp(x, gamma, eps: float):
    """:func:`rms_norm` as array operations on any namespace (a device's; numpy for other dtypes
    or layouts): the same operations in the same order (``np.sum`` is numpy's pairwise
    ``add.reduce``, the kernel's sum)."""
    xp = array_module(x)
    mean_square = xp.sum(x * x, axis=-1, keepdims=True) / float(x.shape[-1])
    return (x * (1.0 / xp.sqrt(mean_square + float(eps)))) * gamma


def norm_heads(norm, x, gamma, eps: float):
    """Q or K heads ``x[..., heads, hd]`` RMS-normed by ``norm`` (:func:`rms_norm` or
    :func:`rms_norm_xp`): each head alone for a gamma of ``hd`` (qwen3, gemma3), all heads as one
    vector for a gamma of ``heads * hd`` (olmo2)."""
    if gamma.shape[0] == x.shape[-1]:
        return norm(x, gamma, eps)
    xp = array_module(x)
    return xp.reshape(norm(xp.reshape(x, (*x.shape[:-2], -1)), gamma, eps), x.shape)


def soft_cap(x, cap: float):
    """``tanh(x / cap) * cap`` on any namespace (gemma2's final logit soft-capping)."""
    xp = array_module(x)
    return xp.tanh(x / cap) * cap


# ----- a layer's weights on a device backend -------------------------------------------------
class Uploads:
    """A model's matrices on one device backend, each uploaded once whichever layers use it (a
    tied embedding table and LM head: one upload, where the kernels keep it a float32 array).

    ``how``: "matrix" (through :meth:`LLMKernels.upload`, what :meth:`LLMKernels.linear` reads),
    "rows" (a float32 array rows are gathered from) or "vector" (a bias or norm gamma)."""

    def __init__(self, kernels: LLMKernels):
        self.kernels = kernels
        self.backend: Backend = kernels.backend
        self.xp = kernels.xp
        # (id(m), how) -> (m, its device copy): m is kept so that its id is not reused
        self._done: dict[tuple[int, str], tuple[Matrix, object]] = {}

    def get(self, m: Matrix, how: str):
        hit = self._done.get((id(m), how))
        if hit is None:
            hit = self._done[(id(m), how)] = (m, self._upload(m, how))
        return hit[1]

    def _upload(self, m: Matrix, how: str):
        xp = self.xp
        if how == "matrix":
            return self.kernels.upload(m)
        if how == "rows":
            shared = self._done.get((id(m), "matrix"))
            if shared is not None and array_module(shared[1]) is xp and shared[1].dtype == xp.float32:
                return shared[1]
            return self.kernels.table(m)
        return xp.asarray(np.asarray(m, dtype=np.float32))


def layer_label(layer) -> str:
    """A layer as errors name it: its class and where it sits in the grid (once placed there)."""
    where = getattr(layer, "path", "") or getattr(layer, "coords", "")
    return f"{type(layer).__name__} {where}".strip()


class DeviceCopy:
    """One layer's weights on a device backend: its current matrices (:meth:`MatrixStore.current`)
    uploaded on creation, uploaded again only when the layer's weights change (a morph, a new
    master). Filler biases (:func:`is_filler_bias`) are not uploaded: the device path adds none,
    as the host path skips them."""

    def __init__(self, uploads: Uploads, layer: InferenceOnly):
        self.uploads = uploads
        self.backend = uploads.backend
        self.kernels = uploads.kernels
        self.rows = layer.rows_parts  # parts read row by row (the embedding table), not multiplied
        self._key: tuple | None = None
        self._arrays: dict[str, object] = {}
        self._refresh(layer)

    def arrays(self, layer, ctx) -> dict[str, object]:
        """The layer's weights on the device, for a forward under run context ``ctx``.

        Raises:
            LoomConfigError: the network runs on another backend than these weights (a network
                mixing devices).
        """
        backend = ctx.net.backend
        if backend != self.backend:
            raise LoomConfigError(
                f"{layer_label(layer)}: its weights are on the {self.backend.name!r} backend's device "
                f"({self.backend.device}), the network runs on {backend.name!r} ({backend.device}); a "
                "network runs on one device (CausalLM.place puts every layer there)")
        self._refresh(layer)
        return self._arrays

    def _refresh(self, layer) -> None:
        """Upload the layer's current matrices unless those uploaded are still its current ones."""
        store = layer.weights
        key = (layer.cfg.dtype, store.version, store.encoded)
        if self._key is not None and self._key[:2] == key[:2] and self._key[2] is key[2]:
            return
        current = store.current(layer.cfg.dtype)
        self._arrays = {name: None if store.is_filler(name, m)
                        else self.uploads.get(m, self._how(name, m)) for name, m in current.items()}
        self._key = key

    def _how(self, name: str, m: Matrix) -> str:
        if name in self.rows:
            return "rows"
        return "matrix" if len(m.shape) == 2 else "vector"

    def linear(self, x, m):
        """``x @ m.T`` over the last axis of device array ``x`` (any leading shape)."""
        xp = self.uploads.xp
        y = self.kernels.linear(xp.reshape(x, (-1, x.shape[-1])), m)
        return xp.reshape(y, (*x.shape[:-1], y.shape[-1]))

    def linear_bias(self, x, w: dict[str, object], matrix: str, bias: str):
        """``x @ w[matrix].T + w[bias]``, the bias left out while it is a filler (None)."""
        y = self.linear(x, w[matrix])
        return y if w[bias] is None else y + w[bias]


class MatrixStore(WeightStore):
    """A layer's weights as named matrices, with the float32 master built on demand.

    The master is the matrices flattened in insertion order (which the layers choose to be
    Loom's layout), so morphing and DNA see an ordinary :class:`WeightStore`.
    """

    def __init__(self, blocks: dict[str, Matrix]):
        self.blocks = dict(blocks)  # the file's matrices: what block formats are encoded from
        self.encoded: dict[str, Matrix] | None = None  # the matrices in a block format, when morphed to one
        self.scale = 1.0
        self.version = 0
        self.native: dict[str, np.ndarray] = {}
        self._compute: dict[tuple, tuple[int, object]] = {}
        self._master: np.ndarray | None = None
        # zero biases the builders put where the file has none (Loom's layout has the slots)
        self.fillers = frozenset(name for name, m in self.blocks.items() if is_filler_bias(name, m))

    def is_filler(self, name: str, m: Matrix) -> bool:
        """Whether ``m``, the current matrix ``name``, is still the zero bias a builder filled in."""
        return name in self.fillers and m is self.blocks[name]

    @property
    def master(self) -> np.ndarray:
        if self._master is None:
            self._master = np.concatenate([dense(m).reshape(-1) for m in self.blocks.values()])
        return self._master

    @master.setter
    def master(self, value) -> None:
        self._master = np.ascontiguousarray(value, dtype=np.float32).reshape(-1)

    def __len__(self) -> int:
        return sum(math.prod(m.shape) for m in self.blocks.values())

    def nbytes(self, dtype: str) -> int:
        return dtypes.packed_nbytes(len(self), dtype)

    def current(self, layer_dtype: str) -> dict[str, Matrix]:
        """The matrices forward multiplies with: the file's own, or their block-format encoding,
        until the master is changed or the layer is morphed to a Loom dtype, then views of the
        (dequantized) master."""
        if self._as_blocks(layer_dtype):
            return self.encoded if self.encoded is not None else self.blocks
        flat = self.values(np, np.float32, layer_dtype)
        out, at = {}, 0
        for name, m in self.blocks.items():
            n = math.prod(m.shape)
            out[name] = flat[at:at + n].reshape(m.shape)
            at += n
        return out

    def _as_blocks(self, layer_dtype: str) -> bool:
        return self.version == 0 and layer_dtype == "float32"

    # ----- morph targets: GGUF's block formats besides Loom's dtypes (see .block_morph) -----------
    def file_encoding(self) -> str:
        """The file's encoding of the matrices, e.g. ``"Q4_1"`` or ``"Q4_K+Q6_K"`` (``"F32"`` for a
        layer of vectors only): the target that goes back to the file's own blocks."""
        return _label(self.blocks)

    def targets(self) -> tuple[str, ...]:
        blocks = BLOCK_FORMATS if any(is_matrix(m) for m in self.blocks.values()) else ()
        loom = [d for d in super().targets() if d != "float32"]  # the file's encoding stands for it
        return tuple(dict.fromkeys((self.file_encoding(), *blocks, *loom)))

    def matrix_parts(self) -> tuple[str, ...]:
        """The parts block formats apply to: the 2-D matrices (vectors stay float32)."""
        return tuple(name for name, m in self.blocks.items() if is_matrix(m))

    def block_encodings(self, layer_dtype: str) -> dict[str, str] | None:
        """Each matrix's block encoding as forward reads it (the file's, or what a morph gave it),
        or None while the layer reads a Loom dtype (see :meth:`current`)."""
        if not self._as_blocks(layer_dtype):
            return None
        current = self.current(layer_dtype)
        return {part: encoding_name(current[part]) for part in self.matrix_parts()}

    def refusal(self, target: str) -> str:
        if target in (self.file_encoding(), "float32"):
            return ""
        if is_block_format(target):
            return self.parts_refusal(dict.fromkeys(self.matrix_parts(), target))
        return super().refusal(target)

    def parts_refusal(self, formats: Mapping[str, str]) -> str:
        """Why :meth:`morph_parts` cannot give these matrices these formats ("" when it can)."""
        if self.version != 0:
            return "its weights were changed in place, and block formats are encoded from the file's"
        matrices = self.matrix_parts()
        for part, fmt in formats.items():
            if part not in matrices:
                return f"it has no matrix {part!r} (its matrices: {', '.join(matrices) or 'none'})"
            if fmt not in PART_FORMATS:
                return f"{fmt!r} is not a format for one matrix ({', '.join(PART_FORMATS)})"
        problems = []
        for fmt in dict.fromkeys(formats.values()):
            n = block_elems(fmt)
            bad = sorted({self.blocks[p].shape[1] for p, f in formats.items() if f == fmt
                          and self.blocks[p].shape[1] % n})
            if bad:
                rows = ", ".join(map(str, bad))
                problems.append(f"rows of {rows} weights are not whole {fmt} blocks of {n}")
        return "; ".join(problems)

    def morph_to(self, target: str) -> str:
        if target in (self.file_encoding(), "float32"):
            return self._use_encoded(None)  # the file's own (its encoding named, or Loom's float32)
        if is_block_format(target):
            return self.morph_parts(dict.fromkeys(self.matrix_parts(), target))
        self.encoded = None
        return super().morph_to(target)

    def morph_parts(self, formats: Mapping[str, str],
                    importance: Mapping[str, np.ndarray | None] | None = None) -> str:
        """Encode each matrix named in ``formats`` (part -> one of :data:`PART_FORMATS`) in its own
        format (a layer of Q4_K and Q6_K matrices, as llama.cpp's mixes make them); the matrices not
        named keep their block encoding (the file's, when the layer is in a Loom dtype now). A
        format equal to the file's matrix gives back the file's own. ``importance`` (part -> its
        imatrix vector) weighs the quantization as llama-quantize's ``--imatrix`` does. Returns
        the layer's dtype."""
        encoded = dict(self.encoded if self.encoded is not None else self.blocks)
        for part, fmt in formats.items():
            encoded[part] = encode(self.blocks[part], fmt, (importance or {}).get(part))
        same = all(encoded[name] is m for name, m in self.blocks.items())
        return self._use_encoded(None if same else encoded)

    def _use_encoded(self, encoded: dict[str, Matrix] | None) -> str:
        self.encoded = encoded
        # no float32 master or Loom dtype copies stay behind: the file's blocks rebuild them
        self.native.clear()
        self._compute.clear()
        if self.version == 0:
            self._master = None
        return "float32"

    def encoding(self, layer_dtype: str) -> str:
        return _label(self.current(layer_dtype)) if self._as_blocks(layer_dtype) else layer_dtype

    def stored(self, layer_dtype: str) -> dict[tuple, tuple[str, int]]:
        """As stored in a GGUF file (blocks, 4 bytes per float32 weight; filler biases are none of
        the model's), each matrix by identity; in a Loom dtype the packed bytes of the layer."""
        if self._as_blocks(layer_dtype):
            return {(id(m),): (encoding_name(m), stored_nbytes(m))
                    for name, m in self.current(layer_dtype).items() if not is_filler_bias(name, m)}
        return {(layer_dtype, *sorted(self.tensor_sizes())): (layer_dtype, self.nbytes(layer_dtype))}

    def error(self, layer_dtype: str) -> tuple[float, float]:
        """Against the file's weights, a matrix at a time (no float32 copy of the layer is made)
        for a block-format encoding; against the master for a Loom dtype."""
        if not self._as_blocks(layer_dtype):
            return super().error(layer_dtype)
        if self.encoded is None:
            return 0.0, 1.0
        totals = np.zeros(4)
        for name, m in self.blocks.items():
            totals += error_sums(dense(m), dense(self.encoded[name]))
        return error_from_sums(*totals)

    def tensor_sizes(self) -> dict[int, int]:
        """The file's matrices by identity (two layers may share one), without filler biases."""
        return {id(m): math.prod(m.shape) for name, m in self.blocks.items() if not is_filler_bias(name, m)}

    def encodings(self, layer_dtype: str) -> dict[str, str]:
        """Each matrix's encoding as forward reads it (see :meth:`current`): the file's own (Q4_1,
        Q6_K, F16 ...; float32 for vectors) or a block format it was morphed to, until the master
        is changed or the layer is morphed to a Loom dtype, then that dtype for all of them."""
        if self._as_blocks(layer_dtype):
            return {name: "float32" if isinstance(m, np.ndarray) else m.type_name
                    for name, m in self.current(layer_dtype).items()}
        return dict.fromkeys(self.blocks, layer_dtype)

    def sample(self, limit: int, rng: np.random.Generator) -> np.ndarray:
        """As :meth:`WeightStore.sample`; while the master is not built and still the file's
        matrices, whole rows are drawn from each matrix in proportion to its size instead, so a
        28M-weight table is never dequantized whole for a look at its values."""
        if self._master is not None or self.version != 0:
            return super().sample(limit, rng)
        total, parts = len(self), []
        for m in self.blocks.values():
            rows = m.shape[0]
            want = rows if total <= limit else min(rows, max(1, round(limit * rows / total)))
            ids = np.arange(rows) if want == rows else np.sort(rng.choice(rows, want, replace=False))
            parts.append(np.asarray(m[ids] if isinstance(m, np.ndarray) else m.rows(ids), np.float32).ravel())
        sample = np.concatenate(parts) if parts else np.empty(0, np.float32)
        if sample.size > limit:  # rounding up to whole rows can overshoot
            sample = sample[np.sort(rng.choice(sample.size, limit, replace=False))]
        return sample

    def copy(self) -> MatrixStore:
        clone = MatrixStore(self.blocks)
        clone.encoded = None if self.encoded is None else dict(self.encoded)
        if self._master is not None:
            clone._master = self._master.copy()
        clone.scale, clone.version = self.scale, self.version
        clone.native = {k: v.copy() for k, v in self.native.items()}
        return clone


def _label(matrices: dict[str, Matrix]) -> str:
    """A layer's encoding in one word: its matrices' (vectors are float32 in every encoding)."""
    names = sorted({encoding_name(m) for m in matrices.values() if is_matrix(m)})
    return "+".join(names) if names else "F32"


def is_filler_bias(part: str, m) -> bool:
    """Whether a store's part is a bias of zeros: the layer builders fill the bias slots of
    Loom's layout that the file lacks with zeros, which are not the model's parameters (a file's
    own all-zero bias, which adds nothing, is taken for one too)."""
    return part.startswith("b") and isinstance(m, np.ndarray) and m.ndim == 1 and not m.any()


class InferenceOnly:
    """Mixed into the LLM layers: they run forward only (no training of file weights here)."""

    device_copy: DeviceCopy | None = None  # the weights on a device backend (CausalLM.place)

    def place(self, uploads: Uploads | None) -> None:
        """Run on ``uploads``' device backend from now on (None: on the host, with numpy)."""
        self.device_copy = None if uploads is None else DeviceCopy(uploads, self)

    rows_parts: tuple[str, ...] = ()  # parts read row by row on a device (see DeviceCopy)

    def backward(self, cache, gy, ctx):
        raise LoomConfigError(f"{type(self).__name__} is inference-only: model layers have no backward")


def token_ids(x, vocab_size: int) -> np.ndarray:
    """Integer token ids from ``x`` (ints, or floats holding ints as the grid passes them)."""
    x = np.asarray(x)
    ids = x.astype(np.int64)
    if ids.size and (np.any(ids != x) or ids.min() < 0 or ids.max() >= vocab_size):
        raise LoomShapeError(f"token ids must be integers in [0, {vocab_size}); "
                             f"got values in [{x.min()}, {x.max()}]")
    return ids


class LLMEmbedding(InferenceOnly, Embedding):
    """Token embedding read row by row from the file's table, times ``scale`` (gemma: sqrt(d))."""

    def __init__(self, table: Matrix, scale: float = 1.0):
        vocab, d = table.shape
        super().__init__(LayerConfig(type="Embedding", vocab_size=vocab, embedding_dim=d),
                         MatrixStore({"table": table}))
        self.scale = np.float32(scale)

    rows_parts = ("table",)

    def forward(self, x, ctx, skip=None):
        if self.device_copy is not None:
            return self._forward_on_device(x, ctx), None
        ids = token_ids(x, self.cfg.vocab_size)
        table = self.weights.current(self.cfg.dtype)["table"]
        flat = ids.reshape(-1)
        rows = table[flat] if isinstance(table, np.ndarray) else table.rows(flat)
        y = np.asarray(rows, dtype=np.float32).reshape(*ids.shape, self.cfg.embedding_dim)
        return (y * self.scale if self.scale != 1 else y), None

    def _forward_on_device(self, x, ctx):
        """The table's rows gathered on the device. Ids come from the host (the decode path's);
        a grid forward's float ids on the device are brought over first (one transfer of them),
        since checking them is a host decision."""
        dc = self.device_copy
        table = dc.arrays(self, ctx)["table"]
        ids = token_ids(x if isinstance(x, np.ndarray) else to_host(x), self.cfg.vocab_size)
        xp = dc.uploads.xp
        y = xp.reshape(xp.take(table, xp.asarray(ids.reshape(-1)), axis=0),
                       (*ids.shape, self.cfg.embedding_dim))
        return y * float(self.scale) if self.scale != 1 else y


class LLMRMSNorm(InferenceOnly, RMSNorm):
    """RMSNorm over the last axis (the core one follows Loom's one-row-per-batch-item rule)."""

    def __init__(self, gamma: np.ndarray, eps: float):
        n = gamma.shape[0]
        super().__init__(LayerConfig(type="RMSNorm", input_height=n, output_height=n),
                         MatrixStore({"gamma": np.asarray(gamma, dtype=np.float32)}))
        self.eps = eps

    def forward(self, x, ctx, skip=None):
        if self.device_copy is not None:
            return rms_norm_xp(x, self.device_copy.arrays(self, ctx)["gamma"], self.eps), None
        return rms_norm(x, self.weights.current(self.cfg.dtype)["gamma"], self.eps), None


@dataclass(frozen=True, eq=False)
class AttentionSpec:
    """What one attention layer does beyond its matrices."""

    n_heads: int
    n_kv_heads: int
    head_dim: int
    rope: Rope
    window: int | None = None  # sliding window: positions a query sees, itself included
    scale: float | None = None  # score scale; head_dim ** -0.5 when None
    norm_eps: float = 1e-6  # eps of the Q/K norms (qwen3, gemma3: per head; olmo2: all heads)
    softcap: float | None = None  # scores soft-capped at this (gemma2); None: uncapped
    output_scale: float = 1.0  # times the output (granite's residual multiplier)


class LLMAttention(InferenceOnly, MultiHeadAttention):
    """Causal self-attention with GQA, RoPE, optional Q/K RMSNorm and sliding window.

    ``index`` is the layer's position among the model's attention layers: its slot in each
    sequence's cache list. Store layout: Loom's Wq, Wk, Wv, Wo, bq, bk, bv, bo, then the Q/K
    norm gammas when the model has them.
    """

    def __init__(self, index: int, spec: AttentionSpec, weights: dict[str, Matrix]):
        d = weights["wq"].shape[1]
        cfg = LayerConfig(type="MultiHeadAttention", d_model=d, num_heads=spec.n_heads,
                          num_kv_heads=spec.n_kv_heads, head_dim=spec.head_dim,
                          query_dim=spec.n_heads * spec.head_dim)
        super().__init__(cfg, MatrixStore(weights))
        self.index = index
        self.spec = spec

    def forward(self, x, ctx, skip=None):
        if self.device_copy is not None:
            return self._forward_on_device(x, ctx), None
        s = self.spec
        x3 = x.reshape(-1, *x.shape[-2:]) if x.ndim >= 2 else x.reshape(1, 1, -1)
        B, T, _ = x3.shape
        # the decode path's caches; any other run (a Loom-style forward) is a fresh sequence
        caches = ctx.layer_caches(self.index, B) if isinstance(ctx, CachedRun) else None
        starts = tuple(c.offset for c in caches) if caches else (0,) * B
        q, k, v = self.queries_keys_values(x3, ctx, starts)
        if caches and all(c.on_host_float32 for c in caches):  # one call for every sequence
            out = append_and_attend(q, np.ascontiguousarray(k), np.ascontiguousarray(v), caches, starts,
                                    s.window, self.score_scale, s.softcap)
        else:
            out = np.empty((B, T, s.n_heads * s.head_dim), dtype=np.float32)
            for b in range(B):
                kb, vb = k[b].transpose(1, 0, 2), v[b].transpose(1, 0, 2)
                if caches:  # the kernel reads the whole buffers (contiguous; float16 as its bits)
                    caches[b].update_and_fetch(kb, vb)
                    kb, vb = caches[b].keys, caches[b].values
                out[b] = self._attend(q[b], kb, vb, starts[b])
        y = self.output(out, ctx)
        return y.reshape(*x.shape[:-1], y.shape[-1]), None

    def queries_keys_values(self, x3, ctx, starts: tuple[int, ...]) -> tuple:
        """Queries ``[B, T, heads, hd]``, keys and values ``[B, T, kv_heads, hd]`` of ``x3[B, T, d]``
        (numpy, or the device's arrays once placed), sequence ``b`` at positions ``starts[b]..``:
        projections and biases, the Q/K norms, RoPE."""
        s, dc = self.spec, self.device_copy
        B, T, _ = x3.shape
        shapes = ((B, T, s.n_heads, s.head_dim), (B, T, s.n_kv_heads, s.head_dim))
        if dc is None:
            w, st = self.weights.current(self.cfg.dtype), self.weights
            q, k, v = (plus_bias(y, st, w, bias) for y, bias in
                       zip(linears(x3, (w["wq"], w["wk"], w["wv"])), ("bq", "bk", "bv"), strict=True))
            q, k, v = q.reshape(shapes[0]), k.reshape(shapes[1]), v.reshape(shapes[1])
            norm = rms_norm
        else:
            w, xp = dc.arrays(self, ctx), dc.uploads.xp
            q, k, v = (xp.reshape(dc.linear_bias(x3, w, f"w{n}", f"b{n}"), shape)
                       for n, shape in zip("qkv", (shapes[0], shapes[1], shapes[1]), strict=True))
            norm = rms_norm_xp
        if "q_norm" in w:
            q, k = norm_heads(norm, q, w["q_norm"], s.norm_eps), norm_heads(norm, k, w["k_norm"], s.norm_eps)
        q, k = s.rope(starts, T, q, k) if dc is None else s.rope.on_device(starts, T, xp, q, k)
        return q, k, v

    def output(self, out, ctx):
        """The heads' outputs ``out[..., heads * hd]`` projected by Wo, plus its bias, times the
        layer's ``output_scale``: what the layer returns."""
        dc = self.device_copy
        if dc is None:
            w = self.weights.current(self.cfg.dtype)
            y = plus_bias(linear(out, w["wo"]), self.weights, w, "bo")
        else:
            y = dc.linear_bias(out, dc.arrays(self, ctx), "wo", "bo")
        return scaled(y, self.spec.output_scale)

    def _attend(self, q, keys, values, start: int) -> np.ndarray:
        """Queries ``q[T, H, hd]`` at positions ``start..start+T-1`` over ``keys/values[Hkv, S, hd]``
        at positions ``0..S-1`` (float32, or a float16 cache's bits); returns ``[T, H*hd]``, each
        query's row the same bits whatever T is (see :mod:`.attention_kernel`)."""
        # the layer's own q, keys and values fit together: attend's checks are skipped (~30 calls
        # a token); a KVCache's keys are a transposed view of a head_dim-major buffer: no copy
        return attend_checked(q, np.ascontiguousarray(keys.transpose(0, 2, 1)), np.ascontiguousarray(values),
                              start, self.spec.window, self.score_scale, self.spec.softcap)

    @property
    def score_scale(self) -> float:
        """What query-key products are multiplied by (``head_dim ** -0.5`` unless the model says)."""
        s = self.spec
        return s.scale if s.scale is not None else s.head_dim ** -0.5

    def _forward_on_device(self, x, ctx):
        """:meth:`forward` on the device: projections through the backend's kernels, Q/K norms,
        RoPE (angles uploaded once per step), the caches' device buffers, ``LLMKernels.attend``."""
        s, dc = self.spec, self.device_copy
        dc.arrays(self, ctx)  # refuses a network running on another backend, before any array work
        xp = dc.uploads.xp
        x3 = xp.reshape(x, (-1, *x.shape[-2:]) if x.ndim >= 2 else (1, 1, -1))
        B, T, _ = x3.shape
        caches = ctx.layer_caches(self.index, B) if isinstance(ctx, CachedRun) else None
        starts = tuple(c.offset for c in caches) if caches else (0,) * B
        q, k, v = self.queries_keys_values(x3, ctx, starts)
        rows = []
        for b in range(B):
            kb, vb = xp.permute_dims(k[b, ...], (1, 0, 2)), xp.permute_dims(v[b, ...], (1, 0, 2))
            if caches:
                kb, vb = caches[b].update_and_fetch(kb, vb)
                if caches[b].dtype == "float32":  # the whole buffers, as on the host: attend reads
                    kb, vb = caches[b].keys, caches[b].values  # what it needs, and no view is copied
            rows.append(dc.kernels.attend(q[b, ...], kb, vb, starts[b], s.window, self.score_scale,
                                          s.softcap))
        y = self.output(xp.stack(rows), ctx)
        return xp.reshape(y, (*x.shape[:-1], y.shape[-1]))


class LLMGatedMLP(InferenceOnly, SwiGLU):
    """``down(act(gate(x)) * up(x))`` with SiLU (SwiGLU) or tanh-GELU (gemma) gate; ``activation``
    is a Loom activation name; ``output_scale`` multiplies the output (granite's residual
    multiplier). Store layout: Loom's Wgate, Wup, Wdown, bgate, bup, bdown."""

    def __init__(self, weights: dict[str, Matrix], activation: str = "Silu", output_scale: float = 1.0):
        ffn, d = weights["gate"].shape
        cfg = LayerConfig(type="SwiGLU", activation=activation, input_height=d, output_height=ffn)
        blocks = {name: weights[name] for name in ("gate", "up", "down")}
        for name, width in (("b_gate", ffn), ("b_up", ffn), ("b_down", d)):
            blocks[name] = weights.get(name, np.zeros(width, np.float32))
        super().__init__(cfg, MatrixStore(blocks))
        self.output_scale = output_scale

    def forward(self, x, ctx, skip=None):
        if self.device_copy is not None:
            dc = self.device_copy
            w = dc.arrays(self, ctx)
            h = activate(self.cfg.act_id, dc.linear_bias(x, w, "gate", "b_gate")) * \
                dc.linear_bias(x, w, "up", "b_up")
            return scaled(dc.linear_bias(h, w, "down", "b_down"), self.output_scale), None
        w = self.weights.current(self.cfg.dtype)
        st = self.weights
        gate, up = linears(x, (w["gate"], w["up"]))
        gate, up = plus_bias(gate, st, w, "b_gate"), plus_bias(up, st, w, "b_up")
        if int8_enabled() and self.cfg.act_id in GATED_ACTIVATIONS:  # the fused step's bits (mlp_kernel)
            h = gated(self.cfg.act_id, gate, up)
        else:
            h = activate(self.cfg.act_id, gate) * up
        return scaled(plus_bias(linear(h, w["down"]), st, w, "b_down"), self.output_scale), None


class LLMHead(InferenceOnly, Dense):
    """The LM head: logits over the vocabulary, divided by ``divisor`` (granite's logits scaling),
    soft-capped at ``softcap`` when given (gemma2); ``weight`` may be the embedding's own table."""

    def __init__(self, weight: Matrix, divisor: float = 1.0, softcap: float | None = None):
        vocab, d = weight.shape
        super().__init__(LayerConfig(type="Dense", input_height=d, output_height=vocab),
                         MatrixStore({"weight": weight}))
        self.divisor = divisor
        self.softcap = softcap

    def forward(self, x, ctx, skip=None):
        if self.device_copy is not None:
            y = self.device_copy.linear(x, self.device_copy.arrays(self, ctx)["weight"])
        else:
            y = linear(x, self.weights.current(self.cfg.dtype)["weight"])
        return self.finished(y), None

    def finished(self, logits):
        """``logits / divisor`` in float32, then soft-capped (the logits themselves for neither)."""
        if self.divisor != 1:
            logits = logits / float(np.float32(self.divisor))
        return logits if self.softcap is None else soft_cap(logits, self.softcap)
