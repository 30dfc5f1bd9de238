"""The 8-bit-activation kernels against numpy ports of llama.cpp's formulas.

Activation quantizers: bit for bit against ports of ``quantize_row_q8_0_ref`` / ``q8_1_ref`` /
``q8_K_ref`` (ggml-quants.c), written independently of the kernel: C's ``roundf`` in float64,
``nearest_int``'s magic-number addition on float32 bits, float16 through numpy.

Products: against ``ggml_vec_dot_<w>_<x>``'s formula summed in float64 from both sides' ints and
scales. The weight ints come from gguf-py (the oracle for the block layouts): dequantizing a copy
of the blocks with the super scale d set to 1 (and the min scale to 0) gives each weight's
``sub-scale * quant`` (Q2_K, Q4_K, Q5_K: with d = 0 and dmin = 1, minus its min). The kernel's integer sums
are exact, so it differs from the oracle only by its float32 operations per block (two products
and up to two sums) and the sum over blocks: at most (blocks + 4) * 2^-24 of the sum of the
terms' magnitudes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import llvmlite.binding as llvm
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, quants
from gguf import GGMLQuantizationType as GT

from loomlab.core.errors import LoomConfigError, LoomShapeError
from loomlab.core.llm.kernels import quant_int8_rows
from loomlab.core.llm.kernels.quant import ROW_CHUNK, QuantMatrix
from loomlab.core.llm.kernels.quant_int8 import (
    int8_activations,
    int8_enabled,
    int8_matmul,
    int8_matvec,
    quantize_activations,
)
from loomlab.core.llm.kernels.quant_int8_tiles import TILE, TILE_KINDS

from .test_quant import QUANTIZED, gemma3, random_blocks, smollm2  # noqa: F401 (fixtures)

F32, F64 = np.float32, np.float64

# ---------------------------------------------------------------------------------------------
# ggml-quants.c's reference quantizers, ported.


def c_roundf(v: np.ndarray) -> np.ndarray:
    """C ``roundf`` (halves away from zero); |v| + 0.5 is exact in float64 for float32 v."""
    v = v.astype(F64)
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: add 1.5 * 2^23 in float32 and read the low mantissa bits."""
    bits = (v.astype(F32) + F32(12582912.0)).view(np.int32)
    return (bits & 0x007FFFFF) - 0x00400000


def ref_q8_01(x: np.ndarray):
    """quantize_row_q8_0_ref / q8_1_ref for one row: qs, fp16 d, sums of qs, q8_1's fp16 s."""
    blocks = x.reshape(-1, 32).astype(F32)
    qs, d, sums, s = [], [], [], []
    for b in blocks:
        amax = F32(np.max(np.abs(b)))
        dd = F32(amax / F32(127))
        inv = F32(F32(1) / dd) if dd else F32(0)
        q = c_roundf(b * inv).astype(np.int8)
        total = int(q.astype(np.int64).sum())
        qs.append(q)
        d.append(F32(np.float16(dd)))
        sums.append(total)
        s.append(F32(np.float16(F32(F32(total) * dd))))
    return np.concatenate(qs), np.array(d, F32), np.array(sums, np.int32), np.array(s, F32)


def ref_q8_K(x: np.ndarray):
    """quantize_row_q8_K_ref for one row: qs, float32 d, bsums (per 16)."""
    qs, d, bsums = [], [], []
    for b in x.reshape(-1, 256).astype(F32):
        top = b[np.argmax(np.abs(b))]  # the first of largest magnitude, as the C loop's ">"
        if top == 0:
            q, dd = np.zeros(256, np.int8), F32(0)
        else:
            iscale = F32(F32(-127) / top)
            q = np.minimum(127, nearest_int(iscale * b)).astype(np.int8)
            dd = F32(F32(1) / iscale)
        qs.append(q)
        d.append(dd)
        bsums.append(q.astype(np.int32).reshape(16, 16).sum(1))
    return np.concatenate(qs), np.array(d, F32), np.concatenate(bsums).astype(np.int32)


def edge_rows(rng: np.random.Generator, n: int) -> list[np.ndarray]:
    """Large values, and halves: each block's largest magnitude is 127 (d = 1; for Q8_K the
    signed -127, so iscale = 1), so x / d ends in .5, which roundf and nearest_int round apart."""
    halves = rng.integers(-126, 126, n) + 0.5
    halves[::32] = 127.0
    halves[::256] = -127.0
    return [rng.standard_normal(n) * 30, halves]


def activation_rows(rng: np.random.Generator) -> np.ndarray:
    """1024 values a row: normal ones, :func:`edge_rows`, and a row with an all-zero block (d = 0),
    values so small that d is a subnormal float16, and a Q8_K block whose largest magnitude is
    negative and appears twice."""
    mixed = rng.standard_normal(1024)
    mixed[:256] = 0.0
    mixed[256:512] *= 1e-4
    mixed[512:768] = rng.uniform(-1, 1, 256)
    mixed[520] = mixed[700] = -3.0
    return np.array([rng.standard_normal(1024), *edge_rows(rng, 1024), mixed], F32)


@pytest.mark.parametrize("kind", ["Q8_0", "Q8_1"])
def test_q8_0_and_q8_1_match_reference(kind):
    X = activation_rows(np.random.default_rng(1))
    got = quantize_activations(X, kind)
    assert got.kind == kind and got.qs.shape == X.shape and got.d.shape == (4, 32)
    for t, x in enumerate(X):
        qs, d, sums, s = ref_q8_01(x)
        np.testing.assert_array_equal(got.qs[t], qs)
        np.testing.assert_array_equal(got.d[t].view(np.uint32), d.view(np.uint32))
        np.testing.assert_array_equal(got.sums[t], sums)
        want_s = s if kind == "Q8_1" else np.zeros_like(s)
        np.testing.assert_array_equal(got.s[t].view(np.uint32), want_s.view(np.uint32))
    assert np.any(got.d[3] < 2.0**-14) and np.all(got.d[3][:8] == 0)  # subnormal and zero d were met
    assert np.any(c_roundf(X[2]) != np.rint(X[2]))  # the halves tell roundf from rint


def test_q8_K_matches_reference():
    X = activation_rows(np.random.default_rng(2))
    got = quantize_activations(X, "Q8_K")
    assert got.d.shape == (4, 4) and got.sums.shape == (4, 64)
    for t, x in enumerate(X):
        qs, d, bsums = ref_q8_K(x)
        np.testing.assert_array_equal(got.qs[t], qs)
        np.testing.assert_array_equal(got.d[t].view(np.uint32), d.view(np.uint32))
        np.testing.assert_array_equal(got.sums[t], bsums)
    assert got.d[3, 0] == 0 and got.d[3, 2] > 0  # the zero block; the block whose max is -3


def test_one_vector_is_one_row():
    x = np.random.default_rng(3).standard_normal(512).astype(F32)
    one, many = quantize_activations(x, "Q8_K"), quantize_activations(x[None], "Q8_K")
    np.testing.assert_array_equal(one.qs, many.qs)
    np.testing.assert_array_equal(one.d, many.d)


def test_quantizer_rejects_bad_input():
    with pytest.raises(LoomConfigError, match="Q8_0, Q8_1, Q8_K"):
        quantize_activations(np.zeros(32, F32), "Q4_0")
    with pytest.raises(LoomShapeError, match="multiple of 256"):
        quantize_activations(np.zeros(288, F32), "Q8_K")
    with pytest.raises(LoomShapeError, match="multiple of 32"):
        quantize_activations(np.zeros((2, 2, 32), F32), "Q8_0")


# ---------------------------------------------------------------------------------------------
# Products: llama.cpp's ggml_vec_dot formulas in float64.

# weight type -> (activation kind, byte offsets of the f16 super scale d and of the min scale)
DOT = {GT.Q4_0: ("Q8_0", 0, None), GT.Q4_1: ("Q8_1", 0, 2), GT.Q5_0: ("Q8_0", 0, None),
       GT.Q5_1: ("Q8_1", 0, 2), GT.Q8_0: ("Q8_0", 0, None), GT.Q4_K: ("Q8_K", 0, 2),
       GT.Q5_K: ("Q8_K", 0, 2), GT.Q6_K: ("Q8_K", 208, None), GT.Q2_K: ("Q8_K", 80, 82),
       GT.Q3_K: ("Q8_K", 108, None), GT.IQ4_XS: ("Q8_K", 0, None), GT.IQ4_NL: ("Q8_0", 0, None),
       GT.MXFP4: ("Q8_0", None, None)}  # MXFP4's scale: an E8M0 byte (gguf-py's e8m0_to_fp32_half)


def f16_field(blocks: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[:, :, at:at + 2]).view("<f2")[..., 0].astype(F64)


def with_scales(blocks: np.ndarray, ggml_type: GT, values: dict[int, float]) -> np.ndarray:
    """gguf-py's dequantization of a copy of ``blocks`` with the f16 fields at these offsets set."""
    blocks = blocks.copy()
    for at, value in values.items():
        blocks[:, :, at:at + 2] = np.frombuffer(np.float16(value).tobytes(), np.uint8)
    return quants.dequantize(blocks.reshape(blocks.shape[0], -1), ggml_type).astype(F64)


def reference_products(data: np.ndarray, ggml_type: GT, X: np.ndarray):
    """(value, magnitude) [T, rows]: ggml_vec_dot's sum over blocks in float64, and the sum of
    its terms' magnitudes (the error bound's scale)."""
    kind, d_at, m_at = DOT[ggml_type]
    elems, nbytes = GGML_QUANT_SIZES[ggml_type]
    rows = data.shape[0]
    blocks = data.reshape(rows, -1, nbytes)
    nb = blocks.shape[1]
    if ggml_type == GT.MXFP4:  # exponent 128 is a scale of 1
        unit_blocks = blocks.copy()
        unit_blocks[:, :, 0] = 128
        ints = quants.dequantize(unit_blocks.reshape(rows, -1), ggml_type).reshape(rows, nb, elems)
        d_w = quants.MXFP4.e8m0_to_fp32_half(blocks[:, :, 0].astype(np.uint32)).astype(F64)
    else:
        unit = {d_at: 1.0} | ({m_at: 0.0} if m_at is not None else {})
        ints = with_scales(blocks, ggml_type, unit).reshape(rows, nb, elems)  # sub-scale * quant
        d_w = f16_field(blocks, d_at)
    act = quantize_activations(X, kind)
    xq = act.qs.astype(F64).reshape(X.shape[0], nb, elems)
    xd = act.d.astype(F64)
    terms = [np.einsum("rbe,tbe->trb", ints, xq) * d_w[None] * xd[:, None, :]]
    scale = [np.einsum("rbe,tbe->trb", np.abs(ints), np.abs(xq)) * np.abs(d_w[None] * xd[:, None, :])]
    if ggml_type in (GT.Q4_1, GT.Q5_1):  # + m * s, s = fp16(d_x * sum(q_x))
        terms.append(f16_field(blocks, m_at)[None] * act.s.astype(F64)[:, None, :])
    elif ggml_type in (GT.Q2_K, GT.Q4_K, GT.Q5_K):  # - dmin * d_x * sum(min * bsums)
        mins = with_scales(blocks, ggml_type, {d_at: 0.0, m_at: 1.0}).reshape(rows, nb, elems)
        terms.append(np.einsum("rbe,tbe->trb", mins, xq) * f16_field(blocks, m_at)[None] * xd[:, None, :])
    scale += [np.abs(t) for t in terms[1:]]
    return sum(terms).sum(-1), sum(scale).sum(-1)


def assert_llama_close(got: np.ndarray, data: np.ndarray, ggml_type: GT, X: np.ndarray) -> None:
    want, magnitude = reference_products(data, ggml_type, X)
    n_blocks = data.shape[1] // GGML_QUANT_SIZES[ggml_type][1]
    bound = (n_blocks + 4) * 2.0**-24 * magnitude
    assert got.dtype == F32 and got.shape == want.shape
    excess = np.abs(got - want) - bound
    assert excess.max() <= 0, f"worst error exceeds the bound by {excess.max():.3g}"


# 32 and 48 rows: whole tiles of 16, which Q4_0 / Q4_1 / Q8_0 take (quant_int8_tiles)
CASES = [(t, rows, blocks) for t in QUANTIZED for rows, blocks in ((1, 1), (37, 5), (9, 7), (32, 7), (48, 1))]


@pytest.mark.parametrize(("ggml_type", "rows", "n_blocks"), CASES,
                         ids=[f"{t.name}-{r}x{b}blocks" for t, r, b in CASES])
def test_products_match_llama_formula(ggml_type, rows, n_blocks):
    rng = np.random.default_rng(int(ggml_type) * 10 + rows)
    cols = n_blocks * GGML_QUANT_SIZES[ggml_type][0]
    data = random_blocks(ggml_type, rows, cols, rng)
    m = QuantMatrix(data, ggml_type, (rows, cols))
    X = np.array([*rng.standard_normal((3, cols)), *edge_rows(rng, cols)], F32)
    got = int8_matmul(m, X)
    assert_llama_close(got, data, ggml_type, X)
    tiled = ggml_type in (GT.Q4_0, GT.Q4_1, GT.Q8_0) and rows % TILE == 0
    assert (m.int8_rows[0] in TILE_KINDS) == tiled  # the layout this case means to test
    for t in range(X.shape[0]):  # a row alone gets the same bits as among others (1-7 of them:
        # each count of rows takes its own mix of kernels)
        np.testing.assert_array_equal(int8_matvec(m, X[t]).view(np.uint32), got[t].view(np.uint32))
        for k in range(2, 8):
            np.testing.assert_array_equal(int8_matmul(m, X[t:t + k]).view(np.uint32),
                                          got[t:t + k].view(np.uint32))


def test_products_approximate_the_float_product():
    """Not the oracle (that is the formula above), a guard on its scale: 8-bit activations move
    a SmolLM2-sized product by about a percent of its size, not more."""
    rng = np.random.default_rng(5)
    data = random_blocks(GT.Q4_1, 64, 576, rng)
    m = QuantMatrix(data, GT.Q4_1, (64, 576))
    x = rng.standard_normal(576).astype(F32)
    exact = m.matvec(x)
    assert 0 < np.abs(int8_matvec(m, x) - exact).max() < 0.02 * np.abs(exact).max()


def check_real(tensor, rows: int = 96) -> None:
    ggml_type = GT(int(tensor.tensor_type))
    cols = int(tensor.shape[0])
    data = np.ascontiguousarray(tensor.data[:rows])
    m = QuantMatrix(data, ggml_type, (rows, cols))
    X = np.random.default_rng(9).standard_normal((2, cols)).astype(F32)
    assert_llama_close(int8_matmul(m, X), data, ggml_type, X)


@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "token_embd.weight"])
def test_smollm2_tensors(smollm2, name):  # noqa: F811 (a fixture)
    check_real(smollm2[name])


@pytest.mark.parametrize("name", ["blk.0.attn_output.weight", "blk.0.ffn_down.weight", "blk.0.attn_q.weight"])
def test_gemma3_tensors(gemma3, name):  # noqa: F811 (a fixture)
    check_real(gemma3[name])


def test_products_reject_bad_input():
    m = QuantMatrix(random_blocks(GT.Q4_1, 2, 64, np.random.default_rng(0)), GT.Q4_1, (2, 64))
    with pytest.raises(LoomShapeError, match=r"\(T, 64\)"):
        int8_matmul(m, np.zeros((1, 32), F32))
    with pytest.raises(LoomShapeError, match=r"\(64,\)"):
        int8_matvec(m, np.zeros((1, 64), F32))
    plain = QuantMatrix(np.zeros((2, 32), F32), GT.F32, (2, 32))
    with pytest.raises(LoomConfigError, match="F32"):
        int8_matvec(plain, np.zeros(32, F32))


def test_int8_activations_is_a_per_thread_switch():
    assert not int8_enabled()
    with int8_activations():
        assert int8_enabled()
        with int8_activations(False):
            assert not int8_enabled()
        assert int8_enabled()
    assert not int8_enabled()


VNNI_PROBE = """
import re
import numpy as np
from gguf import GGMLQuantizationType as GT
from loomlab.core.llm.kernels.quant import QuantMatrix
from loomlab.core.llm.kernels import quant_int8
from gguf import GGML_QUANT_SIZES
for name in quant_int8.INT8_TYPES:  # one row of each format: the row kernels (no 16-row tiles)
    elems, size = GGML_QUANT_SIZES[GT[name]]
    m = QuantMatrix(np.zeros((1, size), np.uint8), GT[name], (1, elems))
    quant_int8.int8_matvec(m, np.zeros(elems, np.float32))
kernels = list(quant_int8._kernels.values())
asm = "".join(k.inspect_asm(sig) for k in kernels for sig in k.signatures)
print(len(re.findall(r"vpdpbusd", asm)))
"""


def test_llvm_emits_vnni(tmp_path):
    """The point of writing the block dots as LLVM IR: on a CPU with VNNI the kernel multiplies
    with vpdpbusd (numba shows no machine code for a cached kernel, hence a fresh cache)."""
    features = llvm.get_host_cpu_features()
    if not (features.get("avxvnni") or features.get("avx512vnni")):
        pytest.skip("this CPU has no AVX-VNNI / AVX512-VNNI")
    done = subprocess.run([sys.executable, "-c", VNNI_PROBE], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}, check=True)
    # one per block dot in the compiled kernel: Q4_0/Q4_1, Q5_0/Q5_1, Q8_0, Q4_K's two, Q6_K's four
    assert int(done.stdout.split()[-1]) >= 9


GENERIC_PROBE = """
import sys
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GT
from loomlab.core.llm.kernels import quant_int8
from loomlab.core.llm.kernels.quant import QuantMatrix
from loomlab.core.llm.kernels import quant_int8_rows
assert not quant_int8_rows.host_has_vnni()
with np.load(sys.argv[1]) as f:
    cases = dict(f)
out = {}
for name in sys.argv[3:]:
    data, X = cases[name + "_data"], cases[name + "_X"]
    ggml_type = GT[name.split("-")[0]]
    elems, nbytes = GGML_QUANT_SIZES[ggml_type]
    cols = data.shape[1] // nbytes * elems
    out[name] = quant_int8.int8_matmul(QuantMatrix(data, ggml_type, (data.shape[0], cols)), X)
np.savez(sys.argv[2], **out)
"""


def test_row_dots_without_vnni_match_llama_formula(tmp_path, monkeypatch):
    """The whole-row and tile dots' portable code (no VNNI, no F16C: products summed to lanes
    and halves widened in plain IR), compiled for a generic x86 CPU in a fresh process (in this
    one where the CPU has no VNNI and so runs that code already), against the same formula: 37
    rows take the row layout, 48 (whole tiles) Q4_0 / Q4_1 / Q8_0's tiles."""
    rng = np.random.default_rng(5)
    cases = {}
    formats = (GT.Q4_0, GT.Q4_1, GT.Q5_0, GT.Q5_1, GT.Q8_0, GT.Q2_K, GT.Q3_K, GT.Q4_K, GT.Q5_K, GT.Q6_K,
               GT.IQ4_XS, GT.IQ4_NL, GT.MXFP4)
    names = []
    for ggml_type in formats:
        cols = 7 * 32 if GGML_QUANT_SIZES[ggml_type][0] == 32 else 2 * 256  # groups of 4, 2 and 1 blocks
        for rows in (37, 48):
            name = f"{ggml_type.name}-{rows}"
            cases[f"{name}_data"] = random_blocks(ggml_type, rows, cols, rng)
            cases[f"{name}_X"] = np.array([*rng.standard_normal((3, cols)), *edge_rows(rng, cols)], F32)
            names.append((name, ggml_type))
    np.savez(tmp_path / "in.npz", **cases)
    argv = [str(tmp_path / "in.npz"), str(tmp_path / "out.npz"), *(name for name, _ in names)]
    if quant_int8_rows.host_has_vnni():
        env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_CPU_NAME": "generic"}
        subprocess.run([sys.executable, "-c", GENERIC_PROBE, *argv], env=env, check=True,
                       timeout=900)  # compiling every kernel's portable IR: ~5 min on a 2-core CI machine
    else:  # this CPU runs the portable code itself (and has compiled it already): the probe in process
        monkeypatch.setattr(sys, "argv", ["probe", *argv])
        exec(GENERIC_PROBE, {})
    with np.load(tmp_path / "out.npz") as got:
        for name, ggml_type in names:
            assert_llama_close(got[name], cases[f"{name}_data"], ggml_type, cases[f"{name}_X"])


def test_table_lookups_without_avx2_match_llama_formula(tmp_path):
    """IQ4_XS's and IQ4_NL's nibble-to-value lookups as chains of selects (no vpshufb; IQ4_NL's
    rows of 7 blocks take groups of 4, 2 and 1: 64, 32 and 16 lanes), compiled for a generic x86
    CPU in a fresh process, against the formula."""
    rng = np.random.default_rng(6)
    cases = {GT.IQ4_XS: 512, GT.IQ4_NL: 7 * 32}
    arrays = {}
    for ggml_type, cols in cases.items():
        arrays[f"{ggml_type.name}-21_data"] = random_blocks(ggml_type, 21, cols, rng)
        rows_x = [*rng.standard_normal((3, cols)), *edge_rows(rng, cols)]
        arrays[f"{ggml_type.name}-21_X"] = np.array(rows_x, F32)
    np.savez(tmp_path / "in.npz", **arrays)
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"), "NUMBA_CPU_NAME": "generic"}
    subprocess.run([sys.executable, "-c", GENERIC_PROBE, str(tmp_path / "in.npz"), str(tmp_path / "out.npz"),
                    *(f"{t.name}-21" for t in cases)], env=env, check=True, timeout=900)
    with np.load(tmp_path / "out.npz") as got:
        for ggml_type in cases:
            name = f"{ggml_type.name}-21"
            assert_llama_close(got[name], arrays[f"{name}_data"], ggml_type, arrays[f"{name}_X"])


def test_fp16_round_is_the_float16_conversion():
    """The activation scales' rounding, in integer operations, against numpy's float16
    conversion (round half to even): every exponent from below fp16's subnormals to beyond its
    largest value, exact ties, both signs, zeros and the overflow edge at 65520."""
    from numba import njit

    from loomlab.core.llm.kernels.quant_int8_rows import fp16_round

    rounded = njit(lambda v: fp16_round(v))
    rng = np.random.default_rng(3)
    values = [np.float32(m * 2.0**e) for e in range(-30, 18) for m in rng.uniform(1, 2, 40)]
    ties = [np.float32((2 * k + 1) * 2.0**-11 * 2.0**e)  # halfway between two float16 values
            for e in (-20, -14, -3, 0, 7) for k in range(1024, 1100)]
    edges = [0.0, -0.0, 2.0**-25, 2.0**-24, 1.5 * 2.0**-24, 2.0**-14, 65504.0, 65519.0, 65520.0, 1e30]
    for v in (*values, *ties, *np.float32(edges)):
        for x in (np.float32(v), np.float32(-v)):
            with np.errstate(over="ignore"):  # beyond 65504 the conversion gives inf, as wanted
                want = np.float32(np.float16(x))
            got = np.float32(rounded(x))
            assert got.view(np.uint32) == want.view(np.uint32), (x, got, want)


def test_parallel_chunks_are_whole_tiles():
    """The products hand each parallel work item ROW_CHUNK rows and the fused step's pieces are
    multiples of it; a tiled matrix's kernel takes whole tiles only."""
    assert ROW_CHUNK % TILE == 0


def test_products_of_several_matrices_equal_each_alone():
    """int8_products runs the rows of several matrices with one quantization of X per kind of
    activations, in one parallel loop: each result has the bits of that matrix's own call."""
    from loomlab.core.llm.kernels.quant_int8 import int8_products

    rng = np.random.default_rng(11)
    cols = 512
    matrices = [QuantMatrix(random_blocks(t, rows, cols, rng), t, (rows, cols))
                for t, rows in ((GT.Q4_1, 37), (GT.Q4_K, 20), (GT.Q8_0, 3), (GT.Q6_K, 16), (GT.Q5_0, 50))]
    for T in (1, 6):
        X = rng.standard_normal((T, cols)).astype(F32)
        together = int8_products(matrices, X)
        for m, got in zip(matrices, together, strict=True):
            np.testing.assert_array_equal(got.view(np.uint32), int8_matmul(m, X).view(np.uint32))
            assert_llama_close(got, m.raw_blocks, GT(m.ggml_type), X)


def test_product_functions_are_keyed_by_the_families_sources(tmp_path, monkeypatch):
    """numba keys a cached function by its own file and its captured values: each product
    function captures a stamp of the three families' sources, which an edit of one changes."""
    import hashlib
    from pathlib import Path

    from loomlab.core.llm.kernels import quant_int8_products as products

    for kind in range(products.KINDS):
        captured = sorted(c.cell_contents for c in products.product_function(kind).__closure__)
        assert captured == sorted([kind, products.FAMILIES])
    families = (quant_int8_rows, products.quant_int8_tiles, products.quant_int8_superblocks)
    digest = hashlib.sha256(b"".join(Path(m.__file__).read_bytes() for m in families))
    assert products.FAMILIES == int.from_bytes(digest.digest()[:7], "little")
    edited = tmp_path / "quant_int8_rows.py"
    edited.write_bytes(Path(quant_int8_rows.__file__).read_bytes() + b"\n# an edit\n")
    monkeypatch.setattr(quant_int8_rows, "__file__", str(edited))
    assert products.families_stamp() != products.FAMILIES
