"""The beam tree panel, offscreen: fed the real events of a tiny-model beam run."""

from __future__ import annotations

import time

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor

from playground.beam_tree import FINISHED, PRUNED, SURVIVING
from playground.config import RunSettings
from playground.engine.beam import run_beam_search
from playground.events import PrefillDone
from playground.ui.beam_tree_panel import BeamTreePanel
from playground.ui.style import configure_pyqtgraph


@pytest.fixture(scope="module")
def events(tiny_lm_eos):
    settings = RunSettings(strategy="beam", prompt="The weather in Paris", num_beams=4, max_new_tokens=20,
                           early_stopping="never", num_return_sequences=3)
    return list(run_beam_search(tiny_lm_eos, settings))


@pytest.fixture(scope="module")
def wide_events(tiny_lm):
    settings = RunSettings(strategy="beam", prompt="Beam search keeps", num_beams=16, max_new_tokens=64)
    return list(run_beam_search(tiny_lm, settings))


@pytest.fixture
def panel(qtbot):
    configure_pyqtgraph()
    widget = BeamTreePanel()
    qtbot.addWidget(widget)
    widget.resize(1200, 800)
    widget.show()
    return widget


def feed(panel: BeamTreePanel, events) -> None:
    for event in events:
        if not isinstance(event, PrefillDone):  # the main window does not pass it on: the panel must not need it
            panel.apply(event)
    panel.flush()


def scatter_points(panel: BeamTreePanel) -> int:
    return len(panel._nodes.data)


def test_draws_every_node_and_edge(panel, events):
    feed(panel, events)
    tree = panel.tree
    assert tree.steps == sum(e.type == "beam_step" for e in events)
    assert scatter_points(panel) == len(tree.nodes)
    assert tree.count(SURVIVING) > 0 and tree.count(PRUNED) > 0 and tree.count(FINISHED) > 0
    beam_x, _ = panel._beam_edges.getData()
    pruned_x, _ = panel._pruned_edges.getData()
    assert len(beam_x) + len(pruned_x) == 2 * (len(tree.nodes) - 1)  # one segment per non-root node
    best_x, _ = panel._best_path.getData()
    assert len(best_x) == len(tree.best_path) >= 2
    assert "4 beams" in panel.header.text() and "finished hypotheses" in panel.header.text()
    assert "best sequence" in panel.header.text()


def test_redraws_are_batched(panel, events, qtbot):
    for event in events:
        panel.apply(event)
    assert scatter_points(panel) == 0  # folded, not drawn yet
    assert len(panel.tree.nodes) > 1
    qtbot.waitUntil(lambda: scatter_points(panel) == len(panel.tree.nodes), timeout=2000)


def test_labels_are_readable_token_texts(panel, events):
    feed(panel, events)
    tree = panel.tree
    texts = panel._labels._texts
    assert texts[0] == "prompt"
    finished = tree.finished_nodes()[0]
    assert texts[finished.id].startswith(f"{finished.normalised_score(tree.length_penalty):.2f}")
    space_tokens = [n for n in tree.nodes[1:] if n.text.startswith(" ")]
    for node in space_tokens:
        assert texts[node.id].startswith("␣")


def test_hover_tooltip_has_the_numbers(panel, events):
    feed(panel, events)
    tree = panel.tree
    node = tree.nodes[tree.best_path[1]]
    points = panel._nodes.pointsAt(QPointF(node.x, node.y))
    assert len(points) >= 1
    tip = panel._nodes.opts["tip"](x=node.x, y=node.y, data=points[0].data())
    assert tip == panel.tooltip_for(node.id)
    assert "token:" in tip and "probability:" in tip and "%" in tip
    assert f"cumulative log-prob: {node.cum_logprob:.3f}" in tip
    assert "length-normalised score" in tip and "on the best sequence" in tip
    finished = tree.finished_nodes()[0]
    assert "final score" in panel.tooltip_for(finished.id)
    assert "the prompt" in panel.tooltip_for(0)


def test_slider_reranks_without_regenerating(panel, events):
    feed(panel, events)
    tree = panel.tree
    nodes_before = len(tree.nodes)
    assert panel.penalty_slider.value() == 10  # the run's penalty, 1.0
    assert [h.run_rank for h in panel.ranking[:3]] == [1, 2, 3]
    panel.penalty_slider.setValue(30)  # 3.0: favours long hypotheses
    assert "nothing was regenerated" in panel.penalty_label.text()
    assert "what-if" in panel.penalty_label.text()
    assert panel.ranking == tree.rerank(3.0)
    assert len(tree.nodes) == nodes_before
    assert panel.ranking[0].length >= tree.rerank(1.0)[0].length
    finished = tree.finished_nodes()[0]
    assert panel._labels._texts[finished.id] == panel._label_text(finished, 3.0)
    assert "<b>3</b>" in panel.penalty_label.text()
    if panel.ranking[0].run_rank != 1:
        rerank_x, _ = panel._rerank_path.getData()
        assert len(rerank_x) == len(tree.path(panel.ranking[0].node_id))


def test_slider_waits_for_the_end_of_the_run(panel, events):
    for event in events[:-1]:
        panel.apply(event)
    panel.flush()
    panel.penalty_slider.setValue(25)
    assert panel.ranking == []
    assert "once the run has ended" in panel.penalty_label.text()


def test_kv_cost_label(panel, events):
    feed(panel, events)
    last = [e for e in events if e.type == "beam_step"][-1]
    text = panel.kv_label.text()
    assert "4 beams ×" in text and "MB" in text
    assert f"{last.kv_cache_bytes / 1e6:.3g} MB" in text


def test_zoom_pan_and_fit_all(panel, wide_events):
    feed(panel, wide_events)
    assert panel.view.state["mouseEnabled"] == [True, True]
    (x0, x1), _ = panel.view.viewRange()
    assert x1 - x0 < 64  # follows a readable window, not all 64 steps
    panel.fit_all()
    (x0, x1), (y0, y1) = panel.view.viewRange()
    xs = [n.x for n in panel.tree.nodes]
    ys = [n.y for n in panel.tree.nodes]
    assert x0 <= min(xs) and x1 >= max(xs) and y0 <= min(ys) and y1 >= max(ys)


def test_wide_run_draws_fast(panel, wide_events):
    start = time.perf_counter()
    feed(panel, wide_events)
    panel.grab()
    assert time.perf_counter() - start < 5.0
    assert scatter_points(panel) == len(panel.tree.nodes) == 1 + 64 * 32


def test_reset_empties_the_view(panel, events):
    feed(panel, events)
    panel.reset()
    assert scatter_points(panel) == 0 and panel.tree.steps == 0
    assert panel.kv_label.text() == "" and panel.ranking == []
    feed(panel, events)
    assert scatter_points(panel) == len(panel.tree.nodes)


def test_screenshot_is_not_blank(panel, events, tmp_path):
    feed(panel, events)
    panel.penalty_slider.setValue(30)
    image = panel.grab().toImage()
    path = tmp_path / "beam_tree.png"
    assert image.save(str(path)) and path.stat().st_size > 10_000
    sample = {image.pixelColor(x, y).name() for x in range(0, image.width(), 7) for y in range(0, image.height(), 7)}
    assert len(sample) > 20  # text, nodes, edges, shades: not a blank or single-colour widget
    best = QColor("#CC3311").name()
    assert best in sample or any(_close(c, best) for c in sample)


def _close(a: str, b: str, tol: int = 40) -> bool:
    ca, cb = QColor(a), QColor(b)
    return bool(np.all(np.abs(np.array(ca.getRgb()[:3]) - np.array(cb.getRgb()[:3])) < tol))


@pytest.mark.model
def test_default_model_run_reads_well(qtbot, default_lm, tmp_path):
    configure_pyqtgraph()
    panel = BeamTreePanel()
    qtbot.addWidget(panel)
    panel.resize(1400, 850)
    panel.show()
    settings = RunSettings(strategy="beam", num_beams=4, max_new_tokens=32, num_return_sequences=3)
    feed(panel, run_beam_search(default_lm, settings))
    assert "Paris" in panel.header.text()
    labels = set(panel._labels._texts)
    assert {"␣capital", "␣France", "␣Paris"} <= labels
    assert panel.kv_label.text().count("MB") >= 2
    panel.penalty_slider.setValue(0)
    assert panel.ranking[0].score == pytest.approx(max(h.sum_logprobs for h in panel.ranking))
    assert panel.grab().save(str(tmp_path / "beam_tree_default.png"))
