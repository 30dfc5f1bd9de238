"""ChatSession on the real SmolLM2: what it stores and streams equals ``TextModel.chat`` called
directly (greedy, or sampled with the seed it shows), requests are validated before anything is
stored, every token is stored as it streams, and a reply ends in the store however it ends."""

from __future__ import annotations

import pytest

from loomlab.core.errors import LoomError
from loomlab.core.llm.generate.decoding import TokenRecord
from loomlab.core.llm.generate.textmodel import load_model
from loomlab.core.workspace.chat import REGENERATE_SAMPLING, ChatBusyError, ChatSession, reply_summary
from loomlab.core.workspace.store import Workspace

SHORT = 6
GREEDY = {"temperature": 0.0, "max_tokens": SHORT}


@pytest.fixture(scope="module")
def model():
    with load_model("smollm2-135m") as m:
        yield m


@pytest.fixture
def workspace(tmp_path):
    with Workspace(tmp_path / "ws.sqlite3") as ws:
        yield ws


@pytest.fixture
def session(workspace, model):
    s = ChatSession(workspace, model, logprobs=3)
    s.set_sampling(GREEDY)
    return s


def oracle(model, messages, **sampling) -> list[TokenRecord]:
    return list(model.chat(messages, logprobs=3, **{**GREEDY, **sampling}))


def test_send_streams_and_stores_the_models_own_reply_token_by_token(session, model, workspace):
    session.set_system_prompt("You are terse.")
    expected = oracle(model, [{"role": "system", "content": "You are terse."},
                              {"role": "user", "content": "Name a colour."}])
    reply = session.send("Name a colour.")
    for record in reply.stream():
        # in the database before it reaches the reader
        assert workspace.get_message(reply.message_id).content == reply.text and reply.records[-1] is record
    assert reply.records == expected
    thread = workspace.thread(session.conversation_id)
    assert [(m.role, m.content) for m in thread] == [("user", "Name a colour."), ("assistant", reply.text)]
    stored = thread[-1]
    assert stored.finish_reason == expected[-1].finish_reason and stored.token_count == len(expected)
    assert stored.tokens_per_s == pytest.approx(reply.metrics.decode_tokens_per_s)
    conv = workspace.get(session.conversation_id)
    assert (conv.title, conv.system_prompt, conv.model) == ("Name a colour.", "You are terse.", model.name)
    line = session.status_line()
    assert line == reply_summary(stored) and f"{len(expected)} tokens" in line


def test_a_second_turn_carries_the_conversation(session, model):
    first = session.send("Hi")
    list(first.stream())
    second = session.send("And again?")
    list(second.stream())
    expected = oracle(model, [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": first.text},
                              {"role": "user", "content": "And again?"}])
    assert second.text == "".join(r.text for r in expected)


def test_a_bad_request_raises_before_anything_is_stored(session, workspace):
    session.set_sampling({"temperature": -1.0})
    with pytest.raises(LoomError, match="temperature"):
        session.send("Hi")
    assert workspace.list_conversations() == [] and session.conversation_id is None
    session.set_sampling({"max_tokens": 10**9})
    with pytest.raises(LoomError, match="context"):
        session.send("Hi")
    assert workspace.list_conversations() == []


def test_cancel_and_early_close_finish_the_reply_as_cancelled(session, workspace):
    session.set_sampling({**GREEDY, "max_tokens": 64})
    reply = session.send("Tell me a long story.")
    for record in reply.stream():
        if record.index == 2:
            reply.cancel()
    assert reply.finish_reason == "cancelled" and reply.generated_tokens == 3
    assert workspace.get_message(reply.message_id).finish_reason == "cancelled"
    assert workspace.get_message(reply.message_id).content == reply.text != ""

    again = session.send("Another one.")
    tokens = again.stream()
    next(tokens)
    tokens.close()  # the reader stopped (Ctrl-C in the CLI)
    assert again.done and workspace.get_message(again.message_id).finish_reason == "cancelled"


def test_one_reply_at_a_time(session):
    reply = session.send("Hi")
    tokens = reply.stream()
    next(tokens)
    with pytest.raises(ChatBusyError):
        session.send("Hello?")
    with pytest.raises(ChatBusyError):
        session.open(session.conversation_id)
    tokens.close()
    assert not session.busy


def test_regenerate_samples_with_a_visible_seed_that_repeats_it(session, model, workspace):
    first = session.send("Hi")
    list(first.stream())
    again = session.regenerate()
    list(again.stream())
    assert isinstance(again.seed, int) and again.message.extra["seed"] == again.seed
    assert f"seed {again.seed}" in reply_summary(again.message)
    expected = oracle(model, [{"role": "user", "content": "Hi"}], **REGENERATE_SAMPLING, seed=again.seed)
    assert again.records == expected
    branches = workspace.branches(again.message_id)
    assert [m.id for m in branches] == [first.message_id, again.message_id]


def test_a_sampling_chat_always_has_a_seed(session, model):
    session.set_sampling({"temperature": 0.9, "max_tokens": SHORT})
    reply = session.send("Hi")
    list(reply.stream())
    assert reply.seed is not None
    expected = oracle(model, [{"role": "user", "content": "Hi"}], temperature=0.9, seed=reply.seed)
    assert reply.records == expected


def test_editing_a_user_message_branches_and_the_status_follows_the_branch(session, model, workspace):
    first = session.send("Hi")
    list(first.stream())
    user = workspace.thread(session.conversation_id)[0]
    session.set_sampling({**GREEDY, "max_tokens": SHORT + 2})
    edited = session.edit(user.id, "Hello there")
    list(edited.stream())
    assert edited.records == oracle(model, [{"role": "user", "content": "Hello there"}], max_tokens=SHORT + 2)
    assert [m.content for m in workspace.branches(user.id)] == ["Hi", "Hello there"]
    assert session.status_line() == reply_summary(edited.message)

    session.step_branch(workspace.thread(session.conversation_id)[0].id, -1)  # back to "Hi"
    assert session.thread()[-1].id == first.message_id
    assert session.status_line() == reply_summary(first.message) != reply_summary(edited.message)


def test_completion_continues_plain_text_and_stores_nothing(session, model, workspace):
    reply = session.complete("Once upon a time")
    list(reply.stream())
    expected = list(model.generate("Once upon a time", logprobs=3, **GREEDY))
    assert reply.records == expected and reply.message is None and workspace.list_conversations() == []


def test_context_usage_counts_the_rendered_prompt(session, model):
    session.set_system_prompt("Be brief.")
    list(session.send("Hi").stream())
    used, total = session.context_usage()
    assert used == model.count_chat_tokens(session.model_messages()) > 5 and total == model.context_length


class _FailingModel:
    """A model whose stream breaks after two tokens: the reply must still end in the store."""

    name = "failing"
    context_length = 100

    def chat(self, messages, *, cancel, logprobs, **sampling):
        def tokens():
            yield TokenRecord(0, 1, "a")
            yield TokenRecord(1, 2, "b")
            raise OSError("the disk went away")
        return tokens()

    def metrics(self):
        from loomlab.core.llm.generate.decoding import Metrics
        return Metrics(generated_tokens=2)


def test_a_failing_stream_finishes_the_reply_with_its_error(workspace):
    session = ChatSession(workspace, _FailingModel())
    reply = session.send("Hi")
    with pytest.raises(OSError):
        list(reply.stream())
    stored = workspace.get_message(reply.message_id)
    assert stored.content == "ab" and stored.finish_reason == "error"
    assert stored.extra["error"] == "OSError: the disk went away" and not session.busy
