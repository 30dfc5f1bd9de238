"""The Evolution panel's gguf-recipe run (views/evolution_panel.py, views/format_strip.py): the
held-out KL scatter with llama.cpp's presets, the Pareto front, the chosen member's formats as a
strip, Apply, Save recipe and Export GGUF. Oracles: the same run through core (``Evolution`` on
the same model and settings), ``task.references()``, the recipe's genes, ``plan_recipe`` and the
layers' block encodings, and gguf-py's reader of the exported file."""

from __future__ import annotations

import json

import gguf
import pytest
from gguf import GGMLQuantizationType as GT

from loomlab.core.evolve.llm.format_space import pareto_front
from loomlab.core.evolve.search.run import Evolution
from loomlab.core.llm.generate.textmodel import TextModel
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.quality.recipe import plan_recipe, weighted_layers
from loomlab.views.evolution_panel import (
    GGUF_TASK,
    HELDOUT_LABEL,
    NO_MODEL_GGUF,
    EvolutionPanel,
    reference_labels,
)
from loomlab.views.format_strip import EMBEDDING, HEAD, format_grid, tensor_kind

from ..core.llm.model.test_architectures import write_gguf
from .jobs import settle
from .test_evolution_panel import ByteTokenizer

MIB = 2 ** 20
CTX = 64
TRAIN_TEXT = "The mill on the river ground wheat for three hundred years. " * 11  # 660 tokens
HELDOUT_TEXT = "A lighthouse keeper climbed the stairs each evening to light the lamp. " * 9
SETTINGS = dict(task=GGUF_TASK, population=8, generations=2, seed=3, budget="pareto", ctx=CTX)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf-recipe")
    (folder / "train.txt").write_text(TRAIN_TEXT)
    (folder / "heldout.txt").write_text(HELDOUT_TEXT)
    write_gguf(folder / "tiny-f32.gguf", "tiny-llama", "llama")  # float32 matrices: a recipe's source
    write_gguf(folder / "tiny-q8.gguf", "tiny-llama", "llama", qtype=GT.Q8_0)
    return folder


def text_model(path) -> TextModel:
    return TextModel(load_causal_lm(path), ByteTokenizer(), None, name="tiny-llama")


@pytest.fixture
def panel(qtbot, runner):
    p = EvolutionPanel(runner)
    qtbot.addWidget(p)
    p.resize(1280, 520)
    p.show()
    yield p
    p.shutdown()


def encodings(net) -> dict[str, str]:
    """Each GGUF tensor's block encoding as forward reads it."""
    out = {}
    for la in weighted_layers(net):
        blocks = la.layer.weights.block_encodings(la.layer.cfg.dtype) or {}
        out.update({la.parts[part]: enc for part, enc in blocks.items()})
    return out


def test_the_strips_grid_is_the_recipe():
    names = ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.ffn_down.weight", "blk.1.attn_q.weight",
             "blk.1.ffn_down.weight", "blk.1.ffn_norm_exps.weight", "output.weight")
    genes = ("Q8_0", "Q4_0", "Q6_K", "Q4_K", "Q5_0", "F16", "Q6_K")
    grid = format_grid(names, genes)
    assert grid.rows == (EMBEDDING, "blk.0", "blk.1", HEAD)
    assert grid.columns == ("token_embd", "attn_q", "ffn_down", "output", "ffn_norm_exps")
    for name, fmt in zip(names, genes, strict=True):
        r, c = grid.cell(name)
        assert grid.formats[r][c] == fmt and grid.tensors[r][c] == name
    assert sum(f is not None for row in grid.formats for f in row) == len(names)
    assert grid.used() == ["Q4_0", "Q4_K", "Q5_0", "Q6_K", "Q8_0", "F16"]  # fewest bits first
    assert tensor_kind("blk.12.attn_v.weight") == (12, "attn_v")
    assert tensor_kind("output.weight") == (None, "output")
    with pytest.raises(ValueError, match="one format per tensor"):
        format_grid(names, genes[:-1])
    assert reference_labels([("Q4_0", 10, 0.5), ("Q8_0", 20, 0.1), ("Q4_1", 10, 0.5)]) == \
        [("Q4_0 / Q4_1", 10, 0.5), ("Q8_0", 20, 0.1)]


def test_a_gguf_recipe_run_shows_held_out_kl_presets_and_the_strip_and_applies_and_exports(
        qtbot, panel, files, tmp_path):
    model = text_model(files / "tiny-f32.gguf")
    panel.set_form(**SETTINGS, train=str(files / "train.txt"), heldout=str(files / "heldout.txt"))
    assert panel.message.text() == NO_MODEL_GGUF and not panel.start_button.isEnabled()
    panel.set_model(model)
    assert panel.message.text() == "" and not panel.speciation_check.isEnabled()
    assert panel.budget_box.isVisibleTo(panel) and panel.ctx_edit.isVisibleTo(panel)
    panel.start()
    settle(qtbot, panel, timeout=60000)
    assert panel.status.text().startswith("run finished at generation 2"), panel.status.text()
    assert panel.recipe_box.isVisibleTo(panel) and panel.strip.isVisibleTo(panel)
    assert not panel.species_plot.isVisibleTo(panel)

    # the oracle: the same run through core on the same (still unmorphed) model; the panel's
    # reporter measured the presets after generation 1, so does the oracle
    plan = panel.run_plan()
    plan.task.use_model(model)
    api = Evolution(plan.task, config=plan.neat, population=8)
    api.run(1)
    references = plan.task.references()
    api.run(1)
    scores = plan.task.last_scores
    assert [(r.parameters, r.kl, r.heldout_kl) for r in sorted(panel.rows, key=lambda r: r.index)] == \
        [(s.bytes, s.kl_mean, s.heldout_kl) for s in scores]

    # the scatter: members re-scored on the held-out text, in MiB, their front, the presets labelled
    shown = [i for i, r in enumerate(panel.rows) if r.heldout_kl is not None]
    assert len(shown) >= 2
    x, y = panel.recipe_points.getData()
    assert list(zip(x, y, strict=True)) == [(panel.rows[i].parameters / MIB, panel.rows[i].heldout_kl)
                                            for i in shown]
    assert sorted(zip(x, y, strict=True)) == sorted((s.bytes / MIB, s.heldout_kl) for s in scores
                                                    if s.heldout_kl is not None)
    points = [(panel.rows[i].parameters, panel.rows[i].heldout_kl) for i in shown]
    assert panel.front == [shown[i] for i in pareto_front(points)]
    fx, fy = panel.front_line.getData()
    assert list(fx) == [panel.rows[i].parameters / MIB for i in panel.front]
    assert panel.recipe_plot.getAxis("left").labelText == HELDOUT_LABEL
    assert panel.recipe_plot.getAxis("bottom").labelText == "weight size (MiB)"
    assert panel.references == [(name, s.bytes, s.kl_mean) for name, s in references.items()]
    assert {"Q4_K_M", "Q4_0", "Q8_0"} <= set(references)
    labels = reference_labels(panel.references)
    assert [item.toPlainText() for item in panel.reference_labels] == [name for name, _, _ in labels]
    assert [(item.pos().x(), item.pos().y()) for item in panel.reference_labels] == \
        [(size / MIB, kl) for _, size, kl in labels]
    rx, ry = panel.reference_points.getData()
    assert list(zip(rx, ry, strict=True)) == [(size / MIB, kl) for _, size, kl in labels]

    # the strip: the fittest by default, then the member whose point is clicked
    names = plan.task.space.names
    assert panel.layer_names == names
    assert panel.strip.grid == format_grid(names, panel.rows[0].recipe)
    assert len(panel.strip.grid.rows) == 3 + 2  # the tiny model's 3 blocks, its embedding and head
    canvas = panel.strip.canvas
    name = "blk.1.attn_v.weight"
    r, c = panel.strip.grid.cell(name)
    fmt = panel.rows[0].recipe[names.index(name)]
    assert canvas.text_at(canvas.cell_rect(r, c).center().toPoint()) == f"{name}: {fmt}"
    assert fmt in panel.strip.legend.text()
    other = next(i for i in reversed(shown) if panel.rows[i].recipe != panel.rows[0].recipe)
    spot = next(s for s in panel.recipe_points.points() if s.data() == other)
    panel.recipe_points.sigClicked.emit(panel.recipe_points, [spot], None)
    assert panel.selected_row == other and panel.table.currentRow() == other
    assert panel.strip.grid == format_grid(names, panel.rows[other].recipe)
    cx, cy = panel.chosen_point.getData()
    assert (list(cx), list(cy)) == ([panel.rows[other].parameters / MIB], [panel.rows[other].heldout_kl])

    # Save recipe: the JSON quantize --recipe reads
    mapping = dict(zip(names, panel.rows[other].recipe, strict=True))
    assert panel.chosen_mapping() == mapping
    panel.save_recipe(str(tmp_path / "recipe.json"))
    assert json.loads((tmp_path / "recipe.json").read_text()) == mapping

    # Apply morphs the loaded model to the chosen member; the panels are told
    morphed = []
    panel.model_morphed.connect(morphed.append)
    assert panel.apply_button.isEnabled()
    panel.apply_button.click()
    assert panel.is_busy() and not panel.start_button.isEnabled()
    settle(qtbot, panel)
    assert panel.status.text().startswith("applied the recipe"), panel.status.text()
    assert plan_recipe(model.net, mapping).changed == ()
    assert encodings(model.net) == mapping
    assert len(morphed) == 1 and morphed[0]

    # Export GGUF: the fittest member this time, applied first, then written as llama.cpp reads it
    panel.select_row(0)
    fittest = dict(zip(names, panel.rows[0].recipe, strict=True))
    out = tmp_path / "evolved.gguf"
    panel.export_gguf(str(out))
    settle(qtbot, panel)
    assert panel.status.text().startswith(f"saved {out}"), panel.status.text()
    written = {t.name: GT(t.tensor_type).name for t in gguf.GGUFReader(out).tensors}
    assert {n: written[n] for n in fittest} == fittest
    assert encodings(model.net) == fittest and len(morphed) == (1 if fittest == mapping else 2)
    assert not panel.recipe_progress.isVisibleTo(panel)


def test_a_quantized_model_is_refused_in_the_message_line(qtbot, panel, files):
    panel.set_form(**SETTINGS)
    panel.set_model(text_model(files / "tiny-q8.gguf"))
    assert panel.message.text() == ""
    panel.start()
    settle(qtbot, panel, timeout=30000)
    assert "is stored as Q8_0" in panel.message.text(), panel.message.text()
    assert panel.status.text().startswith("evolve failed"), panel.status.text()
    assert panel.start_button.isEnabled()


def test_a_text_file_that_is_not_there_is_refused_before_start(qtbot, panel, files):
    panel.set_form(**SETTINGS, train=str(files / "missing.txt"))
    panel.set_model(text_model(files / "tiny-f32.gguf"))
    assert panel.message.text() == f"training text: {files / 'missing.txt'} is not a file"
    assert not panel.start_button.isEnabled()
