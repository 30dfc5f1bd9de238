"""Merging language models of one architecture and shape: linear, SLERP and task arithmetic.

Parents are what :func:`~loomlab.core.llm.files.discovery.resolve` takes: a built-in alias, a GGUF file
or an HF safetensors folder, in any mix. Every tensor is read by its transformers name,
dequantized to float32 and put in transformers' layout (GGUF llama's permuted Q/K rows back in
order, gemma's GGUF norms ``1 + w`` back to ``w``), merged, and written straight into the
``model.safetensors`` of an HF folder: one merged tensor is in memory at a time. The folder also
gets ``config.json`` and the tokenizer files of the first model, so it loads back with
:func:`~loomlab.core.llm.load_model` as a :class:`~loomlab.core.llm.TextModel` that chats (a
parent without tokenizer files, such as the tiny test checkpoints, gives a folder that
:func:`~loomlab.core.llm.model.loader.load_causal_lm` loads).

Methods, per tensor (``A``, ``B``, ``base``: the parents' float32 tensors):

* ``linear``: ``(1 - t) A + t B``;
* ``slerp``: spherical interpolation of the flattened tensors along the arc between their
  directions, ``sin((1-t) w) / sin(w) A + sin(t w) / sin(w) B`` with ``w`` the angle between
  them; tensors almost parallel (``|cos w| > 0.9995``) or zero are interpolated linearly;
* ``task`` (task arithmetic): ``base + sum_i weights_i (M_i - base)`` over ``M = A, B``.

``t`` is one number for every tensor, or a schedule: ``K >= 2`` values spread evenly over the
transformer blocks, first block to last, each block taking the piecewise-linear value at its
place (as mergekit's gradients; with ``K`` equal to the block count every block gets its own
value). The embedding takes the first value, the final norm and the LM head the last. A tensor
whose ``t`` is 0 or 1 is the parent's, bit for bit.

The folder is written beside the target under a temporary name and renamed into place once
complete (an existing folder is moved aside first and removed after), so a crash never leaves a
half-written model under the target's name. Which existing folder may be replaced is
:func:`~loomlab.core.io.output_folder.check_output_folder`'s rule: a new or empty one, or one
holding only what Loom Lab wrote there (its marker lists the files), never an input or a folder
holding one.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import struct
from collections.abc import Callable, Sequence
from functools import cached_property
from pathlib import Path

import numpy as np

from ...cancel import Cancel, as_cancel_check
from ...errors import LoomCancelled, LoomConfigError
from ...io.atomic import terminate_unwinds
from ...io.output_folder import MARKER, check_output_folder, marker_bytes
from ..files.discovery import resolve
from ..files.hf_files import HFTensor
from ..files.weights_source import Progress, WeightSource, open_source
from ..model.llm_layers import dense
from ..model.loader import read_args
from ..model.model_args import FULL, SLIDING, ModelArgs
from ..model.rope import RopeConfig
from ..text.tokenizer import Tokenizer

METHODS = ("linear", "slerp", "task")
SLERP_PARALLEL = 0.9995  # |cos| above this: the arc is a line to float32 precision (mergekit's threshold)
# Files of an HF folder that describe its tokenizer and chat template; copied from the first model.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "generation_config.json", "chat_template.jinja")
# Settings the tensors' shapes do not show but the meaning of their rows depends on.
LAYOUT_SETTINGS = ("num_heads", "num_kv_heads", "head_dim", "qk_norm", "attention_biases")
HF_CLASSES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM",
              "qwen3": "Qwen3ForCausalLM", "gemma3": "Gemma3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
              "olmo2": "Olmo2ForCausalLM"}
_BLOCK = re.compile(r"model\.layers\.(\d+)\.")
_HEADER_LEN = struct.Struct("<Q")

Schedule = float | Sequence[float]
ModelRef = str | os.PathLike[str]


def merge_models(a: ModelRef, b: ModelRef, out_dir: str | os.PathLike[str], *, method: str = "linear",
                 t: Schedule = 0.5, base: ModelRef | None = None, weights: Sequence[float] = (1.0, 1.0),
                 progress: Progress | None = None, cancel: Cancel = None, force: bool = False) -> Path:
    """Merge models ``a`` and ``b`` into the HF folder ``out_dir``; returns its path (resolved).

    ``method`` is ``linear`` or ``slerp`` (both use ``t``, in [0, 1]) or ``task`` (needs ``base``
    and uses ``weights``, one per model). ``progress(stage, done, total)`` hears about fetching a
    built-in model and then ``("merge", tensors written, tensors)``; ``cancel`` stops between
    tensors with :class:`~loomlab.core.errors.LoomCancelled`, leaving ``out_dir`` as it was.

    An existing ``out_dir`` is replaced only as
    :func:`~loomlab.core.io.output_folder.check_output_folder` allows (``force`` lets it replace a
    folder holding other files, never an input or a folder holding one).

    Raises :class:`~loomlab.core.errors.LoomConfigError` for bad arguments, for an output folder
    that may not be replaced and for models that cannot be merged (naming the first tensor or
    setting that differs), before any writing.
    """
    schedule = _check_arguments(method, t, base, weights)
    stop = as_cancel_check(cancel)
    refs = [("A", a), ("B", b)] + ([("base", base)] if method == "task" else [])
    check_output_folder(out_dir, [ref for _, ref in refs], force=force)  # before fetching a built-in
    parents: list[_Parent] = []
    try:
        for label, ref in refs:
            parents.append(_Parent(label, resolve(ref, progress=progress, cancel=stop)))
        target = check_output_folder(out_dir, [p.path for p in parents], force=force)
        for other in parents[1:]:
            _check_compatible(parents[0], other)
        first = parents[0]
        config, tied = first.hf_config()
        out_args = first.module.Args.from_hf(config)
        names = first.shapes()
        combine = _combiner(method, schedule, tuple(float(w) for w in weights), out_args.num_layers)

        def merged(name: str) -> np.ndarray:
            return combine(name, [p.tensor(name, out_args) for p in parents])

        files = {"config.json": json.dumps(config, indent=2).encode(), **first.tokenizer_files()}
        _write_folder(target, files, names, merged, progress, stop)
    finally:
        for p in parents:
            p.close()
    return target


def linear(t: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(1 - t) a + t b`` in float32; ``a`` itself at t = 0 and ``b`` at t = 1."""
    if t == 0:
        return a
    if t == 1:
        return b
    return np.float32(1 - t) * a + np.float32(t) * b


def slerp(t: float, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Spherical interpolation of ``a`` and ``b`` (any shape, as flat vectors) in float32; the
    angle is measured in float64. Linear when they are (anti)parallel or one is zero."""
    if t == 0:
        return a
    if t == 1:
        return b
    fa, fb = a.reshape(-1).astype(np.float64), b.reshape(-1).astype(np.float64)
    norms = math.sqrt(fa @ fa) * math.sqrt(fb @ fb)
    cos = fa @ fb / norms if norms else 1.0
    if abs(cos) > SLERP_PARALLEL:
        return linear(t, a, b)
    omega = math.acos(cos)
    s0, s1 = math.sin((1 - t) * omega) / math.sin(omega), math.sin(t * omega) / math.sin(omega)
    return np.float32(s0) * a + np.float32(s1) * b


def task_arithmetic(base: np.ndarray, models: Sequence[np.ndarray], weights: Sequence[float]) -> np.ndarray:
    """``base + sum_i weights_i (models_i - base)`` in float32."""
    out = base.copy()
    for w, m in zip(weights, models, strict=True):
        out += np.float32(w) * (m - base)
    return out


def schedule_value(schedule: Sequence[float], name: str, n_blocks: int) -> float:
    """The ``t`` of tensor ``name`` under ``schedule`` (see the module doc)."""
    if len(schedule) == 1:
        return schedule[0]
    m = _BLOCK.match(name)
    if m is None:
        return schedule[0] if name.startswith("model.embed_tokens.") else schedule[-1]
    where = int(m[1]) / max(n_blocks - 1, 1)
    return float(np.interp(where, np.linspace(0.0, 1.0, len(schedule)), schedule))


# ----- arguments --------------------------------------------------------------------------------

def _check_arguments(method: str, t: Schedule, base, weights: Sequence[float]) -> tuple[float, ...]:
    if method not in METHODS:
        raise LoomConfigError(f"unknown merge method {method!r}; known: {', '.join(METHODS)}")
    if method == "task":
        if base is None:
            raise LoomConfigError("task arithmetic needs a base model (the one both models were tuned from)")
        if len(weights) != 2 or not all(_finite(w) for w in weights):
            raise LoomConfigError(f"task arithmetic needs two finite weights, one per model; "
                                  f"got {list(weights)}")
        return (0.0,)
    if base is not None:
        raise LoomConfigError(f"a base model is for task arithmetic only, not {method}")
    schedule = (t,) if isinstance(t, int | float) else tuple(t)
    if not schedule or not all(_finite(v) and 0 <= v <= 1 for v in schedule):
        raise LoomConfigError(f"t must be a number in [0, 1] or a non-empty list of them; got {t!r}")
    return tuple(float(v) for v in schedule)


def _finite(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _combiner(method: str, schedule: tuple[float, ...], weights: tuple[float, ...],
              n_blocks: int) -> Callable[[str, list[np.ndarray]], np.ndarray]:
    if method == "task":
        return lambda name, ts: task_arithmetic(ts[2], ts[:2], weights)
    mix = linear if method == "linear" else slerp
    return lambda name, ts: mix(schedule_value(schedule, name, n_blocks), ts[0], ts[1])


# ----- parents ----------------------------------------------------------------------------------

class _Parent:
    """One opened model: its settings and its tensors by transformers name, read on demand."""

    def __init__(self, label: str, path: Path):
        self.label, self.path = label, path
        self.source: WeightSource = open_source(path)
        try:
            self.module, self.args = read_args(self.source)
            if self.source.kind == "gguf" and self.args.architecture not in HF_CLASSES:
                raise LoomConfigError(f"{label} ({path.name}) is a {self.args.architecture} GGUF file, whose "
                                      "transformers config is not written here; merge its HF release instead")
            if self.source.kind == "gguf":
                self.matrices = self.source.load(self.module.GGUF_BLOCK_NAMES)  # blocks stay in the file
            else:
                self.matrices = dict(self.source.tensors)
            if "rope_freqs" in self.matrices:
                raise LoomConfigError(f"{label} ({path.name}) scales RoPE by a rope_freqs tensor, which an "
                                      "HF folder cannot hold; merge it from its HF release instead")
        except BaseException:
            self.source.close()
            raise

    def close(self) -> None:
        self.source.close()

    def describe(self) -> str:
        return f"{self.label} ({self.path.name})"

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(m.shape) for name, m in self.matrices.items()}

    def tensor(self, name: str, out_args: ModelArgs) -> np.ndarray:
        """Tensor ``name`` as float32 in transformers' layout and values, as ``out_args`` reads it."""
        m = self.matrices[name]
        w = np.asarray(m.data(), np.float32) if isinstance(m, HFTensor) else dense(m)
        if self.args.rope_interleaved and not out_args.rope_interleaved:
            heads = {"self_attn.q_proj.": self.args.num_heads, "self_attn.k_proj.": self.args.num_kv_heads}
            n = next((h for part, h in heads.items() if part in name), None)
            if n is not None:
                w = _unpermute(w, n)
        shift = getattr(out_args, "norm_shift", 0.0) - getattr(self.args, "norm_shift", 0.0)
        if shift and name.endswith("norm.weight"):  # the rule of arch_gemma3.sanitize, undone
            w = w - np.float32(shift)
        return w

    def hf_config(self) -> tuple[dict, bool]:
        """config.json of the merged folder (this model's own for an HF folder, float32 weights)
        and whether its LM head is the embedding table."""
        tied = "lm_head.weight" not in self.matrices
        if self.source.kind == "hf":
            config = dict(self.source.metadata)
            for key in [k for k in ("torch_dtype", "dtype") if k in config] or ["torch_dtype"]:
                config[key] = "float32"
            return config, tied
        vocab = self.args.vocab_size or self.shapes()["model.embed_tokens.weight"][0]
        tok = self.tokenizer
        bos, eos = (tok.bos_id, sorted(tok.eos_ids)) if tok is not None else (None, [])
        return _hf_config(self.args, vocab, tied, bos, eos), tied

    @cached_property
    def tokenizer(self) -> Tokenizer | None:
        """A GGUF file's tokenizer, built from its vocabulary (None for a file without one)."""
        meta = self.source.metadata
        return Tokenizer.from_gguf_metadata(meta) if "tokenizer.ggml.model" in meta else None

    def tokenizer_files(self) -> dict[str, bytes]:
        """The tokenizer and chat-template files for the merged folder: an HF folder's own, or
        made from a GGUF file's vocabulary (tokenizer.json, tokenizer_config.json with the chat
        template, generation_config.json with every end-of-turn id)."""
        if self.source.kind == "hf":
            return {name: (self.path / name).read_bytes() for name in TOKENIZER_FILES
                    if (self.path / name).is_file()}
        meta, tokenizer = self.source.metadata, self.tokenizer
        if tokenizer is None:
            return {}
        tokens = meta["tokenizer.ggml.tokens"]
        config = {key: tokens[i] for key, i in (
            ("bos_token", tokenizer.bos_id), ("eos_token", meta.get("tokenizer.ggml.eos_token_id")),
            ("pad_token", tokenizer.pad_id), ("unk_token", tokenizer.unk_id)) if isinstance(i, int)}
        if isinstance(meta.get("tokenizer.chat_template"), str):
            config["chat_template"] = meta["tokenizer.chat_template"]
        generation = {"bos_token_id": tokenizer.bos_id, "eos_token_id": sorted(tokenizer.eos_ids)}
        return {"tokenizer.json": tokenizer.to_json().encode(),
                "tokenizer_config.json": json.dumps(config, indent=2).encode(),
                "generation_config.json": json.dumps(generation, indent=2).encode()}


def _check_compatible(first: _Parent, other: _Parent) -> None:
    """One LoomConfigError naming the first tensor (then setting) in which ``other`` differs."""
    what = f"cannot merge {first.describe()} with {other.describe()}"
    if first.module is not other.module:
        raise LoomConfigError(f"{what}: architectures differ ({first.source.architecture} vs "
                              f"{other.source.architecture})")
    mine, theirs = first.shapes(), other.shapes()
    for name, shape in mine.items():
        if name not in theirs:
            raise LoomConfigError(f"{what}: tensor {name} is in {first.label} but not in {other.label}")
        if theirs[name] != shape:
            raise LoomConfigError(f"{what}: tensor {name} is {shape} in {first.label} but {theirs[name]} "
                                  f"in {other.label}")
    extra = next((name for name in theirs if name not in mine), None)
    if extra is not None:
        raise LoomConfigError(f"{what}: tensor {extra} is in {other.label} but not in {first.label}")
    for setting in LAYOUT_SETTINGS:
        x, y = getattr(first.args, setting), getattr(other.args, setting)
        if x != y:
            raise LoomConfigError(f"{what}: {setting} is {x} in {first.label} but {y} in {other.label}")


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's converter permutation of Q/K rows (each head's halves interleaved)."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _hf_config(args: ModelArgs, vocab: int, tied: bool, bos: int | None, eos: list[int]) -> dict:
    """transformers' config.json for a model read from GGUF metadata (Q/K in transformers' order)."""
    gemma = args.architecture in ("gemma3", "gemma2")
    config = {
        "architectures": [HF_CLASSES[args.architecture]],
        "model_type": "gemma3_text" if args.architecture == "gemma3" else args.architecture,
        "hidden_size": args.hidden_size, "intermediate_size": args.intermediate_size,
        "num_hidden_layers": args.num_layers, "num_attention_heads": args.num_heads,
        "num_key_value_heads": args.num_kv_heads, "head_dim": args.head_dim, "rms_norm_eps": args.norm_eps,
        "vocab_size": vocab, "max_position_embeddings": args.context_length, "tie_word_embeddings": tied,
        "rope_parameters": _rope_parameters(args.rope), "bos_token_id": bos, "eos_token_id": eos,
        "torch_dtype": "float32",
    }
    if args.architecture in ("llama", "mistral"):
        config["attention_bias"] = bool(args.attention_biases)
    if args.layer_types:
        config["layer_types"] = list(args.layer_types)
        config["sliding_window"] = args.sliding_window
    if args.architecture == "gemma3":
        config["rope_parameters"] = {FULL: _rope_parameters(args.rope),
                                     SLIDING: _rope_parameters(args.local_rope)}
    if args.architecture == "gemma2":
        config["attn_logit_softcapping"] = args.attn_softcap
        config["final_logit_softcapping"] = args.final_softcap
    if gemma:
        config["query_pre_attn_scalar"] = args.query_scale ** -2 if args.query_scale else args.head_dim
        config["hidden_activation"] = "gelu_pytorch_tanh"
    return config


def _rope_parameters(rope: RopeConfig) -> dict:
    params = {"rope_type": rope.kind, "rope_theta": rope.base}
    if rope.kind != "default":
        params["factor"] = rope.factor
    if rope.kind == "llama3":
        params.update(low_freq_factor=rope.low_freq_factor, high_freq_factor=rope.high_freq_factor,
                      original_max_position_embeddings=rope.original_context)
    return params


# ----- writing ----------------------------------------------------------------------------------

def _write_folder(target: Path, files: dict[str, bytes], shapes: dict[str, tuple[int, ...]],
                  tensor: Callable[[str], np.ndarray], progress: Progress | None,
                  stop: Callable[[], bool]) -> None:
    """Write ``files``, model.safetensors (``tensor(name)`` for each of ``shapes``, float32) and the
    marker listing them into a folder beside ``target``, then put it in ``target``'s place."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.{secrets.token_hex(4)}.tmp")
    files = {**files, MARKER: marker_bytes([*files, "model.safetensors"])}
    with terminate_unwinds():
        _write_staged(staging, target, files, shapes, tensor, progress, stop)


def _write_staged(staging: Path, target: Path, files: dict[str, bytes], shapes: dict[str, tuple[int, ...]],
                  tensor: Callable[[str], np.ndarray], progress: Progress | None,
                  stop: Callable[[], bool]) -> None:
    staging.mkdir()
    try:
        for name, data in files.items():
            with open(staging / name, "wb") as f:
                f.write(data)
                os.fsync(f.fileno())
        _write_safetensors(staging / "model.safetensors", shapes, tensor, progress, stop)
        _fsync_dir(staging)
        _replace_folder(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], tensor: Callable[[str], np.ndarray],
                       progress: Progress | None, stop: Callable[[], bool]) -> None:
    """A float32 safetensors file, streamed: the header is known from the shapes, then each
    tensor is made and written in turn."""
    header: dict[str, dict] = {"__metadata__": {"format": "pt"}}
    at = 0
    for name, shape in shapes.items():
        n = 4 * math.prod(shape)
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [at, at + n]}
        at += n
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data area starts 8-byte aligned, as the safetensors library writes
    with open(path, "wb") as f:
        f.write(_HEADER_LEN.pack(len(raw)) + raw)
        for i, name in enumerate(shapes):
            if stop():
                raise LoomCancelled(f"merge cancelled after {i} of {len(shapes)} tensors")
            f.write(np.ascontiguousarray(tensor(name), dtype="<f4").data)
            if progress is not None:
                progress("merge", i + 1, len(shapes))
        f.flush()
        os.fsync(f.fileno())


def _replace_folder(staging: Path, target: Path) -> None:
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.{secrets.token_hex(4)}.old")
        os.replace(target, old)
    os.replace(staging, target)
    _fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
