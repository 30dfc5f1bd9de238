"""The Models panel: listing, filtering, details against model_info.describe, load / unload,
the tokenizer preview against the tokenizer, a real cancelled fetch, opening Loom networks, the
mode a model supports, "Show in panels", a load before the search ends, a first run's kernel count,
layout and contrast."""

from __future__ import annotations

import json
import re
import threading
from pathlib import Path
from types import SimpleNamespace

import gguf
import pytest
from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QFileDialog, QLabel, QPushButton, QScrollArea

from loomlab.core import load_network, save_network
from loomlab.core.errors import ModelFormatError
from loomlab.core.layer_names import model_parts
from loomlab.core.llm.files import discovery, registry
from loomlab.core.llm.generate.textmodel import TextModel, load_model
from loomlab.core.llm.kernels.kernel_warmup import KERNELS_STAGE
from loomlab.core.llm.model import model_info
from loomlab.core.llm.model.model_info import CHAT, COMPLETION, EMBEDDING
from loomlab.core.llm.text.tokenizer_process import TokenizerProcess
from loomlab.views import models_panel
from loomlab.views.models_panel import CANNOT_LOAD, COLUMNS, ModelsPanel, NetworkEntry
from loomlab.views.workers import JobRunner

from .contrast import AA, assert_legible, contrast, dark_theme

GOLDENS = Path(__file__).resolve().parent.parent / "data" / "loom-goldens-seed1.json"
SMOLLM = "smollm2-135m"
TINY_BERT = Path(__file__).resolve().parents[1] / "data" / "tiny-hf" / "tiny-bert"


@pytest.fixture
def make_panel(qtbot):
    """Panels on their own runners; each is shut down (jobs joined, model closed) after the test."""
    made: list[tuple[JobRunner, ModelsPanel]] = []

    def make(folders: list[str] | None = None, wait_for_scan: bool = True) -> ModelsPanel:
        runner = JobRunner()
        panel = ModelsPanel(runner, folders)
        qtbot.addWidget(panel)
        panel.resize(1000, 620)
        panel.show()
        made.append((runner, panel))
        if wait_for_scan:
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
    assert panel.scan_label.text() == f"{len(names)} models listed"
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


def test_a_model_this_build_cannot_run_is_listed_with_the_reason(make_panel, qtbot, tmp_path):
    """Listed so before it is selected (the listing's cheap check reads the architecture), the
    reason in its tooltip and, once read, first in its details; a broken file likewise."""
    writer = gguf.GGUFWriter(str(tmp_path / "other-arch.gguf"), "deepseek2")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    _fake_gguf(tmp_path, "tiny-fake.gguf")
    panel = make_panel([str(tmp_path)])
    row = panel.visible_names().index("other-arch")
    reason = "architecture 'deepseek2' is not supported"
    assert _row_text(panel, row, "Mode") == CANNOT_LOAD
    assert reason in panel.list_view.model().index(row, 0).data(Qt.ItemDataRole.ToolTipRole)
    _select(qtbot, panel, "other-arch")
    qtbot.waitUntil(lambda: "Problem" in panel.details(), timeout=20000)
    assert panel.details()["Problem"].startswith(reason) and panel.current_info.problem.startswith(reason)
    fake = panel.visible_names().index("tiny-fake")
    assert _row_text(panel, fake, "Mode") == CANNOT_LOAD  # a header cut short
    assert "not a GGUF model" in panel.list_view.model().index(fake, 0).data(Qt.ItemDataRole.ToolTipRole)


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
    # the words of every panel: block N sits in cell N + 1, after the embedding
    blocks = f"{info.blocks} blocks in {info.blocks + 3} cells"
    assert shown["Shape"].startswith(f"{blocks} · d={info.hidden_size}")
    assert shown["Context"] == f"{info.context_length:,} tokens"
    assert shown["Quant types"] == info.types_text
    assert info.types_text == ", ".join(f"{t} × {n}" for t, n in info.tensor_types.items())  # none decoded
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
    # it moved, to the end (the job throttles progress to 5 updates a second, so a fast load
    # shows only a few steps), then the idle bar went away, empty
    assert values[-1] == 0 and panel.progress_bar.isHidden() and panel.progress_bar.text() == ""
    moved = values[:-1]
    assert len(set(moved)) >= 2 and moved[-1] == panel.progress_bar.maximum() and moved == sorted(moved)
    with load_model(SMOLLM) as reference:
        assert model.info() == reference.info()

    typed = "Hello world! Tokenizers split text into pieces, 12345 of them."
    qtbot.keyClicks(panel.preview_edit, typed)  # QTest types ASCII only
    _assert_preview_shows(panel, model, typed)
    pasted = "Ünïcödé\tand emoji 🧵 too, 日本"  # the emoji and 日 are split across tokens
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
    pieces = [piece for _, piece in panel.preview_tokens()]
    # each token's text, a byte that is not a whole character on its own as <0xNN>: read back as
    # bytes, the pieces spell the text typed
    assert "\ufffd" not in "".join(pieces)
    parts = re.split(r"<0x([0-9A-F]{2})>", "".join(pieces))  # text, byte, text, byte, ...
    spelled = b"".join(bytes([int(p, 16)]) if k % 2 else p.encode() for k, p in enumerate(parts))
    assert spelled.decode() == text
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
    parts = str(model_parts(net))
    assert panel.details()["Parts"] == parts == "1 cell × 4 per cell · 4 layers, 4 weighted"  # a 1x1x1 grid
    assert f"{net.parameter_count():,}" in panel.details()["Parameters"]

    assert panel.progress_bar.isHidden()  # no "0%" left after an action that reports no progress
    assert panel.scan_label.text() == f"{len(registry.BUILTINS)} models · 1 network listed"

    # selecting it again after a model was selected shows it in the panels again
    panel.select(SMOLLM)
    assert not panel.show_button.isEnabled()  # not loaded: nothing to show
    panel.select(path.name)
    assert not panel.load_button.isEnabled() and panel.show_button.isEnabled()
    with qtbot.waitSignal(panel.show_requested, timeout=1000) as again:
        qtbot.mouseClick(panel.show_button, Qt.MouseButton.LeftButton)
    assert again.args[0] is net


# ----- what the review found ----------------------------------------------------------------------------
def _golden_network(tmp_path) -> Path:
    case = next(c for c in json.loads(GOLDENS.read_text())["forward"] if c["name"] == "transformer_block")
    path = tmp_path / "block.json"
    path.write_text(json.dumps(case["network"]))
    return path


def _load(qtbot, panel: ModelsPanel, name: str) -> TextModel:
    with qtbot.waitSignal(panel.model_loaded, timeout=30000) as loaded:
        panel.load(name)
    return loaded.args[0]


def test_a_model_loaded_by_name_before_the_search_ends_is_the_listed_row(make_panel, qtbot, monkeypatch):
    """--model and Open recent call load() at once; the search ends later."""
    release = threading.Event()
    discover = discovery.discover
    monkeypatch.setattr(discovery, "discover", lambda folders: (release.wait(20), discover(folders))[1])
    panel = make_panel([], wait_for_scan=False)
    model = _load(qtbot, panel, SMOLLM)
    assert panel.scanning
    release.set()
    qtbot.waitUntil(lambda: not panel.scanning, timeout=20000)
    assert panel.visible_names().count(SMOLLM) == 1
    entry = panel.selected_entry()
    assert entry.name == SMOLLM and entry.source == "builtin"
    row = panel.visible_names().index(SMOLLM)
    assert _row_text(panel, row, "State") == "loaded" and _row_text(panel, row, "Mode") == CHAT
    qtbot.waitUntil(lambda: panel.current_info is not None, timeout=10000)
    assert panel.current_info == model_info.describe(model.net.source.path)
    assert panel.details()["Name"] == panel.current_info.name and panel.details()["Mode"] == CHAT
    assert panel.show_button.isEnabled() and not panel.load_button.isEnabled()


def _row_text(panel: ModelsPanel, row: int, column: str) -> str:
    return panel.list_view.model().index(row, COLUMNS.index(column)).data()


class _FirstRun:
    """A TextModel as the panel reads it on a first run: its kernels compiling (no child here),
    ``kernels_ready`` and ``kernels_compiled`` moved by the test as the compilation would."""

    supports_chat = True
    is_embedding_model = False

    def __init__(self):
        self.name, self.kernels_ready, self.kernels_compiled, self.closed = SMOLLM, False, 0, False
        self.tokenizer = SimpleNamespace(encode=lambda text: [])  # the preview's text is empty

    def close(self) -> None:
        self.closed = True


def test_a_first_runs_kernels_are_counted_until_ready(make_panel, qtbot, monkeypatch):
    """Loaded while its kernels compile, the model answers on numpy: the status line says so in
    the CLI's words and follows the count each second, until they are ready, the model is
    unloaded or the panel shuts down; the timer that reads them stops in each case."""
    models: list[_FirstRun] = []

    def load_model(*args, **kwargs) -> _FirstRun:
        models.append(_FirstRun())
        return models[-1]

    monkeypatch.setattr(models_panel, "load_model", load_model)
    panel = make_panel([])
    label, timer = panel.status_label, panel.kernels_timer
    compiling = f"Loaded {SMOLLM} · {KERNELS_STAGE}: {{}} compiled; answering on numpy meanwhile"

    model = _load(qtbot, panel, SMOLLM)
    assert model is models[-1] and label.text() == compiling.format(0) and timer.isActive()
    model.kernels_compiled = 3
    qtbot.waitUntil(lambda: label.text() == compiling.format(3), timeout=3000)
    model.kernels_ready = True
    qtbot.waitUntil(lambda: not timer.isActive(), timeout=3000)
    assert label.text() == f"Loaded {SMOLLM}"

    model = _load(qtbot, panel, SMOLLM)  # unloads the first
    assert models[0].closed and label.text() == compiling.format(0) and timer.isActive()
    panel.unload()
    assert model.closed and not timer.isActive() and label.text() == f"Unloaded {SMOLLM}"

    model = _load(qtbot, panel, SMOLLM)
    label.setText("Opened block.json")  # another action's news stands: the next tick stops
    qtbot.waitUntil(lambda: not timer.isActive(), timeout=3000)
    assert label.text() == "Opened block.json" and not model.closed

    model = _load(qtbot, panel, SMOLLM)
    assert timer.isActive()
    panel.close()  # a floating panel closed: shut down
    assert model.closed and not timer.isActive()


@pytest.mark.parametrize(("alias", "mode"), [("smollm2-135m", CHAT), ("gemma3-270m", COMPLETION)])
def test_the_mode_a_model_supports_is_listed_and_detailed(make_panel, qtbot, alias, mode):
    registry.fetch(alias)
    panel = make_panel([])
    _select(qtbot, panel, alias)
    assert panel.current_info.mode == mode == model_info.describe(registry.model_path(alias)).mode
    assert panel.details()["Mode"].startswith(mode)
    assert _row_text(panel, panel.visible_names().index(alias), "Mode") == mode


def test_an_embedding_model_is_listed_detailed_and_loaded_as_one(make_panel, qtbot):
    panel = make_panel([str(TINY_BERT)])
    _select(qtbot, panel, "tiny-bert")
    assert panel.current_info.mode == EMBEDDING and panel.details()["Mode"].startswith(EMBEDDING)
    assert _load(qtbot, panel, "tiny-bert").is_embedding_model
    assert _row_text(panel, panel.visible_names().index("tiny-bert"), "Mode") == EMBEDDING


def test_opening_a_network_keeps_the_model_and_both_can_be_shown_again(make_panel, qtbot, tmp_path):
    panel = make_panel([])
    model = _load(qtbot, panel, SMOLLM)
    assert panel.progress_bar.isHidden()
    with qtbot.waitSignal(panel.network_opened, timeout=10000) as opened:
        panel.open_network(_golden_network(tmp_path))
        assert panel.progress_bar.isVisible()  # while it opens
    assert panel.progress_bar.isHidden()
    assert panel.model is model and panel.unload_button.isEnabled()  # not stranded, still loaded
    shown = []
    panel.show_requested.connect(shown.append)
    panel.select(SMOLLM)
    assert panel.show_button.isEnabled() and not panel.load_button.isEnabled()
    qtbot.mouseClick(panel.show_button, Qt.MouseButton.LeftButton)
    panel.select("block.json")
    qtbot.mouseClick(panel.show_button, Qt.MouseButton.LeftButton)
    assert shown == [model, opened.args[0]]


def test_docked_in_a_column_the_tokenizer_preview_is_on_screen(make_panel, qtbot):
    panel = make_panel([])
    _load(qtbot, panel, SMOLLM)
    panel.resize(400, 900)  # the Models dock at the left of a 1600x1000 window
    qtbot.wait(50)
    assert (panel.width(), panel.height()) == (400, 900)  # no minimum size holds it wider
    _select(qtbot, panel, SMOLLM)
    for w in (panel.preview_edit, panel.preview_view, panel.preview_count, panel.load_button,
              panel.show_button, panel.unload_button, panel.status_label, panel.list_view):
        assert w.isVisible() and w.visibleRegion().boundingRect() == w.rect(), w
    assert panel.preview_view.height() >= 120 and panel.list_view.height() >= 150
    for button in panel.findChildren(QPushButton):
        assert button.width() >= button.minimumSizeHint().width(), button.text()


def test_legible_in_the_dark_theme(make_panel, qtbot, qapp, tmp_path):
    _fake_gguf(tmp_path, "tiny-fake.gguf")
    with dark_theme(qapp):
        panel = make_panel([str(tmp_path)])
        _load(qtbot, panel, SMOLLM)
        panel.preview_edit.setText("Hello, world")
        _select(qtbot, panel, "tiny-fake")  # the details show an error
        error = next(label for label in panel.findChildren(QLabel)
                     if label.property("error") and label.text() == panel.details()["Error"])
        qtbot.waitUntil(error.isVisible, timeout=1000)  # Qt shows a widget added to a shown form later
        assert assert_legible(panel) >= 20
        assert error.palette().color(QPalette.ColorRole.WindowText).red() > 200  # still red
    for colour in models_panel.CHIP_COLOURS:  # the preview's chips carry their own colours
        for text in (models_panel.CHIP_TEXT, models_panel.CHIP_ID):
            assert contrast(QColor(text), QColor(colour)) >= AA
    # back in the light theme (Qt posts the palette change), errors are the light theme's red
    light = models_panel.ERROR_ON_LIGHT
    qtbot.waitUntil(lambda: error.palette().color(QPalette.ColorRole.WindowText) == light, timeout=2000)


def test_the_details_show_whole_rows_at_any_height(make_panel, qtbot, smollm_path):
    """The details scroll, and the edge of what they show falls between two rows: a row cut just
    below its letters read "Q4 1" for the file's "Q4_1" quant type."""
    panel = make_panel([])
    _select(qtbot, panel, SMOLLM)
    texts = set(panel.details().values())
    labels = [label for label in panel.findChildren(QLabel) if label.text() in texts]
    quant = next(label for label in labels if label.text() == panel.details()["Quant types"])
    scroll = next(area for area in panel.findChildren(QScrollArea) if area.widget().isAncestorOf(quant))
    names = [scroll.widget().layout().labelForField(label) for label in labels]
    viewport = scroll.viewport()
    seen = set()
    for height in range(440, 1100, 2):  # a column dock's heights: the details' edge crosses every row
        panel.resize(320, height)
        QApplication.processEvents()
        for label in [*labels, *names]:
            where = QRect(label.mapTo(viewport, QPoint(0, 0)), label.size())
            cut = where.intersects(viewport.rect()) and not viewport.rect().contains(where)
            assert not cut, f"{label.text()!r} cut at {where.getRect()} by {viewport.rect().getRect()} " \
                            f"(panel height {height})"
        seen.add(viewport.rect().contains(QRect(quant.mapTo(viewport, QPoint(0, 0)), quant.size())))
    assert seen == {False, True}  # the quant types were below the edge, then shown
    panel.resize(317, 479)  # the Models dock of a 1280x800 window: scrolled, no row is cut at the bottom
    bar = scroll.verticalScrollBar()
    for value in range(bar.maximum() + 1):
        bar.setValue(value)
        QApplication.processEvents()
        for label in [*labels, *names]:
            where = QRect(label.mapTo(viewport, QPoint(0, 0)), label.size())
            assert where.top() < 0 or not where.intersects(viewport.rect()) or viewport.rect().contains(where)
    last = labels[-1]  # the path, whole at the end of the range
    assert bar.value() == bar.maximum() and last.text() == panel.details()["Path"]
    assert viewport.rect().contains(QRect(last.mapTo(viewport, QPoint(0, 0)), last.size()))
