"""Importance matrices: llama.cpp's ``llama-imatrix`` statistics, computed here and read and written
in its file formats (issue 36 §2). ``llama-quantize --imatrix`` weighs each matrix's quantization
error by them; IQ2/IQ1 types need one.

What is collected (``tools/imatrix/imatrix.cpp``, ``IMatrixCollector::collect_imatrix``): for every
weight matrix of a block (``blk.N.attn_q.weight`` ... ``blk.N.ffn_down.weight``), over every token
of every chunk, the sum of squares of the matrix's *input* per input column (``in_sum2``, one value
per column), the plain sum (``in_sum``), and ``counts``, the number of tokens (input rows) seen.
``in_sum2 / counts`` is the importance llama-quantize uses (a tensor never reached: 1.0). Q, K and V
share their input, as do gate and up; down's input is ``act(gate x) * up x``, recomputed here from
the MLP's input with the layer's own weights. The LM head (``output.weight``) is skipped unless asked
for (``--process-output``); a head tied to ``token_embd`` is skipped even then, as llama.cpp's
name filter does. Mixture-of-experts models (per-expert rows, counted over the tokens routed to
each expert) are refused.

Chunking (``compute_imatrix`` in imatrix.cpp): the whole text is tokenized once, with the model's BOS
where it adds one and special-token text left as text (no ``--parse-special``); it must hold at least
``2 * ctx`` tokens; it is cut into ``len // ctx`` chunks of ``ctx`` tokens (``chunks`` caps that; the
rest of the text is unused), each run from position 0 with a fresh KV state and its first token
replaced by BOS when the model adds one. Every token of a chunk counts (the first-half skip is the
perplexity score's, not the statistics'), so each chunk adds ``ctx`` to each count, and
``imatrix.chunk_count`` is the number of chunks, ``imatrix.chunk_size`` is ``ctx``. (llama.cpp also
skips a product over fewer than 16 tokens; its batches hold ``2048 // ctx`` chunks at once, so only a
last batch of under 16 tokens in all is skipped there; here every token counts.)

Files:

* GGUF (the current format): ``general.type = "imatrix"``, ``imatrix.datasets`` (string array),
  ``imatrix.chunk_count`` and ``imatrix.chunk_size`` (uint32); per matrix, in sorted name order,
  ``<name>.in_sum2`` (F32, ``[n_mat, n_per_row]``, 1-D when ``n_mat`` is 1), ``<name>.counts``
  (F32, one per ``n_mat``) and ``<name>.in_sum`` (F32, like in_sum2).
* the legacy ``.dat`` (little-endian): ``int32 n_entries``; per entry ``int32 name length``, the name,
  ``int32 ncall``, ``int32 nval``, ``float32 values[nval]``; then ``int32 chunk count``, ``int32
  length`` and the dataset name. ``ncall = ceil(max count / chunk_size)`` and each value is
  ``in_sum2 / count * ncall`` (1 * ncall for a count of 0), so ``values / ncall`` is the importance.
  The file has no chunk size: reading one back, llama.cpp takes its own ``--ctx`` (512 by default)
  as it and restores ``in_sum2 = value * chunk_size``, ``counts = ncall * chunk_size``.

Statistics are summed in float64 here and kept as llama.cpp keeps them, float32 sums and integer
counts. Bad files raise :class:`~loomlab.core.errors.ModelFormatError` naming the field and byte
offset; every length is checked against the file's size before anything is allocated for it.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter
from gguf.gguf_writer import WriterState

from ...activations import activate
from ...backend import array_module, to_host
from ...cancel import Cancel, as_cancel_check
from ...errors import LoomCancelled, LoomConfigError, ModelFormatError
from ...inspect.trace import Tracer
from ...io.atomic import replacing
from ...layer_names import ATTENTION_TENSORS, MLP_TENSORS
from ..files.gguf_file import MAGIC, open_gguf
from ..kernels.quant_int8 import int8_activations
from ..model.kv_cache import CachedRun
from ..model.llm_layers import LLMGatedMLP, linears, plus_bias
from ..model.moe_layer import LLMMixtureOfExperts
from .drift import bos_id

DEFAULT_CTX = 512  # llama-imatrix's default --ctx-size, and the chunk size it assumes reading a .dat
KEY_TYPE, IMATRIX_TYPE = "general.type", "imatrix"
KEY_DATASETS = "imatrix.datasets"
KEY_CHUNK_COUNT = "imatrix.chunk_count"
KEY_CHUNK_SIZE = "imatrix.chunk_size"
SUM2, COUNTS, SUM = ".in_sum2", ".counts", ".in_sum"
# Architectures whose GGUF files hold fused matrices, loaded here as separate parts: the parts'
# statistics are the fused tensor's (one input), named as llama.cpp names that tensor.
FUSED = {"phi3": {"attn_q": "attn_qkv", "attn_k": "attn_qkv", "attn_v": "attn_qkv", "ffn_gate": "ffn_up"}}
MAX_NAME_BYTES = 1 << 16  # a tensor name; GGML_MAX_NAME is 64, anything near this is a broken file

Progress = Callable[[int, int], None]  # (chunks done, chunks)
_I32 = struct.Struct("<i")


@dataclass
class ImportanceMatrix:
    """Per weight tensor (GGUF name, ``blk.0.attn_q.weight``): ``in_sum2`` float32 ``[n_mat,
    n_per_row]`` (n_mat is 1 for a plain matrix, the expert count for a stacked one), ``counts``
    int64 ``[n_mat]`` (tokens seen), ``in_sum`` like in_sum2 when known (a ``.dat`` has none); and
    the run's ``chunk_count``, ``chunk_size`` and ``datasets`` (the texts it was computed on)."""

    in_sum2: dict[str, np.ndarray]
    counts: dict[str, np.ndarray]
    chunk_count: int
    chunk_size: int
    datasets: list[str] = field(default_factory=list)
    in_sum: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        """The tensor names, sorted (the order both file formats store them in)."""
        return sorted(self.in_sum2)

    def importance(self, name: str) -> np.ndarray:
        """What llama-quantize passes as ``quant_weights`` for tensor ``name``: ``in_sum2 / counts``
        in float32, 1.0 for a row never reached (count 0); ``[n_per_row]`` for a plain matrix,
        ``[n_mat, n_per_row]`` for a stacked one."""
        sums, counts = self.in_sum2[name], self.counts[name].astype(np.float32)[:, None]
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(counts > 0, sums / np.where(counts > 0, counts, 1), np.float32(1))
        out = out.astype(np.float32)
        return out[0] if out.shape[0] == 1 else out


# ----- collecting ------------------------------------------------------------------------------
def compute_imatrix(model, text: str, *, ctx: int = DEFAULT_CTX, chunks: int | None = None,
                    dataset: str = "", process_output: bool = False, progress: Progress | None = None,
                    cancel: Cancel = None) -> ImportanceMatrix:
    """llama-imatrix over ``text`` for ``model`` (a loaded
    :class:`~loomlab.core.llm.generate.textmodel.TextModel`), held while it works and computed on the
    exact path (float32 activations). ``dataset`` is the name recorded in ``imatrix.datasets`` (the
    text file's path, as llama.cpp records it). Chunking as in the module docstring.

    Raises:
        LoomConfigError: the model is busy, an embedding model or a mixture of experts; ``ctx`` or
            ``chunks`` out of range; the text shorter than ``2 * ctx`` tokens.
        LoomCancelled: ``cancel`` asked to stop (checked between blocks).
    """
    if model.is_embedding_model:
        raise LoomConfigError(f"{model.name or 'this model'} is an embedding model: an importance matrix "
                              "is collected from a causal language model's forward passes")
    _check_int("ctx", ctx, 1, model.context_length)
    if chunks is not None:
        _check_int("chunks", chunks, 1, None)
    if not isinstance(text, str):
        raise LoomConfigError(f"the text must be a str, got {type(text).__name__}")
    with model.busy(), int8_activations(False):
        ids = model.tokenizer.encode(text, add_special_tokens=True)
        cut = imatrix_chunks(ids, ctx, bos_id(model.tokenizer), chunks)
        return collect_imatrix(model.net, cut, datasets=[dataset] if dataset else [],
                               process_output=process_output,
                               progress=progress, cancel=cancel)


def imatrix_chunks(ids: Sequence[int], ctx: int, bos: int | None,
                   chunks: int | None = None) -> list[list[int]]:
    """``ids`` (the whole text, tokenized with BOS where the model adds one) cut as llama-imatrix cuts
    it: ``min(chunks, len // ctx)`` chunks of ``ctx`` tokens, each one's first token replaced by
    ``bos`` when given. :class:`LoomConfigError` for fewer than ``2 * ctx`` tokens (its rule)."""
    ids = [int(i) for i in ids]
    if len(ids) < 2 * ctx:
        raise LoomConfigError(f"the text is {len(ids)} tokens; llama-imatrix needs at least 2 × ctx = "
                              f"{2 * ctx} for a context of {ctx} (a longer text, or a smaller --ctx)")
    n = len(ids) // ctx if chunks is None else min(chunks, len(ids) // ctx)
    out = [ids[i * ctx:(i + 1) * ctx] for i in range(n)]
    if bos is not None:
        for chunk in out:
            chunk[0] = bos
    return out


def collect_imatrix(net, chunks: Iterable[Sequence[int]], *, datasets: Sequence[str] = (),
                    process_output: bool = False, progress: Progress | None = None,
                    cancel: Cancel = None) -> ImportanceMatrix:
    """The statistics of ``net`` (a :class:`~loomlab.core.llm.model.causal_lm.CausalLM`) over
    ``chunks`` (token-id sequences of one length, each run alone from position 0), on the calling
    thread's activation path. ``progress(chunks done, chunks)`` after each chunk; ``cancel`` is
    checked between blocks (:class:`LoomCancelled`).

    Raises:
        LoomConfigError: a mixture-of-experts model, no chunks or chunks of different lengths.
        InspectError: a network that is not a decoder-only language model.
    """
    stop = as_cancel_check(cancel)
    chunks = [list(c) for c in chunks]
    if not chunks or len({len(c) for c in chunks}) != 1 or not chunks[0]:
        raise LoomConfigError("an importance matrix needs one or more chunks of one length (tokens each)")
    tracer = Tracer(net)
    _refuse_experts(tracer)
    names = _block_names(tracer, net.args.architecture)
    head = _output_head(tracer, net) if process_output else None
    stats = _Stats()

    def edit(site: str, layer: int, value):
        for name in names.get((site, layer), ()):
            stats.add(name, value)
        if site == "mlp_in":
            hidden = _down_input(tracer.blocks[layer].mlp, value, CachedRun(net, None))
            stats.add(f"blk.{layer}.ffn_down.weight", hidden)
        return value

    for done, chunk in enumerate(chunks):
        if stop():
            raise LoomCancelled(f"the importance matrix was cancelled after {done} of {len(chunks)} chunks")
        trace = tracer.run([chunk], edit=edit, cancel=stop)
        if head is not None:
            normed = tracer.final_norm.forward(trace.final, CachedRun(net, None))[0]
            stats.add(head, normed)
        if progress is not None:
            progress(done + 1, len(chunks))
    return stats.matrix(len(chunks), len(chunks[0]), list(datasets))


class _Stats:
    """Running float64 sums per tensor name (llama.cpp's ``Stats``, one matrix per tensor)."""

    def __init__(self):
        self.sum2: dict[str, np.ndarray] = {}
        self.sum: dict[str, np.ndarray] = {}
        self.count: dict[str, int] = {}

    def add(self, name: str, value) -> None:
        """Add the input one matrix multiplied, ``[B, T, ...]`` (z's heads flattened into its
        columns), one row per token; the sums are taken where the value is, then come over."""
        xp = array_module(value)
        x = xp.reshape(value, (value.shape[0] * value.shape[1], -1)).astype(xp.float64)
        sum2, total = to_host(xp.sum(x * x, axis=0)), to_host(xp.sum(x, axis=0))
        if name not in self.sum2:
            self.sum2[name], self.sum[name], self.count[name] = np.zeros_like(sum2), np.zeros_like(total), 0
        self.sum2[name] += sum2
        self.sum[name] += total
        self.count[name] += x.shape[0]

    def matrix(self, chunk_count: int, chunk_size: int, datasets: list[str]) -> ImportanceMatrix:
        """Kept as llama.cpp keeps them: float32 sums, one row (one matrix) per tensor."""
        def f32(sums: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            return {name: v.astype(np.float32)[None, :] for name, v in sums.items()}

        counts = {name: np.array([c], np.int64) for name, c in self.count.items()}
        return ImportanceMatrix(f32(self.sum2), counts, chunk_count, chunk_size, datasets, f32(self.sum))


def _block_names(tracer: Tracer, architecture: str) -> dict[tuple[str, int], list[str]]:
    """``(site, block)`` -> the tensors multiplying that value: ``attn_in`` Q, K, V; ``z`` the output
    projection; ``mlp_in`` gate and up (down's input is derived from it); a fused architecture's
    parts as its one tensor."""
    fused = FUSED.get(architecture, {})
    stem = {part: name.removesuffix(".weight") for part, name in {**ATTENTION_TENSORS, **MLP_TENSORS}.items()}
    parts = {"attn_in": ("wq", "wk", "wv"), "z": ("wo",), "mlp_in": ("gate", "up")}
    return {(site, i): list(dict.fromkeys(f"blk.{i}.{fused.get(stem[p], stem[p])}.weight" for p in ps))
            for site, ps in parts.items() for i in range(tracer.n_layers)}


def _refuse_experts(tracer: Tracer) -> None:
    """A mixture of experts is refused (module docstring); so is any MLP that is not the gated one."""
    for i, block in enumerate(tracer.blocks):
        if isinstance(block.mlp, LLMMixtureOfExperts):
            raise LoomConfigError(f"block {i}'s MLP is a mixture of experts: llama-imatrix keeps one row "
                                  "per expert, counted over the tokens routed to it, which is not collected "
                                  "here yet; compute this model's importance matrix with llama-imatrix")
        if not isinstance(block.mlp, LLMGatedMLP):
            raise LoomConfigError(f"block {i}'s MLP is a {type(block.mlp).__name__}, not a gated MLP: "
                                  "its matrices' inputs are not known here")


def _output_head(tracer: Tracer, net) -> str | None:
    """``output.weight`` when the head has its own matrix; None when it is tied to the embedding
    (llama.cpp sees ``token_embd.weight`` there, which its name filter skips)."""
    tied = tracer.head.weights.blocks["weight"] is net.cells[0].weights.blocks["table"]
    return None if tied else "output.weight"


def _down_input(mlp, x, ctx):
    """What the MLP's down projection multiplies: ``act(gate x + b) * (up x + b)``, as
    :meth:`LLMGatedMLP.forward` computes it on the exact path (here or on the layer's device)."""
    if mlp.device_copy is not None:
        dc = mlp.device_copy
        w = dc.arrays(mlp, ctx)
        gate, up = dc.linear_bias(x, w, "gate", "b_gate"), dc.linear_bias(x, w, "up", "b_up")
        return activate(mlp.cfg.act_id, gate) * up
    w = mlp.weights.current(mlp.cfg.dtype)
    gate, up = linears(x, (w["gate"], w["up"]))
    gate, up = plus_bias(gate, mlp.weights, w, "b_gate"), plus_bias(up, mlp.weights, w, "b_up")
    return activate(mlp.cfg.act_id, gate) * up


def _check_int(what: str, value, low: int, high: int | None) -> None:
    ok = isinstance(value, int | np.integer) and not isinstance(value, bool)
    if not ok or value < low or (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"of at least {low}"
        raise LoomConfigError(f"{what} must be an integer {bound}, got {value!r}")


# ----- writing ---------------------------------------------------------------------------------
class _Writer(GGUFWriter):
    """gguf-py's writer for a file with no architecture (llama.cpp's imatrix files have none) and
    an empty string array allowed (``imatrix.datasets`` of a matrix combined from files only)."""

    def __init__(self):
        super().__init__(None, IMATRIX_TYPE)
        self.kv_data[0].clear()

    def _pack_val(self, val, vtype, add_vtype, sub_type=None) -> bytes:
        if vtype == GGUFValueType.ARRAY and len(val) == 0:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type or GGUFValueType.STRING) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def write_imatrix(im: ImportanceMatrix, path: str | os.PathLike, *, output_format: str = "gguf") -> Path:
    """Write ``im`` to ``path`` as llama-imatrix does (``output_format`` "gguf" or "dat", module
    docstring); the file is replaced only once complete. Returns the path."""
    if output_format not in ("gguf", "dat"):
        raise LoomConfigError(f"an importance matrix is written as gguf or dat, not {output_format!r}")
    path = Path(path)
    if output_format == "dat":
        with replacing(path) as f:
            f.write(legacy_bytes(im))
        return path
    writer = _Writer()
    writer.add_string(KEY_TYPE, IMATRIX_TYPE)
    writer.add_key_value(KEY_DATASETS, list(im.datasets), GGUFValueType.ARRAY, sub_type=GGUFValueType.STRING)
    writer.add_uint32(KEY_CHUNK_COUNT, int(im.chunk_count))
    writer.add_uint32(KEY_CHUNK_SIZE, int(im.chunk_size))
    for name in im.names:
        sums, counts = im.in_sum2[name], im.counts[name]
        flat = sums.shape[0] == 1  # ggml drops a trailing dimension of 1: llama.cpp's files hold [n_per_row]
        writer.add_tensor(name + SUM2, _f32(sums[0] if flat else sums))
        writer.add_tensor(name + COUNTS, _f32(counts if flat else counts[:, None]))
        if name in im.in_sum:
            writer.add_tensor(name + SUM, _f32(im.in_sum[name][0] if flat else im.in_sum[name]))
    with replacing(path) as f:
        writer.fout, writer.state = [f], WriterState.EMPTY  # our temporary file, not one it opens
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.flush()
    return path


def legacy_bytes(im: ImportanceMatrix) -> bytes:
    """``im`` in the legacy ``.dat`` layout (``save_imatrix_legacy``): entries with no tokens at all
    are left out; the last dataset name (or none) closes the file."""
    out = [b""]
    n = 0
    for name in im.names:
        counts = im.counts[name]
        if not counts.any():
            continue
        n += 1
        ncall = int(-(-int(counts.max()) // im.chunk_size))
        count = counts.astype(np.float32)[:, None]
        values = im.in_sum2[name].astype(np.float32)
        values = np.where(count == 0, np.float32(1), values / np.where(count == 0, 1, count))
        values = values * np.float32(ncall)
        raw = name.encode("utf-8")
        out += [_I32.pack(len(raw)), raw, _I32.pack(ncall), _I32.pack(values.size),
                values.astype("<f4").tobytes()]
    dataset = im.datasets[-1].encode("utf-8") if im.datasets else b""
    out[0] = _I32.pack(n)
    out += [_I32.pack(int(im.chunk_count)), _I32.pack(len(dataset)), dataset]
    return b"".join(out)


def _f32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


# ----- reading ---------------------------------------------------------------------------------
def read_imatrix(path: str | os.PathLike, *, chunk_size: int = DEFAULT_CTX) -> ImportanceMatrix:
    """Read a GGUF imatrix or a legacy ``.dat`` (told apart by the GGUF magic). ``chunk_size`` is the
    chunk size a ``.dat`` is taken to have (its file does not say; llama.cpp takes its ``--ctx``).

    Raises:
        ModelFormatError: anything malformed, naming the field and byte offset where known.
        OSError: the file cannot be read.
    """
    path = Path(path)
    _check_int("chunk_size", chunk_size, 1, None)
    with open(path, "rb") as f:
        if f.read(4) == MAGIC:
            return _read_gguf(path)
        size = os.fstat(f.fileno()).st_size
        if size < 4:
            raise ModelFormatError("n_entries", f"the file has {size} bytes: not an importance matrix", 0)
        # mapped, so a wrong file (a model) is read only as far as its header allows
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return read_legacy(data, chunk_size=chunk_size)


def _read_gguf(path: Path) -> ImportanceMatrix:
    with open_gguf(path) as g:
        if not g.tensors:
            raise ModelFormatError("tensors", f"{path.name} holds no importance data")
        if g.metadata.get(KEY_TYPE, IMATRIX_TYPE) != IMATRIX_TYPE:
            raise ModelFormatError(KEY_TYPE, f"{g.metadata[KEY_TYPE]!r} is not an importance matrix",
                                   g.kv_offsets.get(KEY_TYPE))
        datasets = g.require(KEY_DATASETS, list) if KEY_DATASETS in g.metadata else []
        if not all(isinstance(d, str) for d in datasets):
            raise ModelFormatError(KEY_DATASETS, "expected an array of strings",
                                   g.kv_offsets.get(KEY_DATASETS))
        chunk_count, chunk_size = g.require(KEY_CHUNK_COUNT, int), g.require(KEY_CHUNK_SIZE, int)
        parts: dict[str, dict[str, np.ndarray]] = {}
        for name, t in g.tensors.items():
            suffix = next((s for s in (SUM2, COUNTS, SUM) if name.endswith(s)), None)
            if suffix is None:
                continue  # llama.cpp ignores other tensors
            if t.ggml_type != GGMLQuantizationType.F32:
                raise ModelFormatError(name, f"type {t.type_name}; an importance matrix holds F32", t.offset)
            parts.setdefault(name.removesuffix(suffix), {})[suffix] = np.array(t.data(), np.float32)
        im = ImportanceMatrix({}, {}, chunk_count, chunk_size, list(datasets))
        for name, p in sorted(parts.items()):
            if SUM2 not in p or COUNTS not in p:
                raise ModelFormatError(name, "has one of in_sum2 and counts, not both (mismatched sums)")
            counts = p[COUNTS].reshape(-1)
            sums = p[SUM2].reshape(-1)
            if counts.size == 0 or sums.size == 0 or sums.size % counts.size:
                raise ModelFormatError(name + SUM2, f"{sums.size} sums do not split into {counts.size} "
                                                    "matrices")
            if not (np.isfinite(counts).all() and (counts >= 0).all()):
                raise ModelFormatError(name + COUNTS, "counts must be finite and not negative")
            im.in_sum2[name] = sums.reshape(counts.size, -1)
            im.counts[name] = np.rint(counts).astype(np.int64)  # llama.cpp: std::lround
            if SUM in p:
                if p[SUM].size != sums.size:
                    raise ModelFormatError(name + SUM, f"{p[SUM].size} values, in_sum2 has {sums.size}")
                im.in_sum[name] = p[SUM].reshape(counts.size, -1)
    return im


def read_legacy(data: bytes | mmap.mmap, *, chunk_size: int = DEFAULT_CTX) -> ImportanceMatrix:
    """The legacy ``.dat`` layout (module docstring) from ``data``, restored as llama.cpp restores it
    (``in_sum2 = value * chunk_size``, ``counts = ncall * chunk_size``)."""
    cur = _Cursor(data)
    n_entries = cur.i32("n_entries")
    # an entry is at least 16 bytes: name length, a 1-byte name, ncall, nval (and nval >= 1 floats)
    if n_entries < 1 or n_entries > (len(data) - 4) // 16:
        raise ModelFormatError("n_entries", f"{n_entries} entries cannot fit in a {len(data)}-byte file "
                                            "(not an importance matrix?)", 0)
    im = ImportanceMatrix({}, {}, 0, chunk_size)
    for i in range(n_entries):
        at = cur.pos
        name = cur.text(f"entry[{i}].name", MAX_NAME_BYTES, empty=False)
        if name in im.in_sum2:
            raise ModelFormatError(f"entry[{i}].name", f"{name!r} appears twice", at)
        ncall = cur.i32(f"{name}.ncall")
        if ncall < 0:
            raise ModelFormatError(f"{name}.ncall", f"negative call count {ncall}", cur.pos - 4)
        nval = cur.i32(f"{name}.nval")
        if nval < 1 or nval > cur.left // 4:
            raise ModelFormatError(f"{name}.nval", f"{nval} values; {cur.left} bytes remain", cur.pos - 4)
        values = np.frombuffer(cur.take(4 * nval, f"{name}.values"), "<f4").astype(np.float32)  # a copy
        im.in_sum2[name] = (values * np.float32(chunk_size))[None, :]
        im.counts[name] = np.array([ncall * chunk_size], np.int64)
    ncalls = max(int(c[0]) for c in im.counts.values()) // chunk_size
    im.chunk_count = cur.i32("chunk_count") if cur.left else ncalls  # very old files end here
    if im.chunk_count < 0:
        raise ModelFormatError("chunk_count", f"negative chunk count {im.chunk_count}", cur.pos - 4)
    if cur.left:
        im.datasets.append(cur.text("dataset", len(data), empty=True))
    if cur.left:
        raise ModelFormatError("end", f"{cur.left} bytes after the dataset name", cur.pos)
    return im


class _Cursor:
    """Reads little-endian fields from ``data``, each checked against the bytes that remain."""

    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    @property
    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, n: int, what: str) -> bytes:
        if n > self.left:
            raise ModelFormatError(what, f"needs {n} bytes, {self.left} remain (truncated file)", self.pos)
        self.pos += n
        return self.data[self.pos - n:self.pos]

    def i32(self, what: str) -> int:
        return _I32.unpack(self.take(4, what))[0]

    def text(self, what: str, limit: int, *, empty: bool) -> str:
        at = self.pos
        n = self.i32(what + " length")
        if n < (0 if empty else 1) or n > min(limit, self.left):
            raise ModelFormatError(what, f"length {n} with {self.left} bytes left", at)
        try:
            return self.take(n, what).decode("utf-8")
        except UnicodeDecodeError:
            raise ModelFormatError(what, "is not UTF-8", at + 4) from None


def imatrix_summary(im: ImportanceMatrix) -> dict:
    """A JSON-able description: tensors, values, chunks, datasets and the most tokens any tensor saw."""
    return {"tensors": len(im.in_sum2), "values": int(sum(v.size for v in im.in_sum2.values())),
            "chunk_count": im.chunk_count, "chunk_size": im.chunk_size, "datasets": list(im.datasets),
            "tokens": max((int(c.max()) for c in im.counts.values()), default=0)}
