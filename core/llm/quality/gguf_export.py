"""Saving a (morphed) language model as a GGUF file that llama.cpp runs (issue 14 §5).

The model is written as it is now, tensor by tensor in its source file's order:

* a tensor whose layer still reads the file's own matrix is copied byte for byte from the file;
* a matrix morphed to a block format (Q8_0, Q4_K ...) is written as its new blocks;
* a layer in one of Loom's float dtypes GGUF has (float32, float16, bfloat16) is written as F32,
  F16 or BF16 matrices of exactly the values forward multiplies with; its vectors (norm gains,
  biases) as F32, as llama.cpp keeps vectors in every file type. Any other Loom dtype (int8 and
  its per-layer scale, fp8, int4 ...) has no GGUF type and is refused before anything is written.

A tied output head (SmolLM2's, Gemma's) shares ``token_embd.weight``; when the head is morphed
apart from the embedding it is written as its own ``output.weight``, which llama.cpp and our
loader both take instead of the table.

Metadata (architecture settings, tokenizer, chat template) is copied with each key's own GGUF
type. A model whose tensors are all the file's keeps every key as it was; otherwise
``general.file_type`` names the new mix (see :func:`file_type`) and ``general.quantized_by`` says
"Loom Lab". Only models loaded from a GGUF file can be exported: a Hugging Face folder has no
GGUF tokenizer metadata to copy (convert it with llama.cpp's ``convert_hf_to_gguf.py`` first).

The file is written beside its destination and replaces it only when complete
(:func:`~loomlab.core.io.atomic.replacing`): a failure or a cancel leaves no partial file and any
old file untouched.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.gguf_writer import WriterState

from ...cancel import Cancel, as_cancel_check
from ...errors import LoomCancelled, LoomConfigError, ModelFormatError
from ...io.atomic import replacing
from ..files.weights_source import Progress

# Loom dtypes GGUF has a tensor type for; the values forward reads convert to them exactly
LOOM_TO_GGML = {"float32": GGMLQuantizationType.F32, "float16": GGMLQuantizationType.F16,
                "bfloat16": GGMLQuantizationType.BF16}
TABLE, OUTPUT = "token_embd.weight", "output.weight"
QUANTIZED_BY = "Loom Lab"


@dataclass(frozen=True, eq=False)
class _Tensor:
    """One tensor of the file to write; its bytes are made only when it is written."""

    name: str
    shape: tuple[int, ...]  # numpy order: (rows, cols) for a matrix
    ggml_type: GGMLQuantizationType
    data: Callable[[], np.ndarray]
    holds: tuple  # what it holds: equal for two layers that share the tensor and agree on it
    from_file: bool

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.ggml_type]
        return math.prod(self.shape) // block * size


@dataclass(frozen=True)
class GGUFExport:
    """What :func:`export_gguf` wrote."""

    path: Path
    file_type: int  # general.file_type (llama.cpp's LLAMA_FTYPE)
    tensors: int
    changed: int  # tensors not copied from the source file (new encodings, an untied head)
    nbytes: int  # size of the file


def export_gguf(model, path: str | os.PathLike, *, progress: Progress | None = None,
                cancel: Cancel = None, ftype: LlamaFileType | None = None) -> GGUFExport:
    """Write ``model`` (a :class:`~.textmodel.TextModel` loaded from a GGUF file) to ``path`` as
    GGUF, in its current encodings (module docstring). Do not morph the model meanwhile.

    ``progress("export", tensors written, tensors)``; ``cancel`` stops between tensors. ``ftype``
    is the ``general.file_type`` to write when tensors changed (a preset's, which llama-quantize
    writes); without it, the source's when nothing changed, else :func:`file_type` of the mix.

    Raises:
        LoomConfigError: a model not loaded from a GGUF file, a layer in a Loom dtype GGUF cannot
            store (all such layers named), or ``path`` being the file the model reads — before
            anything is written.
        LoomCancelled: ``cancel`` asked to stop; ``path`` is as it was.
        OSError: the file could not be written; ``path`` is as it was.
    """
    stop = as_cancel_check(cancel)
    source = _gguf_source(model)
    path = Path(path)
    if path.exists() and path.samefile(source.path):
        raise LoomConfigError(f"cannot export over {path}: the model reads its weights from that file")
    tensors = _plan(model.net, source)
    changed = sum(not t.from_file for t in tensors)
    if not changed:
        ftype = source.metadata.get("general.file_type")
    elif ftype is None:
        ftype = file_type(tensors)
    writer = GGUFWriter(None, source.architecture)
    _copy_metadata(writer, source, None if not changed else ftype)
    for t in tensors:
        # the element shape: any dtype but uint8 tells gguf-py it is not a shape in bytes
        writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes, raw_dtype=t.ggml_type)
    with replacing(path) as f:
        writer.fout, writer.state = [f], WriterState.EMPTY  # our temporary file, not one it opens
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for i, t in enumerate(tensors):
            if stop():
                raise LoomCancelled(f"GGUF export cancelled after {i} of {len(tensors)} tensors")
            writer.write_tensor_data(np.ascontiguousarray(t.data()).reshape(-1).view(np.uint8))
            if progress is not None:
                progress("export", i + 1, len(tensors))
        writer.flush()
    return GGUFExport(path, int(ftype) if ftype is not None else -1, len(tensors), changed,
                      path.stat().st_size)


def export_refusal(model) -> str:
    """Why :func:`export_gguf` would refuse ``model`` ("" when it can write it); nothing is written."""
    try:
        _plan(model.net, _gguf_source(model))
    except LoomConfigError as e:
        return str(e)
    return ""


def check_recipe_plan(plan) -> None:
    """Refuse a recipe plan (:class:`~.recipe.RecipePlan`) that puts a layer in a Loom dtype GGUF
    has no type for (int8, fp4 ...), all such layers named, before anything is morphed; the
    layers it does not change keep what forward reads now, which :func:`export_gguf` checks."""
    refused: dict[str, list[str]] = {}  # dtype -> the layers the plan puts in it
    for lp in plan.changed:
        if lp.dtype is not None and lp.dtype not in LOOM_TO_GGML:
            refused.setdefault(lp.dtype, []).append(lp.name)
    _refuse_unstorable(refused, "cannot export as GGUF", "give {} one of those in the recipe")


def file_type(tensors: list[_Tensor]) -> LlamaFileType:
    """llama.cpp's ``general.file_type`` of a mix, by llama.cpp's own rule for a file that lacks
    the key: the encoding of the most tensors (here of the most matrices: vectors are F32 in every
    file type), ``MOSTLY_<type>``, for a K type ``MOSTLY_<type>_M`` (llama.cpp has only its _S/_M
    mixes), ``ALL_F32`` for F32; ties go to the encoding met first in the file."""
    counts: dict[str, int] = {}
    for t in tensors:
        if len(t.shape) == 2:
            counts[t.ggml_type.name] = counts.get(t.ggml_type.name, 0) + 1
    top = max(counts, key=counts.get, default="F32")
    if top == "F32":
        return LlamaFileType.ALL_F32
    names = LlamaFileType.__members__
    return names.get(f"MOSTLY_{top}") or names.get(f"MOSTLY_{top}_M") or LlamaFileType.GUESSED


# ----- planning: every check happens here, before the file is created -----------------------------
def _gguf_source(model):
    source = model.net.source
    if source is None or source.kind != "gguf":
        where = f"a Hugging Face folder ({source.path})" if source is not None else "no file"
        raise LoomConfigError(f"only a model loaded from a GGUF file can be exported as GGUF (its "
                              f"tokenizer, template and settings are copied from that file); "
                              f"{model.name or 'this model'} comes from {where}: convert it with "
                              f"llama.cpp's convert_hf_to_gguf.py, load that file, then morph and export")
    return source


def _plan(net, source) -> list[_Tensor]:
    """The file's tensors in order, each as the model holds it now (module docstring)."""
    from ...layer_names import layer_name
    from ...morph import weighted_cells

    by_name: dict[str, list[_Tensor]] = {}
    refused: dict[str, list[str]] = {}  # dtype -> the layers in it
    experts: list[str] = []  # morphed experts: rows of a stacked tensor, not written apart
    for cell, layer in weighted_cells(net):
        named = layer_name(net, (*net.coord(cell), layer.path))
        dtype = layer.cfg.dtype
        if not _reads_blocks(layer.weights, dtype) and dtype not in LOOM_TO_GGML:
            refused.setdefault(dtype, []).append(named.label)
            continue
        for part, tensor_name in named.tensors.items():
            record = source.tensors.get(tensor_name)
            if record is None and tensor_name.endswith("]"):  # an expert: rows of a stacked tensor
                if not _file_matrix(layer, part):  # (ffn_up_exps.weight[e])
                    experts.append(named.label)
                continue
            if record is None or tuple(record.shape) != tuple(layer.weights.blocks[part].shape):
                raise LoomConfigError(f"{named.label}: its {part!r} matrix is not the file's {tensor_name} "
                                      "but part of a fused one, split at load (phi3's Q/K/V and gate/up): "
                                      "such a model cannot be exported as GGUF")
            by_name.setdefault(tensor_name, []).append(_layer_tensor(layer, part, tensor_name, source))
    _refuse_unstorable(refused, "cannot export as GGUF", "morph {} to one of those first")
    if experts:
        raise LoomConfigError(f"cannot export as GGUF: morphed experts ({', '.join(dict.fromkeys(experts))}) "
                              "are rows of a stacked tensor, which the export writes as the file has it; "
                              "morph them back to the file's encoding first")
    out = []
    for name, record in source.tensors.items():
        users = by_name.get(name) or [_file_tensor(record)]  # a tensor no layer names: as it is
        first = users[0]
        out.append(first)
        apart = [t for t in users[1:] if t.holds != first.holds]
        if apart:
            if name != TABLE or OUTPUT in source.tensors:
                raise ModelFormatError(name, "layers sharing this tensor hold it in different encodings")
            head = apart[0]  # the tied head, morphed apart from the embedding: a head of its own
            out.append(_Tensor(OUTPUT, head.shape, head.ggml_type, head.data, head.holds, False))
    return out


def _refuse_unstorable(refused: dict[str, list[str]], what: str, advice: str) -> None:
    """One LoomConfigError naming every layer in a Loom dtype GGUF cannot store, by dtype;
    ``advice`` has a ``{}`` for "that layer" or "those layers"."""
    if not refused:
        return
    layers = "that layer" if sum(map(len, refused.values())) == 1 else "those layers"
    which = "; ".join(_layers_in(dtype, names) for dtype, names in refused.items())
    raise LoomConfigError(f"{what}: {which}. GGUF stores Loom's float32, float16 and bfloat16 and the "
                          f"block formats (Q8_0, Q4_K ...), not Loom's other dtypes (their per-layer scale "
                          f"has no GGUF type): {advice.format(layers)}")


def _layers_in(dtype: str, names: list[str], shown: int = 4) -> str:
    """``"blk.0.attn_norm is int8"``, or for many ``"123 layers are int8 (token_embd, ... and 119
    more)"``: a whole model in int8 would otherwise be a message of 120 names."""
    if len(names) == 1:
        return f"{names[0]} is {dtype}"
    listed = ", ".join(names[:shown]) + (f" and {len(names) - shown} more" if len(names) > shown else "")
    return f"{len(names)} layers are {dtype} ({listed})"


def _file_tensor(record) -> _Tensor:
    return _Tensor(record.name, record.shape, GGMLQuantizationType(record.ggml_type), record.data,
                   ("file",), True)


def _reads_blocks(store, dtype: str) -> bool:
    """Whether forward reads the file's matrices or their block-format encodings (not the master):
    the store's encoding then names block types; once it reads the master, the layer's dtype."""
    return store.encoding(dtype) != dtype


def _file_matrix(layer, part: str) -> bool:
    """Whether forward multiplies with the file's own matrix ``part`` (not morphed)."""
    store, dtype = layer.weights, layer.cfg.dtype
    return _reads_blocks(store, dtype) and store.current(dtype)[part] is store.blocks[part]


def _layer_tensor(layer, part: str, name: str, source) -> _Tensor:
    store, dtype = layer.weights, layer.cfg.dtype
    if _file_matrix(layer, part):
        return _file_tensor(source.tensors[name])
    if _reads_blocks(store, dtype):
        m = store.current(dtype)[part]
        ggml = GGMLQuantizationType(m.ggml_type)
        return _Tensor(name, m.shape, ggml, lambda: _encoded_bytes(m, ggml), ("blocks", id(m)), False)
    shape = store.blocks[part].shape
    ggml = LOOM_TO_GGML[dtype] if len(shape) == 2 else GGMLQuantizationType.F32
    # two stores of one file matrix agree while neither master was changed in place
    holds = ("loom", dtype, "file" if store.version == 0 else id(store))
    return _Tensor(name, shape, ggml, lambda: _loom_values(store, dtype, part, ggml), holds, False)


def _encoded_bytes(m, ggml: GGMLQuantizationType) -> np.ndarray:
    """A morph's QuantMatrix as GGUF stores it: its blocks, or for a plain type (F16, llama.cpp's
    fallback for rows that are not whole blocks) its exact float32 values converted back."""
    return m.raw_blocks if m.raw_blocks is not None else _as_ggml(m.dequantize(), ggml)


def _loom_values(store, dtype: str, part: str, ggml: GGMLQuantizationType) -> np.ndarray:
    """The values forward multiplies with (float32, already rounded to ``dtype``) as ``ggml``:
    exact, as float16 and bfloat16 are unscaled in Loom."""
    return _as_ggml(store.current(dtype)[part], ggml)


def _as_ggml(values: np.ndarray, ggml: GGMLQuantizationType) -> np.ndarray:
    """float32 ``values`` that ``ggml`` (F32, F16 or BF16) holds exactly, in that type."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if ggml == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    if ggml == GGMLQuantizationType.BF16:
        return (values.view(np.uint32) >> 16).astype(np.uint16)  # the low half is zero: exact
    return values


def _copy_metadata(writer: GGUFWriter, source, ftype: int | None) -> None:
    """Every key of the source with its own GGUF type; ``ftype`` (when not None) replaces
    ``general.file_type`` and ``general.quantized_by`` is set (both added when missing)."""
    meta, types = source.metadata, source.file.kv_types
    changes = {} if ftype is None else {"general.file_type": (int(ftype), GGUFValueType.UINT32),
                                        "general.quantized_by": (QUANTIZED_BY, GGUFValueType.STRING)}
    for key, value in meta.items():
        if key == "general.architecture" or key.startswith("split."):
            continue  # the writer starts with it (from the same value); the export is one file
        vtype, etype = types[key]
        value = changes.pop(key, (value,))[0]
        if key == "general.alignment":
            writer.data_alignment = int(value)
        if vtype == GGUFValueType.ARRAY:
            items = value.tolist() if isinstance(value, np.ndarray) else list(value)
            if not items:
                raise ModelFormatError(key, "an empty array, which gguf-py's writer cannot write")
            writer.add_key_value(key, items, GGUFValueType.ARRAY, sub_type=GGUFValueType(etype))
        else:
            writer.add_key_value(key, value, GGUFValueType(vtype))
    for key, (value, vtype) in changes.items():
        writer.add_key_value(key, value, vtype)
