"""The Inspect panel: look inside the loaded language model on one sequence, a typed prompt or a
turn of the Chat panel's conversation, with the inspections of :mod:`loomlab.core.inspect`.

The sequence shows as a strip of token chips; clicking one selects that *position*. The *target*
is the token the model is asked about at that position: by default the model's own top
prediction there, or any single token typed in the Target field. The views:

* Attention: every head's pattern as a thumbnail (layers by row, heads by column), the chosen
  head's full pattern with token labels, and how much each head attends to the selected position;
* Logit lens: the top token of every layer at every position, tinted by its probability, the top
  k and the target's probability and rank in the tooltip;
* Attribution: the heads and MLPs with the largest shares of the target's logit at the position;
  clicking a bar selects that layer in the Topology, Telemetry and Morph panels;
* Ablation: tick heads, attention or MLP halves or blocks, Rerun, and compare the greedy
  continuation from the position before and after;
* Patching: a corrupted prompt as long as the clean one; the share of the clean answer each layer
  and position (or head) restores.

Ablation and patching read the sequence up to and including the selected position, so that every
view asks about the same prediction. Every inspection runs in a job, one at a time, with progress
and Cancel; Attention, Logit lens and Attribution compute by themselves when shown and when the
sequence, position or target change, Ablation and Patching when asked. Any view exports its
picture (PNG) and its numbers (CSV, JSON: :mod:`.inspect_export`).
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QProgressBar,
    QPushButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from loomlab.core.errors import InspectError
from loomlab.core.inspect import Inspector
from loomlab.core.inspect.trace import Tracer
from loomlab.core.io.atomic import write_atomic
from loomlab.core.layer_names import LayerKey

from . import inspect_export as export
from .inspect_jobs import WORK, Inputs, Shown
from .inspect_views import (
    AblationView,
    AttentionView,
    AttributionView,
    LensView,
    PatchingView,
    TokenStrip,
    shown_token,
)
from .theme import error_colour
from .workers import Job, JobRunner

VIEWS = ("attention", "lens", "attribution", "ablation", "patching")
TITLES = {"attention": "Attention", "lens": "Logit lens", "attribution": "Attribution",
          "ablation": "Ablation", "patching": "Patching"}
AUTO = ("attention", "lens", "attribution")  # computed when shown; the others when asked
PROMPT = "Prompt"
DEFAULT_PROMPT = "The capital of France is"
TURN_PREVIEW = 40  # characters of a turn's user message its entry in the list shows


class InspectPanel(QWidget):
    """Inspection of a loaded :class:`~loomlab.core.llm.generate.textmodel.TextModel`.

    Hand it a :class:`~loomlab.views.workers.JobRunner`, then :meth:`set_model`; the Chat panel's
    conversation arrives with :meth:`set_conversation` (or is asked of the callable given to
    :meth:`set_conversation_source` whenever the panel is shown).
    """

    layer_selected = Signal(object)  # the (z, y, x, l, path) of a layer the user picked
    computed = Signal(str)  # a view that now shows a new result
    sequence_changed = Signal()  # the token strip shows a new sequence

    def __init__(self, runner: JobRunner, parent: QWidget | None = None):
        super().__init__(parent)
        self._runner = runner
        self._model = None
        self._inspector: Inspector | None = None
        self._generation = 0  # bumped by a new model: results of older jobs are dropped
        self._messages: list[dict] = []
        self._conversation_source: Callable[[], list[dict]] | None = None
        self._ids: tuple[int, ...] = ()
        self._texts: list[str] = []
        self._position: int | None = None
        self._target_text = ""
        self._names: dict[int, str] = {}
        self._auto_targets: dict[tuple, int] = {}
        self._results: dict[str, Shown] = {}
        self._displayed: dict[str, Inputs | None] = dict.fromkeys(VIEWS)
        self._patterns: tuple[tuple[int, ...], Any, Any] | None = None  # ids, AttentionPatterns, thumbnails
        self._head = (0, 0)
        self._keys: dict[str, list[LayerKey]] = {}
        self._block_of_cell: dict[tuple, int] = {}
        self._job: Job | None = None
        self._job_view: str | None = None
        self._pending: tuple[str, Inputs | None, Callable, Callable] | None = None
        self._job_inputs: Inputs | None = None
        self._given_up: dict[str, Inputs] = {}  # failed or cancelled by the user: not computed by itself
        self._shown = True
        self._closed = False
        self._build()
        self._sync_controls()

    # ----- layout --------------------------------------------------------------------------------
    def _build(self) -> None:
        self.source_box = QComboBox()
        self.source_box.addItem(PROMPT)
        self.source_box.setToolTip("Inspect a typed prompt, or a turn of the Chat panel's conversation "
                                   "(up to and including that reply)")
        self.source_box.activated.connect(self._source_chosen)
        self.prompt_edit = QLineEdit(DEFAULT_PROMPT)
        self.prompt_edit.returnPressed.connect(lambda: self.set_prompt(self.prompt_edit.text()))
        self.tokenise_button = QPushButton("Tokenise")
        self.tokenise_button.clicked.connect(lambda: self.set_prompt(self.prompt_edit.text()))
        self.turns_button = QPushButton("Chat turns")
        self.turns_button.setToolTip("Offer the turns of the Chat panel's conversation again")
        self.turns_button.clicked.connect(self.pull_conversation)
        top = QHBoxLayout()
        top.addWidget(self.source_box)
        top.addWidget(self.prompt_edit, 1)
        top.addWidget(self.tokenise_button)
        top.addWidget(self.turns_button)

        self.strip = TokenStrip()
        self.strip.position_chosen.connect(self.select_position)
        self.target_edit = QLineEdit()
        self.target_edit.setToolTip("The token asked about at the selected position: empty for the model's "
                                    "own top prediction there, or one token's text (mind a leading space)")
        self.target_edit.setMaximumWidth(160)
        self.target_edit.editingFinished.connect(lambda: self.set_target_text(self.target_edit.text()))
        self.selection_label = QLabel("")
        tokens = QHBoxLayout()
        tokens.addWidget(self.strip, 1)
        tokens.addWidget(QLabel("Target"))
        tokens.addWidget(self.target_edit)
        tokens.addWidget(self.selection_label)

        self.attention_view = AttentionView()
        self.attention_view.head_chosen.connect(self.choose_head)
        self.lens_view = LensView()
        self.attribution_view = AttributionView()
        self.attribution_view.component_chosen.connect(self._component_chosen)
        self.ablation_view = AblationView()
        self.ablation_view.rerun_requested.connect(lambda: self.compute("ablation"))
        self.patching_view = PatchingView()
        self.patching_view.run_requested.connect(lambda: self.compute("patching"))
        self.views = {"attention": self.attention_view, "lens": self.lens_view,
                      "attribution": self.attribution_view, "ablation": self.ablation_view,
                      "patching": self.patching_view}
        self.tabs = QTabWidget()
        for name in VIEWS:
            self.tabs.addTab(self.views[name], TITLES[name])
        self.tabs.currentChanged.connect(lambda _i: self._tab_changed())

        self.status = QLabel("Load a model in the Models panel to inspect it")
        self.progress = QProgressBar()
        self.progress.setTextVisible(False)
        self.progress.setMaximumWidth(160)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel)
        self.export_buttons = {}
        bottom = QHBoxLayout()
        bottom.addWidget(self.status, 1)
        bottom.addWidget(self.progress)
        bottom.addWidget(self.cancel_button)
        for fmt in ("PNG", "CSV", "JSON"):
            button = QPushButton(f"{fmt}…")
            button.setToolTip(f"Export this view as {fmt}")
            button.clicked.connect(lambda _=False, f=fmt: self._ask_export(f))
            self.export_buttons[fmt] = button
            bottom.addWidget(button)

        layout = QVBoxLayout(self)
        layout.setContentsMargins(4, 4, 4, 4)
        layout.addLayout(top)
        layout.addLayout(tokens)
        layout.addWidget(self.tabs, 1)
        layout.addLayout(bottom)

    # ----- the model and the sequence ------------------------------------------------------------
    @property
    def model(self):
        return self._model

    @property
    def inspector(self) -> Inspector | None:
        return self._inspector

    def set_model(self, model) -> None:
        """Inspect ``model`` (None: nothing); what was shown belongs to the old one and goes."""
        self._forget()
        self._model = model
        self._inspector = None
        if model is not None:
            try:
                self._inspector = Inspector(model)
                tracer = Tracer(model.net)
            except InspectError as e:
                self.status.setText(str(e))
            else:
                self._learn_layers(tracer)
                self.ablation_view.set_shape(tracer.n_layers, tracer.n_heads)
                self.status.setText("")
                self._catch_up()
        if model is None:
            self.status.setText("Load a model in the Models panel to inspect it")
        self._sync_controls()

    def clear_model(self) -> None:
        self.set_model(None)

    def refresh(self) -> None:
        """The model changed (morphed, a block switched off): compute the views again."""
        if self._inspector is None:
            return
        self._generation += 1
        self._patterns = None
        self._auto_targets.clear()
        self._invalidate()

    def set_conversation(self, messages: Sequence[Mapping[str, str]]) -> None:
        """The Chat panel's conversation (as the model is given it): each turn, up to and including
        an assistant reply, is offered as a sequence."""
        self._messages = [dict(m) for m in messages]
        current = self.source_box.currentIndex()
        self.source_box.blockSignals(True)
        self.source_box.clear()
        self.source_box.addItem(PROMPT)
        for k, end in enumerate(self._turn_ends(), start=1):
            user = next((m["content"] for m in reversed(self._messages[:end]) if m["role"] == "user"), "")
            preview = " ".join(user.split())
            if len(preview) > TURN_PREVIEW:
                preview = preview[:TURN_PREVIEW - 1] + "…"
            self.source_box.addItem(f"Turn {k}: {preview}")
        self.source_box.setCurrentIndex(current if current < self.source_box.count() else 0)
        self.source_box.blockSignals(False)

    def set_conversation_source(self, source: Callable[[], list[dict]] | None) -> None:
        """Where :meth:`pull_conversation` (and showing the panel) reads the conversation from."""
        self._conversation_source = source

    def pull_conversation(self) -> None:
        if self._conversation_source is not None:
            self.set_conversation(self._conversation_source())

    def turns(self) -> list[list[dict]]:
        """The offered turns: the conversation up to and including each assistant reply."""
        return [self._messages[:end] for end in self._turn_ends()]

    def _turn_ends(self) -> list[int]:
        return [i + 1 for i, m in enumerate(self._messages) if m["role"] == "assistant"]

    def set_prompt(self, text: str) -> None:
        """Inspect ``text`` as a prompt (tokenised as generation reads it)."""
        self.prompt_edit.setText(text)
        self.source_box.setCurrentIndex(0)
        self._tokenise(lambda ins: ins.prompt_ids(text), "the prompt")

    def use_turn(self, index: int) -> None:
        """Inspect turn ``index`` (from 0; -1: the last) of the conversation."""
        turns = self.turns()
        if not turns:
            self.status.setText("The Chat panel's conversation has no reply yet")
            return
        index %= len(turns)
        self.source_box.setCurrentIndex(index + 1)
        messages = turns[index]
        self._tokenise(lambda ins: ins.chat_ids(messages), f"turn {index + 1}")

    def _source_chosen(self, index: int) -> None:
        if index == 0:
            self.set_prompt(self.prompt_edit.text())
        else:
            self.use_turn(index - 1)

    def _tokenise(self, ids_of: Callable[[Inspector], list[int]], what: str) -> None:
        ins = self._inspector
        if ins is None:
            return

        def work(job: Job):
            job.report(f"tokenising {what}", 0, 0)
            ids = ids_of(ins)
            if not ids:
                raise InspectError(f"{what} has no tokens")
            return ids, ins.token_texts(ids)

        self._run("sequence", None, work, self._tokenised, preempt=True)

    def _tokenised(self, found) -> None:
        ids, texts = found
        self._ids, self._texts = tuple(int(i) for i in ids), list(texts)
        self._names.update(zip(self._ids, self._texts, strict=True))
        self._position = len(self._ids) - 1
        self.strip.set_tokens(self._texts)
        self.strip.select(self._position)
        self.sequence_changed.emit()
        self._invalidate()

    @property
    def tokens(self) -> list[int]:
        return list(self._ids)

    @property
    def position(self) -> int | None:
        return self._position

    def select_position(self, position: int) -> None:
        """Ask about the prediction at ``position`` (as a click on its chip does)."""
        if not 0 <= position < len(self._ids) or position == self._position:
            return
        self._position = position
        self.strip.select(position)
        self._invalidate()

    def set_target_text(self, text: str) -> None:
        """The target as one token's text; "" for the model's own top prediction at the position."""
        if self.target_edit.text() != text:
            self.target_edit.setText(text)
        if text == self._target_text:
            return
        self._target_text = text
        self._invalidate()

    def target_text(self) -> str:
        return self._target_text

    @property
    def target(self) -> int | None:
        """The target token id at the selected position, once a computation has resolved it."""
        if not self._target_text:
            return self._auto_targets.get((self._ids, self._position))
        now = self._inputs("lens")
        return next((s.target for s in self._results.values()
                     if (s.inputs.generation, s.inputs.ids, s.inputs.position, s.inputs.target_text)
                     == (now.generation, now.ids, now.position, now.target_text) and s.target >= 0), None)

    def choose_head(self, layer: int, head: int) -> None:
        """Show head ``head`` of layer ``layer``'s full pattern."""
        self._head = (layer, head)
        self.compute("attention")

    def name(self, token: int) -> str:
        """A token's text, as resolved by the jobs (the model's tokenizer is not asked here)."""
        return self._names.get(token, f"#{token}")

    # ----- computing -----------------------------------------------------------------------------
    def current_view(self) -> str:
        return VIEWS[self.tabs.currentIndex()]

    def show_view(self, view: str) -> None:
        self.tabs.setCurrentIndex(VIEWS.index(view))

    def _inputs(self, view: str) -> Inputs:
        extra: tuple = ()
        if view == "attention":
            extra = self._head
        elif view == "ablation":
            extra = (tuple(self.ablation_view.ablations()), self.ablation_view.new_tokens.value())
        elif view == "patching":
            extra = (self.patching_view.corrupted_edit.text(), self.patching_view.site_box.currentText())
        return Inputs(self._generation, self._ids, -1 if self._position is None else self._position,
                      self.target_text() if view != "attention" else "", extra)

    def result(self, view: str) -> Any:
        """The result ``view`` shows now (an AttentionPatterns, LogitLens, Attribution,
        AblationResult or PatchGrid), or None when it shows none or an outdated one."""
        shown = self._results.get(view)
        fresh = shown is not None and self._displayed[view] == shown.inputs == self._inputs(view)
        return shown.result if fresh else None

    def compute(self, view: str | None = None) -> None:
        """Compute ``view`` (default: the one in front) for the current inputs, in a job."""
        view = view or self.current_view()
        ins = self._inspector
        if ins is None or not self._ids:
            return
        inputs = self._inputs(view)
        if view == "ablation" and not inputs.extra[0]:
            self.ablation_view.clear_result("Tick heads, halves or blocks to switch off, then Rerun")
            return
        if view == "patching":
            self.patching_view.show_error("")
            if not inputs.extra[0].strip():
                self.patching_view.show_error(self._error("Type a corrupted prompt first"))
                return
        known = self._auto_targets.get((inputs.ids, inputs.position)) if not inputs.target_text else None
        cached = self._patterns if self._patterns is not None and self._patterns[0] == inputs.ids else None
        work = WORK[view](ins, inputs, known, cached)
        self._run(view, inputs, work, lambda shown: self._computed(view, shown), preempt=True)

    def _computed(self, view: str, shown: Shown) -> None:
        self._names.update(shown.parts.pop("names", {}))
        if not shown.inputs.target_text and view != "attention":
            self._auto_targets[(shown.inputs.ids, shown.inputs.position)] = shown.target
        if view == "attention":
            self._patterns = (shown.inputs.ids, shown.result, shown.parts["thumbnails"])
        self._results[view] = shown
        if shown.inputs.generation == self._generation and shown.inputs.ids == self._ids:
            self._display(view)
            self._show_selection()

    def _display(self, view: str) -> None:
        shown = self._results.get(view)
        if shown is None or shown.inputs == self._displayed[view]:
            return
        self._displayed[view] = shown.inputs
        texts, p = self._texts, shown.inputs.position
        if view == "attention":
            v = self.attention_view
            v.show_thumbnails(shown.parts["thumbnails"])
            layer, head = shown.inputs.extra
            v.show_pattern(shown.parts["pattern"], layer, head, texts)
            v.show_attending(shown.parts["attending"], p, texts)
        elif view == "lens":
            self.lens_view.show_lens(shown.result, texts, self.name, p)
        elif view == "attribution":
            a = shown.result
            self.attribution_view.show_attribution(
                a, f"logit of {self.name(a.token)!r} at position {p}: {a.logit:.3f} (shares sum "
                   f"{a.total():.3f})")
        elif view == "ablation":
            self.ablation_view.show_result(shown.result, self.name)
        elif view == "patching":
            self.patching_view.show_grid(shown.result, texts, self.name)
        self.computed.emit(view)
        self._sync_controls()

    def _invalidate(self) -> None:
        """The inputs changed: stale results are cleared from sight and the view in front computes
        again if it computes by itself."""
        current = {v: self._inputs(v) for v in VIEWS}
        for view in VIEWS:
            shown = self._results.get(view)
            if shown is not None and shown.inputs == current[view]:
                self._display(view)
            elif self._displayed[view] is not None or view in ("ablation", "patching"):
                self._displayed[view] = None
                self._clear_view(view)
        self._show_selection()
        self._catch_up(preempt=True)

    def _clear_view(self, view: str) -> None:
        if view == "attention":
            self.attention_view.clear()
        elif view == "lens":
            self.lens_view.setRowCount(0)
            self.lens_view.setColumnCount(0)
        elif view == "attribution":
            self.attribution_view.clear_bars()
        elif view == "ablation":
            self.ablation_view.clear_result("Tick what to switch off, then Rerun" if self._ids else "—")
        elif view == "patching":
            self.patching_view.clear_grid()
            self.patching_view.summary_label.setText("—")

    def _catch_up(self, preempt: bool = False) -> None:
        """On screen with a model: tokenise the prompt if nothing is shown yet, else compute the
        view in front when it computes by itself and shows nothing for these inputs."""
        if not self._on_screen() or self._inspector is None or self._closed:
            return
        if not self._ids:
            if self._job is None and self._pending is None:
                self.set_prompt(self.prompt_edit.text())
            return
        view = self.current_view()
        inputs = self._inputs(view)
        if view in AUTO and self._displayed[view] != inputs and self._given_up.get(view) != inputs:
            if preempt or (self._job is None and self._pending is None):
                self.compute(view)

    def _tab_changed(self) -> None:
        self._sync_controls()
        self._catch_up()

    # ----- jobs: one at a time; a newer request cancels the running one ---------------------------
    def _run(self, view: str, inputs: Inputs | None, work: Callable[[Job], Any], done: Callable[[Any], None],
             *, preempt: bool) -> None:
        if self._closed:
            return
        generation = self._generation

        def guarded(result) -> None:
            if not self._closed and generation == self._generation:
                done(result)

        self._pending = (view, inputs, work, guarded)
        if self._job is not None:
            if preempt:
                self._job.cancel()
            return
        self._start_next()

    def _start_next(self) -> None:
        if self._job is not None or self._pending is None or self._closed:
            self._sync_controls()
            return
        view, inputs, work, done = self._pending
        self._pending = None
        self._job_view, self._job_inputs = view, inputs
        self._job = self._runner.start(
            work, name=f"inspect {view}", on_progress=self._on_progress,
            on_success=lambda result: self._ended("", done, result),
            on_failure=lambda message: self._ended(message, failed=(view, inputs)),
            on_cancel=lambda: self._ended("cancelled" if self._pending is None else ""))
        self._sync_controls()

    def _ended(self, message: str, done: Callable | None = None, result: Any = None,
               failed: tuple[str, Inputs | None] | None = None) -> None:
        if self._closed:
            return
        self._job, self._job_view, self._job_inputs = None, None, None
        self.status.setText(message)
        if failed is not None:
            view, inputs = failed
            if inputs is not None:
                self._given_up[view] = inputs
            if view == "patching":
                self.patching_view.show_error(self._error(message))
            else:
                self.status.setText(self._error(message))
        if done is not None:
            done(result)
        self._start_next()
        if self._job is None:
            self._catch_up()

    def _on_progress(self, stage: str, done: int, total: int) -> None:
        if self._closed:
            return
        self.progress.setRange(0, total)
        self.progress.setValue(done)
        self.status.setText(f"{stage} ({done}/{total})" if total else f"{stage}…")

    def _error(self, message: str) -> str:
        colour = error_colour(self.palette()).name()
        return f'<span style="color: {colour}">{_html(message)}</span>'

    def is_busy(self) -> bool:
        return self._job is not None or self._pending is not None

    def cancel(self) -> None:
        """Stop the running inspection and drop the one waiting."""
        self._pending = None
        if self._job is not None:
            if self._job_view is not None and self._job_inputs is not None:
                self._given_up[self._job_view] = self._job_inputs  # asked to stop: not restarted by itself
            self._job.cancel()

    def shutdown(self) -> None:
        """Cancel and join this panel's job for good (the runner belongs to the caller)."""
        self._closed = True
        self._pending = None
        job, self._job = self._job, None
        if job is not None:
            job.stop()

    def closeEvent(self, event) -> None:
        self.shutdown()
        super().closeEvent(event)

    def set_shown(self, shown: bool) -> None:
        """Whether the panel is on screen (the window reports its dock's ``visibilityChanged``):
        behind another tab it computes nothing."""
        self._shown = shown
        if self._on_screen():
            self.pull_conversation()
            self._catch_up()

    def showEvent(self, event) -> None:  # noqa: N802 - Qt's name
        super().showEvent(event)
        if self._on_screen():
            self._catch_up()

    def _on_screen(self) -> bool:
        return self._shown and self.isVisible()

    def _forget(self) -> None:
        self._generation += 1
        self.cancel()
        self._ids, self._texts, self._position = (), [], None
        self._results.clear()
        self._given_up.clear()
        self._auto_targets.clear()
        self._patterns = None
        self._head = (0, 0)
        self._keys, self._block_of_cell = {}, {}
        self.strip.set_tokens([])
        for view in VIEWS:
            self._displayed[view] = None
            self._clear_view(view)
        self.ablation_view.set_shape(0, 0)
        self._show_selection()

    # ----- the selection link --------------------------------------------------------------------
    def _learn_layers(self, tracer: Tracer) -> None:
        """Each block's attention and MLP layer keys (the rows Morph lists; Topology and Telemetry
        show them too) and which block each grid cell holds (block i is cell i + 1)."""
        key = lambda layer: (*layer.coords, layer.path)  # noqa: E731
        self._keys = {"attention": [key(b.attention) for b in tracer.blocks],
                      "mlp": [key(b.mlp) for b in tracer.blocks],
                      "embed": [key(tracer.embedding)]}
        self._block_of_cell = {tuple(b.attention.coords): i for i, b in enumerate(tracer.blocks)}

    def layer_key(self, kind: str, layer: int) -> LayerKey | None:
        """The key of the layer an attribution component lives in: a head's (and the attention
        bias's) attention layer, an MLP's MLP layer, the embedding."""
        if kind == "embed":
            return self._keys["embed"][0]
        group = "mlp" if kind == "mlp" else "attention"
        return self._keys[group][layer] if group in self._keys else None

    def _component_chosen(self, kind: str, layer: int, head) -> None:
        key = self.layer_key(kind, layer)
        self.attribution_view.highlight_layer(layer if kind != "embed" else None)
        self.status.setText(f"selected {export.component_label(kind, layer, head)}")
        if key is not None:
            self.layer_selected.emit(key)

    def select_layer_key(self, key: LayerKey | None) -> None:
        """Another panel's selection: the bars of the block holding ``key`` are highlighted
        (nothing is announced back)."""
        block = None if key is None else self._block_of_cell.get(tuple(key[:4]))
        self.attribution_view.highlight_layer(block)

    # ----- export --------------------------------------------------------------------------------
    def export_rows(self, view: str | None = None) -> tuple[list[dict], dict]:
        """The rows and the summary ``view`` (default: the one in front) exports; ([], {}) when it
        shows nothing."""
        view = view or self.current_view()
        shown = self._results.get(view)
        if shown is None or self._displayed[view] != shown.inputs:
            return [], {}
        texts, r = self._texts, shown.result
        if view == "attention":
            layer, head = shown.inputs.extra
            rows = (export.pattern_rows(shown.parts["pattern"], layer, head, texts)
                    + export.attending_rows(shown.parts["attending"], shown.inputs.position, texts))
            return rows, {}
        if view == "lens":
            return export.lens_rows(r, texts, self.name), {"target": self.name(r.target)}
        if view == "attribution":
            return export.attribution_rows(r), {"target": self.name(r.token), "position": r.position,
                                                "logit": r.logit}
        if view == "ablation":
            return export.ablation_rows(r, self.name), export.ablation_summary(r, self.name)
        return export.patching_rows(r, texts), export.patching_summary(r, self.name)

    def export_csv(self, path: str) -> None:
        rows, _ = self.export_rows()
        write_atomic(path, export.to_csv(rows).encode())
        self.status.setText(f"saved {path}")

    def export_json(self, path: str) -> None:
        view = self.current_view()
        rows, summary = self.export_rows(view)
        shown = self._results.get(view)
        inputs = {} if shown is None else {
            "tokens": list(shown.inputs.ids), "token texts": self._texts,
            "position": shown.inputs.position, "target": self.name(shown.target)}
        write_atomic(path, export.to_json(view, inputs, rows, summary).encode())
        self.status.setText(f"saved {path}")

    def export_png(self, path: str) -> None:
        if not self.views[self.current_view()].grab().save(path, "PNG"):
            self.status.setText(self._error(f"cannot write {path}"))
            return
        self.status.setText(f"saved {path}")

    def _ask_export(self, fmt: str) -> None:
        view = self.current_view()
        path, _ = QFileDialog.getSaveFileName(self, f"Export {TITLES[view]}", f"inspect-{view}.{fmt.lower()}",
                                              f"{fmt} (*.{fmt.lower()})")
        if path:
            {"PNG": self.export_png, "CSV": self.export_csv, "JSON": self.export_json}[fmt](path)

    # ----- what the controls allow -----------------------------------------------------------------
    def _show_selection(self) -> None:
        p = self._position
        if p is None:
            self.selection_label.setText("")
            self.target_edit.setPlaceholderText("")
            return
        auto = self._auto_targets.get((self._ids, p))
        self.target_edit.setPlaceholderText("top prediction" if auto is None else f"auto: {self.name(auto)}")
        self.selection_label.setText(f"position {p} {shown_token(self._texts[p])}")

    def _sync_controls(self) -> None:
        has_model, busy = self._inspector is not None, self.is_busy()
        has_sequence = has_model and bool(self._ids)
        for w in (self.source_box, self.prompt_edit, self.tokenise_button, self.turns_button):
            w.setEnabled(has_model)
        self.target_edit.setEnabled(has_sequence)
        self.ablation_view.rerun_button.setEnabled(has_sequence)
        self.patching_view.run_button.setEnabled(has_sequence)
        self.cancel_button.setEnabled(busy)
        self.progress.setVisible(busy)
        if not busy:
            self.progress.setRange(0, 1)
            self.progress.setValue(1)
        exportable = self.result(self.current_view()) is not None
        for button in self.export_buttons.values():
            button.setEnabled(exportable)


def _html(text: str) -> str:
    return html.escape(text)
