"""Inputs for hand runs. Oracle: the Loom goldens' own inputs (one default_rng(1) stream, case by
case) and outputs; numpy's generators for seeded inputs; the files' own numbers."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

from loomlab.core import LoomConfigError, LoomShapeError, VolumetricNetwork, make_layer
from loomlab.core.io.loom_json import read_network
from loomlab.core.run_inputs import (
    GOLDEN_SEED,
    fit_input,
    golden_probe,
    input_spec,
    random_input,
    read_input_file,
)

from .goldens import case_input, forward_case, goldens


def dense_net(n_in=6, n_out=3):
    net = VolumetricNetwork(1, 1, 1, 1)
    net[0, 0, 0, 0] = make_layer("Dense", input_height=n_in, output_height=n_out, activation="Tanh",
                                 rng=np.random.default_rng(0))
    return net


def test_the_golden_recipe_reproduces_every_golden_input():
    """One seed-1 stream drawn case by case gives each case's input bit for bit, in its shape, and
    fit_input lays the flat stored values out in that same shape."""
    rng = np.random.default_rng(GOLDEN_SEED)
    cases = goldens()["forward"]
    assert len(cases) > 50
    for case in cases:
        net = read_network(case["network"])
        probe = golden_probe(net, case["input_shape"][0], rng)
        assert list(probe.shape) == case["input_shape"], case["name"]
        np.testing.assert_array_equal(probe, case_input(case), err_msg=case["name"])
        flat = np.asarray(case["input"], np.float32)
        assert list(fit_input(net, flat).shape) == case["input_shape"], case["name"]


@pytest.mark.parametrize("name", ["dense_relu", "mha_gqa", "embedding", "kmeans_prob", "transformer_block"])
def test_a_fitted_flat_golden_input_gives_the_golden_output(name):
    case = forward_case(name)
    net = read_network(case["network"])
    y = net.forward(fit_input(net, np.asarray(case["input"], np.float32)))
    np.testing.assert_allclose(np.asarray(y).ravel(), case["output"], rtol=1e-5, atol=1e-6)


def test_the_default_golden_probe_is_the_first_cases_input():
    case = goldens()["forward"][0]
    net = read_network(case["network"])
    np.testing.assert_array_equal(golden_probe(net, case["input_shape"][0]), case_input(case))


def test_an_embedding_gets_the_golden_ids_modulo_its_vocabulary():
    net = VolumetricNetwork(1, 1, 1, 1)
    net[0, 0, 0, 0] = make_layer("Embedding", vocab_size=3, embedding_dim=2, rng=np.random.default_rng(0))
    assert input_spec(net).kind == "tokens"
    np.testing.assert_array_equal(golden_probe(net, 2), [[0, 1, 1, 1, 2]] * 2)
    ids = random_input(net, seed=5, batch=4)
    np.testing.assert_array_equal(ids, np.random.default_rng(5).integers(0, 3, (4, 5)))


def test_random_input_is_numpys_standard_normal_of_the_input_shape():
    x = random_input(dense_net(), seed=7, batch=3)
    np.testing.assert_array_equal(x, np.random.default_rng(7).standard_normal((3, 6)).astype(np.float32))
    assert x.dtype == np.float32


def test_a_kmeans_network_reads_one_vector_whatever_the_batch():
    case = forward_case("kmeans_prob")
    net = read_network(case["network"])
    assert golden_probe(net, batch=5).shape == (1, 6)
    with pytest.raises(LoomShapeError, match="reads one vector of 6 values, got 12"):
        fit_input(net, np.zeros(12))


@pytest.mark.parametrize("batch", [0, -1, 1.5, True])
def test_a_bad_batch_is_refused(batch):
    with pytest.raises(LoomConfigError, match="batch must be a positive integer"):
        random_input(dense_net(), seed=0, batch=batch)


def test_an_input_that_does_not_fit_names_what_the_network_reads():
    with pytest.raises(LoomShapeError, match=r"\[4, 5\] \(20 values\).*reads \[batch, 6\].*a multiple of 6"):
        fit_input(dense_net(), np.zeros((4, 5)))
    np.testing.assert_array_equal(fit_input(dense_net(), np.arange(12)), np.arange(12).reshape(2, 6))


def test_a_network_without_an_input_size_is_refused():
    net = VolumetricNetwork(1, 1, 1, 1)
    net[0, 0, 0, 0] = make_layer("Softmax")
    with pytest.raises(LoomConfigError, match="cannot tell what input this network reads"):
        golden_probe(net)


# ----- files ---------------------------------------------------------------------------------------

def test_npy_and_json_files_give_their_numbers(tmp_path):
    values = np.random.default_rng(0).standard_normal((2, 6))
    np.save(tmp_path / "x.npy", values)
    np.testing.assert_array_equal(read_input_file(tmp_path / "x.npy"), values.astype(np.float32))
    (tmp_path / "x.json").write_text(json.dumps(values.tolist()))
    np.testing.assert_array_equal(read_input_file(tmp_path / "x.json"), values.astype(np.float32))
    (tmp_path / "ref.json").write_text(json.dumps({"input": values.ravel().tolist(), "shape": [2, 6]}))
    np.testing.assert_array_equal(read_input_file(tmp_path / "ref.json"), values.astype(np.float32))
    np.save(tmp_path / "ints.npy", np.arange(4, dtype=np.int16))
    np.testing.assert_array_equal(read_input_file(tmp_path / "ints.npy"), [0, 1, 2, 3])


def _write_pickled_npy(path):
    np.save(path, np.array([{"a": 1}], dtype=object), allow_pickle=True)


def _write_truncated_npy(path):
    np.save(path, np.zeros(100, np.float32))
    path.write_bytes(path.read_bytes()[:-40])


def _write_npy_claiming_a_terabyte(path):
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {"descr": "<f4", "fortran_order": False, "shape": (2**38,)})
        f.write(bytes(16))


BAD_FILES = [
    ("object.npy", _write_pickled_npy, "pickled Python objects, which are never loaded"),
    ("raw_pickle.npy", lambda p: p.write_bytes(pickle.dumps([1.0, 2.0])), "pickled Python objects"),
    ("text.npy", lambda p: np.save(p, np.array(["a", "b"])), "must hold numbers, got dtype <U1"),
    ("complex.npy", lambda p: np.save(p, np.zeros(3, np.complex64)), "got dtype complex64"),
    ("empty.npy", lambda p: np.save(p, np.zeros((0, 3), np.float32)), "holds no values"),
    ("truncated.npy", _write_truncated_npy, "not a plain numeric .npy array"),
    ("huge_header.npy", _write_npy_claiming_a_terabyte, "not a plain numeric .npy array"),
    ("archive.npy", lambda p: np.savez(open(p, "wb"), a=np.zeros(3)), "an .npz archive"),
    ("nan.npy", lambda p: np.save(p, np.array([1.0, np.nan])), "NaN or infinite"),
    ("big.npy", lambda p: np.save(p, np.array([1e39])), "NaN or infinite"),
    ("strings.json", lambda p: p.write_text('["a", 1]'), "expected an array of numbers"),
    ("ragged.json", lambda p: p.write_text("[[1, 2], [3]]"), "not a rectangular array"),
    ("object.json", lambda p: p.write_text('{"values": [1]}'), "expected an array of numbers"),
    ("bools.json", lambda p: p.write_text("[true, false]"), "expected an array of numbers"),
    ("broken.json", lambda p: p.write_text("[1, 2"), "not a readable JSON file"),
    ("deep.json", lambda p: p.write_text("[" * 200_000 + "]" * 200_000), "nested too deeply"),
    ("infinite.json", lambda p: p.write_text("[1, Infinity]"), "NaN or infinite"),
    ("badshape.json", lambda p: p.write_text('{"input": [1, 2, 3], "shape": [2, 2]}'), "not fit 3 values"),
    ("negshape.json", lambda p: p.write_text('{"input": [1], "shape": [-1]}'), "list of positive integers"),
    ("notes.txt", lambda p: p.write_text("1 2 3"), "must be .npy or .json, not '.txt'"),
]


@pytest.mark.parametrize(("name", "write", "message"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_a_bad_input_file_gives_one_clear_error_naming_it(tmp_path, name, write, message):
    path = tmp_path / name
    write(path)
    with pytest.raises(LoomConfigError, match=message) as raised:
        read_input_file(path)
    assert str(path) in str(raised.value)


def test_a_missing_or_oversized_file_is_refused(tmp_path, monkeypatch):
    with pytest.raises(LoomConfigError, match="cannot read the input file"):
        read_input_file(tmp_path / "absent.npy")
    np.save(tmp_path / "x.npy", np.zeros(1000, np.float32))
    monkeypatch.setattr("loomlab.core.run_inputs.MAX_INPUT_FILE_BYTES", 1000)
    with pytest.raises(LoomConfigError, match="more than an input file may hold"):
        read_input_file(tmp_path / "x.npy")
