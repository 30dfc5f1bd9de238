"""Names of a network's layers as people know them, for every panel that lists layers.

A language model's weighted layers are named by the tensors their weights come from, in the GGUF
(llama.cpp) naming: ``blk.10.attn_q/k/v/output``, ``blk.10.ffn_norm``, ``token_embd``. Its
containers are named by block: ``block 10``, ``block 10 attention``. Any other network's layers
are named by type, grid cell ``(z, y, x, l)`` and container path. Layers are located by the key
observer events carry: ``(z, y, x, l, path)``.

How big a network is reads the same in every panel (:class:`Parts`): a *cell* is one ``(z, y, x)``
place of the grid, holding up to ``layers_per_cell`` layers; a *layer* is any layer, containers and
their children included; a *weighted* layer holds weights (the rows Morph lists); a language
model's *block* N sits in cell N + 1, after the embedding, and is labelled ``block N`` wherever it
is shown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .errors import LoomConfigError
from .layers.base import Layer
from .llm.model.llm_layers import LLMAttention, LLMEmbedding, LLMGatedMLP, LLMHead, LLMRMSNorm, is_filler_bias
from .llm.model.moe_layer import LLMMixtureOfExperts
from .network import VolumetricNetwork
from .units import format_count

LayerKey = tuple[int, int, int, int, str]

# Weight-store part -> GGUF tensor name within a block (``blk.N.`` goes in front).
ATTENTION_TENSORS = {
    "wq": "attn_q.weight", "wk": "attn_k.weight", "wv": "attn_v.weight", "wo": "attn_output.weight",
    "bq": "attn_q.bias", "bk": "attn_k.bias", "bv": "attn_v.bias", "bo": "attn_output.bias",
    "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
}
MLP_TENSORS = {
    "gate": "ffn_gate.weight", "up": "ffn_up.weight", "down": "ffn_down.weight",
    "b_gate": "ffn_gate.bias", "b_up": "ffn_up.bias", "b_down": "ffn_down.bias",
}
# A mixture of experts: its router, and expert e's rows of the stacked tensors (``[e]``)
ROUTER_TENSORS = {"router": "ffn_gate_inp.weight"}
EXPERT_TENSORS = {"gate": "ffn_gate_exps.weight[{e}]", "up": "ffn_up_exps.weight[{e}]",
                  "down": "ffn_down_exps.weight[{e}]"}
# A decoder block is Sequential[attention half, Residual, MLP half, Residual] (layer_builders.
# decoder_block); each half is [norm, main layer, optional post-norm]. A norm's GGUF name says
# which half it sits in and whether it comes before or after that half's main layer.
HALVES = ("attention", "attention residual", "MLP", "MLP residual")
NORM_NAMES = {("attention", True): "attn_norm", ("attention", False): "post_attention_norm",
              ("MLP", True): "ffn_norm", ("MLP", False): "post_ffw_norm"}
_STEP = re.compile(r"(?:sequential_layers|parallel_branches)\[(\d+)\]")


@dataclass(frozen=True)
class LayerName:
    """What a layer is called: ``label`` for lists and titles, ``block`` (a language model's
    block number, None elsewhere) and ``tensors``: each weight-store part the file holds ->
    that tensor's GGUF name (empty for a Loom network)."""

    label: str
    block: int | None = None
    tensors: dict[str, str] = field(default_factory=dict)


# A language model's grid around its blocks: embedding first, final norm and LM head last.
LLM_CELLS_AROUND_BLOCKS = 3


@dataclass(frozen=True)
class Parts:
    """A network's size in the words every panel uses (see the module doc); ``layers`` and
    ``weighted`` are None where only the file's header is known."""

    cells: int
    per_cell: int = 1
    blocks: int | None = None
    layers: int | None = None
    weighted: int | None = None

    @classmethod
    def of_language_model(cls, blocks: int) -> Parts:
        """A language model known by its block count (a file not loaded yet)."""
        return cls(blocks + LLM_CELLS_AROUND_BLOCKS, 1, blocks)

    def __str__(self) -> str:
        cells = format_count(self.cells, "cell")
        if self.per_cell > 1:
            cells += f" × {self.per_cell} per cell"
        text = cells if self.blocks is None else f"{format_count(self.blocks, 'block')} in {cells}"
        if self.layers is not None:
            text += f" · {format_count(self.layers, 'layer')}"
        if self.weighted is not None:
            text += f", {self.weighted:,} weighted"
        return text


def model_parts(net: VolumetricNetwork) -> Parts:
    """How many cells, blocks (a language model's), layers and weighted layers ``net`` has."""
    layers = list(net.all_layers())
    blocks = len(net.cells) - LLM_CELLS_AROUND_BLOCKS if _is_llm(net) else None
    return Parts(net.depth * net.rows * net.cols, net.layers_per_cell, blocks, len(layers),
                 sum(1 for layer in layers if layer.weights is not None))


def layer_label(net: VolumetricNetwork, key: LayerKey) -> str:
    """The name to show for the layer at ``key`` = (z, y, x, l, path) (see :func:`layer_name`)."""
    return layer_name(net, key).label


def layer_name(net: VolumetricNetwork, key: LayerKey) -> LayerName:
    """Name the layer at ``key`` = (z, y, x, l, path), as observer events locate layers.

    Raises:
        LoomConfigError: no layer of ``net`` sits at ``key``.
    """
    chain = _chain(net, key)
    z, y, x, l, path = key  # noqa: E741
    name = _llm_name(net, net.index((z, y, x, l)), chain, _steps(path)) if _is_llm(net) else None
    return name or LayerName(f"{chain[-1].type_name} ({z},{y},{x},{l}) {path}".rstrip())


def _steps(path: str) -> list[int]:
    return [int(m[1]) for m in _STEP.finditer(path)]


def _chain(net: VolumetricNetwork, key: LayerKey) -> list[Layer]:
    """The grid layer at the key's cell and each container child down its path."""
    try:
        z, y, x, l, path = key  # noqa: E741
        layer = net.layer_at((int(z), int(y), int(x), int(l)))
        parts = path.split(".") if path else []
    except (TypeError, ValueError, AttributeError):
        raise LoomConfigError(f"a layer key is (z, y, x, l, path), got {key!r}") from None
    chain = [layer]
    for part in parts:
        m = _STEP.fullmatch(part)
        if layer is None or m is None or int(m[1]) >= len(layer.children):
            break
        layer = layer.children[int(m[1])]
        chain.append(layer)
    if layer is None or len(chain) != len(parts) + 1:
        raise LoomConfigError(f"no layer at {key!r} in a {'x'.join(map(str, net.shape))} network")
    return chain


def _is_llm(net: VolumetricNetwork) -> bool:
    cells = net.cells
    return len(cells) >= 3 and isinstance(cells[0], LLMEmbedding) and isinstance(cells[-1], LLMHead)


def _llm_name(net: VolumetricNetwork, cell: int, chain: list[Layer], steps: list[int]) -> LayerName | None:
    """A language model's grid: embedding, blocks, final norm, head (layer_builders.assemble_causal_lm)."""
    last, layer = len(net.cells) - 1, chain[-1]
    if cell == 0:
        return _tensor_name(layer, {"table": "token_embd.weight"}, "", None)
    if cell == last:
        tied = layer.weights.blocks["weight"] is net.cells[0].weights.blocks["table"]
        name = _tensor_name(layer, {"weight": "token_embd.weight" if tied else "output.weight"}, "", None)
        return LayerName("output (tied to token_embd)", None, name.tensors) if tied else name
    if cell == last - 1:
        return _tensor_name(layer, {"gamma": "output_norm.weight"}, "", None)
    block = cell - 1
    if not steps:
        return LayerName(f"block {block}", block)
    if len(steps) == 3 and isinstance(chain[-2], LLMMixtureOfExperts):
        named = _tensor_name(layer, {part: t.format(e=steps[2]) for part, t in EXPERT_TENSORS.items()},
                             f"blk.{block}.", block)
        return LayerName(f"{named.label}[{steps[2]}]", block, named.tensors)
    if steps[0] >= len(HALVES) or len(steps) > 2:
        return None
    half = HALVES[steps[0]]
    if len(steps) == 1:
        return LayerName(f"block {block} {half}", block)
    prefix = f"blk.{block}."
    if isinstance(layer, LLMAttention):
        return _tensor_name(layer, ATTENTION_TENSORS, prefix, block)
    if isinstance(layer, LLMGatedMLP):
        return _tensor_name(layer, MLP_TENSORS, prefix, block)
    if isinstance(layer, LLMMixtureOfExperts):
        return _tensor_name(layer, ROUTER_TENSORS, prefix, block)
    if isinstance(layer, LLMRMSNorm) and half in ("attention", "MLP"):
        siblings = chain[-2].children
        main = next((i for i, c in enumerate(siblings) if not isinstance(c, LLMRMSNorm)), len(siblings))
        return _tensor_name(layer, {"gamma": f"{NORM_NAMES[half, steps[1] < main]}.weight"}, prefix, block)
    return None


def _tensor_name(layer: Layer, names: dict[str, str], prefix: str, block: int | None) -> LayerName:
    """Name ``layer`` by the tensors behind its store's parts. A bias of zeros is left out: the
    builders fill a bias the file lacks with zeros, and one the file has as zeros adds nothing."""
    tensors = {part: prefix + names[part] for part, m in layer.weights.blocks.items()
               if part in names and not is_filler_bias(part, m)}
    stems = list(dict.fromkeys(t.rsplit(".", 1)[0].removeprefix(prefix) for t in tensors.values()))
    return LayerName(prefix + _join_stems(stems), block, tensors)


def _join_stems(stems: list[str]) -> str:
    """``attn_q/k/v/output`` for stems sharing ``attn_``; one stem as it is."""
    if len(stems) == 1:
        return stems[0]
    first = stems[0]
    shared = first[:first.index("_") + 1] if "_" in first else ""
    if not shared or not all(s.startswith(shared) for s in stems):
        return "/".join(stems)
    return shared + "/".join(s[len(shared):] for s in stems)
