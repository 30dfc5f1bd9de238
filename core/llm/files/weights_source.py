"""Where a model's tensors come from: a GGUF file or an HF directory, read in place.

:func:`open_source` opens either and says which architecture it holds; :meth:`WeightSource.load`
turns its tensors into the matrices the layers multiply with, under the names transformers
uses (``model.layers.3.self_attn.q_proj.weight`` ...): GGUF matrices become ``QuantMatrix``
objects over the memory-mapped blocks (nothing is dequantized), vectors and HF tensors become
float32 arrays.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ...errors import ModelFormatError
from ..kernels.quant import Matrix

# GGUF tensor names -> transformers names. Block tensors map by stem through a table each
# architecture gives (``ffn_norm`` is llama's post_attention_layernorm, gemma3's pre_feedforward_layernorm).
GGUF_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                  "output.weight": "lm_head.weight", "rope_freqs.weight": "rope_freqs"}
GGUF_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)")
HF_BLOCK = re.compile(r"model\.layers\.(\d+)\.([\w.]+)\.(weight|bias)")
EXPERT = re.compile(r"\.experts\.(\d+)\.")  # one expert's matrix: ``mlp.experts.3.up_proj``

Progress = Callable[[str, int, int], None]  # (stage, done, total)


@dataclass
class WeightSource:
    """An opened model file or directory.

    ``kind`` is ``"gguf"`` or ``"hf"``; ``architecture`` is the file's own name for it (GGUF
    ``general.architecture`` or config.json ``model_type``); ``metadata`` is the GGUF key/value
    dict or config.json; ``offsets`` maps GGUF keys to their byte offsets (for errors).
    """

    path: Path
    kind: str
    architecture: str
    metadata: dict[str, Any]
    offsets: dict[str, int]
    file: Any  # the GGUFFile or HFFiles, kept open while matrices view its mapping

    @property
    def tensors(self) -> dict[str, Any]:
        return self.file.tensors

    def load(self, block_names: dict[str, str] | None = None, progress: Progress | None = None) -> Weights:
        """Every tensor as a matrix, keyed by its transformers name.

        ``block_names`` maps GGUF block stems (``attn_q``) to transformers ones
        (``self_attn.q_proj``); GGUF tensors it does not cover keep their own name.
        """
        convert = _gguf_matrix if self.kind == "gguf" else _hf_matrix
        names = block_names or {}
        out = Weights(gguf_names={v: k for k, v in names.items()} if self.kind == "gguf" else None)
        items = list(self.tensors.items())
        for i, (name, tensor) in enumerate(items):
            key = gguf_to_hf(name, names) if self.kind == "gguf" else name
            m = convert(tensor)
            # a GGUF's stacked experts: one matrix per expert, named as checkpoints name them
            for e, part in enumerate(m) if isinstance(m, list) else ((None, m),):
                at = key if e is None else expert_name(key, e)
                out[at] = part
                out.offsets[at] = tensor.offset
            if progress is not None:
                progress("load", i + 1, len(items))
        return out

    def close(self) -> None:
        self.file.close()


class Weights(dict):
    """Matrices by transformers name that remember where each came from, so errors name the
    file's own tensor (``blk.3.attn_q.weight`` in a GGUF) and its byte offset."""

    def __init__(self, *args, gguf_names: dict[str, str] | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.offsets: dict[str, int] = {}
        self._gguf_names = gguf_names  # transformers block stem -> GGUF stem; None for HF files

    def file_name(self, name: str) -> str:
        """The name tensor ``name`` has (or would have) in the file."""
        if self._gguf_names is None:
            return name
        top = {v: k for k, v in GGUF_TOP_NAMES.items()}
        m = HF_BLOCK.fullmatch(name)
        if m is None:
            return top.get(name, name)
        expert = EXPERT.search(m[2])  # one expert's matrix: a slice of the stacked tensor
        stem = self._gguf_names.get(EXPERT.sub(".experts.", m[2]))
        where = f"[{expert[1]}]" if expert else ""
        return f"blk.{m[1]}.{stem}.{m[3]}{where}" if stem else name

    def error(self, name: str, message: str) -> ModelFormatError:
        return ModelFormatError(self.file_name(name), message, self.offsets.get(name))


def open_source(path: str | os.PathLike[str]) -> WeightSource:
    """Open a ``.gguf`` file (or a split model, from any of its files) or an HF model directory
    (config.json + safetensors)."""
    path = Path(path)
    if path.is_dir():
        from .hf_files import open_hf

        hf = open_hf(path)
        model_type = hf.config.get("model_type")
        if not isinstance(model_type, str):
            hf.close()
            raise ModelFormatError("config.json:model_type", f"expected a string, got {model_type!r}")
        return WeightSource(path, "hf", model_type, hf.config, {}, hf)
    from .gguf_splits import open_model_gguf

    gguf = open_model_gguf(path)
    try:
        arch = gguf.architecture
    except ModelFormatError:
        gguf.close()
        raise
    return WeightSource(path, "gguf", arch, gguf.metadata, gguf.kv_offsets, gguf)


def gguf_to_hf(name: str, block_names: dict[str, str]) -> str:
    """The transformers name of GGUF tensor ``name`` (unchanged when there is none)."""
    m = GGUF_BLOCK.fullmatch(name)
    if m is None:
        return GGUF_TOP_NAMES.get(name, name)
    stem = block_names.get(m[2])
    return f"model.layers.{m[1]}.{stem}.{m[3]}" if stem else name


def expert_name(stacked: str, e: int) -> str:
    """Expert ``e``'s name within stacked experts ``stacked`` (``mlp.experts.up_proj.weight`` ->
    ``mlp.experts.3.up_proj.weight``), the reverse of llama.cpp's converter, which stacks them."""
    return stacked.replace(".experts.", f".experts.{e}.", 1)


def _gguf_matrix(tensor) -> Matrix | list[Matrix]:
    """Matrices stay in the file's encoding as a QuantMatrix; vectors become float32 arrays;
    stacked experts (``blk.N.ffn_up_exps`` ``[experts, rows, cols]``) become one QuantMatrix per
    expert over its own rows of the mapping (views: nothing is copied)."""
    from ..kernels.quant import QuantMatrix

    if len(tensor.shape) == 3 and tensor.name.rsplit(".", 1)[0].endswith("_exps"):
        data = tensor.data()
        return [QuantMatrix(data[e], tensor.ggml_type, shape=tensor.shape[1:], name=f"{tensor.name}[{e}]")
                for e in range(tensor.shape[0])]
    if len(tensor.shape) == 2:
        return QuantMatrix(tensor.data(), tensor.ggml_type, shape=tensor.shape, name=tensor.name)
    if len(tensor.shape) == 1:
        if tensor.type_name in ("F32", "F16"):
            return np.asarray(tensor.data(), dtype=np.float32)
        row = QuantMatrix(tensor.data().reshape(1, -1), tensor.ggml_type, shape=(1, tensor.shape[0]),
                          name=tensor.name)
        return np.asarray(row.dequantize(), dtype=np.float32).reshape(-1)
    raise ModelFormatError(tensor.name, f"{len(tensor.shape)}-D tensor; models here use 1-D and 2-D ones "
                                        "(3-D for stacked experts, named *_exps)",
                           tensor.offset)


def _hf_matrix(tensor) -> np.ndarray:
    return np.asarray(tensor.data(), dtype=np.float32)
