"""The tokenizer in a child process answers exactly as the in-process one (transformers' ids from
tests/data/llm as well), passes typed errors back, and never hangs on a dead or stuck child."""

from __future__ import annotations

import os
import signal
import struct

import numpy as np
import pytest

from loomlab.core import pipe_messages
from loomlab.core.errors import EngineProcessError, LoomConfigError, ModelFormatError
from loomlab.core.llm.files import registry
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.llm.text import tokenizer_process
from loomlab.core.llm.text.tokenizer_process import TokenizerProcess

from .test_tokenizer import EXTRA_TEXTS, MODELS, cases, gguf_tokenizer, tiny_tokenizer_json


@pytest.fixture(scope="module", params=MODELS)
def pair(request):
    child = TokenizerProcess(registry.fetch(request.param))
    yield request.param, gguf_tokenizer(request.param), child
    child.close()


def test_answers_as_the_in_process_tokenizer(pair):
    alias, local, child = pair
    for name in ("vocab_size", "bos_id", "eos_ids", "pad_id", "unk_id", "special_ids"):
        assert getattr(child, name) == getattr(local, name), name
    texts = [c["text"] for c in cases(alias)] + EXTRA_TEXTS
    for case in cases(alias):  # transformers' ids, as test_tokenizer checks the local one
        assert child.encode(case["text"], allow_special=True) == case["ids_no_special"]
    for text in texts:
        for special in (False, True):
            assert child.encode(text, special) == local.encode(text, special)
            assert child.encode(text, allow_special=special) == local.encode(text, allow_special=special)
        ids = local.encode(text, allow_special=True)
        assert child.special_spans(text) == local.special_spans(text)
        assert child.decode(ids) == local.decode(ids)
        assert child.decode(ids, skip_special_tokens=True) == local.decode(ids, skip_special_tokens=True)
        stream = child.decode_stream()
        assert "".join([stream.push(i) for i in ids] + [stream.flush()]) == local.decode(ids)
        halves = [ids[:len(ids) // 2], ids, ids[-1:]]
        for skip in (False, True):
            singly = [local.decode(h, skip_special_tokens=skip) for h in halves]
            assert local.decode_batch(halves, skip_special_tokens=skip) == singly
            assert child.decode_batch(halves, skip_special_tokens=skip) == singly
    pieces = ["Hi", local.bos_id if local.bos_id is not None else 0, " there"]
    assert child.encode_pieces(pieces) == local.encode_pieces(pieces)
    ids = np.array(local.encode(texts[0]), dtype=np.int64)  # what sampling hands over
    assert child.decode(ids) == local.decode(ids.tolist())
    assert [child.id_to_token(int(i)) for i in ids] == [local.id_to_token(int(i)) for i in ids]
    piece = local.id_to_token(int(ids[0]))
    assert child.token_to_id(piece) == local.token_to_id(piece) == ids[0]
    assert child.token_to_id("no such piece \u2603\u2603") is None
    special = min(local.special_ids)
    assert child.is_special(special) and not child.is_special(int(ids[0]))


def test_bad_arguments_raise_the_same_typed_errors():
    child = TokenizerProcess(registry.fetch("smollm2-135m"))
    try:
        for bad in ([49152], [-1], [True], ["3"]):
            with pytest.raises(LoomConfigError, match="not in the vocabulary"):
                child.decode(bad)
            with pytest.raises(LoomConfigError, match="not in the vocabulary"):
                child.decode_batch([[1], bad])
        with pytest.raises(LoomConfigError, match="must be a str"):
            child.encode(3)
        with pytest.raises(LoomConfigError, match="is not a text, a token id"):
            child.encode(b"bytes")  # not even JSON: refused before it is sent
        assert child.encode("still fine") == gguf_tokenizer("smollm2-135m").encode("still fine")
    finally:
        child.close()


def test_bad_model_files_raise_what_the_in_process_reader_raises(tmp_path):
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUX" + bytes(60))
    with pytest.raises(ModelFormatError) as err:
        TokenizerProcess(garbage).wait_ready()
    assert err.value.field == "magic" and err.value.offset == 0
    with pytest.raises(FileNotFoundError, match="missing.gguf"):
        TokenizerProcess(tmp_path / "missing.gguf").wait_ready()
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match="not a valid tokenizer.json"):
        TokenizerProcess(tmp_path).wait_ready()


def test_a_panicking_tokenizer_is_a_typed_error_and_the_child_lives_on(tmp_path):
    # a regex that backtracks only on runs of "z" passes the load probe, and panics on such a text
    path = tiny_tokenizer_json(tmp_path, pre_tokenizer={"type": "Split", "pattern": {"Regex": "(z+)+$"},
                                                        "behavior": "Isolated", "invert": False})
    child = TokenizerProcess(tmp_path).wait_ready()
    try:
        with pytest.raises(ModelFormatError) as err:
            child.encode("z" * 40 + "y")
        assert err.value.field == str(path) and "failed while encoding" in err.value.detail
        assert child.running and child.encode("hello") == [4]  # the child lives on
    finally:
        child.close()


def test_a_dead_child_gives_a_typed_error_not_a_hang():
    child = TokenizerProcess(registry.fetch("smollm2-135m")).wait_ready()
    os.kill(child._proc.pid, signal.SIGKILL)
    with pytest.raises(EngineProcessError, match=r"has ended \(exit code -9\)"):
        child.encode("hello")
    child.close()
    assert not child.running


def test_a_stuck_child_is_stopped_after_the_timeout(monkeypatch):
    child = TokenizerProcess(registry.fetch("smollm2-135m")).wait_ready()
    monkeypatch.setattr(tokenizer_process, "CALL_TIMEOUT_S", 0.3)
    os.kill(child._proc.pid, signal.SIGSTOP)
    with pytest.raises(EngineProcessError, match="gave no answer in 0.3 s and was stopped"):
        child.encode("hello")
    assert not child.running
    with pytest.raises(EngineProcessError, match="has ended"):
        child.decode([1])
    child.close()


def test_close_ends_the_child_and_later_calls_fail_typed():
    child = TokenizerProcess(registry.fetch("smollm2-135m")).wait_ready()
    child.close()
    child.close()  # idempotent
    assert not child.running and child._proc.returncode == 0  # left its loop at end of input
    with pytest.raises(EngineProcessError, match="has ended"):
        child.encode("hello")


def test_a_dropped_tokenizer_process_ends_its_child():
    child = TokenizerProcess(registry.fetch("smollm2-135m")).wait_ready()
    proc = child._proc
    del child
    assert proc.returncode == 0 and proc.stdout.closed


def test_closing_the_model_ends_its_tokenizer_process():
    with load_model("smollm2-135m", tokenizer_process=True) as model:
        assert isinstance(model.tokenizer, TokenizerProcess) and model.tokenizer.running
        reply = "".join(r.text for r in model.generate("The sky is", max_tokens=8, temperature=0))
        with load_model("smollm2-135m") as local:
            assert reply == "".join(r.text for r in local.generate("The sky is", max_tokens=8, temperature=0))
    assert not model.tokenizer.running


def test_torn_and_oversized_messages_are_refused():
    head = struct.pack(">I", 10)
    r, w = os.pipe()
    os.write(w, head + b'{"ok"')  # five of ten bytes, then the end
    os.close(w)
    with os.fdopen(r, "rb") as stream, pytest.raises(EngineProcessError, match="ended inside a message"):
        pipe_messages.receive(stream)
    r, w = os.pipe()
    os.write(w, struct.pack(">I", pipe_messages.MAX_MESSAGE_BYTES + 1))
    os.close(w)
    with os.fdopen(r, "rb") as stream, pytest.raises(EngineProcessError, match="limit"):
        pipe_messages.receive(stream)
    r, w = os.pipe()
    with os.fdopen(r, "rb") as stream, pytest.raises(TimeoutError):
        pipe_messages.receive(stream, timeout=0.05)
    os.close(w)


def test_the_child_refuses_unknown_methods():
    r_in, w_in = os.pipe()
    with os.fdopen(w_in, "wb") as requests:  # small: fits the pipe's buffer
        for message in ({"gguf": str(registry.fetch("smollm2-135m"))}, {"method": "__init__", "args": []},
                        {"method": "id_to_token", "args": [1]}):
            pipe_messages.send(requests, message)
    r_out, w_out = os.pipe()
    with os.fdopen(r_in, "rb") as inp, os.fdopen(w_out, "wb") as out:
        tokenizer_process.serve(inp, out)
    with os.fdopen(r_out, "rb") as replies:
        facts, refused, token = (pipe_messages.receive(replies) for _ in range(3))
        assert pipe_messages.receive(replies) is None  # the child stopped at the end of its input
    assert facts["ok"]["vocab_size"] == 49152
    assert refused["error"] == {"kind": "LoomConfigError",
                                "message": "the tokenizer has no method '__init__'"}
    assert token == {"ok": gguf_tokenizer("smollm2-135m").id_to_token(1)}
