"""DNA (signatures, comparison, logic shifts) of networks on the strict backend, against Loom's own
results (tests/data/evolve-goldens-seed1.json, welvet 0.80.0) and the numpy path.

``strict`` computes on array_api_strict's simulated ``device1`` with numpy's arithmetic underneath:
the same float32 squares, the same in-order float64 sum, the same float32 division, so the same
bits as numpy and Loom. ``no_float64`` has no float64: the squares are summed in float32, which
moves the norm (and so each element of a unit vector) by at most about ``n 2^-24`` relative for
n weights (the sum's error bound gamma_n, halved by the square root, plus the roundings of the
root and the division); the tests allow ``(n + 4) 2^-24``. Host transfers are counted with the
engine tests' TransferCounter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from loomlab.core.evolve.genetics.dna import compare_dna, extract_dna
from loomlab.core.io import load_network
from loomlab.core.train import TrainConfig, train

from ...dna_goldens import loom_result
from ...test_backend_strict_engine import TransferCounter, _batches, _mlp

pytest.importorskip("array_api_strict", reason="the strict backend needs array-api-strict (dev extra)")

GOLDEN = json.loads((Path(__file__).resolve().parents[3] / "data" / "evolve-goldens-seed1.json").read_text())
STRICT = ["strict", "strict-no-float64"]


def load(doc: dict, backend: str, tmp_path: Path, name: str):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return load_network(path, backend=backend)


def assert_unit_vectors_match(got: list[float], want: list[float], backend: str) -> None:
    got, want = np.float32(got), np.float32(want)
    assert got.shape == want.shape
    if backend == "strict":
        np.testing.assert_array_equal(got, want)
    else:  # float32 sums of squares: the module docstring's bound
        bound = (want.size + 4) * 2.0**-24 * np.abs(want.astype(np.float64))
        assert (np.abs(got.astype(np.float64) - want) <= bound).all()


@pytest.mark.parametrize("backend", STRICT)
@pytest.mark.parametrize("case", GOLDEN["dna_signatures"], ids=[c["name"] for c in GOLDEN["dna_signatures"]])
def test_extract_dna_on_strict_equals_loom(case, backend, tmp_path):
    net = load(case["network"], backend, tmp_path, case["name"])
    assert net.backend.name == backend
    ours = extract_dna(net).to_loom()
    assert len(ours) == len(case["dna"])
    for a, b in zip(ours, case["dna"], strict=True):
        assert {k: a[k] for k in ("Z", "Y", "X", "L", "Type", "DType")} == \
            {k: b[k] for k in ("Z", "Y", "X", "L", "Type", "DType")}
        assert_unit_vectors_match(a["Weights"], b["Weights"], backend)


@pytest.mark.parametrize("backend", STRICT)
@pytest.mark.parametrize("case", GOLDEN["dna_pairs"], ids=[c["name"] for c in GOLDEN["dna_pairs"]])
def test_compare_dna_on_strict_equals_loom(case, backend, tmp_path):
    a, b = load(case["a"], backend, tmp_path, "a"), load(case["b"], backend, tmp_path, "b")
    ours, loom = compare_dna(a, b).to_loom(), loom_result(case["result"])
    tolerance = 0 if backend == "strict" else 1e-5  # overlaps are sums of products of unit vectors
    assert ours["OverallOverlap"] == pytest.approx(loom["OverallOverlap"], abs=tolerance)
    assert ours["LayerOverlaps"].keys() == loom["LayerOverlaps"].keys()
    for key, overlap in loom["LayerOverlaps"].items():
        assert ours["LayerOverlaps"][key] == pytest.approx(overlap, abs=tolerance)
    assert [(s["SourcePos"], s["TargetPos"]) for s in ours["LogicShifts"]] == \
        [(s["SourcePos"], s["TargetPos"]) for s in loom["LogicShifts"]]
    for s, t in zip(ours["LogicShifts"], loom["LogicShifts"], strict=True):
        assert s["Overlap"] == pytest.approx(t["Overlap"], abs=tolerance)


@pytest.mark.parametrize("backend", STRICT)
def test_dequantized_dna_across_dtypes_on_strict_equals_numpy(backend, tmp_path):
    """A pair whose second network has an int8 layer: signed by the weights forward uses."""
    case = next(c for c in GOLDEN["dna_pairs"] if c["name"] == "dense3_vs_int8_layer1")
    nets = {n: (load(case["a"], n, tmp_path, "a"), load(case["b"], n, tmp_path, "b"))
            for n in ("numpy", backend)}
    for ours, ref in zip(extract_dna(nets[backend][1], dequantized=True).to_loom(),
                         extract_dna(nets["numpy"][1], dequantized=True).to_loom(), strict=True):
        assert_unit_vectors_match(ours["Weights"], ref["Weights"], backend)
    ours = compare_dna(*nets[backend], across_dtypes=True).layer_overlaps
    ref = compare_dna(*nets["numpy"], across_dtypes=True).layer_overlaps
    assert ours.keys() == ref.keys() and min(ref.values()) < 1  # the int8 layer is not its original
    for key, overlap in ref.items():
        assert ours[key] == pytest.approx(overlap, abs=0 if backend == "strict" else 1e-5)


@pytest.mark.parametrize("backend", STRICT)
def test_each_signed_layer_sends_the_host_its_unit_vector_once(backend, tmp_path, monkeypatch):
    """A Dense, a Parallel of branches (signed as one vector) and a weightless Softmax."""
    case = next(c for c in GOLDEN["dna_signatures"] if c["name"] == "nested")
    net = load(case["network"], backend, tmp_path, "nested")
    counter = TransferCounter(monkeypatch)
    dna = None

    def extract():
        nonlocal dna
        dna = extract_dna(net)

    crossed = counter.during(extract)
    kinds = [layer.cfg.type for _, layer in net.layers()]
    assert kinds == ["Dense", "Parallel", "Softmax"]
    # no weights, no per-element reads, no norms: the Dense's and the Parallel's unit vectors
    assert crossed == [dna.signatures[0].weights.size, dna.signatures[1].weights.size]
    assert dna.signatures[2].weights.tolist() == [1.0]


@pytest.mark.parametrize("backend", STRICT)
def test_dna_after_training_on_the_device_reads_the_device_masters(backend, monkeypatch):
    """After device training the host masters are behind; the DNA is signed from the device ones
    (one transfer per layer: its unit vector, not its master as well) and equals numpy's."""
    config = TrainConfig(epochs=2, optimizer="adamw", learning_rate=0.05)
    nets = {b: _mlp(b) for b in ("numpy", backend)}
    for net in nets.values():
        train(net, _batches(3), config)
    counter = TransferCounter(monkeypatch)
    crossed = counter.during(lambda: extract_dna(nets[backend]))
    sizes = [la.weights.master.size for la in nets["numpy"].weighted_layers()]
    assert crossed == sizes
    # the DNA brought no master home: reading each one now is its first copy to the host
    assert [counter.during(lambda la=la: la.weights.master) for la in nets[backend].weighted_layers()] == \
        [[n] for n in sizes]
    for ours, ref in zip(extract_dna(nets[backend]).to_loom(), extract_dna(nets["numpy"]).to_loom(),
                         strict=True):
        # the masters themselves agree to the training tests' tolerance, and a unit vector with them
        np.testing.assert_allclose(ours["Weights"], ref["Weights"], rtol=1e-4, atol=1e-6)
