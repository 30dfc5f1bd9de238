"""The Server panel in the window, serving the loaded smollm2-135m for real: started from the
panel on a free port with an API key, one chat request over HTTP (answered as the model answers it
directly, greedy), its row in the log at 200 with the server's own counts, a request without the
key at 401 in red; Stop frees the port."""

from __future__ import annotations

import re
import threading

import httpx
import pytest
from PySide6.QtCore import Qt

from loomlab.views.server_panel import COLUMNS
from loomlab.views.theme import error_colour

from ..views.test_server_panel import rows, type_into
from .test_main_window import make_window

TIMEOUT_MS = 120_000
MESSAGES = [{"role": "user", "content": "Name a colour."}]


def column(name: str) -> int:
    return COLUMNS.index(name)


def test_serving_the_loaded_model_from_the_panel(qtbot, tmp_path):
    win = make_window(qtbot, tmp_path)
    panel = win.panels["server"]
    try:
        assert not panel.start_button.isEnabled()  # no model yet
        win.open_model("smollm2-135m")
        qtbot.waitUntil(lambda: win.model is not None and not win.handing_over, timeout=TIMEOUT_MS)
        assert panel.start_button.isEnabled()
        type_into(qtbot, panel.port_box, "0")  # any free port
        panel.generate_key()
        key = panel.key_edit.text()
        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.state == "running", timeout=30_000)
        url = panel.url
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", url) and not url.endswith(":0/v1")
        assert panel.address_edit.text() == url and panel.status_label.text() == f"Running at {url}"

        replies = {}

        def ask() -> None:  # off the GUI thread: the panel draws the log meanwhile
            with httpx.Client(base_url=url, timeout=60) as client:
                replies["ok"] = client.post("/chat/completions", headers={"Authorization": f"Bearer {key}"},
                                            json={"model": "smollm2-135m", "messages": MESSAGES,
                                                  "max_tokens": 8, "temperature": 0})
                replies["no key"] = client.get("/models")

        asker = threading.Thread(target=ask, name="http-client")
        asker.start()
        try:
            qtbot.waitUntil(lambda: len(rows(panel)) == 2 and rows(panel)[1][column("Status")] == "200"
                            and rows(panel)[0][column("Status")] == "401", timeout=TIMEOUT_MS)
        finally:
            asker.join()
        reply = replies["ok"].json()
        assert replies["ok"].status_code == 200 and replies["no key"].status_code == 401
        expected = "".join(r.text for r in win.model.chat(MESSAGES, temperature=0, max_tokens=8))
        assert reply["choices"][0]["message"]["content"] == expected
        chat_row, refused = rows(panel)[1], rows(panel)[0]
        usage = reply["usage"]
        assert chat_row[column("Request")] == "POST /v1/chat/completions"
        assert chat_row[column("Model")] == "smollm2-135m"
        assert chat_row[column("Prompt tokens")] == str(usage["prompt_tokens"])
        assert chat_row[column("Completion tokens")] == str(usage["completion_tokens"])
        assert float(chat_row[column("Tokens/s")]) > 0
        assert chat_row[column("Finish / error")] == reply["choices"][0]["finish_reason"]
        assert refused[column("Request")] == "GET /v1/models"
        assert "API key" in refused[column("Finish / error")]
        assert panel.table.item(0, column("Status")).foreground().color() == error_colour(panel.palette())

        qtbot.mouseClick(panel.start_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: panel.state == "stopped", timeout=30_000)
        with pytest.raises(httpx.ConnectError):  # the port is closed
            httpx.get(f"{url}/models", timeout=5)
    finally:
        win.close()
