"""Evolution runs kept in the workspace database: each run's config, and after every generation a
checkpoint (the members to evaluate next as ``.loom`` bytes, plus the run's state as JSON).

A checkpoint is one transaction, so a process killed mid-generation leaves the previous one whole:
resuming loses at most the generation that was running.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .store import Workspace, WorkspaceError

RUN_STATUSES = ("running", "stopped", "solved", "finished", "failed")


@dataclass(frozen=True)
class RunRecord:
    id: int
    task: str
    config: dict
    status: str
    created: float
    updated: float
    generations: int  # checkpoints written (the last one's generation number)


@dataclass(frozen=True)
class Checkpoint:
    run_id: int
    generation: int
    state: dict
    members: list[bytes]


class EvolutionRuns:
    """The evolution runs of ``workspace`` (the same SQLite file as its conversations)."""

    def __init__(self, workspace: Workspace):
        self.workspace = workspace

    def create(self, task: str, config: Mapping[str, Any]) -> int:
        now = time.time()
        with self.workspace._write() as db:
            cur = db.execute("INSERT INTO evolution_runs(task, config_json, status, created, updated)"
                             " VALUES (?, ?, 'running', ?, ?)", (task, _json(config), now, now))
            return int(cur.lastrowid)

    def save_checkpoint(self, run_id: int, generation: int, state: Mapping[str, Any],
                        members: Sequence[bytes], status: str = "running") -> None:
        """Record generation ``generation``'s checkpoint (replacing one of that number)."""
        _check_status(status)
        now = time.time()
        with self.workspace._write() as db:
            self._record(db, run_id)
            db.execute("DELETE FROM evolution_checkpoints WHERE run_id = ? AND generation >= ?",
                       (run_id, generation))
            db.execute("INSERT INTO evolution_checkpoints(run_id, generation, state_json, created)"
                       " VALUES (?, ?, ?, ?)", (run_id, generation, _json(state), now))
            rows = [(run_id, generation, i, bytes(m)) for i, m in enumerate(members)]
            db.executemany("INSERT INTO evolution_members(run_id, generation, idx, network)"
                           " VALUES (?, ?, ?, ?)", rows)
            db.execute("UPDATE evolution_runs SET status = ?, updated = ? WHERE id = ?",
                       (status, now, run_id))

    def set_status(self, run_id: int, status: str) -> None:
        _check_status(status)
        with self.workspace._write() as db:
            self._record(db, run_id)
            db.execute("UPDATE evolution_runs SET status = ?, updated = ? WHERE id = ?",
                       (status, time.time(), run_id))

    def get(self, run_id: int) -> RunRecord:
        with self.workspace._read() as db:
            return self._record(db, run_id)

    def list(self) -> list[RunRecord]:
        """Every run, newest first."""
        with self.workspace._read() as db:
            ids = [row[0] for row in db.execute(
                "SELECT id FROM evolution_runs ORDER BY updated DESC, id DESC")]
            return [self._record(db, i) for i in ids]

    def latest_checkpoint(self, run_id: int) -> Checkpoint:
        with self.workspace._read() as db:
            self._record(db, run_id)
            row = db.execute("SELECT generation, state_json FROM evolution_checkpoints WHERE run_id = ?"
                             " ORDER BY generation DESC LIMIT 1", (run_id,)).fetchone()
            if row is None:
                raise WorkspaceError(f"evolution run {run_id} has no checkpoint yet")
            members = [bytes(r[0]) for r in db.execute(
                "SELECT network FROM evolution_members WHERE run_id = ? AND generation = ? ORDER BY idx",
                (run_id, row[0]))]
            return Checkpoint(run_id, row[0], json.loads(row[1]), members)

    def delete(self, run_id: int) -> None:
        with self.workspace._write() as db:
            self._record(db, run_id)
            db.execute("DELETE FROM evolution_members WHERE run_id = ?", (run_id,))
            db.execute("DELETE FROM evolution_runs WHERE id = ?", (run_id,))

    @staticmethod
    def _record(db, run_id: int) -> RunRecord:
        row = db.execute("SELECT r.id, r.task, r.config_json, r.status, r.created, r.updated,"
                         " (SELECT COALESCE(MAX(generation), 0) FROM evolution_checkpoints c"
                         "  WHERE c.run_id = r.id) FROM evolution_runs r WHERE r.id = ?",
                         (run_id,)).fetchone()
        if row is None:
            raise WorkspaceError(f"no evolution run {run_id} in this workspace")
        return RunRecord(row[0], row[1], json.loads(row[2]), row[3], row[4], row[5], row[6])


def _check_status(status: str) -> None:
    if status not in RUN_STATUSES:
        raise WorkspaceError(f"a run's status is one of {', '.join(RUN_STATUSES)}, got {status!r}")


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, allow_nan=False, separators=(",", ":"))
