"""The evolved recipes shipped in loomlab.resources/recipes (docs/quantization.md): each names a
format for every matrix of its model, plans as ``--recipe`` plans it, and stays within the bytes
of llama.cpp's Q4_K_M plan for the same model (the budget it was chosen under)."""

from __future__ import annotations

import json
from importlib import resources

import pytest

from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.quality.recipe import plan_recipe, weighted_layers

SHIPPED = {"smollm2-135m": "smollm2-135m-evolved.json", "gemma3-270m": "gemma3-270m-evolved.json"}


@pytest.mark.parametrize("alias", sorted(SHIPPED))
def test_a_shipped_recipe_gives_every_matrix_a_format_within_q4_k_ms_bytes(alias):
    path = resources.files("loomlab.resources").joinpath("recipes", SHIPPED[alias])
    recipe = json.loads(path.read_text("utf-8"))
    with load_model(alias) as model:
        matrices = {t for la in weighted_layers(model.net) for part, t in la.parts.items()
                    if len(la.layer.weights.blocks[part].shape) == 2}
        assert set(recipe) == matrices
        plan = plan_recipe(model.net, str(path))
        planned = {t: f for lp in plan.layers for t, f in lp.tensor_formats.items()}
        assert planned == recipe
        assert plan.bytes <= plan_recipe(model.net, "Q4_K_M").bytes
