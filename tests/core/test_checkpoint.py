"""The .loom checkpoint: byte-identical round trips for every dtype and bad files."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from loomlab.core import LoomFormatError, load_network, save_network
from loomlab.core.io import checkpoint
from loomlab.core.io.checkpoint import checkpoint_bytes

from .bad_input import traced
from .goldens import case_input, goldens

CASES = goldens()["forward"]  # includes a net morphed to each of the 21 dtypes


@pytest.mark.parametrize("case", CASES, ids=lambda c: c["name"])
def test_round_trip_is_byte_identical_and_computes_the_same(case, tmp_path):
    net = load_network(json.dumps(case["network"]))
    path = tmp_path / "net.loom"
    save_network(net, path)
    again = load_network(path)
    assert checkpoint_bytes(again) == path.read_bytes()
    x = case_input(case)
    np.testing.assert_array_equal(again.forward(x), load_network(json.dumps(case["network"])).forward(x))
    # and the JSON written from the checkpoint is still Loom's own serialisation
    from loomlab.core.io import dumps

    assert json.loads(dumps(again)) == case["network"]


def _parts(path):
    data = path.read_bytes()
    n = struct.unpack("<Q", data[:8])[0]
    return json.loads(data[8:8 + n]), data[8 + n:]


def _write(path, header, payload):
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + payload)


@pytest.fixture
def saved(tmp_path):
    case = next(c for c in CASES if c["name"] == "morph_mixed")
    path = tmp_path / "net.loom"
    save_network(load_network(json.dumps(case["network"])), path)
    return path


def _tamper_network(saved, mutate):
    header, payload = _parts(saved)
    meta = json.loads(header["__metadata__"][checkpoint.METADATA_KEY])
    mutate(meta["network"])
    header["__metadata__"][checkpoint.METADATA_KEY] = json.dumps(meta)
    _write(saved, header, payload)


def test_truncated_file(saved):
    saved.write_bytes(saved.read_bytes()[:-5])
    with pytest.raises(LoomFormatError):
        load_network(saved)


def test_header_bomb(saved):
    saved.write_bytes(struct.pack("<Q", 1 << 60) + b"{}")
    with pytest.raises(LoomFormatError):
        load_network(saved)


def test_not_safetensors(saved):
    saved.write_text('{"depth": 1}')
    with pytest.raises(LoomFormatError):
        load_network(saved)


def test_wrong_tensor_size(saved):
    header, payload = _parts(saved)
    name = next(k for k in header if k.startswith("layers"))
    start, end = header[name]["data_offsets"]
    # shrink this tensor by one byte (shift the following offsets to stay a valid file)
    for k, v in header.items():
        if k != "__metadata__" and v["data_offsets"][0] >= end:
            v["data_offsets"] = [v["data_offsets"][0] - 1, v["data_offsets"][1] - 1]
    header[name]["data_offsets"] = [start, end - 1]
    header[name]["shape"] = [end - 1 - start]
    _write(saved, header, payload[:end - 1] + payload[end:])
    with pytest.raises(LoomFormatError, match="bytes"):
        load_network(saved)


def test_unknown_dtype_in_metadata(saved):
    _tamper_network(saved, lambda spec: spec["layers"][0].update(dtype="int3"))
    with pytest.raises(LoomFormatError, match="dtype"):
        load_network(saved)


def test_tampered_metadata_json(saved):
    header, payload = _parts(saved)
    header["__metadata__"][checkpoint.METADATA_KEY] = "{not json"
    _write(saved, header, payload)
    with pytest.raises(LoomFormatError, match="JSON"):
        load_network(saved)


def test_tensor_for_a_layer_without_weights(saved):
    _tamper_network(saved, lambda spec: spec["layers"][0].update(type="Softmax"))
    with pytest.raises(LoomFormatError, match="weights for no layer"):
        load_network(saved)


def test_wrong_format_key(saved):
    header, payload = _parts(saved)
    meta = json.loads(header["__metadata__"][checkpoint.METADATA_KEY])
    meta["format"] = "something-else"
    header["__metadata__"][checkpoint.METADATA_KEY] = json.dumps(meta)
    _write(saved, header, payload)
    with pytest.raises(LoomFormatError, match="not a Loom Lab checkpoint"):
        load_network(saved)


def test_missing_tensor(saved):
    header, payload = _parts(saved)
    name = next(k for k in header if k.startswith("layers"))
    del header[name]
    _write(saved, header, payload)
    with pytest.raises(LoomFormatError):
        load_network(saved)


def _retyped(saved, dtype: str, itemsize: int) -> bytes:
    """The checkpoint with its first tensor declared as ``dtype`` (same bytes, shape to match)."""
    header, payload = _parts(saved)
    name = next(k for k in header if k.startswith("layers"))
    start, end = header[name]["data_offsets"]
    header[name].update(dtype=dtype, shape=[(end - start) // itemsize])
    _write(saved, header, payload)
    return saved.read_bytes()


@pytest.mark.parametrize("dtype, itemsize", [("F8_E4M3", 1), ("F8_E5M2", 1), ("BF16", 2), ("F16", 2),
                                             ("I8", 1)])
def test_a_tensor_of_another_dtype_is_a_format_error_naming_it(saved, dtype, itemsize):
    data = _retyped(saved, dtype, itemsize)
    for read in (lambda: load_network(saved), lambda: checkpoint.checkpoint_from_bytes(data)):
        with pytest.raises(LoomFormatError) as err:
            read()
        assert err.value.path == "$.layers[0]"
        assert "must be 1-D uint8 (U8)" in str(err.value) and dtype in str(err.value)


def test_tensors_beyond_what_the_machine_holds_are_refused_before_reading_them(saved, monkeypatch):
    from loomlab.core.io import loom_json

    from .bad_input import raises_quickly_and_small

    monkeypatch.setattr(loom_json, "physical_memory_bytes", lambda: 1 << 20)  # 65,536 parameters
    header, payload = _parts(saved)
    big = 8 * loom_json.max_parameters() + 1  # over the widest dtype's bytes for them all
    header["layers[99]"] = {"dtype": "U8", "shape": [big], "data_offsets": [len(payload), len(payload) + big]}
    _write(saved, header, payload + bytes(big))
    data = saved.read_bytes()
    for read in (lambda: load_network(saved), lambda: checkpoint.checkpoint_from_bytes(data)):
        err = raises_quickly_and_small(read, LoomFormatError, seconds=2, peak_bytes=256 << 10)
        assert "bytes of weights, over the 65,536 parameters" in str(err)


def test_more_tensors_than_layers_a_network_may_hold_are_refused(saved, monkeypatch):
    monkeypatch.setattr(checkpoint, "MAX_LAYERS", 2)
    header, payload = _parts(saved)
    for i in range(3):
        header[f"extra{i}"] = {"dtype": "U8", "shape": [0], "data_offsets": [len(payload), len(payload)]}
    _write(saved, header, payload)
    with pytest.raises(LoomFormatError, match="tensors; a network holds at most 2 layers") as err:
        load_network(saved)
    assert err.value.path == str(saved)


@pytest.mark.parametrize("dtype, itemsize", [("float32", 4), ("int8", 1), ("float64", 8)])
def test_saving_a_layer_copies_its_weights_once(dtype, itemsize):
    from loomlab.core import VolumetricNetwork, make_layer
    from loomlab.core.morph import morph_all

    net = VolumetricNetwork(1, 1, 1, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=1024, output_height=1024, rng=np.random.default_rng(0))
    morph_all(net, dtype)
    with traced() as used:
        data = checkpoint_bytes(net)
    weights = itemsize << 20
    assert len(data) > weights and used.peak < 1.25 * weights, used.peak  # the file's bytes, no blob copies
    again = checkpoint.checkpoint_from_bytes(data)[0, 0, 0, 0].weights
    np.testing.assert_array_equal(again.dequantized(dtype), net[0, 0, 0, 0].weights.dequantized(dtype))
