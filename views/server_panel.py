"""The Server panel: serve the loaded model over an OpenAI-compatible HTTP API (LM Studio's "Local
Server" tab) and watch its requests.

The panel knows no server: it is handed a ``starter(host, port, api_key, max_batch, on_log)``
that starts one and returns a handle with ``.url`` and ``.stop()`` (the main window passes one
that serves its loaded model). Starting and stopping may take a second, so both run in a job; the
GUI thread never waits on them, except at :meth:`ServerPanel.shutdown`, which stops the server
for good.

``on_log(entry)`` is called on the server's own threads, once when a request arrives (status 0)
and once when it ends, with the same ``entry.id``. A Qt signal carries each entry to the GUI
thread, where it waits in a buffer that a timer drains into the log table at most
``redraw_hz`` times a second: a burst of requests costs one redraw, not one per entry.
"""

from __future__ import annotations

import json
import secrets
import shlex
import time
from collections.abc import Callable
from typing import Any, Protocol

from PySide6.QtCore import QEvent, Qt, QTimer, Signal
from PySide6.QtGui import QBrush, QPalette
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from .activations import ActivationsBox
from .sort_items import row_table
from .theme import error_colour
from .workers import Job, JobRunner

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_BATCH = 8
MAX_BATCH = 64  # sequences decoded together; beyond this a CPU step only gets slower per sequence
MAX_ROWS = 500  # the log keeps the newest requests; older rows are dropped
DEFAULT_REDRAW_HZ = 5.0
KEY_BYTES = 24  # secrets.token_urlsafe(24): 32 characters, 192 random bits
NO_MODEL = "Load a model first: the server answers with the loaded model."
COLUMNS = ("Time", "Request", "Model", "Status", "Prompt tokens", "Completion tokens", "Tokens/s",
           "Duration", "Finish / error")
NUMBER_COLUMNS = frozenset(range(COLUMNS.index("Prompt tokens"), COLUMNS.index("Duration") + 1))
STATUS_COLUMN = COLUMNS.index("Status")
ERROR_COLUMN = COLUMNS.index("Finish / error")
RUNNING = "running…"  # the status cell of a request still being answered


class ServerHandle(Protocol):
    url: str

    def stop(self) -> None: ...


Starter = Callable[[str, int, "str | None", int, Callable[[Any], None]], ServerHandle]


class ServerPanel(QWidget):
    """Start and stop a server for the loaded model, and list its requests as they come.

    ``state`` is "stopped", "starting", "running" or "stopping". :attr:`activations_changed`
    carries the activations ("int8", "float32") the user switched the served model to.
    """

    activations_changed = Signal(str)
    _entry_arrived = Signal(object)  # emitted on server threads, delivered on the GUI thread

    def __init__(self, runner: JobRunner, starter: Starter, parent: QWidget | None = None, *,
                 redraw_hz: float = DEFAULT_REDRAW_HZ, max_rows: int = MAX_ROWS):
        super().__init__(parent)
        if not 0 < redraw_hz <= 30:
            raise ValueError(f"redraw_hz must be in (0, 30], got {redraw_hz}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        self._runner = runner
        self._starter = starter
        self._max_rows = max_rows
        self._model = None  # the loaded TextModel, whose activations the panel shows and switches
        self._model_name: str | None = None  # None: no model loaded
        self._handle: ServerHandle | None = None
        self._job: Job | None = None  # the start or stop in flight
        # what a start job has started, read by shutdown() when the job's result is still queued
        self._started: list[ServerHandle] = []
        self._stop_when_started = False  # Stop (or a new model) came while starting
        self._closed = False
        self._error = False  # the status line shows an error
        self.state = "stopped"
        self._pending: dict[Any, Any] = {}  # entries not yet drawn, by id (insertion order kept)
        self._rows: dict[Any, list] = {}  # a drawn request's cells, by id
        self._entry_arrived.connect(self._buffer_entry)
        self._redraw_timer = QTimer(self)
        self._redraw_timer.setSingleShot(True)  # started by an arriving entry: idle costs nothing
        self._redraw_timer.setInterval(round(1000 / redraw_hz))
        self._redraw_timer.timeout.connect(self._draw_entries)
        self._build_ui()
        self._sync()

    # ----- layout ----------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.host_edit = QLineEdit(DEFAULT_HOST)
        self.host_edit.setToolTip("Address to listen on: 127.0.0.1 for this machine only, 0.0.0.0 for all")
        self.port_box = QSpinBox()
        self.port_box.setRange(0, 65535)
        self.port_box.setValue(DEFAULT_PORT)
        self.port_box.setToolTip("TCP port; 0 lets the system pick a free one")
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText("optional")
        self.key_edit.setToolTip("When set, requests must send \"Authorization: Bearer <key>\"")
        self.generate_button = QPushButton("Generate")
        self.generate_button.setToolTip("A new random key")
        self.generate_button.clicked.connect(self.generate_key)
        self.show_key_button = QPushButton("Show")
        self.show_key_button.setCheckable(True)
        self.show_key_button.toggled.connect(self._show_key)
        self.batch_box = QSpinBox()
        self.batch_box.setRange(1, MAX_BATCH)
        self.batch_box.setValue(DEFAULT_MAX_BATCH)
        self.batch_box.setToolTip("Requests decoded together; more wait in a queue")
        self.start_button = QPushButton("Start server")
        self.start_button.clicked.connect(self._start_or_stop)
        settings = QHBoxLayout()
        for label, widget, stretch in (("Host", self.host_edit, 1), ("Port", self.port_box, 0),
                                       ("API key", self.key_edit, 2)):
            settings.addWidget(QLabel(label))
            settings.addWidget(widget, stretch)
        settings.addWidget(self.show_key_button)
        settings.addWidget(self.generate_button)
        settings.addWidget(QLabel("Max batch"))
        settings.addWidget(self.batch_box)
        settings.addWidget(self.start_button)

        self.status_label = QLabel()
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.activations_box = ActivationsBox()
        # the batch engine holds the model while requests keep coming, and reads the mode as it takes it
        self.activations_box.setToolTip(f"{self.activations_box.toolTip()} A switch applies once the "
                                        "requests being answered have ended, and to the Chat panel too.")
        self.activations_box.mode_chosen.connect(self._on_activations)
        status = QHBoxLayout()
        status.addWidget(self.status_label, 1)
        status.addWidget(QLabel("Activations"))
        status.addWidget(self.activations_box)
        self.address_edit = QLineEdit()
        self.address_edit.setReadOnly(True)
        self.address_edit.setPlaceholderText("the address shows here while the server runs")
        self.copy_address_button = QPushButton("Copy")
        self.copy_address_button.setToolTip("Copy the address")
        self.copy_address_button.clicked.connect(lambda: self._copy(self.address_edit.text()))
        self.curl_edit = QLineEdit()
        self.curl_edit.setReadOnly(True)
        self.copy_curl_button = QPushButton("Copy")
        self.copy_curl_button.setToolTip("Copy the example request")
        self.copy_curl_button.clicked.connect(lambda: self._copy(self.curl_edit.text()))
        address = QHBoxLayout()
        address.addWidget(QLabel("Address"))
        address.addWidget(self.address_edit, 1)
        address.addWidget(self.copy_address_button)
        address.addWidget(QLabel("Try"))
        address.addWidget(self.curl_edit, 3)
        address.addWidget(self.copy_curl_button)

        self.table = row_table(COLUMNS)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)  # the finish reason or error takes what is left
        for column, sample in enumerate(("88:88:88", "POST /v1/chat/completions (stream)", "smollm2-135m",
                                         "running…", "Prompt tokens", "Completion tokens", "8888.8",
                                         "888.88 s")):
            width = self.table.fontMetrics().horizontalAdvance(sample) + 16
            self.table.setColumnWidth(column, width)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(settings)
        layout.addLayout(status)
        layout.addLayout(address)
        layout.addWidget(self.table, 1)

    # ----- public API ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The running server's base URL ("" when none runs)."""
        return self._handle.url if self._handle is not None and self.state == "running" else ""

    def set_model(self, model) -> None:
        """Serve ``model`` (a loaded TextModel; None: none loaded). A server running for the model
        before is stopped: it must not answer with a model that is gone."""
        self._model = model
        self._model_name = None if model is None else (getattr(model, "name", "") or "model")
        if self.state in ("starting", "running"):
            self.stop()
        self.show_activations()
        self._sync()

    def show_activations(self) -> None:
        """Show the model's activations again (switched elsewhere: the Chat panel)."""
        if self._model is not None:
            self.activations_box.set_mode(self._model.activations)

    def _on_activations(self, mode: str) -> None:
        if self._model is not None:
            self._model.activations = mode
            self.activations_changed.emit(mode)

    def generate_key(self) -> None:
        """Put a new random API key in the key field."""
        self.key_edit.setText(secrets.token_urlsafe(KEY_BYTES))

    def start(self) -> None:
        """Start a server with the settings shown (in a job); the state becomes "running", or
        "stopped" with the reason in the status line."""
        if self.state != "stopped" or self._closed or self._model_name is None:
            return
        host = self.host_edit.text().strip()
        if not host:
            self._set_status("Enter a host to listen on (127.0.0.1: this machine only).", error=True)
            return
        port, key, max_batch = self.port_box.value(), self.key_edit.text() or None, self.batch_box.value()
        starter, on_log, started = self._starter, self._entry_arrived.emit, []
        self._started, self._stop_when_started = started, False

        def work(job: Job) -> ServerHandle:
            handle = starter(host, port, key, max_batch, on_log)
            started.append(handle)  # list.append is atomic: shutdown() finds it even before our slot runs
            return handle

        self._job = self._runner.start(work, name="start server", on_success=self._started_ok,
                                       on_failure=self._start_failed)
        self._set_state("starting", f"Starting on {host}:{port}…")

    def stop(self) -> None:
        """Stop the running server (in a job); a server still starting is stopped once it has."""
        if self.state == "starting":
            self._stop_when_started = True
            return
        if self.state != "running" or self._closed:
            return
        handle, self._handle = self._handle, None
        self._job = self._runner.start(lambda job: handle.stop(), name="stop server",
                                       on_success=lambda _: self._stopped(None),
                                       on_failure=self._stopped)
        self._set_state("stopping", "Stopping…")

    def is_busy(self) -> bool:
        """True while a start or a stop is in flight."""
        return self._job is not None

    def clear_log(self) -> None:
        self._pending.clear()
        self._rows.clear()
        self.table.setRowCount(0)

    def shutdown(self) -> None:
        """Stop the server and join the panel's job, for good (the window is closing); safe twice.
        This is the one place the GUI thread waits on the server (up to a couple of seconds)."""
        if self._closed:
            return
        self._closed = True
        self._redraw_timer.stop()
        if self._job is not None:
            self._job.wait()
            self._job = None
        # the handle of a start whose result is still queued is in _started
        for handle in {id(h): h for h in [*self._started, *filter(None, [self._handle])]}.values():
            handle.stop()  # stop() is idempotent: a stop job may already have run it
        self._handle, self._started = None, []
        self.state = "stopped"

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        self.shutdown()
        super().closeEvent(event)

    # ----- start / stop ----------------------------------------------------------------------------
    def _start_or_stop(self) -> None:
        if self.state == "running":
            self.stop()
        else:
            self.start()

    def _started_ok(self, handle: ServerHandle) -> None:
        if self._closed:
            return  # shutdown() has stopped it
        self._job, self._handle, self._started = None, handle, []
        self._set_state("running", f"Running at {handle.url}")
        if self._stop_when_started:
            self.stop()

    def _start_failed(self, message: str) -> None:
        if self._closed:
            return
        self._job, self._started = None, []
        self._set_state("stopped", f"Could not start: {message}", error=True)

    def _stopped(self, message: str | None) -> None:
        if self._closed:
            return
        self._job = None
        if message is None:
            self._set_state("stopped", "Stopped")
        else:  # the server's threads may be left over: say so rather than pretend
            self._set_state("stopped", f"Stop failed: {message}", error=True)

    def _set_state(self, state: str, status: str, *, error: bool = False) -> None:
        self.state = state
        self._set_status(status, error=error)
        self._sync()

    def _set_status(self, text: str, *, error: bool = False) -> None:
        self._error = error
        self.status_label.setText(text)
        self._colour_status()

    def _colour_status(self) -> None:
        palette = QPalette()  # sets no role: the label inherits the panel's palette
        if self._error:
            palette.setColor(QPalette.ColorRole.WindowText, error_colour(self.palette()))
        self.status_label.setPalette(palette)

    def changeEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._colour_status()
            red = QBrush(error_colour(self.palette()))
            for cells in self._rows.values():  # failed requests' cells, in the new palette's red
                for column in (STATUS_COLUMN, ERROR_COLUMN):
                    if cells[column].data(Qt.ItemDataRole.ForegroundRole) is not None:
                        cells[column].setData(Qt.ItemDataRole.ForegroundRole, red)

    def _sync(self) -> None:
        """Controls as the state allows: settings only while stopped, Start only with a model."""
        state, has_model = self.state, self._model_name is not None
        for w in (self.host_edit, self.port_box, self.key_edit, self.generate_button, self.batch_box):
            w.setEnabled(state == "stopped")
        self.activations_box.setEnabled(has_model)
        self.start_button.setText("Stop server" if state in ("running", "stopping") else "Start server")
        self.start_button.setEnabled(state == "running" or (state == "stopped" and has_model))
        self.start_button.setToolTip("" if has_model or state != "stopped" else NO_MODEL)
        if state == "stopped" and not self._error:
            self.status_label.setText("Stopped" if has_model else f"Stopped. {NO_MODEL}")
        url = self.url
        self.address_edit.setText(url)
        self.curl_edit.setText(curl_example(url, self._model_name or "model", bool(self.key_edit.text()))
                               if url else "")
        self.curl_edit.setCursorPosition(0)  # its start ("curl URL") in view, not its end
        for w in (self.copy_address_button, self.copy_curl_button):
            w.setEnabled(bool(url))

    def _show_key(self, shown: bool) -> None:
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Normal if shown else QLineEdit.EchoMode.Password)
        self.show_key_button.setText("Hide" if shown else "Show")

    @staticmethod
    def _copy(text: str) -> None:
        QApplication.clipboard().setText(text)

    # ----- the request log -------------------------------------------------------------------------
    def _buffer_entry(self, entry: Any) -> None:
        if self._closed:
            return
        self._pending.pop(entry.id, None)  # re-inserted: entries are drawn in the order they last came
        self._pending[entry.id] = entry
        if not self._redraw_timer.isActive():
            self._redraw_timer.start()

    def _draw_entries(self) -> None:
        entries, self._pending = list(self._pending.values()), {}
        self.table.setUpdatesEnabled(False)  # one repaint for the whole batch
        try:
            for entry in entries:
                cells = self._rows.get(entry.id)
                if cells is None:
                    self._insert_row(entry)
                else:
                    self._fill_row(cells, entry)
        finally:
            self.table.setUpdatesEnabled(True)

    def _insert_row(self, entry: Any) -> None:
        """A new request goes on top; the oldest row goes once there are more than ``max_rows``."""
        table = self.table
        table.insertRow(0)
        cells = [QTableWidgetItem() for _ in COLUMNS]
        for column, item in enumerate(cells):
            if column in NUMBER_COLUMNS:  # digits line up
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            table.setItem(0, column, item)
        cells[0].setData(Qt.ItemDataRole.UserRole, entry.id)
        self._rows[entry.id] = cells
        self._fill_row(cells, entry)
        while table.rowCount() > self._max_rows:
            last = table.rowCount() - 1
            self._rows.pop(table.item(last, 0).data(Qt.ItemDataRole.UserRole), None)
            table.removeRow(last)

    def _fill_row(self, cells: list, entry: Any) -> None:
        for item, text in zip(cells, log_row(entry), strict=True):
            item.setText(text)
        failed = bool(getattr(entry, "error", None)) or entry.status >= 400
        brush = QBrush(error_colour(self.palette())) if failed else None
        for column in (STATUS_COLUMN, ERROR_COLUMN):
            # a foreground of its own only when failed: otherwise the palette's text colour
            cells[column].setData(Qt.ItemDataRole.ForegroundRole, brush)
        cells[ERROR_COLUMN].setToolTip(entry.error or "")


def log_row(entry: Any) -> tuple[str, ...]:
    """The log table's cells for a request entry (see the module's docstring), as shown."""
    done = entry.status != 0
    request = f"{entry.method} {entry.path}" + (" (stream)" if entry.stream else "")
    status = str(entry.status) if done else RUNNING
    # a zero shows only for a generation that finished (an empty reply): a request that generates
    # nothing (GET /v1/models, a refused one) or has not counted yet leaves the cell blank
    generated = done and entry.finish_reason is not None
    counts = [str(n) if n or (n == 0 and generated) else "" for n in (entry.prompt_tokens,
                                                                      entry.completion_tokens)]
    speed = f"{entry.tokens_per_s:.1f}" if done and entry.tokens_per_s else ""
    duration = f"{entry.duration_s:.2f} s" if done else ""
    return (time.strftime("%H:%M:%S", time.localtime(entry.time)), request, entry.model or "", status,
            *counts, speed, duration, entry.error or entry.finish_reason or "")


def curl_example(url: str, model: str, with_key: bool) -> str:
    """A one-line request to the server at ``url`` (its ``/v1`` base), as a shell command."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}]})
    auth = ' -H "Authorization: Bearer $LOOMLAB_API_KEY"' if with_key else ""
    return f"curl {url}/chat/completions -H \"Content-Type: application/json\"{auth} -d {shlex.quote(body)}"
