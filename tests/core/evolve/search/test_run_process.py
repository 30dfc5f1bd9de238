"""An evolution run in a child process (core/evolve/search/run_process.py) is the same run as in this
process: same history, members and best, bit for bit (oracle: Evolution run directly); pause,
stop and the end of the child's input stop it with its checkpoint kept; errors come back typed.
The live events survive their JSON form unchanged."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading

import pytest

from loomlab.core.errors import EngineProcessError, LoomConfigError
from loomlab.core.evolve.search.live import (
    BestMember,
    LiveBuffer,
    MemberRow,
    Progress,
    RunStarted,
    Snapshot,
    event_from_dict,
    event_to_dict,
    member_rows,
)
from loomlab.core.evolve.search.reporters import GenerationStats
from loomlab.core.evolve.search.run import Evolution
from loomlab.core.evolve.search.run_process import run_in_child
from loomlab.core.evolve.search.speciation import SpeciationConfig
from loomlab.core.evolve.search.tasks import get_task
from loomlab.core.io.checkpoint import checkpoint_bytes
from loomlab.core.io.loom_json import dumps
from loomlab.core.pipe_messages import receive, send
from loomlab.core.workspace.evolution_runs import EvolutionRuns
from loomlab.core.workspace.store import Workspace

SETTINGS = {"run": {"task": "xor", "population": 20}, "neat": {"seed": 5},
            "speciation": {"compatibility_threshold": 0.5}}


def api_run(generations: int) -> Evolution:
    task = get_task("xor")
    run = Evolution(task, config=task.neat_config(seed=5), population=20,
                    speciation=SpeciationConfig(compatibility_threshold=0.5))
    run.run(generations)
    return run


def collect(request, **kw):
    events = []
    result = run_in_child(request, events.append, **kw)
    return result, events


def test_a_run_in_a_child_is_the_run_in_this_process(tmp_path):
    path = tmp_path / "ws.sqlite3"
    result, events = collect({"workspace": str(path), "settings": SETTINGS, "generations": 4})
    api = api_run(4)
    assert (result.generation, result.status, result.best_fitness) == (4, "finished", api.best_fitness)
    started = events[0]
    assert isinstance(started, RunStarted) and started.history == [] and started.task == "xor"
    assert [e for e in events if isinstance(e, GenerationStats)] == api.history
    snapshots = [e for e in events if isinstance(e, Snapshot)]
    assert [s.generation for s in snapshots] == [1, 2, 3, 4]
    last = snapshots[-1].rows
    assert [r.fitness for r in last] == sorted((r.fitness for r in last), reverse=True)
    assert last[0].fitness == api.history[-1].best and len(last) == 20
    best = [e for e in events if isinstance(e, BestMember)][-1]
    assert best.fitness == api.best_fitness and dumps(best.member) == dumps(api.best)
    assert best.member.precision == api.best.precision
    progress = [e for e in events if isinstance(e, Progress) and e.stage == "generation"]
    assert [(p.done, p.total) for p in progress] == [(1, 4), (2, 4), (3, 4), (4, 4)]
    with Workspace(path) as ws:
        stored = EvolutionRuns(ws).latest_checkpoint(result.run_id)
    assert stored.members == [checkpoint_bytes(m) for m in api.members]


def test_pause_then_resume_in_a_child_continues_the_same_run(tmp_path):
    path = str(tmp_path / "ws.sqlite3")
    events = []
    paused = threading.Event()

    def sink(event):  # ask for the pause as soon as the first generation is under way
        events.append(event)
        paused.set()

    first = run_in_child({"workspace": path, "settings": SETTINGS, "generations": 50}, sink, pause=paused)
    assert first.status == "stopped" and 1 <= first.generation < 50
    rest = 5 - first.generation
    second, resumed = collect({"workspace": path, "resume": first.run_id, "generations": rest})
    assert resumed[0].history == api_run(first.generation).history  # what it started from
    api = api_run(5)
    assert second.run_id == first.run_id and second.generation == 5
    with Workspace(path) as ws:
        stored = EvolutionRuns(ws).latest_checkpoint(first.run_id)
    assert stored.state["history"] == [s.to_dict() for s in api.history]
    assert stored.members == [checkpoint_bytes(m) for m in api.members]


def test_cancel_stops_the_child_and_keeps_the_last_checkpoint(tmp_path):
    path = str(tmp_path / "ws.sqlite3")
    seen = []
    result = run_in_child({"workspace": path, "settings": SETTINGS, "generations": 100000}, seen.append,
                          cancelled=lambda: sum(isinstance(e, GenerationStats) for e in seen) >= 2)
    assert result.status == "stopped" and result.generation >= 2
    with Workspace(path) as ws:
        record = EvolutionRuns(ws).get(result.run_id)
    assert record.status == "stopped" and record.generations == result.generation


def test_the_end_of_its_input_stops_the_child(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "loomlab.core.evolve.search.run_process"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0)
    send(proc.stdin, {"workspace": str(tmp_path / "ws.sqlite3"), "settings": SETTINGS, "generations": 100000})
    assert receive(proc.stdout)["event"] == "started"
    proc.stdin.close()  # the parent is gone
    messages = []
    while (m := receive(proc.stdout)) is not None:
        messages.append(m)
    assert proc.wait(timeout=60) == 0
    assert messages[-1]["result"]["status"] == "stopped"


@pytest.mark.parametrize("request_, error, match", [
    ({"settings": {"run": {"task": "xor", "population": 1}}, "generations": 1}, LoomConfigError,
     "population must be an integer >= 2"),
    ({"settings": {"run": {"task": "quant-recipe"}, "task": {"model": "x"}}, "generations": 1},
     LoomConfigError, "not in a child"),
    ({"resume": 7, "generations": 1}, LoomConfigError, "needs the workspace"),
    ({"resume": 7, "generations": 1, "workspace": "WS"}, EngineProcessError, "WorkspaceError"),
])
def test_errors_come_back_typed(tmp_path, request_, error, match):
    if request_.get("workspace") == "WS":
        request_ = {**request_, "workspace": str(tmp_path / "ws.sqlite3")}
    with pytest.raises(error, match=match):
        run_in_child(request_, lambda e: None)


def test_live_events_survive_json():
    task = get_task("xor")
    net = task.seed_network()
    net.precision = "fast"
    stats = GenerationStats(3, 2.5, 1.0, 0.5, float("-inf"), {1: 4, 7: 16})
    rows = member_rows([net, net], [1.0, 2.0], {0: 1})
    recipe = MemberRow(1, 0, None, -0.25, "int8×2", 96, 0.01, ("int8", "int8"))
    events = [RunStarted(4, "xor", [stats], net, 2.5, ()), RunStarted(None, "quant-recipe", [], None,
                                                                       float("-inf"), ("a", "b")),
              stats, Snapshot(3, [*rows, recipe]), BestMember(net, 2.5), Progress("evaluate", 3, 20)]
    for event in events:
        back = event_from_dict(json.loads(json.dumps(event_to_dict(event))))
        if isinstance(event, RunStarted | BestMember):
            member = event.best if isinstance(event, RunStarted) else event.member
            got = back.best if isinstance(back, RunStarted) else back.member
            assert (got is None) == (member is None)
            if member is not None:
                assert dumps(got) == dumps(member) and got.precision == "fast"
            field = "best" if isinstance(event, RunStarted) else "member"
            assert dataclasses.replace(back, **{field: None}) == dataclasses.replace(event, **{field: None})
        else:
            assert back == event
    buffer = LiveBuffer()
    for event in events:
        buffer.accept(event)
    kept, snapshot, best = buffer.drain()
    assert kept == [events[0], events[1], stats] and snapshot is events[3] and best is events[4]
    assert buffer.drain() == ([], None, None)
