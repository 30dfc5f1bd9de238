"""Evolution configs: every bad value is one LoomConfigError naming the setting, raised before a
run is built, and a run too large for this machine's memory is refused from its settings."""

from __future__ import annotations

import dataclasses
import os
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomlab.core.errors import LoomConfigError
from loomlab.core.evolve.genetics import budget
from loomlab.core.evolve.genetics.gorand import GoRand
from loomlab.core.evolve.genetics.neat import NEATConfig, reinitialised
from loomlab.core.evolve.search.run import Evolution
from loomlab.core.evolve.search.run_config import RUN_KEYS, SECTIONS, RunPlan, plan_from_dict, read_plan
from loomlab.core.evolve.search.speciation import SpeciationConfig
from loomlab.core.evolve.search.tasks import COMMON_PARAMS, get_task
from loomlab.core.layers.base import make_layer

MB = 1 << 20


def refused(doc, match) -> LoomConfigError:
    """plan_from_dict(doc) raises one LoomConfigError matching ``match``, quickly and cheaply."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises(LoomConfigError, match=match) as info:
            plan_from_dict(doc)
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.perf_counter() - start < 5 and peak < 64 * MB
    return info.value


def xor(**sections):
    return {"run": {"task": "xor", **sections.pop("run", {})}, **sections}


@pytest.mark.parametrize("doc, match", [
    ({"run": {"task": ["xor"]}}, r"task is named by a string such as 'xor', got \['xor'\]"),
    (xor(neat={"d_model": "x"}), "NEAT d_model must be an integer, got 'x'"),
    (xor(neat={"default_vocab_size": 0}), "default_vocab_size must be >= 1, got 0"),
    (xor(neat={"default_num_clusters": -2}), "default_num_clusters must be >= 1, got -2"),
    (xor(neat={"default_kernel_size": -3}), r"default_kernel_size must be >= 0 \(0: Loom's default\)"),
    (xor(neat={"default_filters": -1}), "default_filters must be >= 0"),
    (xor(neat={"weight_perturb_rate": 10 ** 400}), "weight_perturb_rate must be a finite number"),
    (xor(neat={"weight_perturb_scale": 1e39}), r"weight_perturb_scale must lie in \[0, 3.403e\+38\]"),
    (xor(task={"init_scale": 10 ** 400}), "'init_scale' must be a finite number"),
    (xor(speciation={"structure_weight": 10 ** 400}), "speciation structure_weight must be a finite"),
    ({"run": {"task": "quant-recipe"}, "task": {"lam": 10 ** 400}}, "'lam' must be a finite number"),
])
def test_bad_values_are_one_typed_error_naming_the_key(doc, match):
    refused(doc, match)


@pytest.mark.parametrize("doc, match", [
    (xor(run={"population": 10 ** 9}), r"population 1,000,000,000 \(at most [\d,]+ here\) of task 'xor'"),
    # 10^6 layers: one member (8 GiB) may fit a large machine, 150 of them fit none
    (xor(task={"depth": 10 ** 6}),
     r"population 150 \(at most \d+ here\) of task 'xor' members of about|depth 1,000,000: one member"),
    (xor(task={"hidden": 10 ** 6, "depth": 2}), "task 'xor' with hidden 1,000,000, depth 2: one member"),
    ({"run": {"task": "sine"}, "task": {"points": 10 ** 9}}, "points 1,000,000,000: one member"),
    ({"run": {"task": "spirals", "population": 10 ** 7}}, "population 10,000,000"),
    ({"run": {"task": "quant-recipe", "population": 10 ** 9}}, "population 1,000,000,000 .* 'quant-recipe'"),
    # Loom's default layer types with a kernel of 100000: a CNN3 of 2e15 weights (14.2 PiB)
    ({"run": {"task": "sine"}, "neat": {"default_kernel_size": 100000}},
     "default_kernel_size 100000: a re-initialised CNN3 layer of 2,000,000,000,000,000 weights"),
    (xor(neat={"d_model": 10 ** 6}), "NEAT d_model 1000000: a re-initialised LSTM layer"),
    (xor(run={"workers": 10 ** 9, "scheduler": "local"}), r"\[run\] workers 1,000,000,000 \(Dask worker"),
    (xor(run={"population": 10 ** 400}),  # a number too long to print, a size past every unit
     r"population 100000000000000000\.\.\.0+ \(at most .* over 1024.0 PiB"),
])
def test_sizes_beyond_the_machine_are_refused_before_the_run(doc, match):
    assert "more than a run may use here" in str(refused(doc, match))


def test_the_bound_is_the_estimate_against_half_the_memory(monkeypatch):
    task = get_task("spirals", hidden=8, depth=2, points=50)
    config = task.neat_config(seed=1)
    sizes = [2, 8, 8, 1]  # the seed network; NEAT may add its largest new layer (Embedding 256 x 8)
    member = budget.network_member_bytes(layers=3, weights=2 * 8 + 8 * 8 + 8 + 256 * 8, rows=100,
                                         width=max(*sizes, 2 * 8))
    assert task.member_bytes(config) == member
    monkeypatch.setattr(budget, "physical_memory_bytes", lambda: 2 * 40 * member)
    doc = {"run": {"task": "spirals", "population": 40}, "task": {"hidden": 8, "depth": 2, "points": 50},
           "neat": {"seed": 1}}
    assert plan_from_dict(doc).population == 40
    doc["run"]["population"] = 41
    refused(doc, r"population 41 \(at most 40 here\)")
    with pytest.raises(LoomConfigError, match="population 41"):  # the API refuses it too
        Evolution(task, config=config, population=41)


def test_a_vocabulary_of_zero_no_longer_fails_mid_run():
    # sine evolves with Loom's default layer types, Embedding among them: a vocab of 0 used to
    # raise IndexError once NEAT turned a layer into an Embedding
    config = get_task("sine").neat_config(seed=3)
    with pytest.raises(LoomConfigError, match="default_vocab_size must be >= 1"):
        dataclasses.replace(config, default_vocab_size=0, node_mutate_rate=1.0)


def test_many_heads_count_down_to_the_width_at_once():
    # Loom counts heads down until they divide d_model: from 10^8 that took 10^8 steps
    config = dataclasses.replace(NEATConfig.default(6, seed=1), default_num_heads=10 ** 8)
    dense = make_layer("Dense", input_height=6, output_height=6, rng=np.random.default_rng(0))
    start = time.perf_counter()
    attention = reinitialised(dense, "MultiHeadAttention", config, GoRand(1))
    assert time.perf_counter() - start < 1
    assert (attention.cfg.num_heads, attention.cfg.head_dim) == (6, 1)


# ----- the file -------------------------------------------------------------------------------
def test_config_files_are_read_bounded(tmp_path):
    deep = tmp_path / "deep.toml"
    deep.write_text('[run]\ntask = "xor"\n[task]\nx = ' + "[" * 100_000)
    with pytest.raises(LoomConfigError, match="deep.toml: nested too deeply"):
        read_plan(deep)
    big = tmp_path / "big.toml"
    big.write_bytes(b"#" * (2 * MB))
    with pytest.raises(LoomConfigError, match="big.toml is 2,097,152 bytes; the limit is 1,048,576"):
        read_plan(big)
    with pytest.raises(LoomConfigError, match="is not a regular file"):
        read_plan(tmp_path)
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.toml")
        with pytest.raises(LoomConfigError, match="fifo.toml is not a regular file"):
            read_plan(tmp_path / "fifo.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text('[run]\ntask = "xor"\npopulation = 1000000000\n')
    with pytest.raises(LoomConfigError, match="bad.toml: population 1,000,000,000"):
        read_plan(bad)


# ----- any config: a plan or one typed error ---------------------------------------------------
NEAT_KEYS = [f.name for f in dataclasses.fields(NEATConfig)]
SPECIATION_KEYS = [f.name for f in dataclasses.fields(SpeciationConfig)]
TASK_KEYS = [*COMMON_PARAMS, "points", "model", "dtypes", "probes", "probe_tokens", "lam", "mutation_rate"]
KEYS = {"run": sorted(RUN_KEYS), "task": TASK_KEYS, "neat": NEAT_KEYS, "speciation": SPECIATION_KEYS,
        "evaluator": ["n_workers"]}
NAMES = ["xor", "sine", "spirals", "quant-recipe", "local", "inprocess", "Tanh", "float32", "int4"]
NUMBERS = st.one_of(st.integers(-3, 300), st.sampled_from([10 ** k for k in (4, 6, 9, 12, 30, 400)]),
                    st.floats(-2, 2), st.floats(allow_nan=True))
JUNK = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=6), st.sampled_from(NAMES)),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=8)
VALUES = st.one_of(NUMBERS, NUMBERS, st.sampled_from(NAMES), JUNK)  # mostly numbers, as settings are


RARELY = st.sampled_from([False] * 19 + [True])


def table(draw, keys: list[str], size: int):
    """A section: known keys (rarely an unknown one) with random values; rarely not a table."""
    if draw(RARELY):
        return draw(JUNK)
    return draw(st.dictionaries(st.sampled_from([*keys, *keys, *keys, "bogus"]), VALUES, max_size=size))


@st.composite
def config_docs(draw):
    doc = {"run": table(draw, KEYS["run"], 4)}
    if isinstance(doc["run"], dict) and not draw(RARELY):
        doc["run"]["task"] = draw(st.sampled_from(["xor", "sine", "spirals", "quant-recipe"]))
    for section in draw(st.lists(st.sampled_from(SECTIONS[1:]), unique=True, max_size=4)):
        doc[section] = table(draw, KEYS[section], 3)
    if draw(RARELY):
        doc["bogus"] = {}
    return doc


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(config_docs())
def test_any_config_gives_a_plan_that_fits_or_one_typed_error(doc):
    tracemalloc.start()
    start = time.perf_counter()
    try:
        plan = plan_from_dict(doc)
    except LoomConfigError:
        plan = None
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert time.perf_counter() - start < 5 and peak < 64 * MB
    if plan is not None:  # a plan that is accepted fits this machine, by the same estimate
        assert isinstance(plan, RunPlan)
        assert plan.population * plan.task.member_bytes(plan.neat) <= budget.run_budget()
