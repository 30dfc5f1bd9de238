"""Property tests of the network readers, on inputs built from Loom's own golden networks: Loom JSON
with one field anywhere set to a random JSON value (or removed), random build-schema structures, and
.loom checkpoints with a header field, the network inside, a byte or the header length changed.
Reading each gives a network or one LoomError, never another exception, within a time and memory
bound far below the readers' limits."""

from __future__ import annotations

import copy
import json
import struct
import time
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomlab.core import VolumetricNetwork, load_network
from loomlab.core.enums import LAYER_TYPES
from loomlab.core.errors import LoomError
from loomlab.core.io import checkpoint, loom_json
from loomlab.core.layers.base import CONFIG_FIELDS

from .goldens import forward_case

SECONDS = 2.0  # per input
PEAK_BYTES = 64 * 2**20  # the golden networks take a few KB; the fuzz's own weights cap 16 MB
# the function-scoped fixture is small_machine's constant patch, the same for every example
FUZZ = settings(deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
CASES = ["dense_relu", "mha_gqa", "cnn2", "convt2d", "lstm", "embedding", "kmeans_prob", "softmax_9",
         "parallel_concat", "sequential_residual", "grid_2x1x2", "transformer_block", "morph_int4",
         "morph_binary", "morph_mixed"]
KEYS = sorted({*CONFIG_FIELDS, "weights", "native", "scale", "z", "y", "x", "l", "parallel_branches",
               "sequential_layers", "depth", "rows", "cols", "layers_per_cell", "layers", "junk"})
EDGES = [0, 1, -1, 2, 3, 7, 8, 64, 2**16, 2**20, 2**31 - 1, 2**31, 2**63, 10**400, 1e308, -1e308, 1e39,
         0.5, float("nan"), float("inf")]
LAYER_NAMES = sorted({e.name for e in LAYER_TYPES.values()})

scalars = (st.none() | st.booleans() | st.sampled_from(EDGES) | st.integers()
           | st.floats(allow_nan=False) | st.text(max_size=12) | st.sampled_from(LAYER_NAMES))
json_values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), kids, max_size=4),
                           max_leaves=12)
values = st.sampled_from(EDGES) | json_values  # the edges half the time


def bounded(read) -> None:
    """``read()`` gives a network or raises one LoomError, quickly and without a big allocation."""
    tracemalloc.start()
    start = time.perf_counter()
    try:
        result = read()
    except LoomError as e:
        result = e
    finally:
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    assert isinstance(result, VolumetricNetwork | LoomError), result
    assert elapsed < SECONDS and peak < PEAK_BYTES, (elapsed, peak)


@pytest.fixture(autouse=True)
def small_machine(monkeypatch):
    """A machine of 256 MB: a valid random network may then hold 16 Mi weights (64 MB), no more."""
    monkeypatch.setattr(loom_json, "physical_memory_bytes", lambda: 256 << 20)


def _objects(doc: dict) -> list[dict]:
    """The document and every layer object in it, nested ones included."""
    out, stack = [doc], list(doc["layers"])
    while stack:
        layer = stack.pop()
        out.append(layer)
        stack += layer.get("parallel_branches", []) + layer.get("sequential_layers", [])
    return out


@st.composite
def mutated_docs(draw) -> dict:
    """A golden network with one field of one object (root or any layer) set to a random value,
    removed, or spelled in upper case."""
    doc = copy.deepcopy(forward_case(draw(st.sampled_from(CASES)))["network"])
    target = draw(st.sampled_from(_objects(doc)))
    key = draw(st.sampled_from(sorted(target)) | st.sampled_from(KEYS))  # half the time one it has
    action = draw(st.sampled_from(["set", "set", "remove", "upper"]))
    if action == "set":
        target[key] = draw(values)
    elif key in target:
        value = target.pop(key)
        if action == "upper":
            target[key.upper()] = value
    return doc


@settings(FUZZ, max_examples=100)
@given(doc=mutated_docs(), schema=st.sampled_from(["auto", "build", "persistence"]))
def test_loom_json_with_a_random_field_gives_a_network_or_a_loom_error(doc, schema):
    text = json.dumps(doc)  # NaN / Infinity are written as such and must be refused
    bounded(lambda: load_network(text, schema=schema, seed=0))


SIZE_KEYS = ["input_height", "output_height", "input_width", "output_width", "input_depth", "output_depth",
             "input_channels", "filters", "kernel_size", "stride", "padding", "d_model", "num_heads",
             "num_kv_heads", "head_dim", "vocab_size", "embedding_dim", "num_clusters", "softmax_rows",
             "softmax_cols", "softmax_type"]
sizes = st.integers(0, 6) | st.sampled_from([16, 2**16, 2**31 - 1])
layer_fields = st.tuples(st.sampled_from(LAYER_NAMES), st.dictionaries(st.sampled_from(SIZE_KEYS), sizes,
                                                                        max_size=6),
                         st.sampled_from(["add", "avg", "concat", "filter"])).map(
    lambda t: {"type": t[0], **t[1], "combine_mode": t[2]})
layer_trees = st.recursive(layer_fields, lambda kids: st.tuples(
    layer_fields, st.sampled_from(["parallel_branches", "sequential_layers"]), st.lists(kids, max_size=3)
).map(lambda t: {**t[0], t[1]: t[2]}), max_leaves=6)


@settings(FUZZ, max_examples=60)
@given(dims=st.tuples(*[st.integers(1, 2)] * 4), layers=st.lists(layer_trees, max_size=5),
       coords=st.lists(st.tuples(*[st.integers(0, 2)] * 4), max_size=5))
def test_random_build_schema_structures_give_a_network_or_a_loom_error(dims, layers, coords):
    for layer, (z, y, x, l) in zip(layers, coords, strict=False):  # noqa: E741
        layer.update(z=z, y=y, x=x, l=l)
    doc = dict(zip(("depth", "rows", "cols", "layers_per_cell"), dims, strict=True), layers=layers)
    text = json.dumps(doc)
    bounded(lambda: load_network(text, schema="build", seed=0))


# ----- .loom checkpoints ----------------------------------------------------------------------
SAFETENSORS_DTYPES = ["F8_E4M3", "F8_E5M2", "BF16", "F16", "U8", "I8", "BOOL", "I16", "U16", "I32", "U32",
                      "F32", "F64", "I64", "U64", "U4", "X"]


def _checkpoint(case: str) -> bytes:
    return checkpoint.checkpoint_bytes(load_network(json.dumps(forward_case(case)["network"])))


def _split(data: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _join(header: dict, payload: bytes) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + payload


@st.composite
def mutated_checkpoints(draw) -> bytes:
    """A golden network's checkpoint with one change: a tensor entry's field, the network in its
    metadata, a byte, the length, or the header size."""
    data = _checkpoint(draw(st.sampled_from(["dense_relu", "parallel_concat", "morph_int4", "morph_mixed"])))
    header, payload = _split(data)
    names = sorted(k for k in header if k != "__metadata__")
    kind = draw(st.sampled_from(["dtype", "tensor", "network", "byte", "cut", "size"]))
    if kind in ("dtype", "tensor"):
        entry = header[draw(st.sampled_from(names))]
        field = "dtype" if kind == "dtype" else draw(st.sampled_from(["dtype", "shape", "data_offsets"]))
        entry[field] = draw(st.sampled_from(SAFETENSORS_DTYPES) if kind == "dtype" else
                            st.lists(st.sampled_from(EDGES[:12]) | st.integers(-2, 600), max_size=3) | values)
        return _join(header, payload)
    if kind == "network":
        meta = json.loads(header["__metadata__"][checkpoint.METADATA_KEY])
        target = draw(st.sampled_from(_objects(meta["network"])))
        target[draw(st.sampled_from(sorted(target)) | st.sampled_from(KEYS))] = draw(values)
        header["__metadata__"][checkpoint.METADATA_KEY] = json.dumps(meta)
        return _join(header, payload)
    if kind == "byte":
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([draw(st.integers(0, 255))]) + data[at + 1:]
    if kind == "cut":
        return data[:draw(st.integers(0, len(data) - 1))]
    sizes = st.sampled_from([0, 1, 7, 8, 2**16, 2**31, 2**63]) | st.integers(0, 2**64 - 1)
    return struct.pack("<Q", draw(sizes)) + data[8:]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("checkpoints")


@settings(FUZZ, max_examples=100)
@given(data=mutated_checkpoints())
def test_a_changed_checkpoint_gives_a_network_or_a_loom_error(data, folder):
    path = folder / "net.loom"
    path.write_bytes(data)
    bounded(lambda: load_network(path))
    bounded(lambda: checkpoint.checkpoint_from_bytes(data))
