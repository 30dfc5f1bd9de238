"""Split GGUF models as gguf-py's writer splits them (``convert_hf_to_gguf.py --split-max-tensors``,
the format of llama.cpp's ``gguf-split``): one model, whichever part is named; a missing or foreign
part refused naming it; listed once, sized as all its parts. Oracle: the same model in one file."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from loomlab.core.errors import ModelFormatError
from loomlab.core.llm.files.discovery import discover
from loomlab.core.llm.files.gguf_splits import open_model_gguf
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.model.model_info import describe
from loomlab.core.llm.quality.gguf_export import export_gguf
from tests.core.llm.model.test_architectures import write_gguf

IDS = np.array([[1, 17, 42, 99, 3, 250, 7, 7]])


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The tiny llama as one file and split into files of 12 tensors (3 parts)."""
    folder = tmp_path_factory.mktemp("split")
    for sub in ("single", "parts"):
        (folder / sub).mkdir()
    single = write_gguf(folder / "single" / "tiny.gguf", "tiny-llama", "llama")
    write_gguf(folder / "parts" / "tiny.gguf", "tiny-llama", "llama", split_max_tensors=12)
    return single, sorted((folder / "parts").iterdir())


def test_the_parts_are_named_and_keyed_as_llama_cpp_splits(models):
    _, parts = models
    assert [p.name for p in parts] == [f"tiny-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    with open_model_gguf(parts[0]) as one, open_model_gguf(models[0]) as whole:
        assert one.tensors.keys() == whole.tensors.keys()
        assert one.model_bytes == sum(p.stat().st_size for p in parts)
        assert [p.metadata["split.no"] for p in one.parts] == [1, 2]


@pytest.mark.parametrize("part", [0, 2])
def test_a_split_model_from_any_part_computes_what_the_single_file_does(models, part):
    single, parts = models
    expected = load_causal_lm(single).forward(IDS)
    np.testing.assert_array_equal(load_causal_lm(parts[part]).forward(IDS), expected)


def test_its_size_listing_and_export_cover_every_part(models, tmp_path):
    single, parts = models
    info = describe(parts[1])
    assert info.file_bytes == sum(p.stat().st_size for p in parts)
    (entry,) = discover([parts[0].parent], include_defaults=False, include_builtins=False)
    assert (entry.name, entry.path, entry.size, entry.problem) == ("tiny", parts[0], info.file_bytes, "")
    out = tmp_path / "merged.gguf"
    export_gguf(SimpleNamespace(net=load_causal_lm(parts[0]), name="tiny"), out)
    with open_model_gguf(out) as merged:
        assert not any(key.startswith("split.") for key in merged.metadata) and not merged.parts
    np.testing.assert_array_equal(load_causal_lm(out).forward(IDS), load_causal_lm(single).forward(IDS))


def test_a_missing_part_is_named_when_loading_and_listing(models, tmp_path):
    _, parts = models
    for p in parts[::2]:
        (tmp_path / p.name).symlink_to(p)
    with pytest.raises(ModelFormatError, match="part 2 of 3 is missing: tiny-00002-of-00003.gguf"):
        load_causal_lm(tmp_path / parts[0].name)
    (entry,) = discover([tmp_path], include_defaults=False, include_builtins=False)
    assert entry.problem == "part 2 of 3 is missing: tiny-00002-of-00003.gguf"


def test_a_part_of_another_split_model_is_refused(models, tmp_path):
    _, parts = models
    (tmp_path / "other").mkdir()
    other = write_gguf(tmp_path / "other" / "tiny.gguf", "tiny-llama", "llama", split_max_tensors=20)
    for p in parts:
        (tmp_path / p.name).symlink_to(p)
    (tmp_path / parts[1].name).unlink()
    (tmp_path / parts[1].name).symlink_to(sorted(other.parent.iterdir())[1])  # part 2 of 2
    with pytest.raises(ModelFormatError, match="tiny-00002-of-00003.gguf: split.count.*2, expected 3"):
        load_causal_lm(tmp_path / parts[0].name)
