"""A gguf-recipe run's live events (core/evolve/search/live.py): members' held-out KL in the
population table's rows, the presets as one :class:`References` event after the first generation;
both survive their JSON form, and rows written before ``heldout_kl`` existed still load."""

from __future__ import annotations

import json
from types import SimpleNamespace

from loomlab.core.evolve.search.live import (
    LiveBuffer,
    LiveReporter,
    MemberRow,
    References,
    Snapshot,
    event_from_dict,
    event_to_dict,
    member_rows,
)
from loomlab.core.evolve.search.reporters import GenerationStats


def test_held_out_kl_and_references_survive_json():
    rows = [MemberRow(1, 2, None, -0.03, "Q4_0×3 Q8_0×1", 123456, 0.031, ("Q4_0", "Q8_0"), 0.1 + 0.2),
            MemberRow(2, 0, None, -0.5, "Q4_0×4", 100000, 0.5, ("Q4_0", "Q4_0"))]
    references = References([("Q4_K_M", 130000, 0.04), ("Q8_0", 200000, 1 / 3)])
    for event in (Snapshot(2, rows), references):
        back = event_from_dict(json.loads(json.dumps(event_to_dict(event))))
        assert back == event
    old = event_to_dict(Snapshot(1, rows[1:]))
    old["rows"] = [r[:8] for r in old["rows"]]  # a row from before heldout_kl
    assert event_from_dict(old) == Snapshot(1, rows[1:])
    buffer = LiveBuffer()
    stats = GenerationStats(1, 1.0, 0.5, 0.0, 1.0, {})
    for event in (stats, references, Snapshot(1, rows)):
        buffer.accept(event)
    assert buffer.drain() == ([stats, references], Snapshot(1, rows), None)


def test_member_rows_carry_the_held_out_kl_of_those_re_scored():
    scores = [SimpleNamespace(kl_mean=0.2, bytes=10, heldout_kl=None),
              SimpleNamespace(kl_mean=0.1, bytes=20, heldout_kl=0.15)]
    rows = member_rows([("Q4_0",), ("Q8_0",)], [-0.2, -0.1], {}, scores)
    assert [(r.index, r.parameters, r.kl, r.heldout_kl) for r in rows] == \
        [(1, 20, 0.1, 0.15), (0, 10, 0.2, None)]
    quant = member_rows([("int8",)], [-0.1], {}, [SimpleNamespace(kl_mean=0.1, bytes=5)])  # no held-out text
    assert quant[0].heldout_kl is None


def test_references_are_sent_once_after_the_first_generation():
    asked = []

    def references(cancel=None):
        asked.append(cancel)
        return {"Q4_0": SimpleNamespace(bytes=10, kl_mean=0.3),
                "Q8_0": SimpleNamespace(bytes=20, kl_mean=0.01)}

    events = []
    reporter = LiveReporter(events.append)
    reporter.run = SimpleNamespace(task=SimpleNamespace(references=references), best=None, best_fitness=0.0)
    reporter.cancel_check(lambda: False)
    for g in (1, 2):
        reporter.end_generation(GenerationStats(g, 0.0, 0.0, 0.0, 0.0, {}), 0)
    sent = [e for e in events if isinstance(e, References)]
    assert sent == [References([("Q4_0", 10, 0.3), ("Q8_0", 20, 0.01)])] and len(asked) == 1
    assert callable(asked[0])
    # a task without reference recipes sends none
    events.clear()
    plain = LiveReporter(events.append)
    plain.run = SimpleNamespace(task=SimpleNamespace(), best=None, best_fitness=0.0)
    plain.end_generation(GenerationStats(1, 0.0, 0.0, 0.0, 0.0, {}), 0)
    assert not any(isinstance(e, References) for e in events)
