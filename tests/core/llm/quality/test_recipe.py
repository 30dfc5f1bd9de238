"""Quantization recipes per tensor (core/llm/quality/recipe.py, issue 14 §2).

Oracles: the tensor types llama.cpp's ``llama-quantize`` stored in the two cached GGUF files (read
with gguf-py's GGUFReader): preset Q4_K_M planned for gemma3-270m and preset Q4_1 for smollm2-135m
must give every weighted tensor exactly the file's type, and the plan's bytes the file's tensor
bytes; encodings byte-identical to gguf-py's ``quants.quantize``; block sizes and byte counts from
gguf-py's GGML_QUANT_SIZES; rule precedence as the module documents it.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, quants

from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.files import registry
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.model.llm_layers import MatrixStore
from loomlab.core.llm.quality import recipe as recipe_module
from loomlab.core.llm.quality.gguf_export import check_recipe_plan
from loomlab.core.llm.quality.recipe import (
    RECIPE_FILE_LIMIT,
    apply_recipe,
    fallback_summary,
    plan_recipe,
    resolve_recipe,
    save_recipe,
    weighted_layers,
)
from loomlab.core.morph import morph_sublayer, weighted_cells

GEMMA_ATTENTION = "blk.0.attn_q/k/v/output/q_norm/k_norm"  # a layer's name: the tensors it holds


@functools.cache  # GGUFReader parses gemma's 262,144-token vocabulary: ~10 s a read
def file_types(alias: str) -> dict[str, tuple[str, int, int]]:
    """Each tensor of a built-in model's GGUF file (fetched if need be): (type, weights per row, bytes)."""
    reader = GGUFReader(registry.fetch(alias))
    return {t.name: (t.tensor_type.name, int(t.shape[0]), int(t.n_bytes)) for t in reader.tensors}


def block(fmt: str) -> int:
    return GGML_QUANT_SIZES[GGMLQuantizationType[fmt]][0]


def planned_tensors(plan) -> dict[str, str]:
    out: dict[str, str] = {}
    for lp in plan.layers:
        for tensor, fmt in lp.tensor_formats.items():
            assert out.setdefault(tensor, fmt) == fmt, tensor  # a tied table: one format
    return out


def revert(net) -> None:
    for index, layer in weighted_cells(net):
        morph_sublayer(layer, index, layer.weights.file_encoding())


@pytest.fixture(scope="module")
def gemma():
    with load_model("gemma3-270m") as model:
        yield model


# ----- llama.cpp's presets against the files llama-quantize wrote -----------------------------------
def test_q4_k_m_planned_for_gemma3_is_the_files_own_mix(gemma):
    tensors = file_types("gemma3-270m")
    plan = plan_recipe(gemma.net, "Q4_K_M")
    got = planned_tensors(plan)
    matrices = {name for name in tensors if name.endswith("weight") and "_norm" not in name}
    assert set(got) == matrices  # every quantizable tensor, and no norm
    assert got == {name: tensors[name][0] for name in matrices}
    assert plan.bytes == sum(n for _, _, n in tensors.values()) == gemma.net.memory_bytes()
    assert plan.changed == ()  # the model already is that mix
    # each fallback is a tensor whose rows are not whole blocks of what llama.cpp wanted for it
    assert plan.fallbacks and all(tensors[f.tensor][0] == f.used and f.row == tensors[f.tensor][1]
                                  and f.row % block(f.wanted) and not f.row % block(f.used)
                                  for f in plan.fallbacks)
    assert {f.tensor for f in plan.fallbacks} == {name for name, (t, _, _) in tensors.items()
                                                  if t == "Q5_0" or t == "Q8_0" and "attn_v" in name}


LLAMA_QUANTIZE = json.loads((Path(__file__).parents[3] / "data" / "llama_quantize_smollm2_types.json")
                            .read_text())


@pytest.mark.parametrize("preset", list(LLAMA_QUANTIZE["presets"]))
def test_k_quant_presets_plan_what_llama_quantize_wrote_for_smollm2(smollm2, preset):
    """The tensor types and bytes of llama-quantize's files of SmolLM2 (recorded in tests/data from
    llama-cpp-python 0.3.36's quantizer run on its F16 export): rows of 576 make most matrices fall
    back (Q2_K and Q3_K to Q4_0, Q4_K to Q5_0, Q5_K to Q5_1, Q6_K to Q8_0)."""
    want = LLAMA_QUANTIZE["presets"][preset]
    types = dict(zip(LLAMA_QUANTIZE["names"], want["types"].split(), strict=True))
    plan = plan_recipe(smollm2.net, f"preset:{preset}" if preset == "Q2_K" else preset)
    assert planned_tensors(plan) == {name: t for name, t in types.items() if t != "F32"}
    assert plan.bytes == want["bytes"]


def test_q4_1_planned_for_smollm2_is_the_files_own_mix(smollm2):
    tensors = file_types("smollm2-135m")
    plan = plan_recipe(smollm2.net, "preset:Q4_1")
    matrices = {name for name in tensors if name.endswith("weight") and "_norm" not in name}
    assert planned_tensors(plan) == {name: tensors[name][0] for name in matrices}
    # the tied table wants Q6_K (576 / 256 is not whole): Q8_0, once though two layers hold it
    assert [(f.tensor, f.wanted, f.used, f.row) for f in plan.fallbacks] == [
        ("token_embd.weight", "Q6_K", "Q8_0", 576)]
    assert plan.changed == () and resolve_recipe(smollm2.net, "preset:Q4_1") == {}


def test_a_plain_format_is_every_matrix_and_the_preset_is_llama_cpps_mix(smollm2):
    plain = planned_tensors(plan_recipe(smollm2.net, "Q4_0"))
    preset = planned_tensors(plan_recipe(smollm2.net, "preset:Q4_0"))
    assert set(plain.values()) == {"Q4_0"}
    assert {t: f for t, f in preset.items() if f != "Q4_0"} == {"token_embd.weight": "Q8_0"}
    assert planned_tensors(plan_recipe(smollm2.net, "Q8_0")) == planned_tensors(
        plan_recipe(smollm2.net, "preset:Q8_0"))


def test_q4_k_m_applied_to_smollm2_encodes_each_matrix_as_planned(smollm2):
    net = smollm2.net
    files = {id(m): m for _, layer in weighted_cells(net) for m in layer.weights.blocks.values()}
    plan = plan_recipe(net, "Q4_K_M")
    n_blocks = 30
    use_more_bits = [i < n_blocks // 8 or i >= 7 * n_blocks // 8 or (i - n_blocks // 8) % 3 == 2
                     for i in range(n_blocks)]
    got = planned_tensors(plan)
    for i, more in enumerate(use_more_bits):  # llama.cpp's rule, with 576-wide rows falling back
        assert got[f"blk.{i}.attn_v.weight"] == ("Q8_0" if more else "Q5_0")
        assert got[f"blk.{i}.ffn_down.weight"] == ("Q6_K" if more else "Q4_K")  # rows of 1536
        assert got[f"blk.{i}.attn_q.weight"] == got[f"blk.{i}.ffn_up.weight"] == "Q5_0"
    try:
        reports = apply_recipe(net, plan)
        assert [r.dtype for r in reports] == [lp.format for lp in plan.changed]
        assert net.memory_bytes() == plan.bytes
        for lp in plan.layers:
            store = weighted_layers(net)[lp.position].layer.weights
            current = store.current("float32")
            assert {p: current[p].type_name for p in lp.parts} == dict(lp.parts)
            assert store.encoding("float32") == "+".join(sorted(set(lp.parts.values())))
        attention = weighted_layers(net)[2].layer.weights.current("float32")  # blk.0: v at Q8_0
        for part, fmt in (("wv", "Q8_0"), ("wq", "Q5_0")):
            m = attention[part]
            want = quants.quantize(m.source.dequantize(), GGMLQuantizationType[fmt])
            assert np.array_equal(m._q, want.reshape(m._q.shape))
    finally:
        revert(net)
    assert {id(m) for _, layer in weighted_cells(net) for m in layer.weights.current("float32").values()
            } <= set(files)


# ----- rules -----------------------------------------------------------------------------------------
def test_a_tensor_beats_its_layer_which_beats_patterns_the_first_pattern_wins_and_star_is_last(smollm2):
    recipe = {"blk.1*.ffn_*": "Q5_1", "blk.*.ffn_down": "Q4_0", "blk.3.ffn_down.weight": "Q8_0",
              "blk.3.ffn_gate/up/down": "Q5_0", "*": "Q4_1"}
    got = planned_tensors(plan_recipe(smollm2.net, recipe))
    assert got["blk.3.ffn_down.weight"] == "Q8_0"  # the tensor, over its layer and both patterns
    assert got["blk.3.ffn_gate.weight"] == got["blk.3.ffn_up.weight"] == "Q5_0"  # its layer
    assert got["blk.12.ffn_down.weight"] == got["blk.1.ffn_gate.weight"] == "Q5_1"  # the first pattern
    assert got["blk.5.ffn_down.weight"] == "Q4_0" and got["blk.5.ffn_up.weight"] == "Q4_1"
    assert got["blk.5.attn_q.weight"] == got["token_embd.weight"] == "Q4_1"  # "*"
    assert len(got) == 30 * 7 + 1


def test_patterns_and_star_fall_back_as_llama_cpp_does(gemma):
    tensors = file_types("gemma3-270m")
    plan = plan_recipe(gemma.net, {"*.ffn_down.weight": "Q6_K", "blk.*.attn_v": "Q6_K", "*": "Q4_K"})
    got = planned_tensors(plan)
    for name, fmt in got.items():
        row = tensors[name][1]
        wanted = "Q6_K" if "ffn_down" in name or "attn_v" in name else "Q4_K"
        fallback = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[wanted]
        assert fmt == (wanted if row % 256 == 0 else fallback), name
    assert len(plan.fallbacks) == sum(tensors[n][1] % 256 != 0 for n in got)


def test_loom_dtypes_set_whole_layers_by_their_most_specific_key(smollm2):
    plan = plan_recipe(smollm2.net, {"blk.2.attn_v": "int8", "*": "float16", "blk.3.*": "int4"})
    by_name = {lp.name: lp for lp in plan.layers}
    assert by_name["blk.2.attn_q/k/v/output"].dtype == "int8" and len(plan.layers) == 123
    assert by_name["blk.3.ffn_gate/up/down"].dtype == by_name["blk.3.attn_norm"].dtype == "int4"
    assert by_name["blk.2.attn_norm"].dtype == "float16" and by_name["token_embd"].format == "float16"
    assert by_name["blk.2.attn_q/k/v/output"].parts == {}


@pytest.mark.parametrize("recipe, message", [
    ({"blk.0.attn_q": "Q4_K"},
     f"'blk.0.attn_q': blk.0.attn_q.weight (layer {GEMMA_ATTENTION}) has rows of 640 weights, not whole Q4_K "
     "blocks of 256"),
    ({GEMMA_ATTENTION: "Q6_K"}, "has rows of 640 weights, not whole Q6_K blocks of 256"),
    ({"blk.*.attn_z": "Q8_0"}, "recipe pattern 'blk.*.attn_z' matches no layer or tensor"),
    ({"blk.99.ffn_up": "Q8_0"}, "recipe layer 'blk.99.ffn_up': no such weighted layer"),
    ({"blk.0.ffn_up": "IQ4_XS"}, "unknown format 'IQ4_XS'"),
    ("preset:IQ4_XS", "unknown preset 'IQ4_XS'"),
    ({"blk.*": "Q4_K_M"}, "a preset (Q4_K_M) sets every matrix, so it is the value of \"*\" only"),
    ({"blk.0.attn_norm": "Q8_0"}, "names vectors only"),
    ({"blk.0.attn_v": "int8", "blk.0.attn_q": "Q8_0"}, "is given two formats in the recipe (Q8_0 and int8)"),
    ({"blk.0.attn_v": "Q8_0", "*": "int8"}, "is given two formats in the recipe (Q8_0 and int8)"),
    ({"blk.0.ffn_up": "Q8_0", "blk.0.ffn_up.weight": "Q4_0"},
     "blk.0.ffn_up.weight (layer blk.0.ffn_gate/up/down) is given two formats"),
])
def test_bad_recipes_are_refused_with_the_reason(gemma, recipe, message):
    with pytest.raises(LoomConfigError) as e:
        plan_recipe(gemma.net, recipe)
    assert message in str(e.value)


def test_nothing_is_morphed_when_a_later_layer_refuses(smollm2):
    net = smollm2.net
    plan = plan_recipe(net, "Q8_0")
    before = net.memory_by_dtype()
    last = weighted_layers(net)[plan.changed[-1].position].layer.weights
    last.version += 1  # changed in place: block formats are encoded from the file's weights
    try:
        with pytest.raises(LoomConfigError, match="changed in place"):
            apply_recipe(net, plan)
    finally:
        last.version -= 1
    assert net.memory_by_dtype() == before


# ----- one layer, a format per matrix ----------------------------------------------------------------
def test_a_store_encodes_each_matrix_in_its_own_format_and_reverts_to_the_files():
    rng = np.random.default_rng(3)
    a, b = (rng.standard_normal(s).astype(np.float32) for s in ((64, 256), (32, 48)))
    store = MatrixStore({"a": a, "b": b, "gain": np.ones(48, np.float32)})
    refusal = store.parts_refusal({"a": "Q4_0", "b": "Q4_0"})
    assert refusal == "rows of 48 weights are not whole Q4_0 blocks of 32"
    assert "no matrix 'gain'" in store.parts_refusal({"gain": "Q8_0"})
    store.morph_parts({"a": "Q4_1", "b": "F16"})
    m = store.current("float32")
    assert np.array_equal(m["a"]._q, quants.quantize(a, GGMLQuantizationType.Q4_1).reshape(m["a"]._q.shape))
    assert np.array_equal(m["b"].dequantize(), b.astype(np.float16).astype(np.float32))
    assert store.encoding("float32") == "F16+Q4_1" and store.file_encoding() == "F32"
    store.morph_parts({"a": "Q8_0"})  # the other matrix keeps its encoding
    assert store.encodings("float32") == {"a": "Q8_0", "b": "F16", "gain": "float32"}
    store.morph_to(store.file_encoding())
    assert store.encoded is None and store.current("float32")["a"] is a


# ----- saving ----------------------------------------------------------------------------------------
def test_a_saved_recipe_plans_as_the_mapping_does(smollm2, tmp_path):
    recipe = {"blk.*.attn_v": "Q8_0", "token_embd": "Q5_1", "*": "preset:Q4_0"}
    path = tmp_path / "recipe.json"
    save_recipe(path, recipe, smollm2.net)
    assert json.loads(path.read_text()) == recipe
    assert plan_recipe(smollm2.net, str(path)) == plan_recipe(smollm2.net, recipe)


def test_a_refused_recipe_is_not_saved(smollm2, tmp_path):
    path = tmp_path / "recipe.json"
    for bad, message in (({"blk.0.ffn_up": "Q9"}, "unknown format"), ({"blk.*.no": "Q8_0"}, "matches no"),
                         (["Q8_0"], "mapping")):
        with pytest.raises(LoomConfigError, match=message):
            save_recipe(path, bad, smollm2.net)
    assert list(tmp_path.iterdir()) == []


def test_a_loom_networks_layers_take_loom_dtypes_by_name_and_no_block_format():
    from loomlab.core import VolumetricNetwork, make_layer

    net = VolumetricNetwork(1, 1, 1, 2)
    rng = np.random.default_rng(0)
    for i in range(2):
        net[0, 0, 0, i] = make_layer("Dense", input_height=4, output_height=4, activation="Tanh", rng=rng)
    names = [la.name for la in weighted_layers(net)]
    assert resolve_recipe(net, {names[1]: "int8"}) == {1: "int8"}
    assert resolve_recipe(net, {"Dense*": "float16"}) == {0: "float16", 1: "float16"}
    for recipe in ({names[0]: "Q8_0"}, "Q4_0"):
        with pytest.raises(LoomConfigError, match=f"layer {re.escape(names[0])}: Q._0 is one of GGUF's block "
                                                  "formats, for a language model's matrices"):
            plan_recipe(net, recipe)


# ----- recipe files: bounded reads, typed errors, refused from the plan ---------------------------
def small_net():
    from loomlab.core import VolumetricNetwork, make_layer

    net = VolumetricNetwork(1, 1, 1, 2)
    rng = np.random.default_rng(0)
    for i in range(2):
        net[0, 0, 0, i] = make_layer("Dense", input_height=4, output_height=4, activation="Tanh", rng=rng)
    return net


def test_a_recipe_file_is_read_from_a_regular_file_with_a_size_cap(tmp_path):
    """/dev/zero read without end (7.7 GB, then MemoryError) and a FIFO blocked forever."""
    fifo = tmp_path / "recipe.fifo"
    os.mkfifo(fifo)
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (RECIPE_FILE_LIMIT + 1))
    for path, why in (("/dev/zero", "is not a regular file"), (fifo, "is not a regular file"),
                      (big, f"is {RECIPE_FILE_LIMIT + 1:,} bytes; the limit is {RECIPE_FILE_LIMIT:,}")):
        with pytest.raises(LoomConfigError, match=re.escape(f"the recipe file {path} {why}")):
            plan_recipe(small_net(), str(path))


@pytest.mark.parametrize("text, message", [
    ("[" * 100_000, "is nested too deeply"),  # RecursionError out of json before
    ('{"a": ' * 100_000 + "1" + "}" * 100_000, "is nested too deeply"),
    (b"\xff\xfe", "is not UTF-8 text"),
    ("[1, 2]", "a stored recipe is a JSON array of dtype names"),
    ('"int8"', "holds a JSON object {layer: format} or a list of formats"),
    ('{"\\u00b2": "int8"}', "recipe layer '\u00b2': no such weighted layer"),  # a digit int() refuses
    ('{"' + "9" * 5000 + '": "int8"}', "the model's weighted layers are 0 to 1"),
])
def test_a_bad_recipe_file_is_one_typed_error(tmp_path, text, message):
    path = tmp_path / "recipe.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(LoomConfigError, match=re.escape(message)):
        plan_recipe(small_net(), str(path))


@pytest.mark.parametrize("recipe, message", [
    ("int8", "cannot export as GGUF: 123 layers are int8 (token_embd, blk.0.attn_norm, "
             "blk.0.attn_q/k/v/output, blk.0.ffn_norm and 119 more)"),
    ({"blk.3.ffn_gate/up/down": "fp4", "blk.4.attn_q/k/v/output": "int4", "*": "Q8_0"},
     "cannot export as GGUF: blk.3.ffn_gate/up/down is fp4; blk.4.attn_q/k/v/output is int4. GGUF stores "
     "Loom's float32, float16 and bfloat16 and the block formats (Q8_0, Q4_K ...), not Loom's other dtypes "
     "(their per-layer scale has no GGUF type): give those layers one of those in the recipe"),
])
def test_a_recipe_gguf_cannot_store_is_refused_from_the_plan(smollm2, monkeypatch, recipe, message):
    """Refused before any morphing: before, every layer was morphed first (5-9 s, 1.9 GB)."""
    monkeypatch.setattr(recipe_module, "morph_planned", lambda *a: pytest.fail("morphed before refusing"))
    plan = plan_recipe(smollm2.net, recipe)
    with pytest.raises(LoomConfigError) as e:
        check_recipe_plan(plan)
    assert str(e.value).startswith(message)
    storable = {"*": "Q8_0", "blk.0.ffn_norm": "float16", "output": "bfloat16"}
    check_recipe_plan(plan_recipe(smollm2.net, storable))


def test_fallbacks_are_summed_up_in_one_line(smollm2):
    """The issue's 180 lines for Q4_K_M on SmolLM2 (rows of 576, not whole blocks of 256)."""
    plan = plan_recipe(smollm2.net, "Q4_K_M")
    counts = collections.Counter((f.wanted, f.used, f.row) for f in plan.fallbacks)
    assert len(plan.fallbacks) == 180 and sum(counts.values()) == 180
    parts = [f"{n} {w}->{u} (rows of {r})" for (w, u, r), n in counts.most_common()]
    assert fallback_summary(plan.fallbacks) == ("180 tensors fell back (rows not whole blocks, llama.cpp's "
                                                "rule): " + ", ".join(parts))
    assert fallback_summary(()) == ""
    assert fallback_summary(plan.fallbacks[:1]).startswith("1 tensor fell back (")
