"""``loomlab generate | chat | tokenize | bench`` on the built-in SmolLM2 (greedy, so exact)."""

from __future__ import annotations

import io
import json
import os
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest

from loomlab.app.cli import main
from loomlab.app.commands.llm import CHAT_COMMANDS

from .fake_chat_model import FakeChatModel, use_fake_model

REPO = Path(__file__).resolve().parents[2]

GOLDEN = json.loads((Path(__file__).resolve().parent.parent / "data" / "llm" /
                     "smollm2-135m-instruct-q4_1.json").read_text())


def test_generate_from_ids_prints_the_greedy_continuation(capsys):
    case = next(c for c in GOLDEN["generate"] if c["kind"] == "raw")
    ids = ",".join(map(str, case["prompt_ids"]))
    assert main(["generate", "smollm2-135m", "--ids", ids, "--max-tokens", "16", "--json"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    records, summary = [json.loads(x) for x in lines[:-1]], json.loads(lines[-1])
    assert [r["id"] for r in records] == case["greedy_32"][:16] == summary["ids"]
    assert summary["finish_reason"] == "length" and summary["generated_tokens"] == 16
    assert all(len(r["top"]) == 5 for r in records)


def test_chat_one_message_streams_the_reply(capsys):
    case = next(c for c in GOLDEN["generate"] if c["kind"] == "chat")
    message = case["prompt"][0]["content"]
    assert main(["chat", "smollm2-135m", "--message", message, "--max-tokens", "32", "--exact"]) == 0
    out = capsys.readouterr()
    # transformers' greedy text (the exact path), up to the end-of-turn token the CLI does not print
    assert out.out.strip() == case["greedy_text"].split("<|im_end|>")[0]
    assert "finish: eos" in out.err


def test_tokenize_matches_transformers(capsys):
    case = GOLDEN["tokenize"][0]
    assert main(["tokenize", "smollm2-135m", case["text"], "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    if not any(t in case["text"] for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")):
        assert got["ids"] == case["ids_no_special"]
    assert len(got["tokens"]) == len(got["ids"])


def test_bench_reports_speeds(capsys):
    assert main(["bench", "smollm2-135m", "--tokens", "8", "--repeat", "1", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["generated_tokens"] == 8 and r["decode_tokens_per_s"] > 0 and r["prefill_tokens_per_s"] > 0
    assert r["peak_rss_mib"] > 100
    # the kernels' thread counts seen while decoding lie within numba's pool (they follow the load)
    assert r["kernel_threads"] and set(r["kernel_threads"]) <= set(range(1, r["numba_threads"] + 1))
    assert r["others_busy_cores"] >= 0
    assert r["speculative"] == "prompt-lookup" and 0 <= r["accepted_tokens"] <= r["drafted_tokens"]


def test_bench_speculative_off_decodes_a_token_a_step(capsys):
    assert main(["bench", "smollm2-135m", "--tokens", "24", "--repeat", "1", "--speculative", "off",
                 "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["speculative"] == "off" and r["drafted_tokens"] == 0 and r["generated_tokens"] == 24


@pytest.mark.parametrize("argv, message", [
    (["generate", "smollm2-135m", "--prompt", "hi", "--temperature", "-1"], "temperature"),
    (["generate", "smollm2-135m", "--ids", "1,x"], "--ids"),
    (["generate", "/nonexistent.gguf", "--prompt", "hi"], "nonexistent"),
    (["bench", "smollm2-135m", "--tokens", "0"], "--tokens"),
])
def test_errors_are_one_line(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("loomlab: error: ") and message in err[-1]


@pytest.fixture(scope="module")
def smollm2():
    from loomlab.core.llm import load_model

    with load_model("smollm2-135m") as m:
        yield m


def greedy_text(model, messages, max_tokens=8) -> str:
    return "".join(r.text for r in model.chat(messages, temperature=0, max_tokens=max_tokens))


def test_chat_from_a_pipe_prints_only_the_replies_one_line_each(smollm2, capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO("Hi\n/system Be terse.\n/reset\nHi\n"))
    assert main(["chat", "smollm2-135m", "--max-tokens", "8"]) == 0
    out = capsys.readouterr()
    first = greedy_text(smollm2, [{"role": "user", "content": "Hi"}])
    # /reset starts over but keeps the system prompt, and says so
    terse = {"role": "system", "content": "Be terse."}
    second = greedy_text(smollm2, [terse, {"role": "user", "content": "Hi"}])
    assert out.out == f"{first}\n{second}\n"  # no prompts mixed in, every reply ends its line
    assert '[new conversation; system prompt kept: "Be terse."]' in out.err and "> " not in out.out


def test_chat_json_alternatives_are_text_as_read(smollm2, capsys):
    # the exact path's reply begins "The capital": the default's begins "L'", as close a second
    assert main(["chat", "smollm2-135m", "--message", "What is the capital of France?", "--max-tokens", "4",
                 "--json", "--exact"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    records = [json.loads(x) for x in lines[:-1]]
    tops = [t for r in records for t in r["top"]]
    assert len(tops) == 4 * 5
    assert all(text == smollm2.tokenizer.decode([i]) for i, text, _ in tops)
    assert any(text.startswith(" ") for _, text, _ in tops)  # "Ġ"-pieces come out as spaces
    assert not any("Ġ" in text for _, text, _ in tops)


# ---- the chat command itself, on a stand-in model (tests/app/fake_chat_model.py) -------------------

def chat_with_stdin(lines: str, monkeypatch, model: FakeChatModel | None = None, *argv: str) -> int:
    model = use_fake_model(model or FakeChatModel(), monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO(lines))
    return main(["chat", "fake", *argv])


def test_chat_commands_are_never_sent_to_the_model(monkeypatch, capsys):
    model = FakeChatModel()
    assert chat_with_stdin("/help\nHi\n/frobnicate now\n//etc is a folder\n/quit\nnot sent\n",
                           monkeypatch, model) == 0
    out = capsys.readouterr()
    assert [r["messages"][-1]["content"] for r in model.requests] == ["Hi", "/etc is a folder"]
    assert out.out == "Hello there\nHello there\n"
    for command in CHAT_COMMANDS:
        assert re.search(rf"^  {command} ", out.err, re.MULTILINE)  # /help lists every command
    assert "[unknown command /frobnicate; /help lists the commands]" in out.err


def test_chat_with_a_base_model_points_to_generate(monkeypatch, capsys):
    model = FakeChatModel(name="gemma-3-270m", supports_chat=False)
    assert chat_with_stdin("Hi\n", monkeypatch, model) == 2
    err = capsys.readouterr().err
    assert "gemma-3-270m is a base model without a chat template" in err
    assert "`loomlab generate fake --prompt TEXT`" in err and not model.requests


def test_a_killed_chat_leaves_nothing_of_the_conversation_on_disk(tmp_path):
    places = {name: tmp_path / name for name in ("TMPDIR", "LOOMLAB_DATA", "XDG_DATA_HOME")}
    for folder in places.values():
        folder.mkdir()
    script = ("from tests.app.fake_chat_model import FakeChatModel, use_fake_model; "
              "use_fake_model(FakeChatModel(hang=True)); "
              "from loomlab.app.cli import main; main(['chat', 'fake'])")
    env = {**os.environ, **{name: str(folder) for name, folder in places.items()}}
    child = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=env, stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        child.stdin.write(b"my secret plan\n")
        child.stdin.flush()
        # the reply streams, so the message is in the conversation by now
        assert select.select([child.stdout], [], [], 60)[0], child.stderr.read1().decode()
        assert child.stdout.read(5) == b"Hello"
    finally:
        child.kill()
        child.wait()
        child.stdout.close(), child.stderr.close(), child.stdin.close()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
