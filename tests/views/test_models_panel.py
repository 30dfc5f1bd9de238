"""The Models panel: listing, filtering, details against model_info.describe, load / unload,
the tokenizer preview against the tokenizer, a real cancelled fetch, and opening Loom networks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from loomlab.core import load_network, save_network
from loomlab.core.errors import ModelFormatError
from loomlab.core.llm import model_info, registry
from loomlab.core.llm.textmodel import TextModel, load_model
from loomlab.core.llm.tokenizer_process import TokenizerProcess
from loomlab.views.models_panel import ModelsPanel, NetworkEntry
from loomlab.views.workers import JobRunner

GOLDENS = Path(__file__).resolve().parent.parent / "data" / "loom-goldens-seed1.json"
SMOLLM = "smollm2-135m"


@pytest.fixture
def make_panel(qtbot):
    """Panels on their own runners; each is shut down (jobs joined, model closed) after the test."""
    made: list[tuple[JobRunner, ModelsPanel]] = []

    def make(folders: list[str] | None = None) -> ModelsPanel:
        runner = JobRunner()
        panel = ModelsPanel(runner, folders)
        qtbot.addWidget(panel)
        panel.resize(1000, 620)
        panel.show()
        made.append((runner, panel))
        qtbot.waitUntil(lambda: not panel.scanning, timeout=20000)
        return panel

    yield make
    for runner, panel in made:
        assert panel.shutdown()
        assert runner.shutdown()


@pytest.fixture(scope="module")
def smollm_path() -> Path:
    return registry.fetch(SMOLLM)  # cached on this machine; a download otherwise


def _fake_gguf(folder: Path, name: str) -> Path:
    path = folder / name
    path.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\x05")  # a header cut short
    return path


def _select(qtbot, panel: ModelsPanel, name: str) -> None:
    assert panel.select(name), panel.visible_names()
    qtbot.waitUntil(lambda: "Reading the file…" not in panel.details().values(), timeout=10000)


def test_lists_builtins_and_discovered_models(make_panel, tmp_path):
    fake = _fake_gguf(tmp_path, "tiny-fake.gguf")
    panel = make_panel([str(tmp_path)])
    names = panel.visible_names()
    assert names[:len(registry.BUILTINS)] == list(registry.BUILTINS)
    listed = {e.path: e for e in panel.entries()}
    assert listed[fake].source == "folder" and listed[fake].size == fake.stat().st_size
    assert "tiny-fake" in names


def test_rescan_finds_new_files(make_panel, qtbot, tmp_path):
    panel = make_panel([str(tmp_path)])
    assert "later" not in panel.visible_names()
    _fake_gguf(tmp_path, "later.gguf")
    panel.refresh_button.click()
    assert panel.scanning  # the disk walk runs in a job, not on the GUI thread
    qtbot.waitUntil(lambda: "later" in panel.visible_names(), timeout=20000)


def test_details_of_a_broken_file_show_the_format_error(make_panel, qtbot, tmp_path):
    fake = _fake_gguf(tmp_path, "tiny-fake.gguf")
    with pytest.raises(ModelFormatError) as expected:
        model_info.describe(fake)
    panel = make_panel([str(tmp_path)])
    _select(qtbot, panel, "tiny-fake")
    assert str(expected.value) in panel.details()["Error"]
    assert panel.current_info is None and panel.load_button.isEnabled()  # still usable, no crash


def test_filter_hides_rows_that_do_not_match(make_panel, qtbot, tmp_path):
    _fake_gguf(tmp_path, "tiny-fake.gguf")
    panel = make_panel([str(tmp_path)])
    qtbot.keyClicks(panel.filter_edit, "SMOL")
    assert panel.visible_names() == [SMOLLM]  # case-insensitive
    panel.filter_edit.clear()
    qtbot.keyClicks(panel.filter_edit, "folder")  # any column matches: here the source
    assert panel.visible_names() == ["tiny-fake"]
    panel.filter_edit.clear()
    assert set(panel.visible_names()) >= {*registry.BUILTINS, "tiny-fake"}


def test_details_equal_describe(make_panel, qtbot, smollm_path):
    panel = make_panel([])
    row = panel.visible_names().index(SMOLLM)
    rect = panel.list_view.visualRect(panel.list_view.model().index(row, 0))
    qtbot.mouseClick(panel.list_view.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert panel.selected_entry().name == SMOLLM
    qtbot.waitUntil(lambda: panel.current_info is not None, timeout=10000)
    info = model_info.describe(smollm_path)
    assert panel.current_info == info
    shown = panel.details()
    assert shown["Architecture"].startswith(info.architecture)
    assert f"{info.parameters:,}" in shown["Parameters"]
    assert f"{info.blocks} blocks" in shown["Shape"] and f"d={info.hidden_size}" in shown["Shape"]
    assert shown["Context"] == f"{info.context_length:,} tokens"
    assert shown["Quant types"] == ", ".join(f"{t} × {n}" for t, n in info.tensor_types.items())
    assert shown["Chat template"] == ("yes" if info.chat_template else "no")
    assert shown["File size"] == f"{info.file_bytes / 2**20:.1f} MiB"
    assert shown["Memory estimate"].startswith(f"{info.estimated_memory / 2**20:.1f} MiB")


def test_load_preview_unload(make_panel, qtbot, monkeypatch):
    panel = make_panel([])
    panel.select(SMOLLM)
    assert not panel.preview_edit.isEnabled()  # no model yet: nothing to tokenize with
    values: list[int] = []
    panel.progress_bar.valueChanged.connect(values.append)
    busy: list[bool] = []
    panel.busy_changed.connect(busy.append)

    with qtbot.waitSignal(panel.model_loaded, timeout=30000) as loaded:
        qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
    model = loaded.args[0]
    assert isinstance(model, TextModel) and panel.model is model and busy == [True, False]
    assert isinstance(model.tokenizer, TokenizerProcess) and model.tokenizer.running  # off this GIL
    # it moved, to the end (the job throttles progress to ~30 updates a second, so a fast load
    # shows only a few steps)
    assert len(set(values)) >= 2 and values[-1] == panel.progress_bar.maximum()
    assert values == sorted(values)
    with load_model(SMOLLM) as reference:
        assert model.info() == reference.info()

    typed = "Hello world! Tokenizers split text into pieces, 12345 of them."
    qtbot.keyClicks(panel.preview_edit, typed)  # QTest types ASCII only
    _assert_preview_shows(panel, model, typed)
    pasted = "Ünïcödé\tand emoji 🧵 too"
    panel.preview_edit.setText(pasted)
    _assert_preview_shows(panel, model, pasted)
    panel.preview_edit.setText(typed)
    panel.grab().save("/tmp/models.png")

    closed: list[bool] = []
    close = model.close
    monkeypatch.setattr(model, "close", lambda: (closed.append(True), close()))
    with qtbot.waitSignal(panel.model_unloaded, timeout=1000):
        qtbot.mouseClick(panel.unload_button, Qt.MouseButton.LeftButton)
    assert closed == [True] and panel.model is None and not model.tokenizer.running
    assert not panel.preview_edit.isEnabled() and panel.preview_tokens() == []
    assert not panel.unload_button.isEnabled()


def test_shutting_down_mid_load_ends_the_tokenizer_process(make_panel, qtbot, monkeypatch):
    started: list[TokenizerProcess] = []
    start = TokenizerProcess.__init__
    monkeypatch.setattr(TokenizerProcess, "__init__",
                        lambda self, path: (started.append(self), start(self, path))[1])
    panel = make_panel([])
    panel.select(SMOLLM)
    qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bool(started), timeout=10000)
    assert panel.shutdown()  # joins the load, then closes the model nobody took
    assert panel.model is None and not started[0].running


def _assert_preview_shows(panel: ModelsPanel, model: TextModel, text: str) -> None:
    ids = model.tokenizer.encode(text)
    assert [i for i, _ in panel.preview_tokens()] == ids
    assert [piece for _, piece in panel.preview_tokens()] == [model.tokenizer.decode([i]) for i in ids]
    shown = panel.preview_view.toPlainText()
    assert all(str(i) in shown for i in ids)
    assert panel.preview_count.text().startswith(f"{len(ids)} tokens")


def test_cancelled_fetch_leaves_nothing(make_panel, qtbot, tmp_path, monkeypatch):
    monkeypatch.setenv("LOOMLAB_CACHE", str(tmp_path))
    panel = make_panel([])
    panel.select(SMOLLM)
    shown = panel.details()
    assert "not fetched" in shown["State"]
    assert shown["File size"] == f"{registry.BUILTINS[SMOLLM].size / 2**20:.1f} MiB"
    busy: list[bool] = []
    panel.busy_changed.connect(busy.append)

    qtbot.mouseClick(panel.fetch_button, Qt.MouseButton.LeftButton)  # a real fetch: pip starts
    assert panel.busy and panel.cancel_button.isEnabled() and not panel.load_button.isEnabled()
    qtbot.mouseClick(panel.cancel_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not panel.busy, timeout=20000)

    assert busy == [True, False] and "cancelled" in panel.status_label.text()
    assert list(tmp_path.iterdir()) == []  # no partial file, no temporary folder
    assert not registry.is_fetched(SMOLLM)
    assert panel.fetch_button.isEnabled() and panel.load_button.isEnabled()
    assert not panel.cancel_button.isEnabled()


@pytest.mark.parametrize("suffix", [".json", ".loom"])
def test_open_network_emits_it(make_panel, qtbot, tmp_path, monkeypatch, suffix):
    case = next(c for c in json.loads(GOLDENS.read_text())["forward"] if c["name"] == "transformer_block")
    path = tmp_path / "block.json"
    path.write_text(json.dumps(case["network"]))
    if suffix == ".loom":
        save_network(load_network(path), tmp_path / "block.loom")
        path = tmp_path / "block.loom"
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *a, **k: (str(path), ""))
    panel = make_panel([])

    with qtbot.waitSignal(panel.network_opened, timeout=10000) as opened:
        qtbot.mouseClick(panel.open_button, Qt.MouseButton.LeftButton)
    net = opened.args[0]
    assert sum(1 for _ in net.layers()) == len(case["network"]["layers"]) == 4
    entry = panel.selected_entry()
    assert isinstance(entry, NetworkEntry) and entry.net is net
    assert panel.details()["Layers"] == "4" and f"{net.parameter_count():,}" in panel.details()["Parameters"]

    # selecting it again after a model was selected makes it current again
    panel.select(SMOLLM)
    panel.select(path.name)
    with qtbot.waitSignal(panel.network_opened, timeout=1000) as again:
        qtbot.mouseClick(panel.load_button, Qt.MouseButton.LeftButton)
    assert again.args[0] is net
