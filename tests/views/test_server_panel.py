"""The Server panel with a fake starter (no HTTP): what is typed reaches the starter, Stop reaches
the handle, a failed start shows its message, and request entries emitted on a plain thread (as
the server's threads do) land in the log newest first, updated in place, bounded."""

from __future__ import annotations

import json
import shlex
import threading
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QPalette
from PySide6.QtWidgets import QApplication, QLineEdit

from loomlab.core.errors import LoomError
from loomlab.views.server_panel import (
    COLUMNS,
    NO_MODEL,
    RUNNING,
    ServerPanel,
    curl_example,
    log_row,
)
from loomlab.views.theme import error_colour

from .contrast import assert_legible, dark_theme
from .panel_layout import DOCKED, assert_unclipped

MODEL = SimpleNamespace(name="tiny-chat", activations="int8")  # what the panel reads of a TextModel


@dataclass
class Entry:
    """What the server's on_log hands over (app/serve/server.py)."""

    id: int
    time: float = 1_700_000_000.0
    method: str = "POST"
    path: str = "/v1/chat/completions"
    status: int = 0
    model: str = "tiny-chat"
    stream: bool = False
    prompt_tokens: int | None = 12
    completion_tokens: int | None = 0
    duration_s: float = 0.0
    tokens_per_s: float = 0.0
    finish_reason: str | None = None
    error: str | None = None


def done(entry: Entry, **changes) -> Entry:
    return replace(entry, **{"status": 200, "completion_tokens": 30, "duration_s": 1.5, "tokens_per_s": 20.0,
                             "finish_reason": "stop", **changes})


class FakeHandle:
    def __init__(self, url: str):
        self.url = url
        self.stops = 0

    def stop(self) -> None:
        time.sleep(0.05)  # a real stop joins threads: the GUI must not wait on it
        self.stops += 1


class FakeStarter:
    """Records each call, returns a FakeHandle (or raises ``error``) after ``delay_s``."""

    def __init__(self, *, error: Exception | None = None, delay_s: float = 0.05):
        self.calls: list[tuple] = []
        self.handles: list[FakeHandle] = []
        self.error, self.delay_s = error, delay_s
        self.on_log = None

    def __call__(self, host, port, api_key, max_batch, on_log):
        self.calls.append((host, port, api_key, max_batch))
        self.on_log = on_log
        time.sleep(self.delay_s)
        if self.error is not None:
            raise self.error
        self.handles.append(FakeHandle(f"http://{host}:{port or 43210}/v1"))
        return self.handles[-1]

    def emit(self, entries) -> None:
        """Hand ``entries`` to on_log from a plain thread, as the server does; joined here."""
        thread = threading.Thread(target=lambda: [self.on_log(e) for e in entries], name="fake-server")
        thread.start()
        thread.join()


def make_panel(qtbot, runner, starter, **kwargs) -> ServerPanel:
    panel = ServerPanel(runner, starter, **kwargs)
    qtbot.addWidget(panel)
    panel.resize(*DOCKED)
    panel.show()
    return panel


@pytest.fixture
def starter():
    return FakeStarter()


@pytest.fixture
def panel(qtbot, runner, starter):
    p = make_panel(qtbot, runner, starter)
    yield p
    p.shutdown()


def start(qtbot, panel) -> None:
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.state == "running", timeout=5000)


def rows(panel) -> list[list[str]]:
    t = panel.table
    return [[t.item(r, c).text() for c in range(t.columnCount())] for r in range(t.rowCount())]


def drawn(qtbot, panel, n_rows: int) -> None:
    qtbot.waitUntil(lambda: panel.table.rowCount() == n_rows and not panel._pending, timeout=5000)


def type_into(qtbot, widget, text: str) -> None:
    """Replace the field's text by typing, as a person does (select all, type)."""
    line = widget if isinstance(widget, QLineEdit) else widget.lineEdit()
    widget.setFocus()
    line.selectAll()
    qtbot.keyClicks(line, text)


def test_start_is_disabled_until_a_model_is_loaded(panel):
    assert not panel.start_button.isEnabled()
    assert panel.start_button.toolTip() == NO_MODEL and NO_MODEL in panel.status_label.text()
    panel.set_model(MODEL)
    assert panel.start_button.isEnabled() and panel.start_button.toolTip() == ""
    assert panel.status_label.text() == "Stopped"
    panel.set_model(None)
    assert not panel.start_button.isEnabled()


def test_start_passes_what_was_typed_and_stop_reaches_the_handle(qtbot, panel, starter):
    panel.set_model(MODEL)
    assert (panel.host_edit.text(), panel.port_box.value(), panel.key_edit.text(), panel.batch_box.value()) \
        == ("127.0.0.1", 8080, "", 8)
    type_into(qtbot, panel.host_edit, "0.0.0.0")
    type_into(qtbot, panel.port_box, "9001")
    type_into(qtbot, panel.key_edit, "sekrit")
    type_into(qtbot, panel.batch_box, "3")
    assert panel.key_edit.echoMode() == QLineEdit.EchoMode.Password
    start(qtbot, panel)
    assert starter.calls == [("0.0.0.0", 9001, "sekrit", 3)]
    handle = starter.handles[0]
    assert panel.url == handle.url == "http://0.0.0.0:9001/v1"
    assert panel.address_edit.text() == handle.url and panel.status_label.text() == f"Running at {handle.url}"
    assert panel.curl_edit.text() == curl_example(handle.url, "tiny-chat", with_key=True)
    assert panel.start_button.text() == "Stop server" and panel.start_button.isEnabled()
    assert not any(w.isEnabled() for w in (panel.host_edit, panel.port_box, panel.key_edit, panel.batch_box))
    qtbot.mouseClick(panel.copy_address_button, Qt.MouseButton.LeftButton)
    assert QApplication.clipboard().text() == handle.url

    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    assert panel.state == "stopping" and not panel.start_button.isEnabled()  # the GUI did not wait
    qtbot.waitUntil(lambda: panel.state == "stopped", timeout=5000)
    assert handle.stops == 1 and panel.url == "" and panel.address_edit.text() == ""
    assert panel.status_label.text() == "Stopped" and panel.host_edit.isEnabled()
    assert panel.start_button.text() == "Start server" and panel.start_button.isEnabled()


def test_an_empty_api_key_is_none(qtbot, panel, starter):
    panel.set_model(MODEL)
    start(qtbot, panel)
    assert starter.calls == [("127.0.0.1", 8080, None, 8)]
    assert "Authorization" not in panel.curl_edit.text()


def test_a_failed_start_shows_the_message_in_red_and_start_works_again(qtbot, runner):
    starter = FakeStarter(error=LoomError("port 8080 is already in use"))
    panel = make_panel(qtbot, runner, starter)
    try:
        panel.set_model(MODEL)
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
        assert panel.state == "starting" and not panel.start_button.isEnabled()
        qtbot.waitUntil(lambda: panel.state == "stopped", timeout=5000)
        assert panel.status_label.text() == "Could not start: LoomError: port 8080 is already in use"
        label_colour = panel.status_label.palette().color(QPalette.ColorRole.WindowText)
        assert label_colour == error_colour(panel.palette())
        assert panel.start_button.isEnabled() and panel.host_edit.isEnabled() and panel.url == ""
        starter.error = None  # the port is free again
        start(qtbot, panel)
        assert len(starter.calls) == 2
        assert panel.status_label.palette().color(QPalette.ColorRole.WindowText) != label_colour
    finally:
        panel.shutdown()


def test_an_empty_host_is_refused_before_starting(qtbot, panel, starter):
    panel.set_model(MODEL)
    type_into(qtbot, panel.host_edit, "  ")
    qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
    assert starter.calls == [] and panel.state == "stopped" and "Enter a host" in panel.status_label.text()


def test_generated_keys_are_random_url_safe_and_hidden_until_shown(qtbot, panel):
    qtbot.mouseClick(panel.generate_button, Qt.MouseButton.LeftButton)
    first = panel.key_edit.text()
    panel.generate_key()
    second = panel.key_edit.text()
    assert len(first) == len(second) == 32 and first != second  # 24 bytes in base64url
    assert set(first + second) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert panel.key_edit.echoMode() == QLineEdit.EchoMode.Password
    qtbot.mouseClick(panel.show_key_button, Qt.MouseButton.LeftButton)
    assert panel.key_edit.echoMode() == QLineEdit.EchoMode.Normal and panel.show_key_button.text() == "Hide"


def test_log_rows_newest_first_updated_in_place(qtbot, panel, starter):
    panel.set_model(MODEL)
    start(qtbot, panel)
    a, b = Entry(1, stream=True), Entry(2, time=1_700_000_001.0)
    starter.emit([a, b])
    drawn(qtbot, panel, 2)
    assert [r[3] for r in rows(panel)] == [RUNNING, RUNNING]
    assert rows(panel)[1][1] == "POST /v1/chat/completions (stream)"
    c = Entry(3, path="/v1/completions", time=1_700_000_002.0)
    starter.emit([done(a), c, done(c, status=401, completion_tokens=0, tokens_per_s=0.0, finish_reason=None,
                                   error="invalid API key")])
    drawn(qtbot, panel, 3)
    table = rows(panel)
    stamp = time.strftime("%H:%M:%S", time.localtime(1_700_000_000.0))
    # newest request on top; request 1 finished in its own (bottom) row
    assert [r[1] for r in table] == ["POST /v1/completions", "POST /v1/chat/completions",
                                     "POST /v1/chat/completions (stream)"]
    assert table[2] == [stamp, "POST /v1/chat/completions (stream)", "tiny-chat", "200", "12", "30", "20.0",
                        "1.50 s", "stop"]
    assert table[1][3:] == [RUNNING, "12", "", "", "", ""]  # still running: no zero counts, no speed
    assert table[0][3:] == ["401", "12", "", "", "1.50 s", "invalid API key"]  # generated nothing: no 0
    # failures in the theme's error colour, in the status and the error cells only
    red = error_colour(panel.table.palette())
    for row, column in ((0, 3), (0, 8)):
        assert panel.table.item(row, column).foreground().color() == red
    assert panel.table.item(2, 3).data(Qt.ItemDataRole.ForegroundRole) is None
    assert panel.table.item(0, 8).toolTip() == "invalid API key"


def test_the_log_keeps_the_newest_rows(qtbot, runner, starter):
    panel = make_panel(qtbot, runner, starter, max_rows=5)
    try:
        panel.set_model(MODEL)
        start(qtbot, panel)
        entries = [Entry(i, prompt_tokens=i) for i in range(12)]
        starter.emit(entries)
        drawn(qtbot, panel, 5)
        assert [r[4] for r in rows(panel)] == ["11", "10", "9", "8", "7"]
        assert sorted(panel._rows) == [7, 8, 9, 10, 11]  # the dropped rows are forgotten
        starter.emit([done(entries[9])])
        qtbot.waitUntil(lambda: rows(panel)[2][3] == "200", timeout=5000)
        assert [r[4] for r in rows(panel)] == ["11", "10", "9", "8", "7"]
        panel.clear_log()
        assert panel.table.rowCount() == 0 and panel._rows == {}
    finally:
        panel.shutdown()


def test_a_burst_of_entries_is_drawn_in_few_redraws(qtbot, runner, starter):
    panel = make_panel(qtbot, runner, starter, redraw_hz=5)
    try:
        panel.set_model(MODEL)
        start(qtbot, panel)
        redraws = []
        panel._redraw_timer.timeout.connect(lambda: redraws.append(time.monotonic()))
        t0 = time.monotonic()
        starter.emit([e for i in range(300) for e in (Entry(i), done(Entry(i)))])
        drawn(qtbot, panel, 300)
        elapsed = time.monotonic() - t0
        # at most one redraw per 200 ms (plus the one in flight): 600 entries, a handful of redraws
        assert 1 <= len(redraws) <= elapsed * 5 + 2
        assert all(r[3] == "200" for r in rows(panel))
    finally:
        panel.shutdown()


def test_unloading_the_model_stops_the_server(qtbot, panel, starter):
    panel.set_model(MODEL)
    start(qtbot, panel)
    panel.set_model(None)
    qtbot.waitUntil(lambda: panel.state == "stopped", timeout=5000)
    assert starter.handles[0].stops == 1 and not panel.start_button.isEnabled()


def test_stop_while_starting_stops_once_started(qtbot, runner):
    starter = FakeStarter(delay_s=0.3)
    panel = make_panel(qtbot, runner, starter)
    try:
        panel.set_model(MODEL)
        panel.start()
        panel.stop()
        assert panel.state == "starting"
        qtbot.waitUntil(lambda: panel.state == "stopped" and not panel.is_busy(), timeout=5000)
        assert starter.handles[0].stops == 1
    finally:
        panel.shutdown()


@pytest.mark.parametrize("when", ["starting", "running"])
def test_shutdown_stops_the_server_and_joins_the_job(qtbot, runner, when):
    starter = FakeStarter(delay_s=0.3)
    panel = make_panel(qtbot, runner, starter)
    panel.set_model(MODEL)
    panel.start()
    if when == "running":
        qtbot.waitUntil(lambda: panel.state == "running", timeout=5000)
    panel.shutdown()  # the start job's result may still be queued: its handle is stopped all the same
    assert len(starter.handles) == 1 and starter.handles[0].stops == 1
    assert not panel.is_busy() and not panel._redraw_timer.isActive()
    panel.shutdown()  # twice is harmless
    assert starter.handles[0].stops == 1


def test_curl_example_is_one_shell_command_with_a_json_body():
    line = curl_example("http://127.0.0.1:8080/v1", "it's-a-model", with_key=True)
    argv = shlex.split(line)
    assert argv[:2] == ["curl", "http://127.0.0.1:8080/v1/chat/completions"]
    assert argv[argv.index("-H", 3) + 1] == "Authorization: Bearer $LOOMLAB_API_KEY"
    body = json.loads(argv[argv.index("-d") + 1])
    assert body == {"model": "it's-a-model", "messages": [{"role": "user", "content": "Hello!"}]}


def test_log_row_shows_a_zero_count_only_for_a_finished_generation():
    empty_reply = log_row(done(Entry(4), completion_tokens=0, tokens_per_s=0.0, finish_reason="stop"))
    assert empty_reply[4:7] == ("12", "0", "")
    refused = log_row(done(Entry(6), prompt_tokens=0, completion_tokens=0, tokens_per_s=0.0,
                           finish_reason=None, status=401))
    assert refused[4:7] == ("", "", "")


def test_log_row_of_a_finished_request_without_counts():
    row = log_row(done(Entry(5, method="GET", path="/v1/models"), prompt_tokens=None, completion_tokens=None,
                       tokens_per_s=0.0, finish_reason=None, duration_s=0.004))
    assert row[1:] == ("GET /v1/models", "tiny-chat", "200", "", "", "", "0.00 s", "")
    assert len(row) == len(COLUMNS)


def test_legible_in_the_dark_theme_and_unclipped_when_docked(qtbot, panel, starter):
    panel.set_model(MODEL)
    start(qtbot, panel)
    starter.emit([Entry(1), done(Entry(2)), done(Entry(3), status=500, error="engine failed")])
    drawn(qtbot, panel, 3)
    assert assert_unclipped(panel) > 10
    light_red = panel.table.item(0, 3).foreground().color()
    with dark_theme(QApplication.instance()):
        # recoloured for the dark window once Qt delivers the (posted) palette change
        qtbot.waitUntil(lambda: panel.table.item(0, 3).foreground().color() != light_red, timeout=2000)
        assert assert_legible(panel) > 20
