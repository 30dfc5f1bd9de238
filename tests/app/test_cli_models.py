"""``loomlab models list``, ``fetch`` and ``info``, and what every command says of an unknown model."""

from __future__ import annotations

import json
import struct

import pytest

from loomlab.app.cli import main
from loomlab.core.errors import ModelNotFoundError
from loomlab.core.llm.files import registry
from loomlab.core.llm.files.discovery import resolve


def _gguf_header(tensors: int = 0, kvs: int = 0) -> bytes:
    return struct.pack("<4sIQQ", b"GGUF", 3, tensors, kvs)


def test_models_list_shows_builtins_and_folder_models(tmp_path, capsys):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "x.gguf").write_bytes(_gguf_header().ljust(64, b"\0"))
    assert main(["models", "list", str(tmp_path / "m"), "--no-defaults", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows][:2] == ["smollm2-135m", "gemma3-270m"]
    assert rows[-1]["name"] == "x" and rows[-1]["size"] == 64 and rows[-1]["source"] == "folder"
    assert rows[-1]["problem"] == ""


def test_models_list_puts_files_that_are_not_models_apart_with_the_reason(tmp_path, capsys):
    (tmp_path / "empty.gguf").write_bytes(b"")
    (tmp_path / "fake.gguf").write_bytes(bytes(range(256)) * 16)
    (tmp_path / "real.gguf").write_bytes(_gguf_header().ljust(64, b"\0"))
    assert main(["models", "list", str(tmp_path), "--no-defaults"]) == 0
    out = capsys.readouterr().out
    table, rejected = out.split("\ncannot load (2):\n")
    assert "real" in table and "empty" not in table and "fake" not in table
    real = next(line for line in table.splitlines() if line.startswith("real "))
    assert " 64 B " in real  # the size in the unit every panel uses (not "0.0 MiB")
    assert rejected.splitlines() == [
        f"  {tmp_path / 'empty.gguf'}: not a GGUF model: header at byte 0: file has 0 bytes; "
        "a GGUF header needs 24",
        f"  {tmp_path / 'fake.gguf'}: not a GGUF model: magic at byte 0: expected b'GGUF', "
        "found b'\\x00\\x01\\x02\\x03': not a GGUF file"]
    assert main(["models", "list", str(tmp_path), "--no-defaults", "--json"]) == 0
    problems = {r["name"]: r["problem"] for r in json.loads(capsys.readouterr().out)}
    assert problems["real"] == "" and problems["empty"] and problems["fake"]


def test_models_list_of_a_folder_that_does_not_exist_fails_naming_it(tmp_path, capsys):
    missing = tmp_path / "nowhere"
    assert main(["models", "list", str(tmp_path), str(missing)]) == 2
    err = capsys.readouterr().err
    assert err == f"loomlab: error: {missing}: no such file or folder to search for models\n"


@pytest.fixture
def empty_home(tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMLAB_CACHE", str(registry.cache_dir()))  # the built-ins stay where they are
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("HF_HOME", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)


def test_an_unknown_model_name_gets_one_message_from_every_command(empty_home, capsys):
    with pytest.raises(ModelNotFoundError) as err:
        resolve("smollm3")
    expected = f"loomlab: error: {err.value}\n"
    for argv in (["models", "info", "smollm3"], ["models", "fetch", "smollm3"],
                 ["generate", "smollm3", "--prompt", "hi"], ["chat", "smollm3", "--message", "hi"],
                 ["tokenize", "smollm3", "hi"], ["bench", "smollm3"]):
        assert main(argv) == 2, argv
        assert capsys.readouterr().err == expected, argv
    assert "smollm2-135m, gemma3-270m" in expected and "~/.lmstudio/models" in expected


def test_models_fetch_of_a_local_file_says_only_builtins_are_fetched(tmp_path, capsys):
    local = tmp_path / "mine.gguf"
    local.write_bytes(_gguf_header())
    assert main(["models", "fetch", str(local)]) == 2
    assert capsys.readouterr().err == (f"loomlab: error: {local} is {local}, not a built-in model: only "
                                       "built-ins are fetched (smollm2-135m, gemma3-270m)\n")


def test_models_info_of_a_broken_file_names_it(tmp_path, capsys):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(bytes(64))
    assert main(["models", "info", str(fake)]) == 2
    assert capsys.readouterr().err == (f"loomlab: error: {fake}: magic at byte 0: expected b'GGUF', "
                                       "found b'\\x00\\x00\\x00\\x00': not a GGUF file\n")


def test_models_fetch_prints_the_path_and_unknown_alias_fails(capsys):
    assert main(["models", "fetch", "smollm2-135m"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == str(registry.model_path("smollm2-135m")) and registry.is_fetched("smollm2-135m")


def test_models_info_of_the_builtin_gguf(capsys):
    assert main(["models", "info", "smollm2-135m", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    # FACTS.md: llama, 30 blocks, d=576, 9/3 heads, head dim 64, vocab 49152, Q4_1 + Q8_0 + F32
    assert (info["architecture"], info["blocks"], info["hidden_size"], info["heads"], info["kv_heads"],
            info["head_dim"], info["vocab_size"]) == ("llama", 30, 576, 9, 3, 64, 49152)
    assert info["tensor_types"] == {"Q4_1": 210, "F32": 61, "Q8_0": 1} and info["chat_template"] is True
    assert info["kv_cache_bytes"] == 2 * 30 * info["context_length"] * 3 * 64 * 4
    assert info["estimated_memory"] == info["file_bytes"] + info["kv_cache_bytes"]
    assert info["file_bytes"] == registry.BUILTINS["smollm2-135m"].size


def test_models_info_of_an_hf_folder_and_errors(capsys):
    from pathlib import Path

    folder = Path(__file__).resolve().parent.parent / "data" / "tiny-hf" / "tiny-qwen2"
    assert main(["models", "info", str(folder), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    config = json.loads((folder / "config.json").read_text())
    assert info["format"] == "hf" and info["architecture"] == "qwen2"
    assert info["blocks"] == config["num_hidden_layers"] and info["tensor_types"] == {"BF16": 38}
    assert main(["models", "info", "/nonexistent/model.gguf"]) == 2
    assert "no model '/nonexistent/model.gguf': not a built-in" in capsys.readouterr().err


SIZES = ["hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size", "max_position_embeddings",
         "head_dim"]


def _tiny_llama(folder, **changes):
    import shutil
    from pathlib import Path

    tiny = Path(__file__).resolve().parent.parent / "data" / "tiny-hf" / "tiny-llama"
    config = {**json.loads((tiny / "config.json").read_text()), **changes}
    (folder / "config.json").write_text(json.dumps(config))
    shutil.copyfile(tiny / "model.safetensors", folder / "model.safetensors")
    return folder


@pytest.mark.parametrize("value", [[64], {"n": 64}, "64", 64.5], ids=["list", "object", "string", "float"])
@pytest.mark.parametrize("key", SIZES)
def test_models_info_refuses_a_size_of_the_wrong_type_as_loading_does(tmp_path, capsys, key, value):
    from loomlab.core.errors import ModelFormatError
    from loomlab.core.llm.model.loader import load_causal_lm

    folder = _tiny_llama(tmp_path, **{key: value})
    with pytest.raises(ModelFormatError) as loading:
        load_causal_lm(folder)
    assert main(["models", "info", str(folder)]) == 2
    assert capsys.readouterr().err == f"loomlab: error: {folder}: {loading.value}\n"
    assert str(loading.value) == f"config.json:{key}: expected int, got {type(value).__name__}"


@pytest.mark.parametrize("key", SIZES)
def test_models_info_of_a_null_size_reads_it_as_absent_as_loading_does(tmp_path, capsys, key):
    folder = _tiny_llama(tmp_path, **{key: None})
    code = main(["models", "info", str(folder), "--json"])
    out, err = capsys.readouterr()
    err = err.replace(str(folder), "DIR")
    if key in ("hidden_size", "num_attention_heads", "num_hidden_layers"):
        assert (code, err) == (2, f"loomlab: error: DIR: config.json:{key}: required setting is missing\n")
        return
    assert code == 0
    info = json.loads(out)
    # absent: the vocabulary comes from the embedding table, the context is generate's 2048, the
    # head size is the width over the heads
    expected = {"vocab_size": 0, "max_position_embeddings": 2048, "head_dim": 64 // 4}[key]
    assert info[{"max_position_embeddings": "context_length"}.get(key, key)] == expected


def test_models_info_refuses_a_layer_count_below_the_blocks_present(tmp_path, capsys):
    folder = _tiny_llama(tmp_path, num_hidden_layers=2)
    assert main(["models", "info", str(folder)]) == 2
    assert capsys.readouterr().err == (f"loomlab: error: {folder}: config.json:num_hidden_layers: the model "
                                       "has 3 blocks of tensors but num_hidden_layers says 2\n")


def test_models_info_of_an_architecture_it_cannot_run_reads_the_common_sizes_typed(tmp_path, capsys):
    import gguf

    def write(block_count, vtype):
        path = tmp_path / "deepseek2.gguf"
        writer = gguf.GGUFWriter(str(path), "deepseek2")
        writer.add_key_value("deepseek2.block_count", block_count, vtype)
        writer.add_embedding_length(96)
        writer.add_head_count(4)
        writer.add_token_list(["a", "b", "c"])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    path = write(2, gguf.GGUFValueType.UINT32)
    assert main(["models", "info", str(path), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    sizes = ("blocks", "hidden_size", "heads", "kv_heads", "head_dim", "context_length", "vocab_size")
    assert (info["architecture"], *(info[k] for k in sizes)) == ("deepseek2", 2, 96, 4, 4, 24, 0, 3)
    path = write("2", gguf.GGUFValueType.STRING)
    assert main(["models", "info", str(path)]) == 2
    at = 24 + 8 + len("general.architecture") + 4 + 8 + len("deepseek2")  # the header, the first pair
    assert capsys.readouterr().err.endswith(f": deepseek2.block_count at byte {at}: expected int, got str\n")
