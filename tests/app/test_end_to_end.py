"""End to end, as a person would do it: the main window loads smollm2-135m, a typed message gets a
streamed greedy reply equal to what ``loomlab chat --message`` prints for the same message, and
after closing the window a new one (a restart) shows the conversation from the database.
Unloading the model clears every panel that showed its grid and gives its memory back."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from PySide6.QtCore import Qt

from loomlab.core.llm.kernels import kernel_warmup
from loomlab.core.procinfo import release_memory, rss_bytes

from ..core.goldens import forward_case
from .test_main_window import make_window

MESSAGE = "Write a short story about a loom."
MAX_TOKENS = 64  # a reply long enough to take several of the view's 100 ms frames at 8-bit speed
TIMEOUT_MS = 120_000
# What an unloaded model may leave resident: measured ~70 MiB (numba's worker threads' arenas and
# stacks, the X server's shared buffers, Qt's caches); loading it took 190-300 MiB. Before unloading
# gave memory back, none of it came back.
UNLOADED_MARGIN = 120 * 2**20


def cli_reply() -> str:
    """The reply ``loomlab chat`` prints (stdout: the text, then a newline; stats go to stderr)."""
    command = [sys.executable, "-m", "loomlab.app.cli", "chat", "smollm2-135m", "--message", MESSAGE,
               "--max-tokens", str(MAX_TOKENS)]
    out = subprocess.run(command, capture_output=True, text=True, timeout=300, check=True,
                         env={**os.environ, "PYTHONIOENCODING": "utf-8"})
    assert out.stdout.endswith("\n")
    return out.stdout[:-1]


def test_gui_reply_equals_the_cli_and_survives_a_restart(qtbot, tmp_path):
    expected = cli_reply()
    assert len(expected) > 10

    win = make_window(qtbot, tmp_path)
    chat = win.panels["chat"]
    kernel_warmup.warm_up()  # the JIT's code and compiler are the process's, not the model's
    release_memory()
    before = rss_bytes()
    win.open_model("smollm2-135m")
    qtbot.waitUntil(lambda: chat.model is not None, timeout=TIMEOUT_MS)
    assert chat.sampling.spins["temperature"].value() == 0  # the default preset is greedy
    chat.sampling.spins["max_tokens"].setValue(MAX_TOKENS)
    shown = []  # the transcript each time the view changed: the reply must grow token by token
    chat.view.textChanged.connect(lambda: shown.append(chat.view.toPlainText()))
    qtbot.keyClicks(chat.input, MESSAGE)
    with qtbot.waitSignal(chat.reply_finished, timeout=TIMEOUT_MS) as blocker:
        qtbot.mouseClick(chat.send_button, Qt.MouseButton.LeftButton)
    reply = blocker.args[0]
    assert reply.content == expected
    assert expected in chat.view.toPlainText()
    # the transcript ended in ever longer beginnings of the reply while it streamed
    prefixes = {k for t in shown for k in range(4, len(expected)) if t.endswith(expected[:k])}
    # (drawn once a frame: at 100-250 tok/s, 64 tokens are a few frames of several tokens each)
    assert len(prefixes) >= 4, f"the reply did not stream: {sorted(prefixes)}"

    morph = win.panels["morph"]
    win.docks["morph"].raise_()  # the Morph panel fills its table once on screen
    qtbot.waitUntil(lambda: morph.table.rowCount() > 100, timeout=TIMEOUT_MS)
    assert win.speed_label.text() == f"{reply.tokens_per_s:.1f} tok/s"

    # a Loom network opened beside the model takes the panels; the model stays loaded and
    # "Show in panels" brings its grid back
    net_path = tmp_path / "block.json"
    net_path.write_text(json.dumps(forward_case("transformer_block")["network"]))
    win.open_network(str(net_path))
    qtbot.waitUntil(lambda: win.network is not win.model.net and not win.handing_over, timeout=TIMEOUT_MS)
    assert win.panels["telemetry"].network is win.network is not None
    assert chat.model is win.model and win.panels["models"].model is win.model
    win.panels["models"].show_requested.emit(win.model)
    qtbot.waitUntil(lambda: win.network is win.model.net and not win.handing_over, timeout=TIMEOUT_MS)
    assert win.panels["telemetry"].network is win.panels["topology"].network is win.model.net
    loaded = rss_bytes()
    win.panels["models"].unload()  # no panel keeps the unloaded model's grid
    assert chat.model is None and win.network is None and morph.table.rowCount() == 0
    assert win.panels["topology"].network is None and win.panels["telemetry"].network is None
    assert win.speed_label.text() == ""  # no speed without a model
    qtbot.waitUntil(lambda: not morph.is_busy(), timeout=TIMEOUT_MS)  # its cancelled job ends
    # the memory goes back once the last job that could hold the model has ended
    qtbot.waitUntil(lambda: not win._release_pending, timeout=TIMEOUT_MS)
    after = rss_bytes()
    print(f"resident memory: {before / 2**20:.0f} MiB before loading, {loaded / 2**20:.0f} MiB loaded, "
          f"{after / 2**20:.0f} MiB after unloading")
    assert after - before < UNLOADED_MARGIN and loaded - after > 0.4 * (loaded - before)
    win.close()

    restarted = make_window(qtbot, tmp_path)  # same settings and database: a restart
    chat = restarted.panels["chat"]
    assert [chat.conversations.item(i).text() for i in range(chat.conversations.count())] == [MESSAGE]
    stored = restarted.workspace.thread(chat.conversation_id)
    assert [(m.role, m.content) for m in stored] == [("user", MESSAGE), ("assistant", expected)]
    assert expected in chat.view.toPlainText()
    restarted.close()
