"""Model discovery in user folders, the HF hub cache layout and LM Studio's layout."""

from __future__ import annotations

import json
import os
import struct
import time
import tracemalloc
from pathlib import Path

import gguf
import pytest

from loomlab.core.errors import LoomConfigError, ModelFormatError, ModelNotFoundError
from loomlab.core.llm.files import architectures, discovery, registry
from loomlab.core.llm.files.discovery import discover, resolve
from loomlab.core.llm.files.gguf_file import open_gguf


def _gguf(path, size=32):
    """A GGUF file with a valid header (version 3, no tensors, no metadata), padded to ``size``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 0).ljust(size, b"\0"))


def _hf(folder, shards=False):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    if shards:
        (folder / "model.safetensors.index.json").write_text("{}")
        (folder / "model-00001-of-00002.safetensors").write_bytes(b"x" * 10)
        (folder / "model-00002-of-00002.safetensors").write_bytes(b"x" * 5)
    else:
        (folder / "model.safetensors").write_bytes(b"x" * 7)


def test_flat_nested_and_symlinked_layouts(tmp_path):
    root = tmp_path / "models"
    _gguf(root / "a.gguf", 40)
    _gguf(root / "deep" / "er" / "b.GGUF")
    _hf(root / "tiny", shards=True)
    (root / "loop").symlink_to(root, target_is_directory=True)  # a symlink loop
    outside = tmp_path / "elsewhere"
    _gguf(outside / "c.gguf")
    (root / "link").symlink_to(outside, target_is_directory=True)
    found = discover([root], include_defaults=False, include_builtins=False)
    by_name = {e.name: e for e in found}
    assert sorted(by_name) == ["a", "b", "c", "tiny"]
    assert by_name["a"].size == 40 and by_name["a"].kind == "gguf" and by_name["a"].source == "folder"
    assert by_name["tiny"].kind == "hf" and by_name["tiny"].size == 15
    assert len(found) == 4  # the loop and the second route to each file add nothing


def test_hf_hub_cache_and_lmstudio_layouts(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("HF_HOME", raising=False)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    snap = tmp_path / ".cache/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M/snapshots/abc123"
    _hf(snap)
    _gguf(tmp_path / ".lmstudio/models/lmstudio-community/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_K_M.gguf")
    found = discover(include_builtins=False)
    assert [(e.name, e.source, e.kind) for e in found] == [
        ("HuggingFaceTB/SmolLM2-135M", "hf-cache", "hf"), ("Qwen3-0.6B-Q4_K_M", "lmstudio", "gguf")]


def test_builtins_are_listed_first_with_their_fetch_state(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMLAB_CACHE", str(tmp_path))
    found = discover(include_defaults=False)
    assert [e.name for e in found] == ["smollm2-135m", "gemma3-270m"]
    assert not any(e.fetched for e in found)
    assert os.listdir(tmp_path) == []


# What a folder may hold that is named like a model but is not one, and why not. The oracle for
# the GGUF cases is the full reader: the listing's header check must refuse what it refuses.
NOT_GGUF = {
    "empty.gguf": b"",
    "fake.gguf": bytes(range(256)) * 4,  # random-looking bytes
    "short.gguf": b"GGUF\x03\x00\x00\x00\x05",  # a header cut short
    "v9.gguf": struct.pack("<4sIQQ", b"GGUF", 9, 0, 0),
    "bomb.gguf": struct.pack("<4sIQQ", b"GGUF", 3, 1 << 62, 0),  # more tensors than bytes
}


def test_files_named_like_models_that_are_not_are_listed_with_the_reason(tmp_path):
    for name, data in NOT_GGUF.items():
        (tmp_path / name).write_bytes(data)
    _gguf(tmp_path / "good.gguf")
    bad_hf = tmp_path / "bad-hf"
    _hf(bad_hf)
    (bad_hf / "config.json").write_text("{not json")
    no_type = tmp_path / "no-type"
    _hf(no_type)
    (no_type / "config.json").write_text("{}")
    found = {e.path.name: e for e in discover([tmp_path], include_defaults=False, include_builtins=False)}
    assert found["good.gguf"].problem == ""
    for name in NOT_GGUF:
        with pytest.raises(ModelFormatError) as err:
            open_gguf(tmp_path / name).close()
        assert found[name].problem == f"not a GGUF model: {err.value}"
    assert found["empty.gguf"].problem.endswith("file has 0 bytes; a GGUF header needs 24")
    assert "expected b'GGUF'" in found["fake.gguf"].problem
    assert found["bad-hf"].problem.startswith("config.json is not JSON")
    assert found["no-type"].problem == "config.json has no model_type"


def test_models_of_an_architecture_this_build_cannot_run_are_listed_with_the_reason(tmp_path):
    """The architecture is read from the GGUF's first metadata pair (gguf-py writes it first) and
    from config.json; a file whose first pair is another key passes the cheap check."""
    for arch in ("deepseek2", "llama"):
        writer = gguf.GGUFWriter(str(tmp_path / f"{arch}.gguf"), arch)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.close()
        _hf(tmp_path / f"hf-{arch}")
        (tmp_path / f"hf-{arch}" / "config.json").write_text(json.dumps({"model_type": arch}))
    other_first = tmp_path / "other-first.gguf"
    key, value = b"general.name", b"x"
    other_first.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", len(key)) + key
                            + struct.pack("<IQ", 8, len(value)) + value)
    found = {e.path.name: e.problem
             for e in discover([tmp_path], include_defaults=False, include_builtins=False)}
    supported = ", ".join(sorted(architectures.SUPPORTED))
    reason = f"architecture 'deepseek2' is not supported (supported: {supported})"
    assert found == {"deepseek2.gguf": reason, "hf-deepseek2": reason, "llama.gguf": "", "hf-llama": "",
                     "other-first.gguf": ""}


def test_an_hf_config_that_is_no_small_regular_file_is_listed_with_the_reason_at_once(tmp_path):
    """A FIFO blocked the listing, /dev/zero filled the memory, deep nesting raised RecursionError
    out of it, a huge file was read whole: the config is read as the loader reads it."""
    cases = {"fifo": os.mkfifo, "device": lambda p: p.symlink_to("/dev/zero"),
             "deep": lambda p: p.write_text("[" * 100_000 + "]" * 100_000),
             "huge": lambda p: p.write_text(json.dumps({"model_type": "llama", "pad": " " * (16 << 20)}))}
    for name, make in cases.items():
        _hf(tmp_path / name)
        (tmp_path / name / "config.json").unlink()
        make(tmp_path / name / "config.json")
        (tmp_path / name / "model.safetensors").write_bytes(b"")
    found = raises_nothing_quickly_and_small(
        lambda: {e.path.name: e.problem for e in discover([tmp_path], include_defaults=False,
                                                          include_builtins=False)})
    for name in ("fifo", "device"):
        assert found[name] == f"config.json {tmp_path / name / 'config.json'} is not a regular file"
    assert found["deep"] == "config.json is nested too deeply"
    assert found["huge"].endswith(f"bytes; the limit is {16 << 20:,}")


def raises_nothing_quickly_and_small(call):
    tracemalloc.start()
    start = time.perf_counter()
    try:
        result = call()
        elapsed, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 2 and peak < 40e6, (elapsed, peak)  # a read reserves the 16 MiB it may take
    return result


def test_the_header_check_reads_no_metadata(tmp_path):
    # a valid header followed by garbage metadata passes the cheap check; the full reader refuses it
    path = tmp_path / "m.gguf"
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + b"\xff" * 64)
    (entry,) = discover([path], include_defaults=False, include_builtins=False)
    assert entry.problem == ""
    with pytest.raises(ModelFormatError):
        open_gguf(path)


@pytest.fixture
def home(tmp_path, monkeypatch):
    """An empty home: the default folders are under it (the built-ins stay in the real cache)."""
    monkeypatch.setenv("LOOMLAB_CACHE", str(registry.cache_dir()))
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_resolve_a_builtin_an_existing_path_and_a_listed_name(home, monkeypatch):
    assert resolve("smollm2-135m") == registry.model_path("smollm2-135m")
    assert registry.is_fetched("smollm2-135m")
    snap = home / ".cache/huggingface/hub/models--HuggingFaceTB--SmolLM2-135M/snapshots/abc123"
    _hf(snap)
    lm = home / ".lmstudio/models/lmstudio-community/Qwen3-0.6B-GGUF/Qwen3-0.6B-Q4_K_M.gguf"
    _gguf(lm)
    assert resolve("HuggingFaceTB/SmolLM2-135M") == snap
    assert resolve("Qwen3-0.6B-Q4_K_M") == lm
    assert resolve(str(lm)) == lm
    monkeypatch.chdir(lm.parent)
    assert resolve(lm.name) == Path(lm.name)  # a relative path is a path first
    assert resolve("~/.lmstudio") == home / ".lmstudio"


def test_an_unknown_name_names_the_builtins_and_the_folders_searched(home):
    with pytest.raises(ModelNotFoundError) as err:
        resolve("smollm3")
    folders = ["~/.cache/huggingface/hub", "~/.lmstudio/models", "~/.cache/lm-studio/models"]
    assert err.value.searched == folders and err.value.builtins == list(registry.BUILTINS)
    assert str(err.value) == ("no model 'smollm3': not a built-in (smollm2-135m, gemma3-270m), no file or "
                              f"folder of that name, and no model of that name in {', '.join(folders)}; "
                              "`loomlab models list` shows the models found")
    # fetching by alias is asked about the built-ins alone, in the same words for them
    with pytest.raises(ModelNotFoundError, match=r"no built-in model 'smollm3'; built-in: smollm2-135m, gem"):
        registry.fetch("smollm3")


def test_a_name_two_models_share_is_refused_naming_both(home):
    a = home / ".lmstudio/models/a/twin.gguf"
    b = home / ".cache/lm-studio/models/b/twin.gguf"
    _gguf(a)
    _gguf(b)
    with pytest.raises(LoomConfigError, match="2 models are named 'twin'") as err:
        resolve("twin")
    assert str(a) in str(err.value) and str(b) in str(err.value)


def test_load_model_goes_through_the_resolver_and_is_exported(home):
    from loomlab.core import llm
    from loomlab.core.llm.generate import textmodel

    assert llm.load_model is textmodel.load_model and llm.TextModel is textmodel.TextModel
    with pytest.raises(ModelNotFoundError, match="no model 'no-such-model'"):
        llm.load_model("no-such-model")
    with pytest.raises(AttributeError):
        llm.no_such_name  # noqa: B018


def test_errors_about_a_model_file_name_it(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(bytes(64))
    with pytest.raises(ModelFormatError) as err:
        open_gguf(path)
    named = discovery.in_file(err.value, path)
    assert str(named) == f"{path}: {err.value}" and named.offset == err.value.offset == 0
    assert discovery.in_file(named, path) is named  # already named: left alone
