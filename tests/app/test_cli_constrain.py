"""``loomlab generate|chat --json-schema FILE | --regex PATTERN``: the printed output validates."""

from __future__ import annotations

import io
import json
import re

import jsonschema
import pytest

from loomlab.app.cli import main
from loomlab.app.commands.llm import EXIT_CUT

from .fake_chat_model import FakeChatModel, use_fake_model

SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "population"],
          "properties": {"city": {"type": "string", "maxLength": 30},
                         "population": {"type": "integer", "minimum": 0, "maximum": 99999999}}}


def _summary(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_generate_json_schema(tmp_path, capsys):
    path = tmp_path / "city.json"
    path.write_text(json.dumps(SCHEMA))
    assert main(["generate", "smollm2-135m", "--prompt", "The largest city in France, as JSON:",
                 "--json-schema", str(path), "--max-tokens", "64", "--json"]) == 0
    summary = _summary(capsys)
    assert summary["finish_reason"] == "stop"
    jsonschema.validate(json.loads(summary["text"]), SCHEMA)


def test_generate_regex(capsys):
    pattern = r"\(\d{3}\) \d{3}-\d{4}"
    assert main(["generate", "smollm2-135m", "--prompt", "Call us at", "--regex", pattern,
                 "--temperature", "0.8", "--seed", "5", "--json"]) == 0
    summary = _summary(capsys)
    assert summary["finish_reason"] == "stop" and re.fullmatch(pattern, summary["text"])


def test_chat_json_schema(tmp_path, capsys):
    path = tmp_path / "city.json"
    path.write_text(json.dumps(SCHEMA))
    assert main(["chat", "smollm2-135m", "--message", "Give the largest city in France as JSON.",
                 "--json-schema", str(path), "--max-tokens", "64", "--json"]) == 0
    summary = _summary(capsys)
    assert summary["finish_reason"] == "stop"
    jsonschema.validate(json.loads(summary["text"]), SCHEMA)


def test_chat_regex(capsys):
    pattern = r"(yes|no), because [a-z ]{5,40}\."
    assert main(["chat", "smollm2-135m", "--message", "Is the sky blue? Answer yes or no and why.",
                 "--regex", pattern, "--max-tokens", "48", "--json"]) == 0
    summary = _summary(capsys)
    assert summary["finish_reason"] == "stop" and re.fullmatch(pattern, summary["text"])


@pytest.mark.parametrize("command, args, words", [
    (["generate", "--prompt", "x"], ["--regex", "[a-"], "regex"),
    (["generate", "--prompt", "x"], ["--json-schema", "/nonexistent/schema.json"], "--json-schema"),
    (["chat", "--message", "x"], ["--regex", "[a-"], "regex"),
    (["chat", "--message", "x"], ["--json-schema", "/nonexistent/schema.json"], "--json-schema"),
])
def test_bad_constraint_is_a_one_line_error(command, args, words, capsys):
    assert main([command[0], "smollm2-135m", *command[1:], *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("loomlab: error:") and words in err


@pytest.mark.parametrize("command, stdin", [
    (["generate", "fake", "--prompt", "Count:"], ""),
    (["chat", "fake", "--message", "Count."], ""),
    (["chat", "fake"], "Count.\n"),  # interactive: the exit status says a reply was cut
])
def test_a_constrained_output_cut_by_max_tokens_warns_and_fails(command, stdin, tmp_path, monkeypatch,
                                                                 capsys):
    # an integer without "maximum": a model may write digits until max_tokens
    path = tmp_path / "count.json"
    path.write_text(json.dumps({"type": "object", "required": ["n"],
                                "properties": {"n": {"type": "integer"}}}))
    model = use_fake_model(FakeChatModel(words=('{"n": 1', "1111"), finish="length"), monkeypatch)
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main([*command, "--json-schema", str(path), "--max-tokens", "2"]) == EXIT_CUT != 0
    out = capsys.readouterr()
    assert '{"n": 11111' in out.out and model.requests[0]["response_format"]["type"] == "json_schema"
    assert ("warning: the output was cut at --max-tokens 2 before it completed the --json-schema format"
            in out.err)
    model.finish = "stop"  # the same output, complete: no warning, success
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main([*command, "--json-schema", str(path), "--max-tokens", "2"]) == 0
    assert "warning" not in capsys.readouterr().err
