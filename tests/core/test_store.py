"""The workspace database: every method checked against direct SQL on the file or a hand-built
expectation; branching, search (FTS5 and the LIKE fallback), exports, durability under SIGKILL,
and appends from a worker thread while the main thread reads and writes."""

from __future__ import annotations

import json
import signal
import sqlite3
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from datetime import UTC, datetime

import pytest

from loomlab.core.errors import LoomError
from loomlab.core.llm.generate.sampling import SamplingParams
from loomlab.core.workspace.store import (
    FILENAME,
    SCHEMA_VERSION,
    Conversation,
    Workspace,
    WorkspaceError,
    default_path,
    fts5_available,
)

SEARCH_MODES = [pytest.param(True, id="fts5", marks=pytest.mark.skipif(not fts5_available(),
                                                                       reason="no FTS5 in this SQLite")),
                pytest.param(False, id="like")]


@pytest.fixture
def path(tmp_path):
    return tmp_path / "ws.sqlite3"


@pytest.fixture
def ws(path):
    with Workspace(path) as workspace:
        yield workspace


def sql(path, query, params=()):
    """Rows read by a separate connection, so they come from the file, not the object's memory."""
    conn = sqlite3.connect(path)
    try:
        return conn.execute(query, params).fetchall()
    finally:
        conn.close()


def chat(ws, title="Cats", turns=(("What is a cat?", "A small feline."), ("And a lion?", "A big one."))):
    """A conversation with user/assistant turns on one branch; returns it and its messages."""
    conv = ws.create_conversation(title, "smollm2-135m")
    messages = []
    for question, answer in turns:
        messages.append(ws.add_message(conv.id, "user", question))
        messages.append(ws.add_message(conv.id, "assistant", answer))
    return conv, messages


# -- the file ---------------------------------------------------------------------------------------

def test_default_path_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOMLAB_DATA", str(tmp_path / "data"))
    assert default_path() == tmp_path / "data" / FILENAME
    monkeypatch.delenv("LOOMLAB_DATA")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    assert default_path() == tmp_path / "xdg" / "loomlab" / FILENAME
    monkeypatch.delenv("XDG_DATA_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_path() == tmp_path / "home" / ".local" / "share" / "loomlab" / FILENAME


def test_default_workspace_creates_its_folder_and_file(monkeypatch, tmp_path):
    monkeypatch.setenv("LOOMLAB_DATA", str(tmp_path / "not" / "yet"))
    with Workspace() as ws:
        assert ws.path == tmp_path / "not" / "yet" / FILENAME
    assert (tmp_path / "not" / "yet" / FILENAME).is_file()


def test_file_is_wal_with_foreign_keys_and_a_schema_version(ws, path):
    assert sql(path, "PRAGMA journal_mode") == [("wal",)]  # WAL is a property of the file
    assert ws._conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert [row[0] for row in sql(path, "SELECT version FROM schema_version")] == [1, 2] \
        == list(range(1, SCHEMA_VERSION + 1))
    tables = {row[0] for row in sql(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"schema_version", "conversations", "messages", "evolution_runs", "evolution_checkpoints",
            "evolution_members"} <= tables


def test_reopening_runs_no_migration_twice_and_sees_everything(path):
    with Workspace(path) as ws:
        conv, messages = chat(ws)
        edited = ws.edit_and_branch(messages[2].id, "And a tiger?")
        before = (ws.list_conversations(), ws.thread(conv.id), ws.branches(edited.id))
    with Workspace(path) as ws:
        assert (ws.list_conversations(), ws.thread(conv.id), ws.branches(edited.id)) == before
    assert len(sql(path, "SELECT * FROM schema_version")) == SCHEMA_VERSION


def test_a_file_that_is_not_sqlite_is_refused_naming_its_path(tmp_path):
    bad = tmp_path / "notes.sqlite3"
    bad.write_bytes(b"this is not a database at all\n" * 200)
    with pytest.raises(WorkspaceError, match="notes.sqlite3"):
        Workspace(bad)
    assert bad.read_bytes() == b"this is not a database at all\n" * 200


def test_a_folder_in_place_of_the_file_is_refused(tmp_path):
    with pytest.raises(WorkspaceError, match=str(tmp_path)):
        Workspace(tmp_path)


def test_another_programs_database_is_left_alone(tmp_path):
    other = tmp_path / "other.db"
    sql(other, "CREATE TABLE things(x)")
    with pytest.raises(WorkspaceError, match="not a Loom Lab workspace"):
        Workspace(other)
    assert sql(other, "SELECT name FROM sqlite_master") == [("things",)]


def test_a_newer_schema_is_refused(path):
    Workspace(path).close()
    conn = sqlite3.connect(path)
    conn.execute("INSERT INTO schema_version VALUES (?, 0)", (SCHEMA_VERSION + 1,))
    conn.commit()
    conn.close()
    with pytest.raises(WorkspaceError, match="newer"):
        Workspace(path)


def test_damaged_pages_raise_workspace_errors_never_sqlite_ones(path):
    with Workspace(path) as ws:
        for i in range(30):
            chat(ws, f"conversation {i}", [("question " * 200, "answer " * 200)])
    raw = bytearray(path.read_bytes())
    raw[4096:len(raw) - 4096] = b"\xa5" * (len(raw) - 8192)  # keep the header, wreck the pages
    path.write_bytes(bytes(raw))
    with pytest.raises(WorkspaceError, match="ws.sqlite3"):
        with Workspace(path) as ws:
            ws.list_conversations()
            ws.search("question")
            ws.thread(1)


def test_a_closed_workspace_raises(path):
    ws = Workspace(path)
    ws.close()
    ws.close()
    with pytest.raises(WorkspaceError, match="closed"):
        ws.list_conversations()


# -- conversations -------------------------------------------------------------------------------

def test_create_and_get_match_the_row(ws, path):
    before = time.time()
    conv = ws.create_conversation("First", "smollm2-135m", "Be brief.", {"temperature": 0.7, "top_k": 40})
    row = sql(path, "SELECT id, title, model, system_prompt, sampling_json, created, updated, active_leaf_id"
                    " FROM conversations")
    sampling_json = json.dumps({"temperature": 0.7, "top_k": 40})
    assert row == [(conv.id, "First", "smollm2-135m", "Be brief.", sampling_json, conv.created, conv.updated,
                    None)]
    assert before <= conv.created == conv.updated <= time.time()
    assert ws.get(conv.id) == conv == Conversation(conv.id, "First", "smollm2-135m", "Be brief.",
                                                   {"temperature": 0.7, "top_k": 40}, conv.created,
                                                   conv.created, None)


def test_sampling_params_are_stored_as_their_fields(ws):
    conv = ws.create_conversation("s", sampling=SamplingParams(temperature=0.5, stop=("\n\n",)))
    assert ws.get(conv.id).sampling["temperature"] == 0.5
    assert ws.get(conv.id).sampling["stop"] == ["\n\n"]
    assert ws.get(conv.id).sampling["max_tokens"] == SamplingParams().max_tokens


def test_rename_and_update_change_only_what_is_given(ws, path):
    conv = ws.create_conversation("Old", "m1", "sys", {"temperature": 0.1})
    renamed = ws.rename(conv.id, "New")
    assert sql(path, "SELECT title, model, system_prompt FROM conversations") == [("New", "m1", "sys")]
    assert renamed.updated >= conv.updated
    updated = ws.update(conv.id, system_prompt="Answer in French.", sampling={"temperature": 0.9})
    assert (updated.title, updated.model, updated.system_prompt, updated.sampling) == (
        "New", "m1", "Answer in French.", {"temperature": 0.9})
    assert ws.update(conv.id, model="m2").model == "m2"


def test_text_with_sql_in_it_is_stored_verbatim(ws, path):
    nasty = "x'); DROP TABLE conversations; --"
    conv = ws.create_conversation(nasty)
    ws.add_message(conv.id, "user", nasty)
    assert sql(path, "SELECT title FROM conversations") == [(nasty,)]
    assert ws.thread(conv.id)[0].content == nasty


def test_list_is_newest_first_and_a_new_message_moves_a_conversation_up(ws):
    a = ws.create_conversation("a")
    b = ws.create_conversation("b")
    c = ws.create_conversation("c")
    assert [conv.id for conv in ws.list_conversations()] == [c.id, b.id, a.id]
    ws.add_message(a.id, "user", "bump")
    assert [conv.id for conv in ws.list_conversations()] == [a.id, c.id, b.id]


def test_delete_cascades_to_messages_and_the_search_index(ws, path):
    keep, _ = chat(ws, "keep", [("hello", "world")])
    gone, _ = chat(ws, "gone", [("zebra question", "zebra answer")])
    ws.delete(gone.id)
    assert sql(path, "SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (gone.id,)) == [(0,)]
    assert sql(path, "SELECT COUNT(*) FROM messages WHERE conversation_id = ?", (keep.id,)) == [(2,)]
    assert [conv.id for conv in ws.list_conversations()] == [keep.id]
    assert ws.search("zebra") == []
    with pytest.raises(WorkspaceError):
        ws.get(gone.id)


# -- messages and branches -----------------------------------------------------------------------

def test_add_message_chains_under_the_active_leaf(ws, path):
    conv, messages = chat(ws)
    rows = sql(path, "SELECT id, parent_id, role, content FROM messages ORDER BY id")
    ids = [m.id for m in messages]
    assert rows == [(ids[0], None, "user", "What is a cat?"),
                    (ids[1], ids[0], "assistant", "A small feline."),
                    (ids[2], ids[1], "user", "And a lion?"),
                    (ids[3], ids[2], "assistant", "A big one.")]
    assert sql(path, "SELECT active_leaf_id FROM conversations") == [(ids[3],)]
    assert ws.thread(conv.id) == messages
    assert ws.thread(conv.id, ids[1]) == messages[:2]
    assert ws.get_message(ids[2]) == messages[2]
    assert ws.thread(ws.create_conversation("empty").id) == []


def test_explicit_parents_and_extras(ws, path):
    conv = ws.create_conversation("t")
    root = ws.add_message(conv.id, "system", "rules", extra={"source": "preset"})
    other_root = ws.add_message(conv.id, "user", "another start", parent_id=None)
    assert other_root.parent_id is None and root.extra == {"source": "preset"}
    under_root = ws.add_message(conv.id, "user", "under rules", parent_id=root.id)
    assert ws.thread(conv.id) == [root, under_root]
    stored = sql(path, "SELECT extra_json FROM messages WHERE id = ?", (root.id,))
    assert stored == [('{"source": "preset"}',)]


def test_editing_a_past_user_message_branches(ws):
    conv, (q1, a1, q2, a2) = chat(ws)
    edited = ws.edit_and_branch(q2.id, "And a tiger?")
    assert (edited.parent_id, edited.role, edited.content) == (a1.id, "user", "And a tiger?")
    assert ws.get(conv.id).active_leaf_id == edited.id
    reply = ws.begin_reply(conv.id)
    ws.append_to_reply(reply.id, "A striped one.")
    assert [m.content for m in ws.thread(conv.id)] == [
        "What is a cat?", "A small feline.", "And a tiger?", "A striped one."]
    # The old branch is still there, reachable from the new message's siblings.
    assert [m.id for m in ws.branches(edited.id)] == [q2.id, edited.id] == [m.id for m in ws.branches(q2.id)]
    assert ws.latest_leaf(q2.id) == a2
    assert [m.id for m in ws.children(a1.id)] == [q2.id, edited.id]
    ws.set_active_leaf(conv.id, a2.id)
    assert ws.thread(conv.id) == [q1, a1, q2, a2]


def test_editing_the_first_message_makes_a_new_root(ws):
    conv, (q1, *_rest) = chat(ws)
    edited = ws.edit_and_branch(q1.id, "What is a dog?")
    assert edited.parent_id is None
    assert ws.thread(conv.id) == [edited]
    assert [m.id for m in ws.branches(q1.id)] == [q1.id, edited.id]


def test_regenerate_is_a_reply_under_the_same_parent(ws):
    conv, (q1, a1, q2, a2) = chat(ws)
    again = ws.begin_reply(conv.id, parent_id=q2.id)
    assert [m.id for m in ws.branches(a2.id)] == [a2.id, again.id]
    assert ws.thread(conv.id)[-1].id == again.id
    assert ws.latest_leaf(q1.id).id == again.id


# -- streaming replies ---------------------------------------------------------------------------

def test_a_streamed_reply_is_saved_piece_by_piece(ws, path):
    conv = ws.create_conversation("stream")
    ws.add_message(conv.id, "user", "Count.")
    reply = ws.begin_reply(conv.id)
    assert (reply.role, reply.content, reply.finish_reason) == ("assistant", "", None)
    assert ws.get(conv.id).active_leaf_id == reply.id
    for piece in ["One", ",", " two", ", ", "three."]:
        ws.append_to_reply(reply.id, piece)
        # Another connection sees it at once: each append is committed.
        assert sql(path, "SELECT content FROM messages WHERE id = ?", (reply.id,))[0][0].endswith(piece)
    done = ws.finish_reply(reply.id, "stop", 5, 42.5, 0.125, extra={"tokens": [{"id": 1, "logprob": -0.1}]})
    assert sql(path, "SELECT content, finish_reason, token_count, tokens_per_s, ttft_s, extra_json"
                     " FROM messages WHERE id = ?", (reply.id,)) == [
        ("One, two, three.", "stop", 5, 42.5, 0.125, '{"tokens": [{"id": 1, "logprob": -0.1}]}')]
    assert done == ws.thread(conv.id)[-1]
    with pytest.raises(WorkspaceError, match="not an unfinished reply"):
        ws.append_to_reply(reply.id, "more")
    user = ws.add_message(conv.id, "user", "Again.")
    with pytest.raises(WorkspaceError, match="role 'user'"):
        ws.append_to_reply(user.id, "text")


def test_append_cost_is_far_below_a_token_time(ws):
    conv = ws.create_conversation("cost")
    reply = ws.begin_reply(conv.id)
    times = []
    for _ in range(500):
        start = time.perf_counter()
        ws.append_to_reply(reply.id, "token ")
        times.append(time.perf_counter() - start)
    # ~0.05 ms measured here; a generous bound so a busy machine does not fail it.
    assert statistics.median(times) < 5e-3
    assert ws.get_message(reply.id).content == "token " * 500


KILLED_WRITER = textwrap.dedent("""
    import sys
    from loomlab.core.workspace.store import Workspace
    ws = Workspace(sys.argv[1])
    conv = ws.create_conversation("killed")
    ws.add_message(conv.id, "user", "Talk forever.")
    reply = ws.begin_reply(conv.id)
    print(reply.id, flush=True)
    for i in range(1_000_000):
        ws.append_to_reply(reply.id, f"t{i} ")
        print(i, flush=True)  # after the append returned: this piece must survive
""")


def test_sigkill_mid_reply_loses_nothing_that_was_appended(path):
    child = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(path)], stdout=subprocess.PIPE,
                             text=True)
    try:
        reply_id = int(child.stdout.readline())
        while int(child.stdout.readline()) < 300:
            pass
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    # Lines the child printed before it died are still in the pipe: the true last confirmed append.
    confirmed = child.stdout.read().split("\n")[:-1]  # drop a possibly half-written last line
    child.stdout.close()
    last = int(confirmed[-1]) if confirmed else 300
    assert child.returncode == -signal.SIGKILL
    with Workspace(path) as ws:
        reply = ws.get_message(reply_id)
        pieces = reply.content.split()
        # Every piece reported as appended is there, in order; at most the in-flight ones follow.
        assert pieces == [f"t{i}" for i in range(len(pieces))]
        assert len(pieces) >= last + 1
        assert reply.finish_reason is None
        assert ws.search("killed")[0].title == "killed"


def test_a_worker_appends_while_the_main_thread_reads_and_writes(ws):
    conv = ws.create_conversation("busy")
    reply = ws.begin_reply(conv.id)
    errors: list[BaseException] = []

    def stream():
        try:
            for i in range(400):
                ws.append_to_reply(reply.id, f"{i},")
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    worker = threading.Thread(target=stream, name="appender")
    worker.start()
    try:
        seen = 0
        while worker.is_alive() or seen == 0:
            others = ws.create_conversation(f"side {seen}")
            ws.add_message(others.id, "user", "hello")
            assert ws.list_conversations()[0].id == others.id
            ws.thread(conv.id)
            ws.search("hello")
            seen += 1
    finally:
        worker.join(30)
    assert not errors
    assert ws.get_message(reply.id).content == "".join(f"{i}," for i in range(400))
    assert len(ws.list_conversations()) == seen + 1


# -- search --------------------------------------------------------------------------------------

@pytest.mark.parametrize("full_text", SEARCH_MODES)
def test_search_finds_titles_and_messages_on_any_branch(path, full_text):
    with Workspace(path, full_text=full_text) as ws:
        pets, (q1, *_rest) = chat(ws, "Pets", [("Tell me about Octopuses", "Eight arms.")])
        ws.edit_and_branch(q1.id, "Tell me about squid")  # the octopus message is now off-thread
        recipes, _ = chat(ws, "Pancake recipes", [("How much flour?", "200 g.")])
        reply = ws.begin_reply(recipes.id)
        ws.append_to_reply(reply.id, "Whisk the eggs")
        assert ws.search("octopuses") == [ws.get(pets.id)]
        assert ws.search("pancake") == [ws.get(recipes.id)]
        assert ws.search("whisk eggs" if full_text else "whisk the eggs") == [ws.get(recipes.id)]
        assert ws.search("tell") == [ws.get(pets.id)]
        assert ws.search("arms flour") == []  # every word must be in the same title or message
        assert ws.search("giraffe") == []
        assert ws.list_conversations(search="PANCAKE") == ws.search("pancake")
        assert ws.search("   ") == ws.list_conversations() == [ws.get(recipes.id), ws.get(pets.id)]
        ws.rename(recipes.id, "Crepes")
        assert ws.search("pancake") == []
        assert ws.search("crepes") == [ws.get(recipes.id)]


@pytest.mark.parametrize("full_text", SEARCH_MODES)
def test_search_text_is_never_query_syntax(path, full_text):
    with Workspace(path, full_text=full_text) as ws:
        chat(ws, "odd", [("50% off_sale \"quoted\" NOT OR *", "ok")])
        chat(ws, "plain", [("500 offXsale", "ok")])
        for query in ['"', "*", "NOT", "a OR b", "')--", "%", "_", "\\", "(", "col:x"]:
            ws.search(query)  # no error
        assert [c.title for c in ws.search('"quoted"')] == ["odd"]
        if not full_text:  # LIKE wildcards in the query are literal characters
            assert [c.title for c in ws.search("50%")] == ["odd"]
            assert [c.title for c in ws.search("off_sale")] == ["odd"]


@pytest.mark.skipif(not fts5_available(), reason="no FTS5 in this SQLite")
def test_the_index_catches_up_with_writes_made_without_it(path):
    with Workspace(path) as ws:
        conv, _ = chat(ws, "indexed", [("alpha", "beta")])
    with Workspace(path, full_text=False) as ws:
        assert sql(path, "SELECT name FROM sqlite_master WHERE type = 'trigger'") == []
        ws.add_message(conv.id, "user", "gamma")
        ws.rename(conv.id, "renamed")
    with Workspace(path) as ws:
        assert ws.full_text
        assert [c.title for c in ws.search("gamma")] == ["renamed"]
        assert ws.search("indexed") == []
        assert [c.title for c in ws.search("alpha")] == ["renamed"]


# -- export --------------------------------------------------------------------------------------

def iso(seconds):
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def exported_chat(ws):
    conv = ws.create_conversation("Greetings", "smollm2-135m", "Be kind.", {"temperature": 0.0})
    question = ws.add_message(conv.id, "user", "Hi!")
    ws.begin_reply(conv.id)
    old = ws.thread(conv.id)[-1]
    ws.finish_reply(old.id, "stop", 1, 10.0, 0.5)
    edited = ws.edit_and_branch(question.id, "Hello!")
    reply = ws.begin_reply(conv.id)
    ws.append_to_reply(reply.id, "Hello, **friend**.")
    ws.finish_reply(reply.id, "stop", 6, 31.25, 0.0421)
    return ws.get(conv.id), ws.get_message(edited.id), ws.get_message(reply.id)


def test_export_json_is_the_active_thread_with_metadata(ws):
    conv, question, reply = exported_chat(ws)
    data = ws.export_json(conv.id)
    assert data == {
        "format": "loomlab-conversation/1",
        "conversation": {"id": conv.id, "title": "Greetings", "model": "smollm2-135m",
                         "system_prompt": "Be kind.", "sampling": {"temperature": 0.0},
                         "created": iso(conv.created), "updated": iso(conv.updated)},
        "messages": [
            {"id": question.id, "parent_id": None, "role": "user", "content": "Hello!",
             "created": iso(question.created), "finish_reason": None, "token_count": None,
             "tokens_per_s": None, "ttft_s": None, "extra": {}},
            {"id": reply.id, "parent_id": question.id, "role": "assistant", "content": "Hello, **friend**.",
             "created": iso(reply.created), "finish_reason": "stop", "token_count": 6,
             "tokens_per_s": 31.25, "ttft_s": 0.0421, "extra": {}},
        ],
    }
    assert json.loads(json.dumps(data)) == data


def test_export_markdown(ws):
    conv, _, _ = exported_chat(ws)
    assert ws.export_markdown(conv.id) == (
        "# Greetings\n"
        "\n"
        "- Model: `smollm2-135m`\n"
        f"- Created: {iso(conv.created)}\n"
        "- Sampling: temperature=0.0\n"
        "\n"
        "## System\n"
        "\n"
        "Be kind.\n"
        "\n"
        "## User\n"
        "\n"
        "Hello!\n"
        "\n"
        "## Assistant\n"
        "\n"
        "Hello, **friend**.\n"
        "\n"
        "*6 tokens · 31.2 tokens/s · first token 0.04 s · finish: stop*\n"
    )
    assert ws.export_markdown(ws.create_conversation("Empty").id) == (
        f"# Empty\n\n- Created: {iso(ws.get(conv.id + 1).created)}\n")


# -- bad input -----------------------------------------------------------------------------------

def test_unknown_ids_and_bad_arguments_raise_workspace_errors(ws, path):
    conv, (q1, *_rest) = chat(ws)
    other = ws.create_conversation("other")
    calls = [
        lambda: ws.get(999), lambda: ws.rename(999, "x"), lambda: ws.delete(999),
        lambda: ws.add_message(999, "user", "x"), lambda: ws.thread(999), lambda: ws.thread(conv.id, 999),
        lambda: ws.branches(999), lambda: ws.children(999), lambda: ws.latest_leaf(999),
        lambda: ws.get_message(999), lambda: ws.set_active_leaf(conv.id, 999),
        lambda: ws.set_active_leaf(other.id, q1.id), lambda: ws.thread(other.id, q1.id),
        lambda: ws.add_message(other.id, "user", "x", parent_id=q1.id),
        lambda: ws.add_message(conv.id, "wizard", "x"), lambda: ws.add_message(conv.id, "user", None),
        lambda: ws.edit_and_branch(999, "x"), lambda: ws.begin_reply(999),
        lambda: ws.append_to_reply(999, "x"), lambda: ws.finish_reply(999, "stop"),
        lambda: ws.get("1; DROP TABLE messages"), lambda: ws.get(True),
        lambda: ws.create_conversation(None), lambda: ws.create_conversation("x", sampling=[1, 2]),
        lambda: ws.add_message(conv.id, "user", "x", extra={"bad": object()}),
        lambda: ws.export_json(999), lambda: ws.export_markdown(999),
    ]
    for call in calls:
        with pytest.raises(WorkspaceError):
            call()
    assert issubclass(WorkspaceError, LoomError)
    # Nothing above changed the file.
    assert sql(path, "SELECT COUNT(*) FROM messages") == [(4,)]
    assert [c.id for c in ws.list_conversations()] == [other.id, conv.id]
