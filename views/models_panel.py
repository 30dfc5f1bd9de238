"""The Models panel: built-in and discovered language models and opened Loom networks in one
searchable list, the selected one's details (with the mode a model supports: chat, or completion
only for a base model), fetch / load (with the activations chosen: int8 or float32) / unload with
progress and cancel, "Show in panels" for the loaded model and the opened networks, and a tokenizer
preview of the loaded model. A model loaded on a first run, its kernels still compiling in a child
process, is said to answer on numpy meanwhile, with the count of kernels done, until they are ready.

Every slow step (walking the disk, reading a file's header, fetching, loading, reading a network)
runs as a job on the shared :class:`~loomlab.views.workers.JobRunner`; the panel only cancels and
joins the jobs it started itself.
"""

from __future__ import annotations

import dataclasses
import html
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QSortFilterProxyModel, Qt, QTimer, Signal
from PySide6.QtGui import QPalette, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QTextBrowser,
    QTreeView,
    QVBoxLayout,
    QWidget,
)
from shiboken6 import isValid

from loomlab.core import VolumetricNetwork, load_network
from loomlab.core.layer_names import Parts, model_parts
from loomlab.core.llm.files import discovery, registry
from loomlab.core.llm.files.discovery import ModelEntry
from loomlab.core.llm.generate.textmodel import TextModel, load_model
from loomlab.core.llm.kernels.kernel_warmup import KERNELS_STAGE
from loomlab.core.llm.model import model_info
from loomlab.core.llm.model.model_info import CHAT, COMPLETION, EMBEDDING, ModelInfo
from loomlab.core.llm.text.token_text import token_text
from loomlab.core.units import format_bytes, format_count

from .activations import ActivationsBox
from .theme import ERROR_ON_DARK, ERROR_ON_LIGHT
from .workers import Job, JobRunner

ENTRY_ROLE = Qt.ItemDataRole.UserRole + 1
COLUMNS = ("Name", "Kind", "Source", "Size", "Mode", "State")
CANNOT_LOAD = "cannot load"  # the Mode of a file this build cannot run (its tooltip and details say why)
NETWORK_FILTER = "Loom networks (*.json *.loom);;All files (*)"
PROGRESS_STEPS = 1000  # the bar counts permille, so multi-GB byte counts never overflow its int range
KERNELS_POLL_MS = 1000  # how often a first run's kernel count is read while they compile
MAX_PREVIEW_TOKENS = 400  # chips beyond this are summarised: a pasted book should not freeze the GUI
CHIP_COLOURS = ("#ffd8a8", "#b2f2bb", "#a5d8ff", "#eebefa", "#ffec99", "#c3fae8", "#ffc9c9", "#d0bfff")
CHIP_TEXT, CHIP_ID = "#1a1a1a", "#495057"  # on the light chips, in either theme: >= 4.5:1 on each


@dataclass(frozen=True)
class NetworkEntry:
    """A Loom network read from a file, kept so selecting it again makes it current."""

    name: str
    path: Path
    net: VolumetricNetwork
    summary: dict


Entry = ModelEntry | NetworkEntry


class ModelsPanel(QWidget):
    """Browse, inspect, fetch and load models; open Loom networks.

    Parameters
    ----------
    runner
        The application's job runner; slow work runs there, never on the GUI thread.
    folders
        Extra folders to search for ``.gguf`` files and Hugging Face model folders, on top of the
        Hugging Face cache and LM Studio's folders.
    """

    model_loaded = Signal(object)  # the TextModel
    model_unloaded = Signal()
    network_opened = Signal(object)  # the VolumetricNetwork
    show_requested = Signal(object)  # the loaded TextModel or an opened VolumetricNetwork, to show again
    busy_changed = Signal(bool)  # a fetch, load or open started (True) or ended (False)
    listed = Signal(list)  # the ModelEntry list a search found (after every scan)

    def __init__(self, runner: JobRunner, folders: list[str] | None = None, parent: QWidget | None = None):
        super().__init__(parent)
        self._runner = runner
        self._folders = list(folders or [])
        self._jobs: dict[int, Job] = {}
        self._tokens = itertools.count()
        self._action: Job | None = None  # the one fetch / load / open the buttons act on
        self._loading: list[TextModel] = []  # a model loaded by a job, until the GUI takes it
        self._model: TextModel | None = None
        self._loaded_key: str | None = None
        self._loaded_entry: ModelEntry | None = None
        self._modes: dict[str, str] = {}  # row key -> CHAT / COMPLETION, once a file was read
        self._scanning = False
        self._describe_seq = 0  # answers from an older selection are dropped
        self._shut_down = False
        self.current_info: ModelInfo | None = None
        self.backend = "numpy"  # what models and networks load on (the window's View > Backend)
        self._details: dict[str, str] = {}
        self._preview: list[tuple[int, str]] = []
        # reads a first run's kernel count into the status line until they are ready (_show_kernels)
        self.kernels_timer = QTimer(self, interval=KERNELS_POLL_MS)
        self.kernels_timer.timeout.connect(self._show_kernels)
        self._kernels_said = ""  # the status line as the timer last wrote it
        self._build()
        self.refresh()

    # ----- construction ------------------------------------------------------------------------
    def _build(self) -> None:
        self._items = QStandardItemModel(0, len(COLUMNS), self)
        self._items.setHorizontalHeaderLabels(COLUMNS)
        self._proxy = QSortFilterProxyModel(self)
        self._proxy.setSourceModel(self._items)
        self._proxy.setFilterKeyColumn(-1)  # match any column: name, kind, source, state
        self._proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)

        self.filter_edit = QLineEdit(placeholderText="Filter models and networks…", clearButtonEnabled=True)
        self.filter_edit.textChanged.connect(self._proxy.setFilterFixedString)
        self.list_view = QTreeView(rootIsDecorated=False, uniformRowHeights=True, alternatingRowColors=True)
        self.list_view.setModel(self._proxy)
        self.list_view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.list_view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.list_view.header()
        header.setStretchLastSection(False)
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.list_view.selectionModel().currentRowChanged.connect(lambda *_: self._on_selection())
        self.list_view.doubleClicked.connect(lambda *_: self.load_selected())
        self.open_button = QPushButton("Open network…", clicked=self._open_network_dialog)
        self.add_folder_button = QPushButton("Add folder…", clicked=self._add_folder_dialog)
        self.refresh_button = QPushButton("Rescan", clicked=self.refresh)
        self.scan_label = QLabel()

        browse = QWidget()
        col = QVBoxLayout(browse)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(self.filter_edit)
        col.addWidget(self.list_view, 1)
        col.addLayout(_row(self.open_button, self.add_folder_button, self.refresh_button, None))
        col.addWidget(self.scan_label)

        self._details_box = QGroupBox("Details")
        self._form = QFormLayout(self._details_box)
        self._form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.fetch_button = QPushButton("Fetch", clicked=self.fetch_selected)
        self.load_button = QPushButton("Load", clicked=self.load_selected)
        self.show_button = QPushButton("Show in panels", clicked=self.show_selected)
        self.show_button.setToolTip("Show the loaded model or this network in the other panels again")
        self.unload_button = QPushButton("Unload", clicked=self.unload)
        self.cancel_button = QPushButton("Cancel", clicked=self.cancel)
        self.activations_box = ActivationsBox()
        self.activations_box.setToolTip("The activations the next load runs with (a loaded model's switch is "
                                        f"in the Chat and Server panels). {self.activations_box.toolTip()}")
        self.progress_bar = QProgressBar(textVisible=True)
        self._reset_progress()
        self.status_label = QLabel(wordWrap=True)
        self.status_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        # The details scroll on their own, so a short dock squeezes neither them nor the preview
        # below, and the buttons always show.
        scroll = _WholeRows(self._details_box, self._form)
        inspect = QWidget()
        col = QVBoxLayout(inspect)
        col.setContentsMargins(0, 0, 0, 0)
        col.addWidget(scroll, 1)
        col.addLayout(_row(self.fetch_button, self.load_button, self.unload_button, None))
        # the load option shares a row with "Show in panels" (Cancel goes with the bar it stops), so
        # the details keep their height in a short dock
        col.addLayout(_row(self.show_button, None, QLabel("Activations"), self.activations_box))
        col.addLayout(_row(self.progress_bar, self.cancel_button))
        col.addWidget(self.status_label)
        self._inspect_splitter = QSplitter(Qt.Orientation.Vertical, childrenCollapsible=False)
        self._inspect_splitter.addWidget(inspect)
        self._inspect_splitter.addWidget(self._build_preview())
        self._inspect_splitter.setStretchFactor(0, 3)
        self._inspect_splitter.setStretchFactor(1, 2)

        self._splitter = QSplitter()
        # Side by side its halves' minimum widths add up (~550 px): made narrower, as a dock in a
        # column is, it must shrink and stack (resizeEvent), not hold the dock that wide.
        self._splitter.setMinimumSize(1, 1)
        self._splitter.addWidget(browse)
        self._splitter.addWidget(self._inspect_splitter)
        self._splitter.setStretchFactor(0, 3)
        self._splitter.setStretchFactor(1, 2)
        QVBoxLayout(self).addWidget(self._splitter)
        self._show_details([("", "Select a model to see its details.")])
        self._update_preview()
        self._update_actions()

    def _build_preview(self) -> QGroupBox:
        box = QGroupBox("Tokenizer preview")
        self.preview_edit = QLineEdit(placeholderText="Type text to see its tokens…", clearButtonEnabled=True)
        self.preview_edit.textChanged.connect(self._update_preview)
        self.preview_view = QTextBrowser(minimumHeight=80)
        self.preview_view.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Ignored)
        self.preview_count = QLabel()
        col = QVBoxLayout(box)
        col.addWidget(self.preview_edit)
        col.addWidget(self.preview_view, 1)
        col.addWidget(self.preview_count)
        return box

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        # Side by side when wide (a central or floating panel), stacked when docked in a narrow column,
        # where the details deserve more of the height than the list.
        size = event.size()
        wide = size.width() > 1.2 * size.height()
        orientation = Qt.Orientation.Horizontal if wide else Qt.Orientation.Vertical
        if orientation != self._splitter.orientation():
            self._splitter.setOrientation(orientation)
            total = size.width() if wide else size.height()
            list_share = 3 / 5 if wide else 1 / 3
            self._splitter.setSizes([int(total * list_share), int(total * (1 - list_share))])
        super().resizeEvent(event)

    # ----- state the rest of the app reads -------------------------------------------------------
    @property
    def model(self) -> TextModel | None:
        """The loaded language model, or None."""
        return self._model

    @property
    def activations(self) -> str:
        """The activations a load runs with, as the load options show them: "int8" or "float32"."""
        return self.activations_box.mode

    @activations.setter
    def activations(self, mode: str) -> None:
        self.activations_box.set_mode(mode)

    @property
    def busy(self) -> bool:
        """True while a fetch, load or network open runs."""
        return self._action is not None

    @property
    def scanning(self) -> bool:
        """True while the folders are being searched for models."""
        return self._scanning

    def entries(self) -> list[Entry]:
        """Every listed model and network, in list order (filtered out or not)."""
        return [self._items.item(r, 0).data(ENTRY_ROLE) for r in range(self._items.rowCount())]

    def visible_names(self) -> list[str]:
        """Names of the rows the filter lets through, top to bottom."""
        return [self._proxy.index(r, 0).data() for r in range(self._proxy.rowCount())]

    def selected_entry(self) -> Entry | None:
        index = self.list_view.currentIndex()
        return index.siblingAtColumn(0).data(ENTRY_ROLE) if index.isValid() else None

    def select(self, name: str) -> bool:
        """Select the visible row named ``name``; False when there is none."""
        for r in range(self._proxy.rowCount()):
            index = self._proxy.index(r, 0)
            if index.data() == name:
                self.list_view.setCurrentIndex(index)
                return True
        return False

    def details(self) -> dict[str, str]:
        """The details pane as shown: field -> text."""
        return dict(self._details)

    def preview_tokens(self) -> list[tuple[int, str]]:
        """The tokenizer preview as shown: (id, piece) per token."""
        return list(self._preview)

    # ----- discovery ------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Search the folders again (in a job) and relist what is found; opened networks stay."""
        if self._scanning:
            return
        self._scanning = True
        self.scan_label.setText("Searching for models…")
        folders = list(self._folders)
        self._start(lambda job: discovery.discover(folders), "discover models",
                    on_success=self._on_discovered, on_failure=self._on_scan_failed)

    def add_folder(self, folder: str) -> None:
        """Search ``folder`` too, from now on."""
        if folder not in self._folders:
            self._folders.append(folder)
        self.refresh()

    def _add_folder_dialog(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Add a folder with models")
        if folder:
            self.add_folder(folder)

    def _on_discovered(self, found: list[ModelEntry]) -> None:
        self._scanning = False
        selected = _key(self.selected_entry()) if self.selected_entry() is not None else None
        networks = [e for e in self.entries() if isinstance(e, NetworkEntry)]
        self._items.removeRows(0, self._items.rowCount())
        for entry in [*found, *networks]:
            self._items.appendRow(self._row_items(entry))
        if self._model is not None and not any(_key(e) == self._loaded_key for e in found):
            self._items.appendRow(self._row_items(self._loaded_entry))  # loaded from elsewhere: still listed
        self._count_rows()
        if selected is None and self._model is not None:
            selected = self._loaded_key  # loaded before the search ended (--model, Open recent)
        if selected is not None:
            self._select_key(selected)
        self.listed.emit(list(found))

    def _count_rows(self) -> None:
        """Say what the list holds, models and networks apart (not just what the search found)."""
        entries = self.entries()
        networks = sum(isinstance(e, NetworkEntry) for e in entries)
        models = len(entries) - networks
        text = f"{models} model{'s' * (models != 1)}"
        if networks:
            text += f" · {networks} network{'s' * (networks != 1)}"
        self.scan_label.setText(text + " listed")

    def _on_scan_failed(self, message: str) -> None:
        self._scanning = False
        self.scan_label.setText(f"Search failed: {message}")

    # ----- list rows -------------------------------------------------------------------------------
    def _row_items(self, entry: Entry) -> list[QStandardItem]:
        items = [QStandardItem(text) for text in self._row_texts(entry)]
        problem = getattr(entry, "problem", "")
        for item in items:
            item.setEditable(False)
            item.setToolTip(f"{entry.path}\n{problem}" if problem else str(entry.path))
        items[0].setData(entry, ENTRY_ROLE)
        return items

    def _row_texts(self, entry: Entry) -> list[str]:
        if isinstance(entry, NetworkEntry):
            kind = "Loom .loom" if entry.path.suffix.lower() == ".loom" else "Loom JSON"
            size = format_count(model_parts(entry.net).layers, "layer")
            return [entry.name, kind, "file", size, "", "open"]
        size = format_bytes(entry.size) if entry.size else ""
        mode = self._modes.get(_key(entry), CANNOT_LOAD if entry.problem else "")
        if _key(entry) == self._loaded_key:
            state = "loaded"
        elif entry.source == "builtin":
            state = "fetched" if entry.fetched else "not fetched"
        else:
            state = ""
        source = {"builtin": "built-in"}.get(entry.source, entry.source)
        return [entry.name, entry.kind.upper(), source, size, mode, state]

    def _refresh_row(self, row: int, entry: Entry) -> None:
        self._items.item(row, 0).setData(entry, ENTRY_ROLE)
        for col, text in enumerate(self._row_texts(entry)):
            self._items.item(row, col).setText(text)

    def _refresh_rows(self) -> None:
        for row, entry in enumerate(self.entries()):
            self._refresh_row(row, entry)

    def _select_key(self, key: str) -> None:
        for row, entry in enumerate(self.entries()):
            if _key(entry) == key:
                source_index = self._items.index(row, 0)
                self.list_view.setCurrentIndex(self._proxy.mapFromSource(source_index))
                return

    # ----- details ---------------------------------------------------------------------------------
    def _on_selection(self) -> None:
        self._update_actions()
        entry = self.selected_entry()
        self._describe_seq += 1
        self.current_info = None
        if entry is None:
            self._show_details([("", "Select a model to see its details.")])
        elif isinstance(entry, NetworkEntry):
            self._show_details(_network_rows(entry))
        elif entry.source == "builtin" and not entry.fetched:
            self._show_details(_unfetched_rows(entry))
        else:
            self._describe(entry)

    def _describe(self, entry: ModelEntry) -> None:
        seq, path = self._describe_seq, entry.path
        self._show_details([("Name", entry.name), ("", "Reading the file…")])
        self._start(lambda job: model_info.describe(path), "describe model",
                    on_success=lambda info: self._on_described(seq, info),
                    on_failure=lambda message: self._on_describe_failed(seq, entry, message))

    def _on_described(self, seq: int, info: ModelInfo) -> None:
        entry = self.selected_entry()
        if seq == self._describe_seq and isinstance(entry, ModelEntry):
            self.current_info = info
            rows = _info_rows(info)
            self._show_details([("Problem", info.problem), *rows] if info.problem else rows)
            self._set_mode(_key(entry), CANNOT_LOAD if info.problem else info.mode)

    def _set_mode(self, key: str, mode: str) -> None:
        self._modes[key] = mode
        for row, entry in enumerate(self.entries()):
            if _key(entry) == key:
                self._refresh_row(row, entry)

    def _on_describe_failed(self, seq: int, entry: ModelEntry, message: str) -> None:
        if seq == self._describe_seq:
            self._show_details([("Name", entry.name), ("Path", str(entry.path)), ("Error", message)])
            self._set_mode(_key(entry), CANNOT_LOAD)

    def _show_details(self, rows: list[tuple[str, str]]) -> None:
        while self._form.rowCount():
            self._form.removeRow(0)
        self._details = dict(rows)
        for field, text in rows:
            value = QLabel(text, wordWrap=True)
            value.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            value.setProperty("error", field == "Error")
            self._form.addRow(f"{field}:" if field else "", value)
        self._colour_errors()

    def _colour_errors(self) -> None:
        """Error text in red that reads on the palette in use (again after a theme change)."""
        dark = self.palette().color(QPalette.ColorRole.Window).lightness() < 128
        for label in [self.status_label, *self._details_box.findChildren(QLabel)]:
            palette = QPalette()  # sets no role: the label inherits the panel's palette
            if label.property("error"):
                palette.setColor(QPalette.ColorRole.WindowText, ERROR_ON_DARK if dark else ERROR_ON_LIGHT)
            label.setPalette(palette)

    def changeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().changeEvent(event)
        if event.type() in (QEvent.Type.PaletteChange, QEvent.Type.ApplicationPaletteChange):
            self._colour_errors()

    # ----- fetch, load, unload, open -----------------------------------------------------------------
    def fetch_selected(self) -> None:
        """Fetch the selected built-in model into the cache (in a job)."""
        entry = self.selected_entry()
        if not _is_unfetched_builtin(entry) or self.busy:
            return
        alias = entry.name
        self._run_action(f"Fetching {alias}", lambda job: registry.fetch(
            alias, progress=job.report, cancel=job.is_cancelled), lambda path: self._on_fetched(alias))

    def _on_fetched(self, alias: str) -> None:
        self.status_label.setText(f"Fetched {alias}")
        self._replace_builtin(alias, fetched=registry.is_fetched(alias))

    def _replace_builtin(self, alias: str, **changes: Any) -> None:
        for row, entry in enumerate(self.entries()):
            if isinstance(entry, ModelEntry) and entry.source == "builtin" and entry.name == alias:
                self._refresh_row(row, dataclasses.replace(entry, **changes))
        self._on_selection()

    def load_selected(self) -> None:
        """Load the selected model (fetching a built-in first); the loaded model or a network is
        shown in the panels again instead (:meth:`show_selected`)."""
        entry = self.selected_entry()
        if entry is None or self.busy:
            return
        if isinstance(entry, NetworkEntry) or _key(entry) == self._loaded_key:
            self.show_selected()
            return
        self._load_entry(entry)

    def show_selected(self) -> None:
        """Emit :attr:`show_requested` with the selected network, or the loaded model when it is
        the one selected: what another open item had taken over in the panels comes back."""
        entry = self.selected_entry()
        if isinstance(entry, NetworkEntry):
            self.show_requested.emit(entry.net)
        elif entry is not None and self._model is not None and _key(entry) == self._loaded_key:
            self.show_requested.emit(self._model)

    def load(self, name_or_path: str | Path) -> None:
        """Load a built-in alias, a listed model, or a model file/folder not listed yet (File menu,
        ``--model``); also before the search for models has ended."""
        if self.busy:
            return
        listed = next((e for e in self.entries() if isinstance(e, ModelEntry)
                       and str(name_or_path) in (e.name, str(e.path))), None)
        self._load_entry(listed or _entry_for(name_or_path))

    def _load_entry(self, entry: ModelEntry) -> None:
        self.unload()  # one model at a time: free the old one's memory before reading the new
        target = entry.name if entry.source == "builtin" else str(entry.path)
        loading, backend, activations = self._loading, self.backend, self.activations

        def work(job: Job) -> TextModel:
            # the tokenizer builds in a child process: in this one it would hold the GIL, and so
            # freeze the window, for up to a second (Gemma's 262k-token vocabulary)
            model = load_model(target, progress=job.report, cancel=job.is_cancelled, tokenizer_process=True,
                               backend=backend, activations=activations)
            loading.append(model)  # held here so a cancelled or abandoned load still gets closed
            return model

        self._run_action(f"Loading {entry.name}", work, lambda model: self._on_loaded(entry))

    def _on_loaded(self, entry: ModelEntry) -> None:
        self._model = self._loading.pop()
        self._loaded_key, self._loaded_entry = _key(entry), entry
        self._modes[self._loaded_key] = (EMBEDDING if self._model.is_embedding_model
                                         else CHAT if self._model.supports_chat else COMPLETION)
        if entry.source == "builtin" and not entry.fetched:
            self._replace_builtin(entry.name, fetched=True)
        if not self._scanning and not any(_key(e) == self._loaded_key for e in self.entries()):
            self._items.appendRow(self._row_items(entry))  # a file the search does not cover
            self._count_rows()
        self._refresh_rows()
        if self.selected_entry() is None:
            self._select_key(self._loaded_key)  # loaded by name (--model, Open recent): show it
        self._show_kernels()  # "Loaded NAME", and while a first run's kernels compile, their count
        self._update_preview()
        self._update_actions()
        self.model_loaded.emit(self._model)

    def _show_kernels(self) -> None:
        """Say the model is loaded; on a first run, that it answers on numpy while its kernels
        compile, with the count so far, read again every tick (two plain attributes: the GUI
        never waits on the engine) until they are ready. A tick after the line said something
        else (another action's news) stops, leaving that news."""
        model, entry = self._model, self._loaded_entry
        superseded = self.kernels_timer.isActive() and self.status_label.text() != self._kernels_said
        if model is None or superseded:
            self.kernels_timer.stop()
            return
        text = f"Loaded {entry.name}"
        if model.kernels_ready:
            self.kernels_timer.stop()
        else:
            text += f" · {KERNELS_STAGE}: {model.kernels_compiled} compiled; answering on numpy meanwhile"
            if not self.kernels_timer.isActive():
                self.kernels_timer.start()
        self._kernels_said = text
        self.status_label.setText(text)

    def unload(self) -> None:
        """Close the loaded model and forget it."""
        if self._model is None:
            return
        model, self._model, self._loaded_key, self._loaded_entry = self._model, None, None, None
        self.kernels_timer.stop()
        model.close()
        self._refresh_rows()
        self.status_label.setText(f"Unloaded {model.name}")
        self._update_preview()
        self._update_actions()
        self.model_unloaded.emit()

    def open_network(self, path: str | Path) -> None:
        """Read a Loom JSON or ``.loom`` network (in a job), list it and emit :attr:`network_opened`."""
        path, backend = Path(path), self.backend

        def work(job: Job) -> tuple[VolumetricNetwork, dict]:
            net = load_network(path, backend=backend)
            return net, net.summary()

        self._run_action(f"Opening {path.name}", work, lambda result: self._on_network(path, *result))

    def _open_network_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Open a Loom network", "", NETWORK_FILTER)
        if path:
            self.open_network(path)

    def _on_network(self, path: Path, net: VolumetricNetwork, summary: dict) -> None:
        entry = NetworkEntry(path.name, path, net, summary)
        rows = [r for r, e in enumerate(self.entries()) if isinstance(e, NetworkEntry) and e.path == path]
        if rows:
            self._refresh_row(rows[0], entry)  # opened again: the file may have changed
        else:
            self._items.appendRow(self._row_items(entry))
            self._count_rows()
        self.filter_edit.clear()  # so the new row is visible and selectable
        self._select_key(_key(entry))
        self._on_selection()
        self.status_label.setText(f"Opened {path.name}: {model_parts(net)}")
        self.network_opened.emit(net)

    def cancel(self) -> None:
        """Cancel the running fetch, load or open."""
        if self._action is not None:
            self._action.cancel()
            self.status_label.setText("Cancelling…")

    # ----- jobs ------------------------------------------------------------------------------------
    def _run_action(self, what: str, fn: Callable[[Job], Any], on_success: Callable[[Any], None]) -> None:
        """Run the one user-visible job: progress on the bar, Cancel enabled, the other buttons not."""
        self.status_label.setProperty("error", False)
        self._colour_errors()
        self.status_label.setText(f"{what}…")
        self._reset_progress()
        self.progress_bar.show()
        self.cancel_button.show()

        def ended(slot: Callable[..., None]) -> Callable[..., None]:
            def call(*args: Any) -> None:
                self._action = None
                slot(*args)
                self._reset_progress()  # idle: the bar goes away until the next action
                self._close_abandoned()
                self._update_actions()
                self.busy_changed.emit(False)
            return call

        self._action = self._start(fn, what, on_progress=self._on_progress, on_success=ended(on_success),
                                   on_failure=ended(self._on_action_failed),
                                   on_cancel=ended(lambda: self._on_action_cancelled(what)))
        self._update_actions()
        self.busy_changed.emit(True)

    def _on_progress(self, stage: str, done: int, total: int) -> None:
        if total <= 0:  # unknown length (e.g. a first run's kernels): Qt's busy animation and a count
            self.progress_bar.setRange(0, 0)
            count = f": {done} done" if done else ""
            self.status_label.setText(f"{stage[:1].upper()}{stage[1:]}{count}…")
            return
        self.progress_bar.setRange(0, PROGRESS_STEPS)
        self.progress_bar.setValue(min(PROGRESS_STEPS, done * PROGRESS_STEPS // total))
        self.progress_bar.setFormat(f"{stage} %p%")

    def _on_action_failed(self, message: str) -> None:
        self.status_label.setProperty("error", True)
        self._colour_errors()
        self.status_label.setText(message)

    def _on_action_cancelled(self, what: str) -> None:
        self.status_label.setText(f"{what.split()[0]} cancelled")

    def _reset_progress(self) -> None:
        """An idle bar: hidden with its Cancel, empty (no "load 100%" left from the last action, no
        "0%")."""
        self.progress_bar.hide()
        self.cancel_button.hide()
        self.progress_bar.setRange(0, PROGRESS_STEPS)
        self.progress_bar.setValue(0)
        self.progress_bar.setFormat("")

    def _close_abandoned(self) -> None:
        while self._loading:
            self._loading.pop().close()

    def _start(self, fn: Callable[[Job], Any], name: str, *,
               on_success: Callable[[Any], None],
               on_failure: Callable[[str], None],
               on_cancel: Callable[[], None] | None = None,
               on_progress: Callable[[str, int, int], None] | None = None) -> Job:
        """Start a job on the shared runner and remember it as ours until it reports its end."""
        # Keyed by a number, so the job's own slots hold no reference to the job (no cycle through Qt).
        token = next(self._tokens)

        def ended(slot: Callable[..., None] | None) -> Callable[..., None]:
            def call(*args: Any) -> None:
                self._jobs.pop(token, None)
                if slot is not None and not self._shut_down and isValid(self):  # not into a deleted panel
                    slot(*args)
            return call

        job = self._runner.start(fn, name=name, on_progress=on_progress, on_success=ended(on_success),
                                 on_failure=ended(on_failure), on_cancel=ended(on_cancel))
        self._jobs[token] = job  # queued slots run after this method returns, so never before this
        return job

    def shutdown(self, timeout_ms: int = 10000) -> bool:
        """Cancel and join this panel's jobs (not the runner's others), stop the kernel count and close
        the loaded model.

        True when every job stopped within ``timeout_ms``.
        """
        self._shut_down = True
        self.kernels_timer.stop()
        jobs = [job for job in self._jobs.values() if isValid(job)]  # the runner may have dropped some
        for job in jobs:
            job.cancel()
        stopped = all(job.wait(timeout_ms) for job in jobs)
        self._jobs.clear()
        self._action = None
        self._close_abandoned()
        if self._model is not None:
            self._model.close()
            self._model = None
        return stopped

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        # Closed as a window of its own (not hidden in a dock): nothing may call back into it afterwards.
        self.shutdown()
        super().closeEvent(event)

    # ----- buttons and tokenizer preview ---------------------------------------------------------------
    def _update_actions(self) -> None:
        entry = self.selected_entry()
        idle = not self.busy
        self.fetch_button.setEnabled(idle and _is_unfetched_builtin(entry))
        loaded = entry is not None and self._model is not None and _key(entry) == self._loaded_key
        self.load_button.setEnabled(idle and isinstance(entry, ModelEntry) and not loaded)
        self.show_button.setEnabled(idle and (loaded or isinstance(entry, NetworkEntry)))
        self.unload_button.setEnabled(idle and self._model is not None)
        self.cancel_button.setEnabled(not idle)
        self.open_button.setEnabled(idle)

    def _update_preview(self) -> None:
        model = self._model
        self.preview_edit.setEnabled(model is not None)
        if model is None:
            self._preview = []
            self.preview_view.setHtml("<i>Load a model to see how its tokenizer splits text.</i>")
            self.preview_count.setText("")
            return
        tokenizer = model.tokenizer
        ids = tokenizer.encode(self.preview_edit.text())  # microseconds: fine on the GUI thread
        self._preview = [(i, token_text(tokenizer, i)) for i in ids]
        chips = [_chip(k, i, piece) for k, (i, piece) in enumerate(self._preview[:MAX_PREVIEW_TOKENS])]
        if len(ids) > MAX_PREVIEW_TOKENS:
            chips.append(f"… {len(ids) - MAX_PREVIEW_TOKENS} more")
        self.preview_view.setHtml(f'<p style="line-height:150%;">{" ".join(chips)}</p>')
        text = self.preview_edit.text()
        self.preview_count.setText(f"{len(ids)} tokens · {len(text)} characters · {model.name}")


class _WholeRows(QScrollArea):
    """A frameless scroll area over a form that shows whole rows only: what it shows ends above
    the row its bottom edge would cut, until that row is scrolled to. Cut just below its letters,
    a row misreads (the quant type "Q4_1" read "Q4 1")."""

    def __init__(self, content: QWidget, form: QFormLayout):
        super().__init__(widgetResizable=True, frameShape=QFrame.Shape.NoFrame)
        self._form = form
        self.setWidget(content)  # QScrollArea filters the content's events (eventFilter below)
        self.verticalScrollBar().valueChanged.connect(self._trim)

    def eventFilter(self, watched, event) -> bool:  # noqa: N802 (Qt's name)
        handled = super().eventFilter(watched, event)
        if watched is self.widget() and event.type() in (QEvent.Type.LayoutRequest, QEvent.Type.Resize):
            if event.type() == QEvent.Type.LayoutRequest:
                watched.layout().activate()  # rows placed now, so the trim sees where they are
            self._trim()
        return handled

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._trim()

    def _trim(self) -> None:
        """End the shown part at the top of the row the scroll area's full height would cut
        (measured without the trim, so trimming never feeds back into itself)."""
        bottom = self.height() - 2 * self.frameWidth()
        if self.horizontalScrollBar().isVisible():
            bottom -= self.horizontalScrollBar().height()
        offset = self.widget().y()  # <= 0 once scrolled
        cut = [top + offset for top, end in self._rows() if 0 < top + offset < bottom < end + offset]
        margin = bottom - cut[0] if cut else 0
        if self.viewportMargins().bottom() != margin:
            self.setViewportMargins(0, 0, 0, margin)

    def _rows(self) -> list[tuple[int, int]]:
        """Top and bottom (exclusive) of each form row, in the content's coordinates."""
        rows = []
        for i in range(self._form.rowCount()):
            rects = [item.widget().geometry() for role in (QFormLayout.ItemRole.LabelRole,
                                                           QFormLayout.ItemRole.FieldRole)
                     if (item := self._form.itemAt(i, role)) is not None and item.widget() is not None]
            if rects:
                rows.append((min(r.top() for r in rects), max(r.bottom() + 1 for r in rects)))
        return rows


# ----- formatting ------------------------------------------------------------------------------------------
def _row(*widgets: QWidget | None) -> QHBoxLayout:
    """A row of widgets; None is a stretch."""
    row = QHBoxLayout()
    for widget in widgets:
        if widget is None:
            row.addStretch(1)
        else:
            row.addWidget(widget)
    return row


def _key(entry: Entry) -> str:
    """What identifies a row across rescans and however it was named: the real path (a model
    loaded by alias or by a symlink's path before the search ended is the row the search finds)."""
    kind = "net" if isinstance(entry, NetworkEntry) else "model"
    return f"{kind}:{Path(entry.path).resolve()}"


def _entry_for(name_or_path: str | Path) -> ModelEntry:
    """A list entry for a model not listed (yet): a built-in by its alias, else a file or folder."""
    builtin = next((e for e in discovery.builtin_entries() if e.name == str(name_or_path)), None)
    if builtin is not None:
        return builtin
    path = Path(name_or_path).expanduser()
    size = path.stat().st_size if path.is_file() else 0
    return ModelEntry(path.stem if path.is_file() else path.name, path, "gguf" if path.is_file() else "hf",
                      "folder", size)


def _is_unfetched_builtin(entry: Entry | None) -> bool:
    return isinstance(entry, ModelEntry) and entry.source == "builtin" and not entry.fetched


def _format_count(n: int) -> str:
    for div, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f} {unit} ({n:,})"
    return f"{n:,}"


def _info_rows(info: ModelInfo) -> list[tuple[str, str]]:
    weights = format_bytes(info.file_bytes)
    return [
        ("Name", info.name),
        ("Architecture", f"{info.architecture} ({info.format.upper()})"),
        ("Parameters", _format_count(info.parameters)),
        ("Shape", f"{Parts.of_language_model(info.blocks)} · d={info.hidden_size} · {info.heads} heads / "
                  f"{info.kv_heads} KV · head dim {info.head_dim}"),
        ("Context", f"{info.context_length:,} tokens"),
        ("Vocabulary", f"{info.vocab_size:,}"),
        ("Quant types", info.types_text),
        ("Chat template", "yes" if info.chat_template else "no"),
        ("Mode", info.mode if info.supports_chat else
         f"{info.mode}: it computes embeddings (/v1/embeddings), no text" if info.embedding_model else
         f"{info.mode}: a base model, it continues text (a chat would echo the prompt)"),
        ("File size", weights),
        ("Memory estimate", info.memory_text),
        ("Path", info.path),
    ]


def _unfetched_rows(entry: ModelEntry) -> list[tuple[str, str]]:
    model = registry.BUILTINS[entry.name]
    return [("Name", entry.name), ("About", model.description), ("File", model.filename),
            ("File size", format_bytes(model.size)), ("State", "not fetched (Fetch or Load downloads it)")]


def _network_rows(entry: NetworkEntry) -> list[tuple[str, str]]:
    s = entry.summary
    dtypes = ", ".join(f"{dtype} {format_bytes(n)}" for dtype, n in s["memory_by_dtype"].items())
    grid = " × ".join(map(str, s["shape"]))
    return [("Name", entry.name), ("Grid", f"{grid} (depth × rows × cols × layers per cell)"),
            ("Parts", str(model_parts(entry.net))), ("Parameters", _format_count(s["parameters"])),
            ("Memory", format_bytes(s["memory_bytes"]) + (f" ({dtypes})" if dtypes else "")),
            ("Path", str(entry.path))]


def _chip(k: int, token_id: int, piece: str) -> str:
    """One token as a coloured chip: its text (whitespace made visible) and, small, its id."""
    shown = piece.replace(" ", "·").replace("\n", "↵").replace("\t", "→") or "∅"
    colour = CHIP_COLOURS[k % len(CHIP_COLOURS)]
    return (f'<span style="background-color:{colour}; color:{CHIP_TEXT};">&nbsp;{html.escape(shown)}'
            f'<sub style="color:{CHIP_ID};">{token_id}</sub>&nbsp;</span>')
