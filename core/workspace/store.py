"""The workspace database: conversations as message trees in one SQLite file (stdlib ``sqlite3``).

A conversation is a tree so that editing a past message and resending it starts a new branch
while the old one stays (ChatGPT / LM Studio style). Each conversation remembers its *active
leaf*; :meth:`Workspace.thread` is the root-to-leaf path the user sees.

Durability: the file is in WAL mode with ``synchronous=NORMAL``, and every write is its own
committed transaction, so a process killed with SIGKILL keeps every write that had returned
(``append_to_reply`` included: a reply loses only text not yet appended). NORMAL may roll back
the last transactions on a power cut or OS crash, never corrupts the file, and costs no fsync per
commit, which matters at one commit per streamed token.

Threads: one connection opened with ``check_same_thread=False`` and guarded by a lock, so the GUI
thread and a generation worker can both call any method; each call is short (one transaction)
and nothing in here waits on anything else while holding the lock.

Search uses an FTS5 index (word-prefix matching: every word of the query must begin a word of a
title or of one message) when this SQLite build has FTS5, else a LIKE scan (every word of the
query must occur as a substring). The index is kept by triggers, so it can never disagree with
the tables; a file opened by a build without FTS5 has its triggers dropped and the index rebuilt
when a build with FTS5 opens it again.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from ..errors import LoomError

ROLES = ("system", "user", "assistant", "tool")
FILENAME = "workspace.sqlite3"
#: The path of a workspace kept in this process's memory only (nothing of it reaches a disk).
IN_MEMORY = ":memory:"


class WorkspaceError(LoomError):
    """The workspace file cannot be used (not a database, newer schema, locked), or an id or
    argument given to :class:`Workspace` is invalid."""


class _ActiveLeaf:
    def __repr__(self) -> str:
        return "ACTIVE_LEAF"


#: Default ``parent_id`` of :meth:`Workspace.add_message` and :meth:`Workspace.begin_reply`:
#: the conversation's active leaf (``parent_id=None`` means a new root instead).
ACTIVE_LEAF: Any = _ActiveLeaf()


@dataclass(frozen=True)
class Conversation:
    id: int
    title: str
    model: str
    system_prompt: str
    sampling: dict
    created: float  # Unix seconds
    updated: float
    active_leaf_id: int | None


@dataclass(frozen=True)
class Message:
    id: int
    conversation_id: int
    parent_id: int | None
    role: str
    content: str
    created: float  # Unix seconds
    finish_reason: str | None  # None while a reply streams (or when it was cut off by a crash)
    token_count: int | None
    tokens_per_s: float | None
    ttft_s: float | None
    extra: dict


def default_path() -> Path:
    """``$LOOMLAB_DATA/workspace.sqlite3``, else ``$XDG_DATA_HOME/loomlab/...``, else
    ``~/.local/share/loomlab/workspace.sqlite3``."""
    root = os.environ.get("LOOMLAB_DATA")
    if root:
        return Path(root) / FILENAME
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "loomlab" / FILENAME


# -- schema -------------------------------------------------------------------------------------

_SCHEMA_V1 = """
CREATE TABLE conversations (
    id INTEGER PRIMARY KEY,
    title TEXT NOT NULL,
    model TEXT NOT NULL DEFAULT '',
    system_prompt TEXT NOT NULL DEFAULT '',
    sampling_json TEXT NOT NULL DEFAULT '{}',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    active_leaf_id INTEGER REFERENCES messages(id) ON DELETE SET NULL
);
CREATE TABLE messages (
    id INTEGER PRIMARY KEY,
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    parent_id INTEGER REFERENCES messages(id) ON DELETE CASCADE,
    role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant', 'tool')),
    content TEXT NOT NULL DEFAULT '',
    created REAL NOT NULL,
    finish_reason TEXT,
    token_count INTEGER,
    tokens_per_s REAL,
    ttft_s REAL,
    extra_json TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX messages_by_conversation ON messages(conversation_id);
CREATE INDEX messages_by_parent ON messages(parent_id);
CREATE INDEX conversations_by_updated ON conversations(updated);
"""

# Evolution runs (core/workspace/evolution_runs.py): a run's config, then one checkpoint per
# generation with its members as .loom bytes; a checkpoint is written in one transaction.
_SCHEMA_V2 = """
CREATE TABLE evolution_runs (
    id INTEGER PRIMARY KEY,
    task TEXT NOT NULL,
    config_json TEXT NOT NULL,
    status TEXT NOT NULL DEFAULT 'running',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
CREATE TABLE evolution_checkpoints (
    run_id INTEGER NOT NULL REFERENCES evolution_runs(id) ON DELETE CASCADE,
    generation INTEGER NOT NULL,
    state_json TEXT NOT NULL,
    created REAL NOT NULL,
    PRIMARY KEY (run_id, generation)
);
CREATE TABLE evolution_members (
    run_id INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    idx INTEGER NOT NULL,
    network BLOB NOT NULL,
    PRIMARY KEY (run_id, generation, idx),
    FOREIGN KEY (run_id, generation) REFERENCES evolution_checkpoints(run_id, generation) ON DELETE CASCADE
);
"""

# version -> DDL that brings the file from version-1 to version. Append, never edit.
MIGRATIONS: dict[int, str] = {1: _SCHEMA_V1, 2: _SCHEMA_V2}
SCHEMA_VERSION = max(MIGRATIONS)

# External-content FTS5 tables mirror the real tables by rowid; not versioned, because whether
# they exist depends on the SQLite build that opens the file, not on the schema.
_FTS_TABLES = """
CREATE VIRTUAL TABLE IF NOT EXISTS messages_fts USING fts5(
    content, content='messages', content_rowid='id', tokenize='unicode61 remove_diacritics 2');
CREATE VIRTUAL TABLE IF NOT EXISTS conversations_fts USING fts5(
    title, content='conversations', content_rowid='id', tokenize='unicode61 remove_diacritics 2');
"""
_FTS_TRIGGERS = {
    "messages_fts_insert": """
        CREATE TRIGGER messages_fts_insert AFTER INSERT ON messages BEGIN
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END""",
    "messages_fts_delete": """
        CREATE TRIGGER messages_fts_delete AFTER DELETE ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
        END""",
    "messages_fts_update": """
        CREATE TRIGGER messages_fts_update AFTER UPDATE OF content ON messages BEGIN
            INSERT INTO messages_fts(messages_fts, rowid, content) VALUES ('delete', old.id, old.content);
            INSERT INTO messages_fts(rowid, content) VALUES (new.id, new.content);
        END""",
    "conversations_fts_insert": """
        CREATE TRIGGER conversations_fts_insert AFTER INSERT ON conversations BEGIN
            INSERT INTO conversations_fts(rowid, title) VALUES (new.id, new.title);
        END""",
    "conversations_fts_delete": """
        CREATE TRIGGER conversations_fts_delete AFTER DELETE ON conversations BEGIN
            INSERT INTO conversations_fts(conversations_fts, rowid, title)
                VALUES ('delete', old.id, old.title);
        END""",
    "conversations_fts_update": """
        CREATE TRIGGER conversations_fts_update AFTER UPDATE OF title ON conversations BEGIN
            INSERT INTO conversations_fts(conversations_fts, rowid, title)
                VALUES ('delete', old.id, old.title);
            INSERT INTO conversations_fts(rowid, title) VALUES (new.id, new.title);
        END""",
}

_CONV_COLS = "id, title, model, system_prompt, sampling_json, created, updated, active_leaf_id"
_MSG_COLS = ("id, conversation_id, parent_id, role, content, created, finish_reason, token_count, "
             "tokens_per_s, ttft_s, extra_json")


def fts5_available() -> bool:
    """Whether this interpreter's SQLite can create FTS5 tables."""
    probe = sqlite3.connect(":memory:")
    try:
        probe.execute("CREATE VIRTUAL TABLE probe USING fts5(x)")
        return True
    except sqlite3.OperationalError:
        return False
    finally:
        probe.close()


# -- the workspace ------------------------------------------------------------------------------

class Workspace:
    """One workspace file: conversations, their message trees and streaming replies.

    Args:
        path: the SQLite file (created with its folder when missing); default :func:`default_path`;
            :data:`IN_MEMORY` for one that lives and dies with this object.
        full_text: use the FTS5 index for search; ``None`` = when this SQLite build has FTS5.

    Raises:
        WorkspaceError: the file is not a workspace database (naming the path), was written by a
            newer Loom Lab, or cannot be opened.

    Every method may be called from any thread (see the module docstring); every write is
    committed before the method returns.

    Attributes:
        path: the database file.
        full_text: whether search uses the FTS5 index (else LIKE).
    """

    def __init__(self, path: str | os.PathLike | None = None, *, full_text: bool | None = None):
        self.path = Path(path) if path is not None else default_path()
        self._lock = threading.RLock()
        self._conn: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = self._connect()
            self._migrate()
            self.full_text = fts5_available() if full_text is None else full_text
            self._sync_search_index()
        except (sqlite3.Error, OSError) as exc:
            self.close()
            raise WorkspaceError(f"{self.path}: cannot open the workspace database: {exc}") from exc
        except WorkspaceError:
            self.close()
            raise

    # -- lifecycle

    def close(self) -> None:
        """Close the file (idempotent); every later call raises :class:`WorkspaceError`."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: no implicit transactions; _write() opens and commits each one.
        conn = sqlite3.connect(self.path, timeout=5.0, isolation_level=None, check_same_thread=False)
        try:
            # The first read of the header is where a non-SQLite file shows itself.
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if mode.lower() != ("memory" if str(self.path) == IN_MEMORY else "wal"):
                raise WorkspaceError(f"{self.path}: the file system refused WAL mode (got {mode!r})")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
        except BaseException:
            conn.close()
            raise
        return conn

    def _migrate(self) -> None:
        with self._write() as db:
            tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if tables and "schema_version" not in tables:
                # Another program's database: never add our tables to it.
                raise WorkspaceError(f"{self.path}: an SQLite database but not a Loom Lab workspace "
                                     f"(tables {sorted(tables)[:5]})")
            db.execute("CREATE TABLE IF NOT EXISTS schema_version ("
                       "version INTEGER PRIMARY KEY, applied REAL NOT NULL)")
            current = db.execute("SELECT COALESCE(MAX(version), 0) FROM schema_version").fetchone()[0]
            if current > SCHEMA_VERSION:
                raise WorkspaceError(f"{self.path}: schema version {current} is newer than this Loom Lab "
                                     f"understands ({SCHEMA_VERSION}); update Loom Lab")
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in _statements(MIGRATIONS[version]):
                    db.execute(statement)
                db.execute("INSERT INTO schema_version(version, applied) VALUES (?, ?)",
                           (version, time.time()))

    def _sync_search_index(self) -> None:
        """Create (and fill) the FTS index when searching with it; drop its triggers when not,
        since a trigger that names an FTS5 table breaks every write on a build without FTS5."""
        with self._write() as db:
            present = {row[0] for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'trigger' AND name GLOB '*_fts_*'")}
            if not self.full_text:
                for name in present:
                    db.execute(f"DROP TRIGGER {name}")  # names come from our own table above
                return
            if present == set(_FTS_TRIGGERS):
                return
            for statement in _statements(_FTS_TABLES):
                db.execute(statement)
            for name, ddl in _FTS_TRIGGERS.items():
                if name not in present:
                    db.execute(ddl)
            # Writes made while the triggers were missing are not in the index yet.
            db.execute("INSERT INTO messages_fts(messages_fts) VALUES ('rebuild')")
            db.execute("INSERT INTO conversations_fts(conversations_fts) VALUES ('rebuild')")

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One committed transaction under the lock; SQLite errors become WorkspaceError."""
        with self._lock, self._translated():
            db = self._open_conn()
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
                db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:  # a failed COMMIT (disk full) may leave it open
                    db.execute("ROLLBACK")
                raise

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._lock, self._translated():
            yield self._open_conn()

    @contextmanager
    def _translated(self) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise WorkspaceError(f"{self.path}: {exc}") from exc

    def _open_conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise WorkspaceError(f"{self.path}: the workspace is closed")
        return self._conn

    # -- conversations

    def create_conversation(self, title: str, model: str = "", system_prompt: str = "",
                            sampling: Mapping | Any | None = None) -> Conversation:
        """A new, empty conversation. ``sampling`` is a mapping or a dataclass (SamplingParams)."""
        now = time.time()
        with self._write() as db:
            cur = db.execute(
                "INSERT INTO conversations(title, model, system_prompt, sampling_json, created, updated)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (_text("title", title), _text("model", model), _text("system_prompt", system_prompt),
                 _sampling_json(sampling), now, now))
            return self._conversation(db, cur.lastrowid)

    def get(self, conv_id: int) -> Conversation:
        with self._read() as db:
            return self._conversation(db, conv_id)

    def rename(self, conv_id: int, title: str) -> Conversation:
        return self.update(conv_id, title=title)

    def update(self, conv_id: int, *, title: str | None = None, model: str | None = None,
               system_prompt: str | None = None, sampling: Mapping | Any | None = None) -> Conversation:
        """Change the given fields of a conversation (the others stay)."""
        fields = {"title": title, "model": model, "system_prompt": system_prompt}
        values = {name: _text(name, value) for name, value in fields.items() if value is not None}
        if sampling is not None:
            values["sampling_json"] = _sampling_json(sampling)
        with self._write() as db:
            self._conversation(db, conv_id)
            if values:
                assignments = ", ".join(f"{column} = ?" for column in values)  # our own column names
                db.execute(f"UPDATE conversations SET {assignments}, updated = ? WHERE id = ?",
                           (*values.values(), time.time(), conv_id))
            return self._conversation(db, conv_id)

    def delete(self, conv_id: int) -> None:
        """Delete a conversation with all its messages."""
        with self._write() as db:
            if db.execute("DELETE FROM conversations WHERE id = ?", (conv_id,)).rowcount == 0:
                raise WorkspaceError(f"no conversation with id {conv_id!r}")

    def list_conversations(self, search: str | None = None) -> list[Conversation]:
        """Every conversation, most recently updated first (only matches when ``search`` is given)."""
        if search is not None and search.strip():
            return self.search(search)
        with self._read() as db:
            rows = db.execute(f"SELECT {_CONV_COLS} FROM conversations ORDER BY updated DESC, id DESC")
            return [_conversation_from(row) for row in rows]

    def search(self, text: str) -> list[Conversation]:
        """Conversations whose title or one of whose messages (on any branch) contains every word
        of ``text``; most recently updated first."""
        words = text.split()
        if not words:
            return self.list_conversations()
        with self._read() as db:
            if self.full_text:
                query = " ".join('"' + word.replace('"', '""') + '"*' for word in words)
                sql = (f"SELECT {_CONV_COLS} FROM conversations WHERE id IN ("
                       "SELECT rowid FROM conversations_fts WHERE conversations_fts MATCH ? UNION "
                       "SELECT m.conversation_id FROM messages_fts"
                       " JOIN messages m ON m.id = messages_fts.rowid WHERE messages_fts MATCH ?)"
                       " ORDER BY updated DESC, id DESC")
                params: tuple = (query, query)
            else:
                patterns = ["%" + _like_escape(word) + "%" for word in words]
                every = " AND ".join(["{col} LIKE ? ESCAPE '\\'"] * len(patterns))
                sql = (f"SELECT {_CONV_COLS} FROM conversations"
                       f" WHERE ({every.format(col='title')}) OR id IN ("
                       f"SELECT conversation_id FROM messages WHERE {every.format(col='content')})"
                       " ORDER BY updated DESC, id DESC")
                params = (*patterns, *patterns)
            return [_conversation_from(row) for row in db.execute(sql, params)]

    # -- messages and branches

    def add_message(self, conv_id: int, role: str, content: str, parent_id: int | None = ACTIVE_LEAF,
                    *, extra: Mapping | None = None) -> Message:
        """Append a message under ``parent_id`` (default: the active leaf; ``None``: a new root)
        and make it the active leaf."""
        with self._write() as db:
            return self._insert_message(db, conv_id, role, content, parent_id, extra)

    def get_message(self, message_id: int) -> Message:
        with self._read() as db:
            return self._message(db, message_id)

    def thread(self, conv_id: int, leaf_id: int | None = None) -> list[Message]:
        """The root-to-leaf path ending at ``leaf_id`` (default: the active leaf)."""
        with self._read() as db:
            conv = self._conversation(db, conv_id)
            leaf_id = conv.active_leaf_id if leaf_id is None else leaf_id
            if leaf_id is None:
                return []
            self._message_of(db, conv_id, leaf_id)
            rows = db.execute(
                "WITH RECURSIVE path(id, depth) AS ("
                " SELECT ?, 0 UNION ALL"
                " SELECT m.parent_id, path.depth + 1 FROM messages m JOIN path ON m.id = path.id"
                " WHERE m.parent_id IS NOT NULL)"
                f" SELECT {_prefixed('m', _MSG_COLS)} FROM path JOIN messages m ON m.id = path.id"
                " ORDER BY path.depth DESC", (leaf_id,))
            return [_message_from(row) for row in rows]

    def branches(self, message_id: int) -> list[Message]:
        """The message and its siblings (the alternatives under the same parent), oldest first."""
        with self._read() as db:
            msg = self._message(db, message_id)
            rows = db.execute(f"SELECT {_MSG_COLS} FROM messages WHERE conversation_id = ? AND parent_id IS ?"
                              " ORDER BY id", (msg.conversation_id, msg.parent_id))
            return [_message_from(row) for row in rows]

    def children(self, message_id: int) -> list[Message]:
        """The replies directly under a message, oldest first."""
        with self._read() as db:
            self._message(db, message_id)
            rows = db.execute(f"SELECT {_MSG_COLS} FROM messages WHERE parent_id = ? ORDER BY id",
                              (message_id,))
            return [_message_from(row) for row in rows]

    def latest_leaf(self, message_id: int) -> Message:
        """The leaf reached from a message by always following its newest reply: where to land
        when the user switches to another branch."""
        with self._read() as db:
            msg = self._message(db, message_id)
            while True:
                row = db.execute(f"SELECT {_MSG_COLS} FROM messages WHERE parent_id = ? ORDER BY id DESC"
                                 " LIMIT 1", (msg.id,)).fetchone()
                if row is None:
                    return msg
                msg = _message_from(row)

    def set_active_leaf(self, conv_id: int, message_id: int) -> None:
        """Show the thread that ends at ``message_id``."""
        with self._write() as db:
            self._conversation(db, conv_id)
            self._message_of(db, conv_id, message_id)
            db.execute("UPDATE conversations SET active_leaf_id = ? WHERE id = ?", (message_id, conv_id))

    def edit_and_branch(self, message_id: int, new_content: str) -> Message:
        """A new sibling of ``message_id`` (same parent and role) with ``new_content``, made the
        active leaf; the original and everything under it stay reachable through :meth:`branches`."""
        with self._write() as db:
            old = self._message(db, message_id)
            return self._insert_message(db, old.conversation_id, old.role, new_content, old.parent_id, None)

    # -- streaming replies

    def begin_reply(self, conv_id: int, parent_id: int | None = ACTIVE_LEAF) -> Message:
        """An empty assistant message under ``parent_id`` (default: the active leaf), made the
        active leaf; regenerate by passing the parent of the reply to replace."""
        with self._write() as db:
            return self._insert_message(db, conv_id, "assistant", "", parent_id, None)

    def append_to_reply(self, message_id: int, text: str) -> None:
        """Add streamed text to an unfinished reply, committed before returning."""
        with self._write() as db:
            cur = db.execute("UPDATE messages SET content = content || ?"
                             " WHERE id = ? AND finish_reason IS NULL AND role = 'assistant'",
                             (_text("text", text), message_id))
            if cur.rowcount == 0:
                msg = self._message(db, message_id)
                raise WorkspaceError(f"message {message_id} is not an unfinished reply "
                                     f"(role {msg.role!r}, finish_reason {msg.finish_reason!r})")

    def finish_reply(self, message_id: int, finish_reason: str, token_count: int | None = None,
                     tokens_per_s: float | None = None, ttft_s: float | None = None,
                     *, extra: Mapping | None = None) -> Message:
        """Record how a reply ended and its metrics; ``extra`` (JSON-able) is merged into its extras."""
        with self._write() as db:
            msg = self._message(db, message_id)
            merged = {**msg.extra, **(extra or {})}
            db.execute("UPDATE messages SET finish_reason = ?, token_count = ?, tokens_per_s = ?, ttft_s = ?,"
                       " extra_json = ? WHERE id = ?",
                       (_text("finish_reason", finish_reason), token_count, tokens_per_s, ttft_s,
                        _json("extra", merged), message_id))
            db.execute("UPDATE conversations SET updated = ? WHERE id = ?",
                       (time.time(), msg.conversation_id))
            return self._message(db, message_id)

    # -- export

    def export_json(self, conv_id: int) -> dict:
        """The conversation's metadata and its active thread as a JSON-able dict."""
        conv = self.get(conv_id)
        return {
            "format": "loomlab-conversation/1",
            "conversation": {
                "id": conv.id, "title": conv.title, "model": conv.model,
                "system_prompt": conv.system_prompt, "sampling": conv.sampling,
                "created": _iso(conv.created), "updated": _iso(conv.updated),
            },
            "messages": [
                {"id": m.id, "parent_id": m.parent_id, "role": m.role, "content": m.content,
                 "created": _iso(m.created), "finish_reason": m.finish_reason, "token_count": m.token_count,
                 "tokens_per_s": m.tokens_per_s, "ttft_s": m.ttft_s, "extra": m.extra}
                for m in self.thread(conv_id)
            ],
        }

    def export_markdown(self, conv_id: int) -> str:
        """The active thread as Markdown: a title, metadata list, then one section per message."""
        conv = self.get(conv_id)
        lines = [f"# {conv.title}", ""]
        if conv.model:
            lines.append(f"- Model: `{conv.model}`")
        lines.append(f"- Created: {_iso(conv.created)}")
        if conv.sampling:
            lines.append("- Sampling: " + ", ".join(f"{k}={v}" for k, v in conv.sampling.items()))
        if conv.system_prompt:
            lines += ["", "## System", "", conv.system_prompt]
        for msg in self.thread(conv_id):
            lines += ["", f"## {msg.role.capitalize()}", "", msg.content]
            metrics = metrics_line(msg)
            if metrics:
                lines += ["", f"*{metrics}*"]
        return "\n".join(lines) + "\n"

    # -- helpers (called with the lock held)

    def _insert_message(self, db: sqlite3.Connection, conv_id: int, role: str, content: str,
                        parent_id: int | None, extra: Mapping | None) -> Message:
        conv = self._conversation(db, conv_id)
        if role not in ROLES:
            raise WorkspaceError(f"role must be one of {ROLES}, got {role!r}")
        if parent_id is ACTIVE_LEAF:
            parent_id = conv.active_leaf_id
        elif parent_id is not None:
            self._message_of(db, conv_id, parent_id)
        now = time.time()
        cur = db.execute("INSERT INTO messages(conversation_id, parent_id, role, content, created,"
                         " extra_json) VALUES (?, ?, ?, ?, ?, ?)",
                         (conv_id, parent_id, role, _text("content", content), now,
                          _json("extra", extra or {})))
        db.execute("UPDATE conversations SET active_leaf_id = ?, updated = ? WHERE id = ?",
                   (cur.lastrowid, now, conv_id))
        return self._message(db, cur.lastrowid)

    def _conversation(self, db: sqlite3.Connection, conv_id: int) -> Conversation:
        row = db.execute(f"SELECT {_CONV_COLS} FROM conversations WHERE id = ?", (_id(conv_id),)).fetchone()
        if row is None:
            raise WorkspaceError(f"no conversation with id {conv_id!r}")
        return _conversation_from(row)

    def _message(self, db: sqlite3.Connection, message_id: int) -> Message:
        row = db.execute(f"SELECT {_MSG_COLS} FROM messages WHERE id = ?", (_id(message_id),)).fetchone()
        if row is None:
            raise WorkspaceError(f"no message with id {message_id!r}")
        return _message_from(row)

    def _message_of(self, db: sqlite3.Connection, conv_id: int, message_id: int) -> Message:
        msg = self._message(db, message_id)
        if msg.conversation_id != conv_id:
            raise WorkspaceError(f"message {message_id} belongs to conversation {msg.conversation_id}, "
                                 f"not {conv_id}")
        return msg


# -- row conversion and argument checks ---------------------------------------------------------

def _conversation_from(row: tuple) -> Conversation:
    id_, title, model, system_prompt, sampling_json, created, updated, leaf = row
    return Conversation(id_, title, model, system_prompt, json.loads(sampling_json), created, updated, leaf)


def _message_from(row: tuple) -> Message:
    *head, extra_json = row
    return Message(*head, extra=json.loads(extra_json))


def _prefixed(alias: str, columns: str) -> str:
    return ", ".join(f"{alias}.{column.strip()}" for column in columns.split(","))


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _id(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise WorkspaceError(f"ids are integers, got {value!r}")
    return value


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise WorkspaceError(f"{name} must be a string, got {type(value).__name__}")
    return value


def _json(name: str, value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise WorkspaceError(f"{name} is not JSON-serialisable: {exc}") from exc


def _sampling_json(sampling: Mapping | Any | None) -> str:
    if sampling is None:
        return "{}"
    if dataclasses.is_dataclass(sampling) and not isinstance(sampling, type):
        sampling = dataclasses.asdict(sampling)
    if not isinstance(sampling, Mapping):
        raise WorkspaceError(f"sampling must be a mapping or a dataclass, got {type(sampling).__name__}")
    return _json("sampling", dict(sampling))


def _like_escape(word: str) -> str:
    return word.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="seconds")


def metrics_line(msg: Message) -> str:
    """``"12 tokens · 40.1 tokens/s · first token 0.10 s · finish: eos"`` for a stored reply."""
    return format_metrics(msg.token_count, msg.tokens_per_s, msg.ttft_s, msg.finish_reason)


def format_metrics(token_count: int | None, tokens_per_s: float | None, ttft_s: float | None,
                   finish_reason: str | None) -> str:
    """The figures of a reply in the one wording every view uses; unknown ones are left out."""
    parts = []
    if token_count is not None:
        parts.append(f"{token_count} tokens")
    if tokens_per_s is not None:
        parts.append(f"{tokens_per_s:.1f} tokens/s")
    if ttft_s is not None:
        parts.append(f"first token {ttft_s:.2f} s")
    if finish_reason is not None:
        parts.append(f"finish: {finish_reason}")
    return " · ".join(parts)
