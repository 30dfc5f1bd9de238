"""``loomlab evolve examples/cartpole.toml``: the shipped example solves CartPole-v1, prints each
generation, and saves the best member's replay, whose frames are that member's episode."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageSequence

from loomlab.app.cli import main
from loomlab.core.evolve.control.frames import episode_frames, replay_fps
from loomlab.core.evolve.search.run import Evolution
from loomlab.core.evolve.search.run_config import read_plan
from loomlab.core.workspace.store import Workspace

pytest.importorskip("gymnasium")

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole.toml"


def test_the_cartpole_example_solves_and_saves_the_best_replay(tmp_path, capsys):
    workspace, replay = tmp_path / "ws.db", tmp_path / "best.gif"
    assert main(["evolve", str(EXAMPLE), "--workspace", str(workspace), "--replay-out", str(replay)]) == 0
    out = capsys.readouterr().out
    plan = read_plan(str(EXAMPLE))
    generations = re.findall(r"^Gen (\d+) \| best=([\d.]+)", out, re.M)
    assert generations and [int(g) for g, _ in generations] == list(range(1, len(generations) + 1))
    solved = re.search(r"run (\d+) solved at generation (\d+): best fitness ([\d.]+)", out)
    assert solved, out
    with Workspace(workspace) as ws:
        run = Evolution.resume(ws, int(solved[1]))
    # the saved best is the member that solved it: its mean return over the example's episodes
    fitness = plan.task.evaluate([run.best])[0]
    assert fitness == pytest.approx(float(solved[3]), abs=5e-5) and fitness >= plan.task.fitness_threshold
    episode = plan.task.episode(run.best)
    assert re.search(rf"replay of the best member \(CartPole-v1, seed 0, {len(episode)} steps, "
                     rf"return {episode.total:g}\): {re.escape(str(replay))}", out)
    with Image.open(replay) as gif:
        frames, durations = zip(*[(np.asarray(f.convert("RGB")), f.info["duration"])
                                  for f in ImageSequence.Iterator(gif)], strict=True)
    drawn = episode_frames(episode)
    assert len(drawn) == len(episode) + 1 and frames[0].shape == drawn[0].shape
    # a GIF keeps a state that looks as the one before it as one longer frame: every state shown
    assert sum(durations) == 1000 // replay_fps("CartPole-v1") * len(drawn)
    assert np.array_equal(frames[0], drawn[0])
    assert np.abs(frames[-1].astype(int) - drawn[-1].astype(int)).mean() < 0.5  # the GIF's palette
