"""Quantization recipes for language models: which format each GGUF tensor (matrix) of each weighted
layer gets, planned before anything is morphed (issue 14 §2).

A recipe is one of:

* a format name: a block format (``Q4_K``) puts every matrix in it, a Loom dtype (``int8``,
  ``float16``) every weighted layer, norms included;
* a preset: one of llama.cpp's file types (:data:`PRESETS`), the mix ``llama-quantize`` makes,
  written ``preset:Q4_0``; ``Q4_K_M`` and ``Q4_K_S``, which are no format, may drop the prefix;
* a mapping ``{key: format}`` (a JSON object, :func:`save_recipe` writes one), the key one of

  1. a GGUF tensor, ``blk.3.attn_v.weight`` (``.weight`` optional): that matrix, in every layer
     holding it (a tied embedding table is one tensor in two layers);
  2. a layer, by its name (``blk.3.attn_q/k/v/output``, ``token_embd``, ``output``) or its position
     among the weighted layers (an int or a string of digits): all its matrices;
  3. a pattern (``fnmatch``: a key holding ``*``, ``?`` or ``[``) matched against layer names and
     tensor names with and without ``.weight``: ``"blk.*.attn_v": "Q6_K"``, ``"*.ffn_down.weight"``;
  4. ``"*"``: every matrix no other key gives a format; its value may be a preset.

  A matrix takes the format of the first of these that names it: a tensor over its layer, both
  over patterns, and among patterns the first that matches in the mapping's order (as
  ``llama-quantize --tensor-type`` takes the first pattern that matches), ``"*"`` last;
* a sequence of formats, one per weighted layer (the evolution's stored recipe);
* the path of a JSON file holding a mapping or a sequence.

Loom's dtypes apply to whole layers (one scale per layer): a tensor given one sets its layer, and
a layer takes the dtype of its most specific keys (``{"*": "int8", "blk.3.ffn_up.weight": "int4"}``
puts blk.3's MLP in int4), which must agree, and not mix with block formats.

Rows that are not whole blocks. A format chosen for a matrix by name (1, 2, or a list) must fit its
rows: a Q4_K (blocks of 256) for rows of 640 weights is refused, naming the tensor, the row and the
block. A format a preset, a pattern or ``"*"`` gives falls back as llama.cpp's
``tensor_type_fallback`` does: Q2_K, Q3_K -> Q4_0, Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0, then
F16 when the rows are not even whole blocks of 32; the plan lists every fallback.

Presets port llama.cpp's ``llama_tensor_get_type`` (src/llama-quant.cpp) for the file types whose
formats Loom Lab encodes: the output matrix, and the token embedding when the head is tied to it,
go to Q6_K (Q8_0 when rows are not whole blocks of the preset's type, or for Q8_0); Q4_K_M gives
attn_v and ffn_down Q6_K on the "use more bits" blocks (the first and last eighth and every third
between); Q4_K_S gives Q5_K to attn_v of the first 4 blocks and ffn_down of the first eighth, which
Loom Lab cannot encode yet (it is refused, naming the tensor, unless the rows fall back to Q5_1).
llama.cpp counts attn_v and ffn_down tensors in its sorted-by-block order; here the block number
is read from the tensor's name, the same number for a model with one attn_v per block (a dense
model) unless ``--tensor-type`` overrides skip some of them in llama.cpp's count. Vectors (norm
gains, biases) stay F32, as in every llama.cpp type.

Why a plain block format is not the preset of the same name: the issue's ``--recipe Q8_0`` means
one format for every matrix (``llama-quantize --pure``), which reads the same in a table of layers;
llama-quantize's own ``Q4_0`` (its output and tied embedding at Q6_K) is ``preset:Q4_0``. For Q8_0
the two are the same plan.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, LlamaFileType
from gguf import GGMLQuantizationType as GT

from ... import dtypes
from ...errors import LoomConfigError
from ...io.atomic import write_atomic
from ...io.bounded_read import parse_json_text, read_small_text
from ...layer_names import layer_name
from ...layers.base import Layer
from ...morph import MorphReport, check_target, layer_report, morph_sublayer, weighted_cells
from ..kernels.block_morph import BLOCK_FORMATS, encoding_name, is_block_format, is_matrix, stored_nbytes
from ..model.llm_layers import MatrixStore, is_filler_bias

PRESET_PREFIX = "preset:"
#: llama.cpp's file types whose formats Loom Lab encodes -> the type of the matrices no rule moves
PRESETS = {"Q4_K_M": "Q4_K", "Q4_K_S": "Q4_K", "Q5_K_M": "Q5_K", "Q5_K_S": "Q5_K", "Q3_K_L": "Q3_K",
           "Q3_K_M": "Q3_K", "Q3_K_S": "Q3_K", "Q2_K": "Q2_K", "Q4_0": "Q4_0", "Q4_1": "Q4_1", "Q5_0": "Q5_0",
           "Q5_1": "Q5_1", "Q6_K": "Q6_K", "Q8_0": "Q8_0"}
#: llama.cpp's tensor_type_fallback: a format whose blocks do not divide the rows -> the one used
FALLBACKS = {"Q2_K": "Q4_0", "Q3_K": "Q4_0", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
LAST_FALLBACK = "F16"  # when the fallback's blocks of 32 do not divide the rows either
PATTERN_CHARS = "*?["
LOOM_PART = "weights"  # the one part of a Loom layer (its flat weights) that recipes see
KEY_KINDS = "a layer or tensor name, a pattern, \"*\" or a layer's position"
POSITION_DIGITS = 18  # a layer's position written longer is out of range (and int() refuses 4,300+)
RECIPE_FILE_LIMIT = 1 << 20  # bytes: a recipe names a format per tensor at most, a few KB
_BLOCK = re.compile(r"blk\.(\d+)\.")
# precedence levels of a recipe's keys, most specific first
TENSOR, LAYER, PATTERN, DEFAULT = range(4)
# a GGUF tensor name -> its importance vector (an imatrix entry), or None to quantize it unweighted
Importance = Callable[[str], np.ndarray | None]


# ----- the model's weighted layers -----------------------------------------------------------------
@dataclass(frozen=True)
class WeightedLayer:
    position: int  # index in the model's list of weighted layers (a recipe's index, 0-based)
    cell: int  # flat grid index of the cell holding it (what morph_sublayer takes)
    layer: Layer
    name: str  # as the Morph panel names it: blk.3.attn_q/k/v/output, token_embd ...
    parts: Mapping[str, str]  # weight-store part -> the GGUF tensor it comes from (blk.3.attn_q.weight)

    @property
    def tensors(self) -> tuple[str, ...]:
        return tuple(self.parts.values())


def weighted_layers(net) -> list[WeightedLayer]:
    """Every weighted layer of a network's grid, in order, with its name. A language model's
    layers list their GGUF tensors; a Loom network's layer has one part, its weights, named as
    the layer (recipes then set whole layers, in Loom's dtypes)."""
    out = []
    for position, (cell, layer) in enumerate(weighted_cells(net)):
        named = layer_name(net, (*net.coord(cell), layer.path))
        parts = dict(named.tensors) if named.tensors else {LOOM_PART: named.label}
        out.append(WeightedLayer(position, cell, layer, named.label, MappingProxyType(parts)))
    return out


def _matrix(la: WeightedLayer, part: str, fmt: str):
    """The matrix (or vector) a block format ``fmt`` would encode; a Loom layer has none."""
    store = la.layer.weights
    if not isinstance(store, MatrixStore):
        raise LoomConfigError(f"layer {la.name}: {fmt} is one of GGUF's block formats, for a language "
                              f"model's matrices; a Loom network's layers take Loom's dtypes (int8 ...)")
    return store.blocks[part]


def format_name(name: Any) -> str:
    """The canonical name of a format a layer can be morphed to: one of GGUF's block formats
    (:data:`~.block_morph.BLOCK_FORMATS`) or Loom's 21 dtypes (any of their spellings)."""
    if not isinstance(name, str):
        raise LoomConfigError(f"a format is a name such as Q8_0, int8 or float16, got {name!r}")
    if is_block_format(name):
        return name
    try:
        return dtypes.get_format(name).name
    except LoomConfigError:
        raise LoomConfigError(f"unknown format {name!r}; expected one of GGUF's block formats "
                              f"({', '.join(BLOCK_FORMATS)}) or Loom's dtypes: "
                              f"{', '.join(sorted(dtypes.FORMATS))}") from None


def preset_name(name: Any) -> str | None:
    """The preset ``name`` spells (``preset:Q4_0``, or ``Q4_K_M`` / ``Q4_K_S`` bare), else None.

    Raises:
        LoomConfigError: ``preset:`` followed by no preset of :data:`PRESETS`.
    """
    if not isinstance(name, str):
        return None
    if name.startswith(PRESET_PREFIX):
        preset = name.removeprefix(PRESET_PREFIX)
        if preset not in PRESETS:
            raise LoomConfigError(f"unknown preset {preset!r}; Loom Lab's presets (llama.cpp's file types "
                                  f"whose formats it encodes): {', '.join(PRESETS)}")
        return preset
    return name if name in PRESETS and not is_block_format(name) else None


def block_size(fmt: str) -> int:
    """Weights per block of a GGUF type (1 for F16)."""
    return GGML_QUANT_SIZES[GT[fmt]][0]


# ----- the plan ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fallback:
    """A matrix whose rows are not whole blocks of the format a rule gave it (llama.cpp's rule)."""

    layer: str
    tensor: str
    wanted: str
    used: str
    row: int  # weights per row

    def __str__(self) -> str:
        return (f"{self.tensor}: rows of {self.row} weights are not whole {self.wanted} blocks of "
                f"{block_size(self.wanted)}, {self.used} instead")


def fallback_summary(fallbacks: Sequence[Fallback]) -> str:
    """The fallbacks in one line, counted by format and row length (a model may have hundreds):
    ``"180 tensors fell back (rows not whole blocks, llama.cpp's rule): 166
    Q4_K->Q5_0 (rows of 576), 14 Q6_K->Q8_0 (rows of 576)"``; "" when there are none."""
    counts: dict[tuple[str, str, int], int] = {}
    for f in fallbacks:
        counts[f.wanted, f.used, f.row] = counts.get((f.wanted, f.used, f.row), 0) + 1
    if not counts:
        return ""
    kinds = ", ".join(f"{n} {wanted}->{used} (rows of {row})" for (wanted, used, row), n in
                      sorted(counts.items(), key=lambda item: -item[1]))
    many = "tensor fell" if len(fallbacks) == 1 else "tensors fell"
    return f"{len(fallbacks)} {many} back (rows not whole blocks, llama.cpp's rule): {kinds}"


@dataclass(frozen=True)
class LayerPlan:
    """What one weighted layer becomes: a Loom dtype for the whole layer, or a format per matrix."""

    position: int
    name: str
    dtype: str | None  # a Loom dtype (one scale for the layer), or None: block formats per matrix
    parts: Mapping[str, str]  # every matrix of the layer -> its format (when dtype is None)
    tensors: Mapping[str, str]  # weight-store part -> GGUF tensor name
    changes: bool  # False when the layer already is so (morphing it changes nothing)

    @property
    def format(self) -> str:
        """In one word, as the Morph panel labels a layer: ``int8``, ``Q4_K``, ``Q4_K+Q6_K``."""
        return self.dtype or "+".join(sorted(set(self.parts.values())))

    @property
    def tensor_formats(self) -> dict[str, str]:
        """GGUF tensor name -> format, for each matrix (empty for a Loom dtype)."""
        return {self.tensors[part]: fmt for part, fmt in self.parts.items()}


@dataclass(frozen=True)
class RecipePlan:
    """A recipe resolved against one model: checked, nothing morphed yet."""

    layers: tuple[LayerPlan, ...]  # every layer the recipe gives a format, in order
    fallbacks: tuple[Fallback, ...] = ()
    bytes: int = 0  # the model's weight bytes once applied (as net.memory_bytes() counts them then)
    preset: str = ""  # the preset "*" gives, if any: the file type llama-quantize writes (file_type)

    @property
    def file_type(self) -> LlamaFileType | None:
        """llama.cpp's ``general.file_type`` of the preset (``MOSTLY_Q4_K_M`` ...), as llama-quantize
        writes it whatever the tensors' mix is; None without a preset."""
        return LlamaFileType.__members__[f"MOSTLY_{self.preset}"] if self.preset else None

    @property
    def changed(self) -> tuple[LayerPlan, ...]:
        """The layers that morphing changes."""
        return tuple(lp for lp in self.layers if lp.changes)

    def formats(self) -> dict[int, str]:
        """``{position: format in one word}`` of the layers that change (what resolve_recipe gives)."""
        return {lp.position: lp.format for lp in self.changed}


# ----- reading a recipe ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _Rule:
    key: str  # as the recipe writes it, for messages
    value: str  # a canonical format name, or a preset name when ``preset``
    level: int
    preset: bool = False

    @property
    def explicit(self) -> bool:
        """Named by tensor, layer or position: its format must fit, no fallback."""
        return self.level in (TENSOR, LAYER)


def plan_recipe(net, recipe: str | os.PathLike | Mapping[str | int, str] | Sequence[str]) -> RecipePlan:
    """Resolve ``recipe`` (see the module docstring) against ``net``'s weighted layers.

    Raises:
        LoomConfigError: an unknown format, preset, layer or tensor, a pattern matching nothing, a
            key that names only vectors with a block format, a matrix or layer given two formats, a
            format named for a matrix whose rows are not whole blocks of it, a preset type Loom Lab
            cannot encode, a sequence of the wrong length, or a file that cannot be read as a recipe.
    """
    layers = weighted_layers(net)
    if isinstance(recipe, str) and not _is_path_like(recipe):
        recipe = _one_word(recipe)
    if isinstance(recipe, str | os.PathLike):
        recipe = _read_recipe_file(Path(recipe))
    if isinstance(recipe, Mapping):
        rules = _rules_from_mapping(layers, recipe)
    elif isinstance(recipe, Sequence) and not isinstance(recipe, bytes):
        if len(recipe) != len(layers):
            raise LoomConfigError(f"a recipe list has one format per weighted layer ({len(layers)}), "
                                  f"got {len(recipe)}")
        rules = _rules_from_mapping(layers, dict(enumerate(recipe)))
    else:
        raise LoomConfigError(f"a recipe is a format name, a preset, a {{layer: format}} mapping, a list of "
                              f"formats or a JSON file of one; got {type(recipe).__name__}")
    return _plan(layers, rules)


def resolve_recipe(net, recipe) -> dict[int, str]:
    """What to morph, in one word per layer: ``{position in weighted_layers(net): format}`` in layer
    order, without the layers already so (``plan_recipe(net, recipe).formats()``)."""
    return plan_recipe(net, recipe).formats()


def _one_word(recipe: str) -> dict[str, str] | str:
    """A recipe given as one word: a preset or a format for everything (``{"*": it}``), else the
    word is taken for a file."""
    try:
        if preset_name(recipe) is None:
            format_name(recipe)
        return {"*": recipe}
    except LoomConfigError as e:
        if Path(recipe).exists():
            return recipe
        raise LoomConfigError(f"recipe {recipe!r} is neither a format nor a recipe file (nor a preset: "
                              f"{', '.join(_preset_spellings())}): {e}") from None


def _preset_spellings() -> list[str]:
    return [p if not is_block_format(p) else PRESET_PREFIX + p for p in PRESETS]


def _is_path_like(text: str) -> bool:
    return text.endswith(".json") or os.sep in text or "/" in text


def _read_recipe_file(path: Path) -> Any:
    """A recipe file's JSON: read with a size cap from a regular file only (``/dev/zero`` and a
    FIFO are refused at once), nesting too deep for the parser refused too."""
    what = f"the recipe file {path}"
    text = read_small_text(path, "the recipe file", RECIPE_FILE_LIMIT)
    value = parse_json_text(text, what)
    if isinstance(value, list):
        return list(recipe_from_value(value))
    if not isinstance(value, dict):
        raise LoomConfigError(f"{what} holds a JSON object {{layer: format}} or a list of "
                              f"formats, one per weighted layer; got {type(value).__name__}")
    return value


def recipe_from_value(value: Any) -> tuple[str, ...]:
    """A recipe written as a list, one dtype name per weighted layer (how an evolution of recipes
    stores its members), from parsed JSON; anything else is one :class:`LoomConfigError`."""
    if not isinstance(value, list) or not all(isinstance(d, str) for d in value):
        raise LoomConfigError("a stored recipe is a JSON array of dtype names")
    return tuple(value)


def _rule_value(key: Any, value: Any) -> tuple[str, bool]:
    """A rule's format (canonical) and whether it is a preset, which only ``"*"`` may be."""
    preset = preset_name(value)
    if preset is None:
        return format_name(value), False
    if key != "*":
        raise LoomConfigError(f"recipe key {key!r}: a preset ({value}) sets every matrix, so it is the "
                              f"value of \"*\" only")
    return preset, True


class _Keys:
    """What a recipe's keys may name in one model: its layers and tensors."""

    def __init__(self, layers: list[WeightedLayer]):
        self.layers = layers
        self.layer_names = {la.name: la.position for la in layers}
        for la in layers:
            if la.name.startswith("output (tied"):
                self.layer_names.setdefault("output", la.position)
        self.tensor_users: dict[str, list[tuple[int, str]]] = {}  # tensor name -> [(position, part)]
        for la in layers:
            for part, tensor in la.parts.items():
                self.tensor_users.setdefault(tensor, []).append((la.position, part))

    def targets(self, key: Any) -> tuple[int, list[tuple[int, str]]]:
        """``(level, [(position, part), ...])`` a key names; patterns and "*" are matched later."""
        is_int = isinstance(key, int | np.integer) and not isinstance(key, bool)
        if is_int or isinstance(key, str) and key.isascii() and key.isdigit():
            position = int(key) if is_int or len(key) <= POSITION_DIGITS else -1  # int() caps its digits
            if not 0 <= position < len(self.layers):
                raise LoomConfigError(f"recipe layer {key!r}: the model's weighted layers are 0 to "
                                      f"{len(self.layers) - 1}")
            return LAYER, self._whole(position)
        if not isinstance(key, str):
            raise LoomConfigError(f"a recipe key is {KEY_KINDS}; got {key!r}")
        if key in self.layer_names:
            return LAYER, self._whole(self.layer_names[key])
        for tensor in (key, key + ".weight"):
            if tensor in self.tensor_users:
                return TENSOR, self.tensor_users[tensor]
        if key == "*":
            return DEFAULT, []
        if any(c in key for c in PATTERN_CHARS):
            return PATTERN, []
        shown = ", ".join(la.name for la in self.layers[:6])
        raise LoomConfigError(f"recipe layer {key!r}: no such weighted layer (the model's {len(self.layers)} "
                              f"are named {shown} ... {self.layers[-1].name}, or given by position "
                              f"0-{len(self.layers) - 1}; tensors by their GGUF names)")

    def _whole(self, position: int) -> list[tuple[int, str]]:
        return [(position, part) for part in self.layers[position].parts]

    def matches(self, pattern: str, la: WeightedLayer, part: str) -> bool:
        tensor = la.parts[part]
        return any(fnmatchcase(name, pattern) for name in (la.name, tensor, tensor.removesuffix(".weight")))


def _rules_from_mapping(layers: list[WeightedLayer], recipe: Mapping) -> dict[tuple[int, str], _Rule]:
    """The rule that decides each (position, part) a recipe sets, by the precedence of the keys."""
    keys = _Keys(layers)
    exact: dict[tuple[int, str], _Rule] = {}
    patterns: list[_Rule] = []
    default = None
    for key, value in recipe.items():
        fmt, preset = _rule_value(key, value)
        level, named = keys.targets(key)
        rule = _Rule(str(key), fmt, level, preset)
        if level == DEFAULT:
            default = rule
        elif level == PATTERN:
            patterns.append(rule)
        else:
            _check_names_a_matrix(rule, named, layers)
            for target in named:
                had = exact.get(target)
                if had is None or rule.level < had.level:
                    exact[target] = rule
                elif had.level == rule.level and had.value != rule.value:
                    la = layers[target[0]]
                    raise LoomConfigError(f"{la.parts[target[1]]} (layer {la.name}) is given two formats in "
                                          f"the recipe ({had.value} by {had.key!r} and {rule.value} by "
                                          f"{rule.key!r})")
    chosen, matched = {}, set()
    for la in layers:
        for part in la.parts:
            target = (la.position, part)
            hits = [p for p in patterns if keys.matches(p.key, la, part)]
            matched.update(p.key for p in hits)
            rule = exact.get(target) or (hits[0] if hits else default)
            if rule is not None:
                chosen[target] = rule
    for p in patterns:
        if p.key not in matched:
            raise LoomConfigError(f"recipe pattern {p.key!r} matches no layer or tensor of the model (layers "
                                  f"are named like {layers[1].name}, tensors like {layers[1].tensors[0]})")
    return chosen


def _check_names_a_matrix(rule: _Rule, named: list[tuple[int, str]], layers: list[WeightedLayer]) -> None:
    """A block format given by name to vectors only is refused: vectors stay F32 in every format."""
    if is_block_format(rule.value) and not any(is_matrix(_matrix(layers[p], part, rule.value))
                                               for p, part in named):
        raise LoomConfigError(f"recipe key {rule.key!r} names vectors only (norm gains, biases); they stay "
                              f"F32 in every block format, and {rule.value} applies to matrices")


# ----- the plan from the rules ---------------------------------------------------------------------
def _plan(layers: list[WeightedLayer], rules: dict[tuple[int, str], _Rule]) -> RecipePlan:
    tied = not any("output.weight" in la.parts.values() for la in layers)  # llama.cpp's has_tied_embeddings
    n_blocks = len({m[1] for la in layers for t in la.tensors if (m := _BLOCK.match(t))})
    gqa = _query_heads_per_kv_head(layers) if any(r.preset for r in rules.values()) else 1
    plans, fallbacks = [], []
    for la in layers:
        mine = {part: rules[la.position, part] for part in la.parts if (la.position, part) in rules}
        if not mine:
            continue
        if any(_is_loom(r) for r in mine.values()):  # a whole layer: its most specific keys decide
            top = min(r.level for r in mine.values())
            values = sorted({r.value for r in mine.values() if r.level == top})
            if len(values) > 1 or not _is_loom(next(r for r in mine.values() if r.level == top)):
                values = values if len(values) > 1 else sorted({r.value for r in mine.values()})
                raise LoomConfigError(f"layer {la.name} is given two formats in the recipe "
                                      f"({' and '.join(values)}): Loom's dtypes apply to whole layers")
            plans.append(_dtype_plan(la, values[0]))
            continue
        parts = {}
        for part, rule in mine.items():
            m = _matrix(la, part, rule.value)
            if not is_matrix(m):
                continue
            wanted = (_preset_format(rule.value, la.parts[part], m.shape[1], n_blocks, tied, gqa)
                      if rule.preset else rule.value)
            parts[part] = _fitted(la, part, rule, wanted, fallbacks)
        if parts:
            plans.append(_parts_plan(la, parts))
    size = _planned_bytes(layers, {lp.position: lp for lp in plans})
    preset = next((r.value for r in rules.values() if r.preset), "")
    return RecipePlan(tuple(plans), tuple(fallbacks), size, preset)


def _is_loom(rule: _Rule) -> bool:
    return not rule.preset and not is_block_format(rule.value)


def _use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of the blocks that get more bits in its _M mixes."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def _query_heads_per_kv_head(layers: list[WeightedLayer]) -> int:
    """llama.cpp's ``n_gqa()``: query heads per key/value head, from the first block's attn_q and
    attn_k rows (1 when the model has neither)."""
    for la in layers:
        rows = {t.removesuffix(".weight").rsplit(".", 1)[-1]: la.layer.weights.blocks[part].shape[0]
                for part, t in la.parts.items()}
        if "attn_q" in rows and "attn_k" in rows:
            return max(1, rows["attn_q"] // rows["attn_k"])
    return 1


def _preset_format(preset: str, tensor: str, row: int, n_blocks: int, tied: bool, gqa: int) -> str:
    """llama.cpp's ``llama_tensor_get_type_impl`` for ``preset`` and one matrix (before fallbacks),
    for a dense model (no experts) of any architecture but Falcon."""
    default = PRESETS[preset]
    if tensor == "output.weight" or tied and tensor == "token_embd.weight":
        if row % block_size(default):
            return "Q8_0"
        return default if default == "Q8_0" else "Q6_K"
    found = _BLOCK.match(tensor)
    block = int(found[1]) if found else -1
    more_bits = _use_more_bits(block, n_blocks)
    if "attn_v.weight" in tensor:
        return {"Q2_K": "Q4_K" if gqa >= 4 else "Q3_K",
                "Q3_K_M": "Q5_K" if block < 2 else "Q4_K",
                "Q3_K_L": "Q5_K",
                "Q4_K_M": "Q6_K" if more_bits else default,
                "Q5_K_M": "Q6_K" if more_bits else default,
                "Q4_K_S": "Q5_K" if block < 4 else default}.get(preset, default)
    if "ffn_down" in tensor:
        return {"Q2_K": "Q3_K",
                "Q3_K_M": "Q5_K" if block < n_blocks // 16 else "Q4_K",
                "Q3_K_L": "Q5_K",
                "Q4_K_M": "Q6_K" if more_bits else default,
                "Q5_K_M": "Q6_K" if more_bits else default,
                "Q4_K_S": "Q5_K" if block < n_blocks // 8 else default}.get(preset, default)
    if "attn_output.weight" in tensor:
        return {"Q2_K": "Q3_K", "Q3_K_M": "Q4_K", "Q3_K_L": "Q5_K"}.get(preset, default)
    return default


def _fitted(la: WeightedLayer, part: str, rule: _Rule, wanted: str, fallbacks: list[Fallback]) -> str:
    """``wanted``, or llama.cpp's fallback when its blocks do not divide the rows (a format named
    for the matrix or its layer is refused instead)."""
    tensor, row = la.parts[part], la.layer.weights.blocks[part].shape[1]
    used = wanted
    if row % block_size(wanted):
        if rule.explicit:
            raise LoomConfigError(f"recipe key {rule.key!r}: {tensor} (layer {la.name}) has rows of {row} "
                                  f"weights, not whole {wanted} blocks of {block_size(wanted)}")
        used = FALLBACKS.get(wanted)
        if used is None:
            raise LoomConfigError(f"recipe key {rule.key!r}: {tensor} (layer {la.name}) has rows of {row} "
                                  f"weights, not whole {wanted} blocks of {block_size(wanted)}, and "
                                  f"llama.cpp defines no fallback for {wanted}")
        if row % block_size(used):
            used = LAST_FALLBACK
        if all(f.tensor != tensor for f in fallbacks):  # a tied table is one tensor in two layers
            fallbacks.append(Fallback(la.name, tensor, wanted, used, row))
    return used


def _dtype_plan(la: WeightedLayer, dtype: str) -> LayerPlan:
    layer = la.layer
    now = (layer.cfg.dtype, layer.weights.encoding(layer.cfg.dtype))
    return LayerPlan(la.position, la.name, dtype, MappingProxyType({}), la.parts, dtype not in now)


def _parts_plan(la: WeightedLayer, parts: dict[str, str]) -> LayerPlan:
    """A layer's matrices: those the recipe sets, the rest as forward reads them now (the file's
    own when the layer is in a Loom dtype)."""
    store, dtype = la.layer.weights, la.layer.cfg.dtype
    now = store.block_encodings(dtype)
    full = {**(now or _file_encodings(store)), **parts}
    return LayerPlan(la.position, la.name, None, MappingProxyType(full), la.parts, full != now)


def _file_encodings(store) -> dict[str, str]:
    return {part: encoding_name(store.blocks[part]) for part in store.matrix_parts()}


def _planned_bytes(layers: list[WeightedLayer], plans: dict[int, LayerPlan]) -> int:
    """Weight bytes once the plan is applied, counted as ``net.memory_by_dtype`` counts them: a
    matrix two layers hold in the same format (a tied table) once."""
    seen: dict[tuple, int] = {}
    for la in layers:
        store, dtype = la.layer.weights, la.layer.cfg.dtype
        lp = plans.get(la.position)
        if lp is None:
            formats = store.block_encodings(dtype)
        elif lp.dtype == "float32" and store.block_encodings("float32") is not None:
            # a language model's float32 reads the file's blocks
            formats, dtype = _file_encodings(store), lp.dtype
        else:
            formats, dtype = lp.parts if lp.dtype is None else None, lp.dtype
        if formats is None:  # a Loom dtype: the layer's packed bytes
            seen.update({key: n for key, (_, n) in store.stored(dtype).items()})
            continue
        for part, m in store.blocks.items():
            if not is_filler_bias(part, m):
                fmt = formats.get(part, encoding_name(m))
                seen[id(m), fmt] = _nbytes(m, fmt)
    return sum(seen.values())


def _nbytes(m, fmt: str) -> int:
    if fmt == encoding_name(m):
        return stored_nbytes(m)
    elems, size = GGML_QUANT_SIZES[GT[fmt]]
    rows, cols = m.shape
    return rows * (cols // elems) * size


# ----- applying and saving -------------------------------------------------------------------------
def morph_planned(layer: Layer, cell: int, plan: LayerPlan,
                  importance: Importance | None = None) -> MorphReport:
    """Morph one layer as its plan says (checked first): a Loom dtype, or a format per matrix,
    each weighted by ``importance(its GGUF tensor name)`` where that gives a vector (an
    importance matrix, llama-quantize's ``--imatrix``)."""
    if plan.dtype is not None:
        return morph_sublayer(layer, cell, plan.dtype)
    _check_parts(layer, cell, plan)
    weights = None if importance is None else {part: importance(plan.tensors[part]) for part in plan.parts}
    layer.cfg.dtype = layer.weights.morph_parts(plan.parts, weights)
    return layer_report(layer, cell)


def _check_parts(layer: Layer, cell: int, plan: LayerPlan) -> None:
    problem = layer.weights.parts_refusal(plan.parts)
    if problem:
        raise LoomConfigError(f"layer {plan.name} at cell {cell} cannot morph to {plan.format}: {problem}")


def apply_recipe(net, recipe, progress: Callable[[int, int, str], None] | None = None,
                 importance: Importance | None = None) -> list[MorphReport]:
    """Morph ``net``'s weighted layers as ``recipe`` (a :class:`RecipePlan` made for this net, or
    anything :func:`plan_recipe` reads) says; every layer is checked before any is changed.
    ``progress(layers done, layers to morph, layer name)`` after each (encoding a model's
    matrices takes seconds); ``importance`` weighs block formats (see :func:`morph_planned`)."""
    plan = recipe if isinstance(recipe, RecipePlan) else plan_recipe(net, recipe)
    layers = weighted_layers(net)
    for lp in plan.changed:
        la = layers[lp.position] if lp.position < len(layers) else None
        if la is None or la.name != lp.name:
            raise LoomConfigError(f"the recipe plan names layer {lp.position} {lp.name}, which this model "
                                  f"does not have there: plan the recipe for this model")
        if lp.dtype is not None:
            check_target(la.layer, la.cell, lp.dtype)
        else:
            _check_parts(la.layer, la.cell, lp)
    reports = []
    for done, lp in enumerate(plan.changed, 1):
        reports.append(morph_planned(layers[lp.position].layer, layers[lp.position].cell, lp, importance))
        if progress is not None:
            progress(done, len(plan.changed), lp.name)
    return reports


def save_recipe(path: str | os.PathLike, recipe: Mapping[str | int, str], net=None) -> None:
    """Write ``recipe`` (a ``{key: format}`` mapping, see the module docstring) as a JSON object,
    atomically; with ``net``, planned against it first, so a recipe that model refuses is not saved.

    Raises:
        LoomConfigError: not a mapping, a key that is no name or position, an unknown format or
            preset, or (with ``net``) anything :func:`plan_recipe` refuses.
    """
    if not isinstance(recipe, Mapping):
        raise LoomConfigError(f"a recipe to save is a {{layer: format}} mapping, got {type(recipe).__name__}")
    for key, value in recipe.items():
        if isinstance(key, bool) or not isinstance(key, str | int | np.integer):
            raise LoomConfigError(f"a recipe key is {KEY_KINDS}; got {key!r}")
        _rule_value(key, value)
    if net is not None:
        plan_recipe(net, recipe)
    text = json.dumps({str(k): v for k, v in recipe.items()}, indent=2) + "\n"
    write_atomic(path, text.encode("utf-8"))
