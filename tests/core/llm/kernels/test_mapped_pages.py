"""mapped_pages: a repacked matrix's pages of the mapped model file are given back, the file's bytes
stay readable, and memory that is not a registered mapping is never touched (oracle: the kernel's
own count of the mapping's resident pages, /proc/self/smaps)."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

from loomlab.core.llm.files.mapped import MappedFile
from loomlab.core.llm.kernels import mapped_pages

pytestmark = pytest.mark.skipif(not Path("/proc/self/smaps").exists() or not hasattr(mmap, "MADV_DONTNEED"),
                                reason="needs Linux's /proc/self/smaps and madvise")
MiB = 2**20


def _resident(path: Path, address: int | None = None) -> int:
    """Bytes of ``path``'s mappings resident in this process (only the one holding ``address``
    when given: another model of the same file may be open in this process)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and len(head) >= 5:  # a mapping's first line
            lo, hi = (int(x, 16) for x in head[0].split("-"))
            inside = len(head) >= 6 and head[-1] == str(path) and (address is None or lo <= address < hi)
        elif inside and head[0] == "Rss:":
            total += int(head[1]) * 1024
    return total


@pytest.fixture
def mapped(tmp_path):
    path = (tmp_path / "weights.bin").resolve()
    data = np.random.default_rng(0).integers(0, 256, 24 * MiB, dtype=np.uint8)
    path.write_bytes(data.tobytes())
    with path.open("rb") as f:
        mf = MappedFile(path, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    yield path, mf, data
    mf.close()


def test_releasing_a_view_gives_its_pages_back_and_keeps_its_bytes(mapped):
    path, mf, data = mapped
    view = mf.bytes()[4 * MiB + 100:20 * MiB + 7]  # not page-aligned at either end
    assert int(view.sum(dtype=np.int64)) == int(data[4 * MiB + 100:20 * MiB + 7].sum(dtype=np.int64))
    before = _resident(path)
    assert before >= 16 * MiB
    assert mapped_pages.release(view)
    assert _resident(path) <= before - 15 * MiB
    np.testing.assert_array_equal(view, data[4 * MiB + 100:20 * MiB + 7])  # read again from the file


def test_memory_outside_a_registered_mapping_is_left_alone(mapped):
    path, mf, data = mapped
    anonymous = data.copy()
    assert not mapped_pages.release(anonymous)
    np.testing.assert_array_equal(anonymous, data)
    mf.bytes()
    mf.close()  # forgotten: its pages are no longer this module's to drop
    with path.open("rb") as f:
        other = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
    assert not mapped_pages.release(other)


def test_a_model_decoding_with_8_bit_activations_holds_its_weights_once(smollm2):
    """After a reply in the default mode the file's mapping is resident for its metadata (1.7 MB:
    the tokenizer), the small float tensors and the embedding rows read, each with the pages the
    kernel maps around a fault (~10 MB of 98 measured; every page before the release): every
    matrix lives in its repacked rows only."""
    list(smollm2.generate("The capital of France is", max_tokens=4))
    path = Path(smollm2.net.source.path).resolve()
    table = smollm2.net.cells[-1].weights.current("float32")["weight"].raw_blocks  # a view of the mapping
    assert _resident(path, table.ctypes.data) < 0.15 * path.stat().st_size


@pytest.mark.parametrize("name", ["Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_0"])
def test_a_matrix_repacked_in_parts_has_the_bytes_of_one_repacking(name, monkeypatch):
    """Oracle: the same matrix repacked whole (parts of 2 tiles' rows against one part)."""
    from gguf import GGML_QUANT_SIZES
    from gguf import GGMLQuantizationType as GT

    from loomlab.core.llm.kernels import quant_int8
    from loomlab.core.llm.kernels.quant import QuantMatrix

    elems, size = GGML_QUANT_SIZES[GT[name]]
    raw = np.random.default_rng(1).integers(0, 256, (80, 4 * size), dtype=np.uint8)
    whole, parts = (QuantMatrix(raw, GT[name], (80, 4 * elems)) for _ in range(2))
    expected = quant_int8.repacked(whole)
    monkeypatch.setattr(quant_int8, "REPACK_ROWS_BYTES", 2 * 16 * raw.shape[1])  # 3 parts of 32, 32, 16 rows
    got = quant_int8.repacked(parts)
    assert got[0] == expected[0]
    np.testing.assert_array_equal(got[1], expected[1])
