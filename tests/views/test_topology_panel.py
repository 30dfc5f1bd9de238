"""The Topology 3D panel: points, lines and colours against the network's blueprint; live activity
from forward passes on other threads; clicks on projected points select layers; a real LLM."""

from __future__ import annotations

import re
import threading

import numpy as np
import pyqtgraph as pg
import pyqtgraph.opengl as gl
import pytest
from PySide6.QtCore import QCoreApplication, QEvent, QPoint, QPointF, Qt
from PySide6.QtGui import QColor, QMouseEvent, QVector3D
from PySide6.QtWidgets import QApplication

from loomlab.core import CallbackObserver, LayerStats, VolumetricNetwork, make_layer
from loomlab.core.llm.files.gguf_file import open_gguf
from loomlab.core.llm.model.loader import load_causal_lm
from loomlab.core.llm.model.moe_layer import LLMMixtureOfExperts
from loomlab.core.morph import morph_sublayer
from loomlab.views.topology_panel import (
    ACTIVITY_COLORMAP,
    IDLE_COLOUR,
    LABEL_COLOUR,
    SAMPLE_LIMIT,
    TYPE_COLOURS,
    VIEW_BACKGROUND,
    TopologyPanel,
    point_size,
    weight_histogram,
)
from loomlab.views.workers import JobRunner

from ..core.llm.model.test_architectures import TINY
from .contrast import AA, assert_legible, contrast, dark_theme
from .panel_layout import assert_axes_legible, assert_tick_labels_apart, assert_unclipped

RNG = np.random.default_rng(7)
LINK_TARGET = (1, 0, 1, 0)


def dense(i: int, o: int, act: str = "Tanh", **kw):
    return make_layer("Dense", input_height=i, output_height=o, activation=act, rng=RNG, **kw)


def small_net() -> VolumetricNetwork:
    """8 grid cells, a Parallel holding a remote link, a Parallel nested two deep in a Sequential."""
    net = VolumetricNetwork(2, 1, 2, 2)
    net[0, 0, 0, 0] = dense(8, 8)
    net[0, 0, 0, 1] = make_layer("Parallel", combine_mode="add", children=[
        dense(8, 8, "ReLU"), dense(8, 8),
        make_layer("Residual", is_remote_link=True, target_z=1, target_x=1)])
    net[0, 0, 1, 0] = make_layer("Sequential", children=[
        dense(8, 8), make_layer("Residual"),
        make_layer("Parallel", combine_mode="add", children=[dense(8, 8, "ReLU"), dense(8, 8, "Silu")])])
    net[0, 0, 1, 1] = make_layer("RMSNorm", input_height=8, output_height=8, rng=RNG)
    net[1, 0, 0, 0] = dense(8, 64, "ReLU")
    net[1, 0, 0, 1] = dense(64, 8)
    net[LINK_TARGET] = dense(8, 8)
    net[1, 0, 1, 1] = dense(8, 4, "Linear")
    return net


def layer_by_path(net: VolumetricNetwork, row):
    """The layer a blueprint row names, found by following its path (the test's own walk)."""
    layer = net[row.z, row.y, row.x, row.l]
    for index in re.findall(r"\[(\d+)\]", row.path):
        layer = layer.children[int(index)]
    return layer


def make_panel(qtbot, net=None, runner=None, shown=True) -> TopologyPanel:
    panel = TopologyPanel(runner=runner)
    qtbot.addWidget(panel)
    panel.resize(1200, 700)
    if shown:
        panel.show()
        qtbot.waitExposed(panel)
        qtbot.waitUntil(panel.view.isExposed)  # the 3-D view is a native window of its own
    if net is not None:
        panel.set_network(net)
    return panel


def screen_point(panel: TopologyPanel, world) -> QPoint:
    """Where the view draws ``world``: Qt's own projective map of the view's matrices."""
    view = panel.view
    viewport = view.getViewport()
    ndc = (view.projectionMatrix(viewport, viewport) * view.viewMatrix()).map(QVector3D(*map(float, world)))
    return QPoint(round((ndc.x() + 1) / 2 * view.width()), round((1 - ndc.y()) / 2 * view.height()))


def click(qtbot, panel: TopologyPanel, pos: QPoint) -> None:
    qtbot.mouseClick(panel.view, Qt.MouseButton.LeftButton, pos=pos)


def hover(panel: TopologyPanel, pos: QPoint) -> None:
    """The pointer moving over the view with no button held. Sent as the event itself: under Xvfb
    qtbot.mouseMove moves the X cursor, which lands a few pixels off in an undecorated window."""
    event = QMouseEvent(QEvent.Type.MouseMove, QPointF(pos), QPointF(panel.view.mapToGlobal(pos)),
                        Qt.MouseButton.NoButton, Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(panel.view, event)


def assert_not_blank(path: str, image) -> None:
    image.save(path)
    arr = pg.imageToArray(image, copy=True)
    assert arr.size and len(np.unique(arr.reshape(-1, arr.shape[-1]), axis=0)) > 4, "the 3-D view is blank"


# ----- model -> view -----------------------------------------------------------------------------
def test_one_point_per_blueprint_row_at_its_cell_coloured_by_type_sized_by_parameters(qtbot):
    net = small_net()
    panel = make_panel(qtbot, net, shown=False)
    topo, rows = panel.topology, net.blueprint()
    assert [(r.index, r.path, r.type, r.parameters) for r in topo.rows] == \
           [(r.index, r.path, r.type, r.parameters) for r in rows]
    assert all(topo.layers[i] is layer_by_path(net, r) for i, r in enumerate(rows))
    np.testing.assert_array_equal(panel.scatter.pos, topo.positions)
    assert len(topo.positions) == len(rows) == 16

    cells = {(r.z, r.y, r.x, r.l): topo.positions[i] for i, r in enumerate(rows) if not r.path}
    pitch = topo.pitch
    for (z, y, x, l), p in cells.items():  # noqa: E741
        np.testing.assert_allclose(p, [x * pitch.x + l * pitch.l, y * pitch.y, z * pitch.z])
    for i, r in enumerate(rows):
        if r.path:  # nested: in its own cell's column, below the next grid level
            own = cells[(r.z, r.y, r.x, r.l)]
            p = topo.positions[i]
            assert own[2] < p[2] < own[2] + topo.pitch.z
            columns = {(q[0], q[1]) for q in cells.values()} - {(own[0], own[1])}
            assert np.linalg.norm((p - own)[:2]) < min(np.hypot(p[0] - a, p[1] - b) for a, b in columns)
    gaps = np.linalg.norm(topo.positions[:, None] - topo.positions[None], axis=-1)
    reach = (topo.sizes[:, None] + topo.sizes[None]) / 2
    pairs = ~np.eye(len(rows), dtype=bool)
    assert (gaps[pairs] > reach[pairs]).all(), "points overlap"

    np.testing.assert_allclose(panel.point_colours(), [TYPE_COLOURS[r.type] for r in rows])
    np.testing.assert_allclose(topo.sizes, [point_size(r.parameters) for r in rows], rtol=1e-6)
    params = np.array([r.parameters for r in rows])
    order = np.argsort(params, kind="stable")
    assert (np.diff(topo.sizes[order]) >= 0).all()
    assert (np.diff(topo.sizes[order])[np.diff(params[order]) > 0] > 0).all()
    assert all(name in panel.legend.text() for name in {r.type for r in rows})
    panel.shutdown()


def test_remote_link_and_flow_lines(qtbot):
    net = small_net()
    panel = make_panel(qtbot, net, shown=False)
    topo, rows = panel.topology, net.blueprint()
    link = next(i for i, r in enumerate(rows) if r.remote_target is not None)
    target = next(i for i, r in enumerate(rows) if (r.z, r.y, r.x, r.l) == LINK_TARGET and not r.path)
    assert rows[link].path == "parallel_branches[2]" and rows[link].remote_target == LINK_TARGET
    np.testing.assert_allclose(topo.links, [[topo.positions[link], topo.positions[target]]])
    np.testing.assert_allclose(panel.link_lines.pos, topo.links.reshape(-1, 3))
    cells = [i for i, r in enumerate(rows) if not r.path]
    np.testing.assert_allclose(panel.flow_line.pos, topo.positions[cells])
    # every nested layer is joined to its container
    assert len(panel.tree_lines.pos) == 2 * sum(1 for r in rows if r.path)
    panel.shutdown()


def test_set_network_watches_it_rebuilds_and_detaches_from_the_old_network(qtbot):
    first, second = small_net(), VolumetricNetwork(1, 1, 3, 1)
    for x in range(3):
        second[0, 0, x, 0] = dense(8, 8)
    panel = make_panel(qtbot, first, shown=False)
    panel.select_layer_key((0, 0, 0, 0, ""))
    assert first.observers == [] and not panel._timer.isActive()  # off screen it costs nothing
    panel.show()
    qtbot.waitExposed(panel)
    assert len(first.observers) == 1 and panel._timer.isActive()  # on screen it watches
    panel.hide()
    assert first.observers == [] and not panel._timer.isActive()
    panel.show()
    panel.set_network(second)
    assert first.observers == [] and len(second.observers) == 1
    assert len(panel.topology.rows) == 3 and panel.scatter.pos.shape == (3, 3)
    assert panel.selected_layer is None and panel.inspector.fields["Type"].text() == "—"
    assert panel.topology.links.shape == (0, 2, 3) and not panel.link_lines.visible()
    panel.set_network(None)
    assert second.observers == [] and not panel._timer.isActive()
    assert panel.topology is None and not panel.scatter.visible()
    panel.set_network(first)
    panel.set_shown(False)  # its dock went behind another dock's tab: Qt still calls it visible
    assert panel.isVisible() and first.observers == [] and not panel._timer.isActive()
    panel.set_network(second)
    assert second.observers == []
    panel.hide()
    panel.show()
    assert second.observers == []
    panel.set_shown(True)
    assert len(second.observers) == 1 and panel._timer.isActive()
    panel.set_network(first)
    panel.shutdown()
    assert first.observers == [] and not panel._timer.isActive()


class StatsByStep:
    """The oracle's observer: every forward event's stats, by step and layer key."""

    def __init__(self, net):
        self.steps: dict[int, dict[tuple, LayerStats]] = {}
        self.observer = net.attach(CallbackObserver(self._record))

    def _record(self, e) -> None:
        if e.type == "forward":
            self.steps.setdefault(e.step_count, {})[(e.z, e.y, e.x, e.l, e.path)] = e.stats


def expected_activity(panel: TopologyPanel, stats: dict) -> np.ndarray:
    """The RMS colours of one pass by the formula: log10 of sqrt(avg^2 + std^2), spread over the
    colormap from the pass's lowest to its highest layer; layers that did not run stay idle."""
    keys = panel.topology.keys
    rms = {keys[k]: np.sqrt(s.avg ** 2 + s.std ** 2) for k, s in stats.items()}
    idx = np.array(sorted(rms))
    v = np.log10(np.array([rms[i] for i in idx]) + 1e-12)
    expected = np.tile(np.float32(IDLE_COLOUR), (len(panel.topology.rows), 1))
    expected[idx] = pg.colormap.get(ACTIVITY_COLORMAP).map((v - v.min()) / (v.max() - v.min()),
                                                             mode=pg.ColorMap.FLOAT)
    return expected


def test_forward_passes_on_another_thread_recolour_by_activity(qtbot):
    net = small_net()
    panel = TopologyPanel(sample_hz=None)  # every pass, as the oracle sees them
    qtbot.addWidget(panel)
    panel.show()  # it watches a network while on screen
    qtbot.waitExposed(panel)
    panel.set_network(net)
    panel.select_layer_key((0, 0, 0, 0, ""))
    panel.colour_mode.setCurrentIndex(panel.colour_mode.findData("rms"))
    np.testing.assert_allclose(panel.point_colours(), np.tile(IDLE_COLOUR, (16, 1)))
    before = np.array(panel.scatter.color, copy=True)
    seen = StatsByStep(net)

    def passes():
        for _ in range(3):
            net.forward(RNG.standard_normal((4, 8)).astype(np.float32))

    worker = threading.Thread(target=passes)
    worker.start()
    worker.join()
    qtbot.waitUntil(lambda: not np.allclose(panel.scatter.color, before), timeout=3000)
    qtbot.waitUntil(lambda: not panel._pending, timeout=3000)
    last = seen.steps[max(seen.steps)]
    np.testing.assert_allclose(panel.scatter.color, expected_activity(panel, last), atol=1e-6)
    # the remote link runs its target, so only the link's own point stays idle
    idle = [r.path for r, colour in zip(panel.topology.rows, panel.scatter.color, strict=True)
            if np.allclose(colour, IDLE_COLOUR)]
    assert idle == ["parallel_branches[2]"]
    stats = last[(0, 0, 0, 0, "")]
    assert f"active {stats.active:,}/{stats.total:,}  (step {max(seen.steps)})" \
           in panel.inspector.fields["Last stats"].text()

    panel.colour_mode.setCurrentIndex(panel.colour_mode.findData("type"))
    np.testing.assert_allclose(panel.scatter.color, panel.topology.colours)
    panel.shutdown()
    assert net.observers == [seen.observer] and not panel._timer.isActive()


# ----- view -> model -----------------------------------------------------------------------------
def test_clicking_a_point_selects_its_layer_and_inspects_it(qtbot):
    net = small_net()
    panel = make_panel(qtbot, net)
    target = net[0, 0, 1, 0].children[2].children[1]  # a Dense two levels down in the Sequential
    where = screen_point(panel, panel.topology.positions[panel.topology.index_of(target)])
    with qtbot.waitSignal(panel.layer_selected, timeout=2000) as blocker:
        click(qtbot, panel, where)
    key = (0, 0, 1, 0, "sequential_layers[2].parallel_branches[1]")
    assert blocker.args == [key] and panel.selected_layer is target and panel.selected_key == key

    inspector = panel.inspector
    assert inspector.fields["Layer"].text() == "Dense (0,0,1,0) sequential_layers[2].parallel_branches[1]"
    assert inspector.fields["Type"].text() == "Dense" and inspector.fields["DType"].text() == "float32"
    activation = inspector.fields["Activation"]
    assert activation.text() == "Silu" and activation.isVisibleTo(panel)
    assert inspector.fields["Parameters"].text() == f"{len(target.weights):,}"
    assert inspector.fields["Input shape"].text() == "8" and inspector.fields["Output shape"].text() == "8"
    hist = inspector.histogram
    counts, edges = np.histogram(target.weights.master, bins=len(hist.counts))
    assert hist.counts.sum() == hist.sampled == hist.total == len(target.weights)
    np.testing.assert_array_equal(hist.counts, counts)
    np.testing.assert_allclose(hist.edges, edges)

    with qtbot.assertNotEmitted(panel.layer_selected):
        click(qtbot, panel, QPoint(3, 3))  # empty space
    assert_not_blank("/tmp/topology_small.png", panel.view.grabFramebuffer())
    panel.shutdown()


def test_the_view_draws_again_in_a_new_gl_context(qtbot):
    # a dock floated into its own window re-creates the view's GL context; after another view
    # (an earlier test's) has compiled pyqtgraph's class-wide shader programs, plain items fail
    # to draw there, and items drawn in the old context keep its (dead) vertex buffers
    net = small_net()
    panel = make_panel(qtbot, net)
    blue = np.round(np.array(TYPE_COLOURS["Dense"][:3]) * 255)
    view = panel.view
    view.grabFramebuffer()  # drawn once in the docked context: its buffers are then that context's
    container = view.container  # as a floated dock moves it into a window of its own
    container.setParent(None)
    qtbot.addWidget(container)
    container.resize(500, 400)
    container.show()
    qtbot.waitExposed(container)
    qtbot.waitUntil(view.isExposed)
    panel.reset_camera()
    pixels = pg.imageToArray(view.grabFramebuffer(), copy=True)[..., [2, 1, 0]]  # BGRA -> RGB
    assert (np.abs(pixels.reshape(-1, 3) - blue).max(axis=1) <= 2).sum() > 100, "no Dense points drawn"
    panel.shutdown()


def test_the_empty_view_compiles_the_shaders_before_a_network_comes(qtbot):
    # the first draw of an item compiles its shaders, ~60 ms through a software GL: done with
    # the empty window, not in the frame that first shows a freshly loaded model
    panel = make_panel(qtbot)
    panel.view.grabFramebuffer()
    assert set(panel.view.shader_programs) == {gl.GLScatterPlotItem, gl.GLLinePlotItem}
    pixels = pg.imageToArray(panel.view.grabFramebuffer(), copy=True)[..., [2, 1, 0]]
    assert (pixels.reshape(-1, 3) == pixels[0, 0]).all(), "the invisible warm-up shapes showed"
    panel.set_network(small_net())
    assert panel.scatter.visible() and len(panel.scatter.pos) == len(panel.topology.rows)
    panel.shutdown()


def test_a_linked_selection_selects_without_echo_and_shows_the_container_total(qtbot):
    net = small_net()
    panel = make_panel(qtbot, net, shown=False)
    with qtbot.assertNotEmitted(panel.layer_selected):
        panel.select_layer_key((0, 0, 0, 1, ""))
    assert panel.selected_layer is net[0, 0, 0, 1] and panel.selected_key == (0, 0, 0, 1, "")
    fields = panel.inspector.fields
    assert fields["Parameters"].text() == "0  (with children: 128)" and fields["Type"].text() == "Parallel"
    assert not fields["Activation"].isVisibleTo(panel)  # a container applies no activation
    assert panel.inspector.histogram is None and panel.inspector.plot_title.text() == "no weights"
    with qtbot.assertNotEmitted(panel.layer_selected):
        panel.select_layer_key((9, 9, 9, 9, ""))  # not in this network: nothing selected
    assert panel.selected_layer is None and fields["Type"].text() == "—"
    panel.shutdown()


def test_histogram_samples_big_layers():
    layer = dense(400, 300)  # 120,000 weights > SAMPLE_LIMIT
    hist = weight_histogram(layer)
    assert hist.sampled == SAMPLE_LIMIT and hist.counts.sum() == SAMPLE_LIMIT and hist.total == 120_000
    assert weight_histogram(layer, limit=100).sampled == 100


# ----- a real language model ---------------------------------------------------------------------
@pytest.fixture
def runner():
    """A JobRunner that outlives the test's own references to it. Each job's ``finished`` slot
    holds the runner; were the test's reference the last other one, deleting a finished job
    (its deleteLater) would free the runner, which deletes its children, that job included,
    mid-destruction: 'pure virtual method called'."""
    jobs = JobRunner()
    yield jobs
    jobs.shutdown()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture(scope="module")
def smollm_tensors(smollm2):
    """The oracle: the GGUF file's own tensor list, name -> (type name, dimensions)."""
    with open_gguf(smollm2.net.source.path) as gguf:
        return {name: (t.type_name, len(t.shape)) for name, t in gguf.tensors.items()}


ATTENTION_9 = (0, 0, 10, 0, "sequential_layers[0].sequential_layers[1]")  # cell 0 is the embedding


def test_llm_inspector_names_the_files_tensors_and_encodings_also_after_a_morph(qtbot, smollm2,
                                                                                smollm_tensors, runner):
    net = smollm2.net
    panel = make_panel(qtbot, net, runner=runner)
    topo = panel.topology
    assert len(topo.rows) == 273 and sum(1 for r in topo.rows if not r.path and r.type == "Sequential") == 30
    attention = net[0, 0, 10, 0].children[0].children[1]
    assert attention.type_name == "MultiHeadAttention"

    with qtbot.waitSignal(panel.layer_selected, timeout=2000) as blocker:
        click(qtbot, panel, screen_point(panel, topo.positions[topo.index_of(attention)]))
    assert blocker.args == [ATTENTION_9] and panel.selected_layer is attention
    fields = panel.inspector.fields
    stems = ("attn_q", "attn_k", "attn_v", "attn_output")
    assert fields["Layer"].text() == "blk.9.attn_q/k/v/output"
    assert all(f"blk.9.{stem}.weight" in smollm_tensors for stem in stems)
    assert fields["DType"].text() == "Q4_1" == smollm_tensors["blk.9.attn_q.weight"][0]
    assert {smollm_tensors[f"blk.9.{stem}.weight"][0] for stem in stems} == {"Q4_1"}
    assert not fields["Activation"].isVisibleTo(panel)  # attention applies no activation
    assert fields["Parameters"].text() == f"{len(attention.weights):,}"

    qtbot.waitUntil(lambda: panel.inspector.histogram is not None, timeout=20000)
    hist = panel.inspector.histogram
    assert hist.counts.sum() == hist.sampled == SAMPLE_LIMIT and hist.total == len(attention.weights)
    assert attention.weights._master is None  # sampled from the file's blocks: nothing dequantized whole
    # the sample follows the layer's weights: same spread as the whole dequantized matrices
    full = np.concatenate([np.asarray(m if isinstance(m, np.ndarray) else m.dequantize()).ravel()
                           for m in attention.weights.blocks.values()])
    centres = (hist.edges[1:] + hist.edges[:-1]) / 2
    std = np.sqrt(np.average((centres - np.average(centres, weights=hist.counts)) ** 2, weights=hist.counts))
    assert std == pytest.approx(full.std(), rel=0.1)

    mlp_key = (0, 0, 10, 0, "sequential_layers[2].sequential_layers[1]")
    panel.select_layer_key(mlp_key)
    assert fields["Layer"].text() == "blk.9.ffn_gate/up/down" and fields["Activation"].text() == "Silu (gate)"
    assert fields["DType"].text() == smollm_tensors["blk.9.ffn_gate.weight"][0]
    panel.select_layer_key((0, 0, 0, 0, ""))
    assert fields["Layer"].text() == "token_embd"
    assert fields["DType"].text() == smollm_tensors["token_embd.weight"][0] == "Q8_0"

    panel.select_layer_key(ATTENTION_9)
    try:
        morph_sublayer(attention, 0, "int8")
        panel.refresh()
        assert fields["DType"].text() == "int8"
    finally:
        morph_sublayer(attention, 0, "float32")  # the module's model is shared: back to the file's
    panel.refresh()
    assert fields["DType"].text() == "Q4_1"
    assert runner.shutdown()
    panel.shutdown()


def test_llm_block_numbers_and_hover_tooltips(qtbot, smollm2):
    net = smollm2.net
    panel = make_panel(qtbot, net)
    topo = panel.topology
    blocks = [i for i, r in enumerate(topo.rows) if not r.path and r.type == "Sequential"]
    assert panel.block_labels.texts == [str(b) for b in range(30)]
    # each number stands in front of its own block's column, below the floor
    np.testing.assert_allclose(panel.block_labels.points[:, :2],
                               topo.positions[blocks, :2] - [0, topo.pitch.y * 0.45], atol=1e-5)
    assert (panel.block_labels.points[:, 2] < topo.positions[:, 2].min()).all()

    attention = topo.keys[ATTENTION_9]
    parameters = len(topo.layers[attention].weights)
    expected = f"blk.9.attn_q/k/v/output\nMultiHeadAttention · {parameters:,} parameters"
    hover(panel, screen_point(panel, topo.positions[attention]))
    assert panel.view.toolTip() == expected
    hover(panel, QPoint(2, 2))  # empty space: no tooltip
    assert panel.view.toolTip() == ""
    assert_not_blank("/tmp/topology_llm.png", panel.view.grabFramebuffer())
    panel.shutdown()


def test_llm_activity_lights_up_while_generating(qtbot, smollm2, runner):
    net = smollm2.net
    panel = make_panel(qtbot, net)  # the default sampling rate, as in the window
    panel.select_layer_key(ATTENTION_9)
    panel.colour_mode.setCurrentIndex(panel.colour_mode.findData("rms"))
    assert np.isclose(panel.scatter.color, IDLE_COLOUR).all()
    seen = StatsByStep(net)
    runner.start(lambda job: [r.text for r in smollm2.generate("The capital of France is", max_tokens=3,
                                                             temperature=0)], name="generate")
    qtbot.waitUntil(lambda: not runner.active, timeout=30000)

    def shows_a_whole_pass() -> bool:  # the inspector says which pass it shows: the colours are its
        m = re.search(r"\(step (\d+)\)", panel.inspector.fields["Last stats"].text())
        return bool(m) and np.allclose(panel.scatter.color, expected_activity(panel, seen.steps[int(m[1])]),
                                       atol=1e-6)

    qtbot.waitUntil(shows_a_whole_pass, timeout=3000)
    assert not np.isclose(panel.scatter.color, IDLE_COLOUR).all(axis=1).any()  # every layer ran
    net.detach(seen.observer)
    assert runner.shutdown()
    panel.shutdown()
    assert net.observers == []


# ----- layout and theme --------------------------------------------------------------------------
TABBED = (986, 567)  # the panel raised in its tab beside Chat in a 1600x1000 main window (measured)


def test_in_a_1600x1000_window_nothing_is_clipped(qtbot, smollm2):
    panel = TopologyPanel()
    qtbot.addWidget(panel)
    panel.resize(*TABBED)
    panel.show()
    qtbot.waitExposed(panel)
    panel.set_network(smollm2.net)
    panel.select_layer_key(ATTENTION_9)
    smollm2.net.step(np.array([[1, 9690, 28]]))
    qtbot.waitUntil(lambda: "step" in panel.inspector.fields["Last stats"].text(), timeout=3000)
    qtbot.wait(50)  # the layout answers the new text on its next pass
    assert panel.minimumSizeHint().width() <= TABBED[0] and panel.minimumSizeHint().height() <= TABBED[1]
    assert assert_unclipped(panel) >= 12
    for name in ("bottom", "left"):
        assert_tick_labels_apart(panel.inspector.plot.getAxis(name))
    # the inspector's rows all fit in the dock's height: no scrolling to reach the stats
    assert panel.inspector_area.verticalScrollBar().maximum() == 0 or \
        panel.inspector.fields["Last stats"].geometry().bottom() < panel.inspector_area.viewport().height()
    # block numbers drawn in the view do not run into each other
    panel.view.grabFramebuffer()
    drawn = panel.block_labels.drawn
    assert len(drawn) >= 5 and not any(a.intersects(b) for i, a in enumerate(drawn) for b in drawn[i + 1:])
    panel.shutdown()


def test_legible_in_the_dark_theme(qtbot, qapp):
    with dark_theme(qapp):
        panel = make_panel(qtbot, small_net())
        panel.select_layer_key((0, 0, 0, 0, ""))
        assert assert_legible(panel) >= 15
        assert_axes_legible(panel.inspector.plot)
        # the 3-D view keeps its dark canvas in both themes; its block numbers are drawn on it
        assert contrast(QColor(*LABEL_COLOUR), QColor(*VIEW_BACKGROUND)) >= AA
        assert tuple(round(c * 255) for c in panel.view.opts["bgcolor"][:3]) == VIEW_BACKGROUND
        panel.shutdown()


# ----- logic-shift arrows (the DNA panel's) -------------------------------------------------------------
def test_logic_shift_arrows_join_the_grid_positions_given_and_clear_with_a_new_network(qtbot):
    from loomlab.core.evolve.genetics.dna import LogicShift

    panel = make_panel(qtbot, small_net())
    topo = panel.topology
    at = {key[:4]: topo.positions[i] for key, i in topo.keys.items() if key[4] == ""}
    drawn = panel.show_logic_shifts([("0,0,0,0", "1,0,1,1", 0.93), LogicShift("1,0,0,0", "0,0,1,1", 0.85),
                                     ("0,0,0,0", "9,9,9,9", 0.99)])  # the last: a position it lacks
    assert drawn == 2
    assert [(s.tolist(), t.tolist(), o) for s, t, o in panel.shift_arrows] == [
        (at[0, 0, 0, 0].tolist(), at[1, 0, 1, 1].tolist(), 0.93),
        (at[1, 0, 0, 0].tolist(), at[0, 0, 1, 1].tolist(), 0.85)]
    lines = panel.shift_lines.pos
    assert panel.shift_lines.visible() and lines.shape == (16, 3)
    assert lines[0].tolist() == at[0, 0, 0, 0].tolist() and lines[3].tolist() == at[1, 0, 1, 1].tolist()
    assert lines[1][2] > max(at[0, 0, 0, 0][2], at[1, 0, 1, 1][2])  # an arc over the grid
    assert panel.show_logic_shifts([]) == 0 and not panel.shift_lines.visible()
    panel.show_logic_shifts([((0, 0, 0, 0), (0, 0, 0, 1), 0.9)])
    panel.set_network(small_net())
    assert panel.shift_arrows == [] and not panel.shift_lines.visible()
    panel.shutdown()


def test_a_mixture_of_experts_draws_each_expert_above_it_and_inspects_its_load(qtbot):
    """Each expert of a MoE block is one point whose parent is the MoE layer, named by its rows of
    the stacked tensors; the MoE layer's inspector counts the tokens its router sent each expert."""
    net = load_causal_lm(TINY / "tiny-mixtral")
    net.forward(np.array([[1, 17, 42, 99, 3]]))
    panel = make_panel(qtbot, net, shown=False)
    topo = panel.topology
    moe = next(la for la in net.all_layers() if isinstance(la, LLMMixtureOfExperts))
    me = topo.index_of(moe)
    experts = [topo.index_of(e) for e in moe.children]
    assert [topo.parents[i] for i in experts] == [me] * 4
    assert [topo.rows[i].type for i in experts] == ["SwiGLU"] * 4
    assert len({tuple(topo.positions[i]) for i in experts}) == 4  # each its own place
    assert panel.names[experts[3]].label == "blk.0.ffn_gate_exps/up_exps/down_exps[3]"
    panel.select_layer_key((*moe.coords, moe.path))
    fields = panel.inspector.fields
    assert fields["Layer"].text() == "blk.0.ffn_gate_inp" and fields["Type"].text() == "Parallel"
    loads = " · ".join(str(n) for n in moe.load.tolist())
    assert fields["Experts"].text() == f"4, 2 per token; tokens routed so far: {loads}"
    assert fields["Experts"].isVisibleTo(panel) and moe.load.sum() == 10
    panel.select_layer_key((*moe.coords, moe.children[0].path))
    assert not fields["Experts"].isVisibleTo(panel)
    panel.shutdown()
