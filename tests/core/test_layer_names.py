"""Layer names against the models' own files: every tensor a GGUF file lists is named by exactly the
layer that holds it (same shape, same encoding), in its block; Loom networks fall back to type,
cell and path; keys that name no layer raise one typed error."""

from __future__ import annotations

import re

import numpy as np
import pytest

from loomlab.core import VolumetricNetwork, make_layer
from loomlab.core.errors import LoomConfigError
from loomlab.core.layer_names import layer_label, layer_name
from loomlab.core.llm.files import registry
from loomlab.core.llm.files.gguf_file import open_gguf
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.morph import morph_sublayer

MODELS = ("smollm2-135m", "gemma3-270m")


@pytest.fixture(scope="module", params=MODELS)
def model(request):
    """(network, the oracle: the file's tensor records by name)."""
    path = registry.fetch(request.param)
    net = load_causal_lm(path)
    with open_gguf(path) as gguf:
        tensors = dict(gguf.tensors)
    yield net, tensors
    net.close()


def keys(net):
    return [(r.z, r.y, r.x, r.l, r.path) for r in net.blueprint()]


def test_every_file_tensor_is_named_by_the_layer_holding_it(model):
    net, tensors = model
    named: dict[str, list] = {}
    for key in keys(net):
        name = layer_name(net, key)
        layer = _layer(net, key)
        for part, tensor in name.tensors.items():
            named.setdefault(tensor, []).append(key)
            record = tensors[tensor]  # KeyError: a name the file does not have
            held = layer.weights.blocks[part]
            assert tuple(held.shape) == record.shape, (key, part, tensor)
            # vectors are held as float32 arrays (converted once at load); matrices keep the file's blocks
            expected = "float32" if len(record.shape) == 1 else record.type_name
            assert layer.weights.encodings(layer.cfg.dtype)[part] == expected
            block = re.match(r"blk\.(\d+)\.", tensor)
            assert name.block == (int(block[1]) if block else None)
    assert set(named) == set(tensors)
    # one layer per tensor, but the tied LM head reads the embedding's own table
    shared = {t: k for t, k in named.items() if len(k) > 1}
    assert list(shared) == ["token_embd.weight"] and len(shared["token_embd.weight"]) == 2
    assert "output.weight" not in tensors


def test_labels_name_tensors_and_blocks(model):
    net, tensors = model
    n_blocks = sum(1 for t in tensors if t.endswith(".attn_q.weight"))
    labels = {key: layer_label(net, key) for key in keys(net)}
    last = len(net.cells) - 1
    assert labels[(0, 0, 0, 0, "")] == "token_embd"
    assert labels[(0, 0, last - 1, 0, "")] == "output_norm"
    assert labels[(0, 0, last, 0, "")] == "output (tied to token_embd)"
    for b in range(n_blocks):
        x = b + 1
        assert labels[(0, 0, x, 0, "")] == f"block {b}"
        assert labels[(0, 0, x, 0, "sequential_layers[0]")] == f"block {b} attention"
        assert labels[(0, 0, x, 0, "sequential_layers[2]")] == f"block {b} MLP"
        assert labels[(0, 0, x, 0, "sequential_layers[3]")] == f"block {b} MLP residual"
        attention, mlp = (labels[0, 0, x, 0, f"sequential_layers[{h}].sequential_layers[1]"] for h in (0, 2))
        stems = "q/k/v/output" + ("/q_norm/k_norm" if f"blk.{b}.attn_q_norm.weight" in tensors else "")
        assert attention == f"blk.{b}.attn_{stems}" and mlp == f"blk.{b}.ffn_gate/up/down"
    # a layer holding one tensor (norms, the embedding) is called by that tensor's name
    singles = {key: layer_name(net, key).tensors for key in labels}
    singles = {key: next(iter(t.values())) for key, t in singles.items() if len(t) == 1}
    assert len(singles) == 2 * n_blocks + 3 + (2 * n_blocks if "blk.0.post_ffw_norm.weight" in tensors else 0)
    for key, tensor in singles.items():
        if key != (0, 0, last, 0, ""):  # the tied head, above
            assert labels[key] == tensor.removesuffix(".weight")


def test_a_morphed_layer_reports_its_dtype_and_back(model):
    net, tensors = model
    key = (0, 0, 3, 0, "sequential_layers[2].sequential_layers[1]")  # block 2's MLP
    layer = _layer(net, key)
    tensor = layer_name(net, key).tensors["down"]
    assert layer.weights.encodings(layer.cfg.dtype)["down"] == tensors[tensor].type_name
    morph_sublayer(layer, 0, "int8")
    try:
        assert set(layer.weights.encodings(layer.cfg.dtype).values()) == {"int8"}
    finally:
        morph_sublayer(layer, 0, "float32")
    assert layer.weights.encodings(layer.cfg.dtype)["down"] == tensors[tensor].type_name


def test_a_loom_network_is_named_by_type_cell_and_path():
    net = VolumetricNetwork(1, 1, 2, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=2, output_height=2)
    net[0, 0, 1, 0] = make_layer("Parallel", combine_mode="add", children=[
        make_layer("Dense", input_height=2, output_height=2), make_layer("Residual")])
    assert layer_label(net, (0, 0, 0, 0, "")) == "Dense (0,0,0,0)"
    assert layer_label(net, (0, 0, 1, 0, "parallel_branches[1]")) == "Residual (0,0,1,0) parallel_branches[1]"
    name = layer_name(net, (0, 0, 1, 0, ""))
    assert (name.label, name.block, name.tensors) == ("Parallel (0,0,1,0)", None, {})


@pytest.mark.parametrize("key", [
    (0, 0, 5, 0, ""), (0, 0, 1, 0, "parallel_branches[2]"), (0, 0, 0, 0, "parallel_branches[0]"),
    (0, 0, 1, 0, "children"), ("a", 0, 0, 0, ""), (0, 0, 0), None,
])
def test_a_key_naming_no_layer_is_refused(key):
    net = VolumetricNetwork(1, 1, 2, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=2, output_height=2)
    net[0, 0, 1, 0] = make_layer("Parallel", combine_mode="add", children=[make_layer("Residual")])
    with pytest.raises(LoomConfigError, match="layer"):
        layer_name(net, key)


def _layer(net, key):
    """The layer a key names, by the test's own walk down the path."""
    layer = net[key[:4]]
    for index in re.findall(r"\[(\d+)\]", key[4]):
        layer = layer.children[int(index)]
    return layer


def test_store_samples_come_from_the_weights():
    rng = np.random.default_rng(0)
    layer = make_layer("Dense", input_height=30, output_height=20, rng=rng)
    store = layer.weights
    np.testing.assert_array_equal(store.sample(10_000, rng), store.master)
    sample = store.sample(100, rng)
    assert sample.size == 100 and np.isin(sample, store.master).all()
    assert store.encodings("float32") == {"weights": "float32"}
    assert store.encodings("int4") == {"weights": "int4"}
