"""``loomlab --screenshot``: the window opened in a given state and saved as a PNG."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from loomlab.app.gui import SCREENSHOT_SIZE

from ..core.goldens import forward_case


def take_screenshot(tmp_path, *options: str):
    """``loomlab --screenshot PNG *options`` in its own process (pytest-xvfb's display is up, as
    the ``qapp`` fixture makes sure); the PNG as a QImage."""
    out = tmp_path / "shot.png"
    env = {**os.environ, "LOOMLAB_DATA": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    done = subprocess.run([sys.executable, "-m", "loomlab.app.cli", "--screenshot", str(out), *options],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    from PySide6.QtGui import QImage

    return QImage(str(out))


def assert_a_real_picture(image) -> None:
    """The window at the size a screenshot asks for (it was 2621x1135, the docks' minimum sizes
    added up), and not blank."""
    assert (image.width(), image.height()) == SCREENSHOT_SIZE
    pixels = np.array([image.pixel(x, y) for x in range(0, image.width(), 37)
                       for y in range(0, image.height(), 37)])
    assert len(np.unique(pixels)) > 20  # not a blank window


def test_screenshot_of_a_network_in_the_topology_panel(tmp_path, qapp):
    net = tmp_path / "block.json"
    net.write_text(json.dumps(forward_case("transformer_block")["network"]))
    assert_a_real_picture(take_screenshot(tmp_path, "--network", str(net), "--panel", "topology"))


@pytest.mark.parametrize("panel", ["dna", "evolution"])
def test_demo_screenshots_of_the_dna_and_evolution_panels(tmp_path, qapp, panel):
    assert_a_real_picture(take_screenshot(tmp_path, "--panel", panel, "--demo"))


def test_screenshot_of_a_reply_from_a_loaded_model(tmp_path, qapp):
    # --model loads it (every panel takes it, one by one) before --prompt sends; the reply is
    # the model's greedy one (the chat panel's default preset), as the engine gives it
    from loomlab.core.llm.generate.textmodel import load_model

    env = {**os.environ, "LOOMLAB_DATA": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    out = tmp_path / "chat.png"
    argv = ["--screenshot", str(out), "--model", "smollm2-135m", "--prompt", "Name a colour.",
            "--panel", "chat"]
    done = subprocess.run([sys.executable, "-m", "loomlab.app.cli", *argv], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.stat().st_size > 10_000
    with load_model("smollm2-135m") as model:
        expected = "".join(r.text for r in model.chat([{"role": "user", "content": "Name a colour."}],
                                                      temperature=0, max_tokens=256))
    assert done.stdout == expected + "\n" and expected
    # the run's chat, recent files and layout went to a throwaway workspace, not the user's
    assert not (tmp_path / "data").exists() and not (tmp_path / "config").exists()


@pytest.mark.parametrize("argv, message", [
    (["--screenshot"], "argument --screenshot: expected one argument"),
    (["--panel", "nope", "--screenshot", "x.png"], "unknown panel 'nope'; panels: models, chat"),
    (["--screenshot", "x.png", "--prompt", "hi"], "--prompt needs --model"),
    (["--prompt", "hi"], "--prompt needs --model"),  # the window driven without a screenshot
    (["--screenshot", "x.png", "--network", "missing.json"], "opening the network failed"),
    (["--screenshot", "no/such/folder/x.png"], "cannot write the screenshot to no/such/folder/x.png"),
])
def test_screenshot_errors_are_one_line_on_stderr_and_exit_2(argv, message, tmp_path, qapp):
    env = {**os.environ, "LOOMLAB_DATA": str(tmp_path / "data"), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    done = subprocess.run([sys.executable, "-m", "loomlab.app.cli", *argv], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("loomlab: error: ")]
    assert message in line, done.stderr
    assert not (tmp_path / "x.png").exists()
