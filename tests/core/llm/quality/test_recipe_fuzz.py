"""Recipe files under random input (core/llm/quality/recipe.py): any JSON value or bytes in the file is a
valid plan or one LoomConfigError, fast.

Oracle: the contract itself. A plan must be one the model takes: every layer it names exists
under that name and position, and each matrix's format is one the plan's rules allow."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomlab.core.errors import LoomConfigError
from loomlab.core.llm.kernels.block_morph import BLOCK_FORMATS
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.quality.recipe import RecipePlan, plan_recipe, weighted_layers

from ..model.test_architectures import write_gguf

SECONDS = 2.0  # per recipe, on a loaded CI machine; a tiny model plans in milliseconds
FUZZ = settings(max_examples=80, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    path = tmp_path_factory.mktemp("recipe-fuzz") / "tiny.gguf"
    return load_causal_lm(write_gguf(path, "tiny-llama", "llama"))


@pytest.fixture(scope="module")
def keys(tiny) -> st.SearchStrategy:
    """Recipe keys: the tiny model's layer and tensor names, patterns, positions and any text."""
    layers = weighted_layers(tiny)
    names = [la.name for la in layers] + [t for la in layers for t in la.tensors]
    known = [*names, *(n.removesuffix(".weight") for n in names), "*", "blk.*.attn_v", "*.ffn_down*",
             "blk.[0-1].*"]
    digits = st.text("0123456789\u00b2\u0663", min_size=1, max_size=6)  # superscript two: isdigit, not int
    return st.one_of(st.sampled_from(known), st.integers(-3, len(layers) + 3).map(str), digits,
                     st.text(max_size=12))


FORMATS = st.sampled_from([*BLOCK_FORMATS, "int8", "fp4", "float16", "bfloat16", "float32", "Q4_K_M",
                           "preset:Q4_0", "preset:Q9", "IQ4_XS", "float64", ""])
SCALARS = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=6), inner, max_size=4), max_leaves=12)


def check(net, path, data: bytes) -> None:
    path.write_bytes(data)
    start = time.perf_counter()
    try:
        plan = plan_recipe(net, str(path))
    except LoomConfigError as e:
        assert str(e)
    else:
        assert isinstance(plan, RecipePlan)
        names = [la.name for la in weighted_layers(net)]
        assert all(names[lp.position] == lp.name for lp in plan.layers)
        for lp in plan.layers:
            assert lp.dtype is not None or set(lp.parts.values()) <= {*BLOCK_FORMATS, "F16", "F32", "BF16"}
    assert time.perf_counter() - start < SECONDS


@FUZZ
@given(data=st.data())
def test_a_mapping_of_names_to_values_is_a_plan_or_one_typed_error(tiny, keys, tmp_path, data):
    recipe = data.draw(st.dictionaries(keys, st.one_of(FORMATS, FORMATS, JSON), max_size=6))
    check(tiny, tmp_path / "recipe.json", json.dumps(recipe).encode())


@FUZZ
@given(value=JSON | st.lists(FORMATS, max_size=40))
def test_any_json_value_is_a_plan_or_one_typed_error(tiny, tmp_path, value):
    check(tiny, tmp_path / "recipe.json", json.dumps(value).encode())


@FUZZ
@given(data=st.binary(max_size=64) | st.integers(1, 5000).map(lambda n: b"[" * n + b"{" * n))
def test_any_bytes_are_a_plan_or_one_typed_error(tiny, tmp_path, data):
    check(tiny, tmp_path / "recipe.json", data)
