"""What a network says it holds: parameters (a shared matrix once, against the GGUF file's own
tensor list read by gguf-py), bytes, and the cells / layers of its grid."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from loomlab.core import VolumetricNetwork, make_layer
from loomlab.core.llm.files import registry
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.model import model_info
from loomlab.core.llm.model.llm_layers import LLMEmbedding, LLMHead, LLMRMSNorm
from loomlab.core.morph import morph_sublayer

VOCAB, D = 50, 8


def tied_net(tied: bool = True) -> VolumetricNetwork:
    """Embedding, norm and an LM head that is (or is a copy of) the embedding's table."""
    table = np.random.default_rng(0).standard_normal((VOCAB, D)).astype(np.float32)
    net = VolumetricNetwork(1, 1, 3, 1, precision="fast")
    net[0, 0, 0, 0] = LLMEmbedding(table)
    net[0, 0, 1, 0] = LLMRMSNorm(np.ones(D, np.float32), 1e-6)
    net[0, 0, 2, 0] = LLMHead(table if tied else table.copy())
    return net


def test_a_tied_head_counts_its_matrix_once():
    assert tied_net(tied=True).parameter_count() == VOCAB * D + D
    assert tied_net(tied=False).parameter_count() == 2 * VOCAB * D + D


def test_a_tied_head_is_one_copy_in_memory_until_morphed_apart():
    net = tied_net()
    assert net.memory_by_dtype() == {"F32": 4 * (VOCAB * D + D)}  # a language model's: GGUF's names
    morph_sublayer(net.cells[2], 2, "int8")  # the head now holds an int8 copy beside the table
    assert net.memory_by_dtype() == {"F32": 4 * (VOCAB * D + D), "int8": VOCAB * D}
    assert net.parameter_count() == VOCAB * D + D  # still one matrix of the model


@pytest.mark.parametrize("alias", list(registry.BUILTINS))
def test_a_language_model_counts_each_tensor_of_its_file_once_and_holds_its_bytes(alias):
    """Each tensor counted once against gguf-py's own reading; every layer in its real encoding
    and bytes, the totals the file's (issue 14 §1)."""
    path = registry.fetch(alias)
    reader = GGUFReader(path)
    in_file = sum(int(t.n_elements) for t in reader.tensors)
    by_type: dict[str, int] = {}
    for t in reader.tensors:
        by_type[t.tensor_type.name] = by_type.get(t.tensor_type.name, 0) + int(t.n_bytes)
    with load_model(alias) as model:
        net = model.net
        assert net.parameter_count() == in_file
        assert net.summary()["parameters"] == in_file
        assert net.memory_by_dtype() == by_type
        assert net.memory_bytes() == sum(by_type.values())
    assert model_info.describe(path).parameters == in_file


def test_summary_counts_cells_and_layers_apart():
    net = VolumetricNetwork(2, 2, 2, 2)
    for z, y, x, l in np.ndindex(*net.shape):  # noqa: E741
        net[z, y, x, l] = make_layer("Dense", input_height=3, output_height=3)
    s = net.summary()
    assert (s["cells"], s["layers_per_cell"], s["layers"]) == (8, 2, 16)
    assert s["parameters"] == 16 * 3 * 3 and s["shape"] == [2, 2, 2, 2]  # Loom's Dense has no bias

    sparse = VolumetricNetwork(1, 3, 1, 2)
    sparse[0, 1, 0, 1] = make_layer("Dense", input_height=3, output_height=3)
    s = sparse.summary()
    assert (s["cells"], s["layers_per_cell"], s["layers"]) == (3, 2, 1)
