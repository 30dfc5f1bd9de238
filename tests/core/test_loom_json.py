"""Loom's JSON wire format: golden cases from the Loom engine, round trips and bad input."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from loomlab.core import LoomFormatError, load_network, make_layer, save_network
from loomlab.core.io import dumps, loom_json, network_to_dict

from .bad_input import traced
from .goldens import case_input, goldens

CASES = goldens()["forward"]  # every layer type, plus a net morphed to each of the 20 other dtypes


def tiny_net_json() -> dict:
    """A 1x1x2x1 grid: Dense 2->2 then Softmax, as Loom writes it."""
    import base64

    w = base64.b64encode(np.array([1, 0, 0, 1], "<f4").tobytes()).decode()
    return {"id": "network", "depth": 1, "rows": 1, "cols": 2, "layers_per_cell": 1, "layers": [
        {"z": 0, "y": 0, "x": 0, "l": 0, "type": "Dense", "activation": "Linear", "dtype": "float32",
         "input_height": 2, "output_height": 2, "weights": w, "native": True, "scale": 1},
        {"z": 0, "y": 0, "x": 1, "l": 0, "type": "Softmax", "activation": "Linear", "dtype": "float32",
         "softmax_type": "Standard"}]}


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_golden_forward_matches_loom(case):
    net = load_network(json.dumps(case["network"]))
    y = net.forward(case_input(case))
    np.testing.assert_allclose(y.ravel(), np.asarray(case["output"], np.float32), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_rewriting_a_loom_file_reproduces_it(case):
    # the golden network is Loom's own serialisation: ours must be the same, key for key and
    # weight blob for weight blob (packed sub-byte dtypes included)
    net = load_network(json.dumps(case["network"]))
    assert json.loads(dumps(net)) == case["network"]
    assert list(network_to_dict(net)["layers"][0]) == list(case["network"]["layers"][0])


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_save_load_round_trip_gives_identical_outputs(case, tmp_path):
    net = load_network(json.dumps(case["network"]))
    path = tmp_path / "net.json"
    save_network(net, path)
    again = load_network(path)
    x = case_input(case)
    np.testing.assert_array_equal(again.forward(x), load_network(json.dumps(case["network"])).forward(x))


def test_writer_uses_gos_layout_and_float_text():
    net = load_network(json.dumps(tiny_net_json()))
    net[0, 0, 0, 0].weights.scale = 0.00496063
    text = dumps(net)
    assert text.startswith('{\n  "id": "network",\n  "depth": 1,')
    assert '"scale": 0.00496063' in text
    assert '"softmax_type": "Standard"' in text and '"seq_length": 1' in text


def test_build_schema_is_seeded_and_uniform_in_loom_range():
    doc = {"depth": 1, "rows": 1, "cols": 1, "layers_per_cell": 2, "layers": [
        {"z": 0, "y": 0, "x": 0, "l": 0, "type": "dense", "activation": "tanh", "input_height": 30,
         "output_height": 20},
        {"z": 0, "y": 0, "x": 0, "l": 1, "type": "softmax", "softmax_type": 1, "softmax_rows": 4,
         "softmax_cols": 5}]}
    a = load_network(json.dumps(doc), seed=3)
    b = load_network(json.dumps(doc), seed=3)
    w = a[0, 0, 0, 0].weights.master
    assert w.size == 600 and -0.1 <= w.min() and w.max() < 0.1 and w.std() > 0.04
    np.testing.assert_array_equal(w, b[0, 0, 0, 0].weights.master)
    assert a[0, 0, 0, 1].cfg.softmax_type == "Grid"
    assert not np.array_equal(w, load_network(json.dumps(doc), seed=4)[0, 0, 0, 0].weights.master)


def test_build_schema_cnn2_width_defaults_to_height():
    doc = {"depth": 1, "rows": 1, "cols": 1, "layers_per_cell": 1, "layers": [
        {"type": "cnn2", "input_height": 4, "output_height": 2, "input_channels": 1, "filters": 1,
         "kernel_size": 3, "stride": 1}]}
    layer = load_network(json.dumps(doc), seed=0)[0, 0, 0, 0]
    assert (layer.cfg.input_width, layer.cfg.output_width) == (4, 2)


def test_keys_match_case_insensitively_like_gos_decoder():
    doc = tiny_net_json()
    doc["layers"][0] = {k.upper(): v for k, v in doc["layers"][0].items()}
    net = load_network(json.dumps(doc))
    np.testing.assert_allclose(net.forward(np.array([[1.0, 0.0]], np.float32)).ravel(),
                               np.exp([1, 0]) / np.exp([1, 0]).sum(), rtol=1e-6)


def test_save_is_atomic_when_the_write_fails(tmp_path, monkeypatch):
    path = tmp_path / "net.json"
    net = load_network(json.dumps(tiny_net_json()))
    save_network(net, path)
    before = path.read_bytes()
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError("disk gone")))
    with pytest.raises(OSError):
        save_network(net, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["net.json"]  # no temp file left


def _broken(mutate) -> str:
    doc = tiny_net_json()
    mutate(doc)
    return json.dumps(doc)


def _set(path, value):
    def mutate(doc):
        obj = doc
        for key in path[:-1]:
            obj = obj[key]
        obj[path[-1]] = value
    return mutate


def _nest(depth):
    def mutate(doc):
        inner = {"type": "Residual"}
        for _ in range(depth):
            inner = {"type": "Sequential", "sequential_layers": [inner]}
        inner.update(z=0, y=0, x=1, l=0)
        doc["layers"][1] = inner
    return mutate


BAD = {
    "unknown layer type": (_set(["layers", 0, "type"], "conv1d"), "$.layers[0].type"),
    "empty layer type": (_set(["layers", 0, "type"], ""), "$.layers[0].type"),
    "unknown activation": (_set(["layers", 0, "activation"], "swish"), "$.layers[0].activation"),
    "unknown dtype": (_set(["layers", 0, "dtype"], "fp8_e4m3"), "$.layers[0].dtype"),
    "unknown softmax type": (_set(["layers", 1, "softmax_type"], "sparse"), "$.layers[1].softmax_type"),
    "unknown combine mode": (_set(["layers", 1, "combine_mode"], "ADD"), "$.layers[1].combine_mode"),
    "weights too short": (_set(["layers", 0, "weights"], "AACAPw=="), "$.layers[0].weights"),
    "weights not base64": (_set(["layers", 0, "weights"], "!!!"), "$.layers[0].weights"),
    "weights missing": (lambda d: d["layers"][0].pop("weights") and None, "$.layers[0].weights"),
    "x outside grid": (_set(["layers", 1, "x"], 2), "$.layers[1].x"),
    "negative z": (_set(["layers", 1, "z"], -1), "$.layers[1].z"),
    "cell undescribed": (lambda d: d["layers"].pop(1) and None, "$.layers"),
    "cell described twice": (_set(["layers", 1, "x"], 0), "$.layers[1]"),
    "float where int": (_set(["layers", 0, "input_height"], 2.0), "$.layers[0].input_height"),
    "string where int": (_set(["layers", 0, "output_height"], "2"), "$.layers[0].output_height"),
    "negative size": (_set(["layers", 0, "output_height"], -2), "$.layers[0].output_height"),
    "zero depth": (_set(["depth"], 0), "$.depth"),
    "layers not a list": (_set(["layers"], {}), "$.layers"),
    "layer not an object": (_set(["layers", 1], 5), "$.layers[1]"),
    "nesting deeper than 64": (_nest(64), "sequential_layers[0]"),
    "mha heads do not divide": (_set(["layers", 1], {
        "x": 1, "type": "MultiHeadAttention", "d_model": 10, "num_heads": 3, "weights": ""}), "$.layers[1]"),
    "mha kv heads do not divide": (_set(["layers", 1], {
        "x": 1, "type": "MultiHeadAttention", "d_model": 12, "num_heads": 4, "num_kv_heads": 3}),
        "$.layers[1]"),
    "huge grid": (lambda d: d.update(depth=1 << 20, rows=1 << 20), "$"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_input_raises_one_typed_error_naming_the_path(name):
    mutate, where = BAD[name]
    with pytest.raises(LoomFormatError) as err:
        load_network(_broken(mutate), schema="persistence")
    assert where in err.value.path, (err.value.path, str(err.value))
    assert str(err.value).startswith(err.value.path)


@pytest.mark.parametrize("data", [b"", b"{", b"[1, 2]", b'{"depth": NaN}', b"\xff{}",
                                  b'{"a": ' + b"[" * 100000 + b"]" * 100000 + b"}"])
def test_invalid_json_raises_format_error(data):
    with pytest.raises(LoomFormatError) as err:
        load_network(data)
    assert err.value.path == "$"


def test_files_over_256_mb_are_refused_before_reading(tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as f:
        f.truncate(loom_json.MAX_FILE_BYTES + 1)  # sparse: no real disk use
    with pytest.raises(LoomFormatError, match="limit"):
        load_network(big)


def test_missing_file_is_a_format_error_naming_the_file(tmp_path):
    for name in ("nope.json", "nope.loom"):
        with pytest.raises(LoomFormatError) as err:
            load_network(tmp_path / name)
        assert err.value.path == str(tmp_path / name)
        assert str(err.value) == f"{tmp_path / name}: cannot read: {os.strerror(2)}"


def _safetensors_bytes() -> bytes:
    from safetensors.numpy import save

    return save({"w": np.zeros(3, np.float32)})


# (file name, contents, words the error must say): files that are something else than the format
# their name promises. The error names the file (not the JSON path "$") and says what it is.
FOREIGN = {
    "gguf as json": ("model.gguf", b"GGUF" + (3).to_bytes(4, "little") + bytes(16) + b"\xff" * 700,
                     "a GGUF language model, not a Loom network: use `loomlab models info`"),
    "gguf as loom": ("model.loom", b"GGUF" + bytes(40), "a GGUF language model"),
    "npy as json": ("in.json", None, "a numpy array (.npy), not a Loom network"),
    "safetensors as json": ("net.json", "safetensors", "a safetensors file, not Loom JSON"),
    "json as loom": ("net.loom", b'  {"depth": 1}', "Loom JSON text, not a checkpoint"),
    "binary as json": ("noise.json", b"{\xff\xfe", "not UTF-8 text (byte 1)"),
    "text as json": ("notes.json", b"hello", "invalid JSON: Expecting value at line 1 column 1"),
    "random bytes as loom": ("noise.loom", bytes(range(7, 200)), "not a valid safetensors file"),
}


@pytest.mark.parametrize("name", list(FOREIGN))
def test_a_file_of_another_kind_is_named_and_said_what_it_is(name, tmp_path):
    filename, data, words = FOREIGN[name]
    path = tmp_path / filename
    if data is None:
        np.save(path.with_suffix(".npy"), np.zeros(4, np.float32))
        path.with_suffix(".npy").rename(path)
    else:
        path.write_bytes(_safetensors_bytes() if data == "safetensors" else data)
    with pytest.raises(LoomFormatError) as err:
        load_network(path)
    assert err.value.path == str(path) and words in str(err.value), str(err.value)
    assert str(err.value).startswith(f"{path}: ")


def test_text_and_bytes_sources_still_name_the_json_root():
    # no file to name: the whole-document problems are at "$"
    for source in (b"GGUF\x03\x00\x00\x00", b"{", "{ nope"):
        with pytest.raises(LoomFormatError) as err:
            load_network(source)
        assert err.value.path == "$"


def test_build_schema_refuses_a_parameter_bomb():
    doc = {"depth": 1, "rows": 1, "cols": 1, "layers_per_cell": 1, "layers": [
        {"type": "Dense", "input_height": 1 << 20, "output_height": 1 << 20}]}
    with pytest.raises(LoomFormatError, match="parameters"):
        load_network(json.dumps(doc))


def test_saving_an_unknown_suffix_is_refused(tmp_path):
    with pytest.raises(LoomFormatError):
        save_network(load_network(json.dumps(tiny_net_json())), tmp_path / "net.bin")


def test_remote_links_and_masks_survive_our_round_trip():
    net = load_network(json.dumps(tiny_net_json()))
    net[0, 0, 1, 0] = make_layer("Softmax", softmax_type="Masked", mask=[True, False])
    par = make_layer("Parallel", combine_mode="add", children=[
        make_layer("Residual", is_remote_link=True, target_x=1), make_layer("Residual")])
    net[0, 0, 0, 0] = par
    again = load_network(dumps(net))
    assert again[0, 0, 1, 0].cfg.mask == [True, False]
    assert again[0, 0, 0, 0].children[0].cfg.is_remote_link
    assert again[0, 0, 0, 0].children[0].cfg.target == (0, 0, 1, 0)


# ----- numbers, sizes and counts a file may ask for -------------------------------------------
def _one_layer(layer: dict) -> str:
    return json.dumps({"depth": 1, "rows": 1, "cols": 1, "layers_per_cell": 1, "layers": [layer]})


FLOAT_FIELDS = {"scale": "Dense", "temperature": "Softmax", "entmax_alpha": "Softmax",
                "kmeans_temperature": "KMeans", "rope_freq_base": "MultiHeadAttention"}


@pytest.mark.parametrize("field", list(FLOAT_FIELDS))
def test_an_integer_too_large_for_a_float_is_a_format_error_naming_the_field(field):
    doc = tiny_net_json()
    doc["layers"][0 if field == "scale" else 1][field] = 10 ** 400  # json writes every digit
    with pytest.raises(LoomFormatError) as err:
        load_network(json.dumps(doc))
    where = f"$.layers[{0 if field == 'scale' else 1}].{field}"
    assert err.value.path == where and "expected a finite number" in str(err.value)
    assert len(str(err.value)) < 200  # the 401 digits are not repeated


def test_a_scale_outside_float32_range_is_refused():
    doc = tiny_net_json()
    doc["layers"][0]["scale"] = 1e39  # a finite float64; Loom's scale is a float32
    with pytest.raises(LoomFormatError, match="float32 range") as err:
        load_network(json.dumps(doc))
    assert err.value.path == "$.layers[0].scale"


def test_a_huge_value_is_cut_short_in_the_message():
    with pytest.raises(LoomFormatError) as err:
        load_network(_one_layer({"type": "x" * 1_000_000}))
    assert err.value.path == "$.layers[0].type" and "x" * 100 not in str(err.value)
    assert len(str(err.value)) < 1000


def test_build_weights_are_float32_drawn_a_chunk_at_a_time_as_if_all_at_once(monkeypatch):
    from loomlab.core import dtypes
    from loomlab.core.weights import uniform_weights

    monkeypatch.setattr(dtypes, "CHUNK", 1000)
    got = uniform_weights(2500, np.random.default_rng(7), 0.1)
    oracle = ((np.random.default_rng(7).random(2500) * 2 - 1) * 0.1).astype(np.float32)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, oracle)


def test_build_schema_allocates_the_float32_weights_and_little_more():
    n = 2048 * 2048
    text = _one_layer({"type": "Dense", "input_height": 2048, "output_height": 2048})
    with traced() as used:
        net = load_network(text, seed=0)
    assert net.parameter_count() == n
    assert used.peak < 4 * n + (8 << 20), used.peak  # the float32 master, not float64 temporaries of it


@pytest.mark.parametrize("schema", ["build", "persistence"])
def test_weights_beyond_what_the_machine_holds_are_refused_before_allocating(schema, monkeypatch):
    from .bad_input import raises_quickly_and_small

    monkeypatch.setattr(loom_json, "physical_memory_bytes", lambda: 64 << 20)  # 4 Mi parameters
    assert loom_json.max_parameters() == (64 << 20) // loom_json.BYTES_PER_PARAMETER
    layer = {"type": "Dense", "input_height": 2048, "output_height": 2049}
    if schema == "persistence":  # one int8 byte a weight in the file, 4 + 1 in memory
        import base64

        layer.update(dtype="int8", native=True, scale=0.01,
                     weights=base64.b64encode(bytes(2048 * 2049)).decode())
    data = _one_layer(layer).encode()
    # the bound holds the file's text twice (5.6 MB of base64), not 17 MB of float32 weights
    err = raises_quickly_and_small(lambda: load_network(data), LoomFormatError, seconds=2,
                                   peak_bytes=16 << 20)
    assert err.path == "$.layers[0]" and "over 4,194,304 parameters" in str(err)


def _binary_layer(n_in: int, n_out: int) -> dict:
    """A Dense layer with native 1-bit weights: the most weights per byte of file, and the
    costliest to read per weight (unpacked, then dequantized to the float32 master)."""
    import base64

    from loomlab.core import dtypes

    blob = bytes(dtypes.packed_nbytes(n_in * n_out, "binary"))
    return {"type": "Dense", "input_height": n_in, "output_height": n_out, "dtype": "binary",
            "native": True, "scale": 0.01, "weights": base64.b64encode(blob).decode()}


@pytest.mark.parametrize("schema", ["build", "persistence"])
def test_a_network_just_over_the_parameter_cap_is_refused_before_allocating(schema, monkeypatch):
    from .bad_input import raises_quickly_and_small

    monkeypatch.setattr(loom_json, "physical_memory_bytes", lambda: 1 << 40)  # the cap, not memory, binds
    assert loom_json.max_parameters() == loom_json.MAX_PARAMETERS == 8192 * 8192
    layer = {"type": "Dense", "input_height": 8192, "output_height": 8193}
    if schema == "persistence":
        layer = _binary_layer(8192, 8193)
    data = _one_layer(layer).encode()
    # the bound holds the file's 11 MB of base64 text twice, not the 268 MB float32 master
    err = raises_quickly_and_small(lambda: load_network(data), LoomFormatError, seconds=2,
                                   peak_bytes=2 * len(data) + (16 << 20))
    assert err.path == "$.layers[0]" and "over 67,108,864 parameters" in str(err)


def test_a_network_at_the_parameter_cap_is_read_within_1_gb():
    """The costliest reading path, measured on 2 Mi weights and scaled to the cap, leaves 100 MB of
    the 1 GB for the interpreter and its modules (reading is linear in the weights)."""
    n = 2048 * 1024
    data = _one_layer(_binary_layer(2048, 1024)).encode()
    with traced() as used:
        load_network(data)
    assert used.peak / n * loom_json.MAX_PARAMETERS < 900e6, used.peak / n


def test_a_grid_larger_than_the_layer_cap_is_refused_before_reading_layers():
    doc = {"depth": 1, "rows": 1, "cols": 1, "layers_per_cell": loom_json.MAX_CELLS + 1, "layers": []}
    with pytest.raises(LoomFormatError, match="cells exceeds") as err:
        load_network(json.dumps(doc))
    assert err.value.path == "$" and loom_json.MAX_CELLS == loom_json.MAX_LAYERS


@pytest.mark.parametrize("key", ["parallel_branches", "sequential_layers"])
def test_nested_layers_count_against_the_layer_cap(key, monkeypatch):
    monkeypatch.setattr(loom_json, "MAX_LAYERS", 100)
    kind = "Parallel" if key == "parallel_branches" else "Sequential"
    fits = _one_layer({"type": kind, key: [{"type": "Softmax"}] * 99})
    assert len(load_network(fits)[0, 0, 0, 0].children) == 99
    over = _one_layer({"type": kind, key: [{"type": "Softmax"}] * 100})
    with pytest.raises(LoomFormatError, match="at most 100 layers") as err:
        load_network(over)
    assert err.value.path == f"$.layers[0].{key}[99]"


def test_a_file_of_millions_of_tiny_values_is_refused_before_parsing():
    from .bad_input import raises_quickly_and_small

    head = _one_layer({"type": "Softmax"})[:-1]
    data = (head + ', "junk": [' + "0," * loom_json.MAX_JSON_VALUES + "0]}").encode()
    err = raises_quickly_and_small(lambda: load_network(data), LoomFormatError, seconds=2,
                                   peak_bytes=1 << 20)
    assert err.path == "$" and "JSON values" in str(err)


def test_reading_a_layer_costs_time_linear_in_its_keys():
    # a layer object with 50,000 unknown keys: Go's decoder ignores them, and so do we, in one
    # pass (a case-insensitive look-up per field scanned them all ~50 times)
    import time

    from loomlab.core.io.loom_json import read_network

    text = _one_layer({"type": "Softmax", **{f"k{i}": 0 for i in range(50_000)}})
    start = time.perf_counter()
    doc = json.loads(text)
    parse = time.perf_counter() - start
    start = time.perf_counter()
    read_network(doc, schema="build")
    assert time.perf_counter() - start < 2 * parse


def test_a_weightless_layer_keeps_under_2_3_kb():
    # at MAX_LAYERS that is 150 MB; a random generator made per Softmax layer added ~900 bytes
    # (and most of the time of reading one)
    n = 1000
    text = json.dumps({"depth": 1, "rows": 1, "cols": 1, "layers_per_cell": n,
                       "layers": [{"l": i, "type": "Softmax"} for i in range(n)]})
    load_network(text)  # imports and caches outside the measurement
    with traced() as used:
        net = load_network(text)
    assert sum(1 for _ in net.layers()) == n and used.kept / n < 2300, used.kept / n


def _whole_floats_as_ints(v):
    if isinstance(v, dict):
        return {k: _whole_floats_as_ints(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_whole_floats_as_ints(x) for x in v]
    return int(v) if isinstance(v, float) and v.is_integer() else v


def test_written_text_is_json_dumps_with_indent_2_and_gos_float_text():
    net = load_network(json.dumps(tiny_net_json()))
    net[0, 0, 1, 0].cfg.output_mode = 'a "quoted" \\ é\n\x7f'  # escapes json.dumps must write
    doc = network_to_dict(net)
    assert dumps(net) == json.dumps(_whole_floats_as_ints(doc), indent=2) + "\n"


def test_saving_json_holds_the_weights_text_twice_at_most(tmp_path):
    net = load_network(json.dumps(tiny_net_json()))
    net[0, 0, 0, 0] = make_layer("Dense", input_height=1024, output_height=1024, rng=np.random.default_rng(0))
    path = tmp_path / "net.json"
    save_network(net, path)  # imports outside the measurement
    with traced() as used:
        save_network(net, path)
    # the base64 text in the layer's object and its UTF-8 bytes; the whole file's text is never made
    assert used.peak < 2.25 * path.stat().st_size, (used.peak, path.stat().st_size)
    assert path.read_text() == dumps(net)


@pytest.mark.parametrize("suffix", [".json", ".loom"])
@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_a_path_that_is_not_a_regular_file_is_refused_before_it_is_opened(kind, suffix, tmp_path):
    import threading

    if kind == "device":
        if not os.path.exists("/dev/zero"):
            pytest.skip("no /dev/zero here")
        path = tmp_path / f"zero{suffix}"
        path.symlink_to("/dev/zero")  # read without end: 256 MB of zeros before the size check
    elif kind == "fifo":
        path = tmp_path / f"pipe{suffix}"
        os.mkfifo(path)  # opening it for reading waits for a writer that never comes
    else:
        path = tmp_path / f"folder{suffix}"
        path.mkdir()
    outcome = []
    reader = threading.Thread(target=lambda: outcome.append(_error_of(lambda: load_network(path))),
                              daemon=True)
    reader.start()
    reader.join(timeout=5)
    assert outcome, "the reader is still waiting"
    assert isinstance(outcome[0], LoomFormatError) and outcome[0].path == str(path)
    assert "not a regular file" in str(outcome[0])


def _error_of(call):
    try:
        call()
    except Exception as e:  # the test checks which one
        return e
    return None
