"""GGUF block formats as morph targets of a language model (issue 14 §2, §3): each matrix is
encoded from the file's weights as gguf-py's reference quantizer encodes it (the oracle, byte for
byte), vectors stay F32, bytes are the new blocks', reverting gives back the file's own matrices,
and formats whose blocks do not divide a row are refused before anything changes."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.kernels.block_morph import encode
from loomlab.core.morph import morph_all, morph_sublayer, weighted_cells


def matrices(net):
    """Every 2-D matrix forward reads, once each, by identity."""
    seen = {}
    for _, layer in weighted_cells(net):
        for m in layer.weights.current(layer.cfg.dtype).values():
            if len(m.shape) == 2:
                seen[id(m)] = m
    return list(seen.values())


def test_q8_0_is_gguf_pys_encoding_of_the_files_weights_and_revert_is_the_file(smollm2):
    net = smollm2.net
    before = net.memory_by_dtype()
    files = {id(m): m for m in matrices(net)}
    morph_all(net, "Q8_0")
    try:
        encoded = matrices(net)
        assert {m.type_name for m in encoded} == {"Q8_0"}
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0]
        q8 = sum(m.shape[0] * m.shape[1] // block * size for m in encoded)
        assert net.memory_by_dtype() == {"Q8_0": q8, "F32": before["F32"]}
        # the tied table was Q8_0 in the file: kept as it is, one copy for embedding and head
        assert sum(id(m) in files for m in encoded) == 1
        for m in encoded[:4] + encoded[-3:]:  # the first block, the last, the table
            source = getattr(m, "source", m)
            expected = quants.quantize(source.dequantize(), GGMLQuantizationType.Q8_0)
            assert np.array_equal(m._q, expected.reshape(m._q.shape))
        for _, layer in weighted_cells(net):
            assert layer.weights.encoding(layer.cfg.dtype) in ("Q8_0", "F32") and layer.cfg.dtype == "float32"
    finally:
        for index, layer in weighted_cells(net):
            morph_sublayer(layer, index, layer.weights.file_encoding())
    assert net.memory_by_dtype() == before
    assert {id(m) for m in matrices(net)} == set(files)  # the file's own objects again


def test_an_encoding_is_shared_by_the_layers_that_share_the_source():
    table = np.random.default_rng(1).standard_normal((64, 64)).astype(np.float32)
    a, b = encode(table, "Q4_0"), encode(table, "Q4_0")
    assert a is b and a.type_name == "Q4_0"
    assert encode(table, "Q4_1") is not a


def test_a_format_whose_blocks_do_not_divide_the_rows_is_refused_before_anything_changes():
    with load_model("gemma3-270m") as model:  # rows of 640 weights: not whole Q4_K blocks of 256
        before = model.net.memory_by_dtype()
        with pytest.raises(LoomConfigError, match="not whole Q4_K blocks of 256"):
            morph_all(model.net, "Q4_K")
        assert model.net.memory_by_dtype() == before


def test_morphing_to_q8_0_drifts_little_as_llama_cpp_measures_it(smollm2):
    """Issue 14 §4: a Q8_0 morph of smollm2-135m: mean KL below 0.01 and the same top token in
    more than 95% of the positions, over the default probe text."""
    from loomlab.core.llm.quality.drift import measure_drift

    report = measure_drift(smollm2, "Q8_0")
    stats = report.stats
    assert stats.kl_mean < 0.01 and stats.same_top > 0.95
    assert smollm2.net.memory_by_dtype()["Q4_1"] > 0  # measured on copies: the model is as loaded


def test_a_morphed_loaded_model_is_not_merged_from_its_file(smollm2):
    """A merge reads the models' files: for a loaded model that is morphed it would silently drop
    the morph, so it is refused with the reason until the model is reverted."""
    from loomlab.core.evolve.llm.dna_table import model_path

    assert model_path(smollm2) == str(smollm2.net.source.path)
    index, layer = weighted_cells(smollm2.net)[6]  # blk.1's attention (a norm's vector stays F32)
    original = layer.weights.file_encoding()
    morph_sublayer(layer, index, "Q8_0")
    try:
        with pytest.raises(LoomConfigError, match="the loaded model is morphed"):
            model_path(smollm2)
    finally:
        morph_sublayer(layer, index, original)
    assert model_path(smollm2) == str(smollm2.net.source.path)
