"""A ``loomlab evolve`` process killed with SIGKILL in the middle of a generation: the workspace
database is intact, its last checkpoint whole and at most that generation behind, and resuming
from it gives, bit for bit, the members of a run that was never interrupted."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from loomlab.core.evolve.genetics.neat import NEATConfig
from loomlab.core.evolve.search.run import Evolution, genome_width
from loomlab.core.evolve.search.speciation import SpeciationConfig
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.io.checkpoint import checkpoint_bytes, checkpoint_from_bytes
from loomlab.core.workspace.evolution_runs import EvolutionRuns
from loomlab.core.workspace.store import Workspace

# 1500 points per spiral make a generation ~0.5 s here: long enough to land a kill inside it,
# while writing its checkpoint takes ~10 ms
TASK = {"points": 1500}
POPULATION, SEED, THRESHOLD = 100, 5, 0.5
CONFIG = f"""
[run]
task = "spirals"
population = {POPULATION}
generations = 1000
[task]
points = {TASK["points"]}
[neat]
seed = {SEED}
[speciation]
compatibility_threshold = {THRESHOLD}
"""
KILL_AFTER = 2  # the checkpoint to wait for; the kill lands in the generation after it
FINAL = 5  # the generation both runs are compared at


def checkpoints(db_path: Path) -> dict[int, float]:
    """When each checkpoint was written, by generation, read through a read-only connection (the
    running process is the only writer)."""
    if not db_path.exists():
        return {}
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    try:
        return dict(db.execute("SELECT generation, created FROM evolution_checkpoints"))
    except sqlite3.OperationalError:  # the tables are not made yet
        return {}
    finally:
        db.close()


def printed_generations(out: Path) -> list[int]:
    """The ``Gen N |`` lines the console reporter printed (after each checkpoint)."""
    return [int(n) for n in re.findall(r"^Gen (\d+) \|", out.read_text(), re.M)]


def test_a_kill_mid_generation_loses_at_most_that_generation(tmp_path):
    started = time.monotonic()
    config, ws_path, out = tmp_path / "run.toml", tmp_path / "ws.sqlite3", tmp_path / "out.txt"
    config.write_text(CONFIG)
    with out.open("w") as stdout, (tmp_path / "err.txt").open("w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "loomlab.app.cli", "evolve", str(config),
                                 "--workspace", str(ws_path)], stdout=stdout, stderr=stderr,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        written = {}
        while KILL_AFTER not in written:
            assert proc.poll() is None, f"the run ended early:\n{(tmp_path / 'err.txt').read_text()}"
            assert time.monotonic() - started < 60, "no checkpoint within 60 s"
            time.sleep(0.02)
            written = checkpoints(ws_path)
        # the next generation began at most 20 ms ago: kill it a fifth of the way in, judging its
        # length by the last one's
        time.sleep(0.2 * (written[KILL_AFTER] - written[KILL_AFTER - 1]))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    printed = printed_generations(out)

    db = sqlite3.connect(ws_path)
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    # nothing of the killed generation was left behind
    last = db.execute("SELECT MAX(generation) FROM evolution_checkpoints").fetchone()[0]
    left = db.execute("SELECT COUNT(*) FROM evolution_members WHERE generation > ?", (last,)).fetchone()
    assert left == (0,)
    db.close()
    with Workspace(ws_path) as ws:
        runs = EvolutionRuns(ws)
        (record,) = runs.list()
        point = runs.latest_checkpoint(record.id)
        # the checkpoint being written when killed is there whole or not at all; the generation
        # being evaluated is the one lost
        assert point.generation == KILL_AFTER == record.generations == last == printed[-1]
        assert record.status == "running"  # nobody got to say otherwise
        assert point.state["generation"] == point.generation
        assert len(point.members) == POPULATION
        assert all(checkpoint_from_bytes(m) is not None for m in point.members)

        resumed = Evolution.resume(ws, record.id)
        assert resumed.generation == point.generation
        resumed.run(FINAL - resumed.generation)

    task = get_task("spirals", **TASK)  # the config as the CLI builds it
    neat = NEATConfig.default(genome_width(task.seed_network()), seed=SEED)
    straight = Evolution(task, config=neat, population=POPULATION,
                         speciation=SpeciationConfig(compatibility_threshold=THRESHOLD))
    straight.run(FINAL)
    assert [checkpoint_bytes(m) for m in resumed.members] == [checkpoint_bytes(m) for m in straight.members]
    assert [s.to_dict() for s in resumed.history] == [s.to_dict() for s in straight.history]
    assert resumed.best_fitness == straight.best_fitness
    with Workspace(ws_path) as ws:
        assert EvolutionRuns(ws).latest_checkpoint(record.id).members == \
            [checkpoint_bytes(m) for m in straight.members]
