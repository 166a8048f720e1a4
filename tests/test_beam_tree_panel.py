"""The beam tree panel, offscreen: fed the real events of a tiny-model beam run."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from PySide6.QtCore import QPointF
from PySide6.QtGui import QColor

from playground.config import RunSettings
from playground.engine.beam import run_beam_search
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, PrefillDone, RunFinished, RunStarted
from playground.state import shade_fraction
from playground.state.beam_tree import FINISHED, PRUNED, SURVIVING
from playground.ui.style import SHADE_TICKS, configure_pyqtgraph, shade_for_prob
from playground.ui.views.beam_tree import items as beam_tree_items
from playground.ui.views.beam_tree.items import CHUNK_STEPS, NODE_SIZE
from playground.ui.views.beam_tree.panel import BeamTreePanel, chunk_of


@pytest.fixture(scope="module")
def events(tiny_lm_eos):
    settings = RunSettings.from_flat(strategy="beam", prompt="The weather in Paris", num_beams=4, max_new_tokens=20,
                           early_stopping="never", num_return_sequences=3)
    return list(run_beam_search(tiny_lm_eos, settings))


@pytest.fixture(scope="module")
def wide_events(tiny_lm):
    settings = RunSettings.from_flat(strategy="beam", prompt="Beam search keeps", num_beams=16, max_new_tokens=64)
    return list(run_beam_search(tiny_lm, settings))


@pytest.fixture(scope="module")
def stopped_events(tiny_lm_eos):
    """Stopped after 3 steps: the run's best is a running beam scored as if it ended there."""
    polls = iter(range(1000))
    settings = RunSettings.from_flat(strategy="beam", prompt="The weather in Paris", num_beams=4, max_new_tokens=40,
                           early_stopping="never", num_return_sequences=3, length_penalty=2.0)
    return list(run_strategy(tiny_lm_eos, settings, should_stop=lambda: next(polls) >= 3))


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
    return sum(len(chunk.nodes.data) for chunk in panel._chunks)


def edge_points(panel: BeamTreePanel, kind: str) -> int:
    return sum(path_points(getattr(chunk, kind)) for chunk in panel._chunks)


def path_points(curve) -> int:
    x, _ = curve.getData()
    return 0 if x is None else len(x)


def test_draws_every_node_and_edge(panel, events):
    feed(panel, events)
    tree = panel.tree
    assert tree.steps == sum(e.type == "beam_step" for e in events)
    assert scatter_points(panel) == len(tree.nodes)
    assert tree.count(SURVIVING) > 0 and tree.count(PRUNED) > 0 and tree.count(FINISHED) > 0
    beam, pruned = edge_points(panel, "beam_edges"), edge_points(panel, "pruned_edges")
    assert beam + pruned == 2 * (len(tree.nodes) - 1)  # one segment per non-root node
    assert pruned == 2 * tree.count(PRUNED)
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
    scatter = panel._chunks[chunk_of(node.step)].nodes
    points = scatter.pointsAt(QPointF(node.x, node.y))
    assert len(points) >= 1
    tip = scatter.opts["tip"](x=node.x, y=node.y, data=points[0].data())
    assert tip == panel.tooltip_for(node.id)
    assert "token:" in tip and "probability:" in tip and "%" in tip
    assert f"cumulative log-prob: {node.cum_logprob:.3f}" in tip
    assert "length-normalised score" in tip and "on the best sequence" in tip
    finished = tree.finished_nodes()[0]
    assert "final score" in panel.tooltip_for(finished.id)
    assert "the prompt" in panel.tooltip_for(0)


def test_hover_tips_follow_the_mouse_across_chunks(panel, wide_events, qtbot):
    feed(panel, wide_events)
    panel.fit_all()
    tree = panel.tree
    viewport = panel.plot.viewport()
    targets = (tree.best_path[3], tree.best_path[CHUNK_STEPS + 4], tree.columns[CHUNK_STEPS + 1][5],
               tree.columns[2 * CHUNK_STEPS + 1][-1], tree.best_path[5])
    for node_id in targets:  # straight from a node of one chunk to a node of another
        node = tree.nodes[node_id]
        qtbot.wait(30)  # pyqtgraph drops mouse moves that come faster than its rate limit
        qtbot.mouseMove(viewport, panel.plot.mapFromScene(panel.view.mapViewToScene(QPointF(node.x, node.y))))
        qtbot.waitUntil(lambda n=node_id: panel.view.toolTip().startswith(panel.tooltip_for(n).split("\n")[0]),
                        timeout=1000)
    qtbot.wait(30)
    qtbot.mouseMove(viewport, viewport.rect().bottomLeft())  # off the nodes: the tip goes
    qtbot.waitUntil(lambda: panel.view.toolTip() == "", timeout=1000)


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
        assert path_points(panel._rerank_path) == len(tree.path(panel.ranking[0].node_id))


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
    assert "4 beams" in text and "MB" in text
    assert f"{last.kv_cache_bytes / 1e6:.3g} MB" in text
    assert "about" in text and "estimate" in text  # the single-sequence figure is derived, not measured


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


def test_flush_draws_only_the_new_nodes(panel, wide_events):
    """Per-flush work follows the new nodes: earlier chunks are left alone, the newest gets only what is new."""
    steps = [e for e in wide_events if isinstance(e, BeamStep)]
    head = wide_events.index(steps[CHUNK_STEPS + 4])
    feed(panel, wide_events[:head])
    assert len(panel._chunks) == 2
    calls: list[tuple[str, int]] = []
    old = panel._chunks[0]
    for item in old.items():
        item.setData = item.addPoints = lambda *a, **k: calls.append(("old chunk", 0))
    newest = panel._chunks[1].nodes
    add_points = newest.addPoints

    def record(*args, **kwargs):
        calls.append(("newest", len(kwargs["x"])))
        return add_points(*args, **kwargs)

    newest.addPoints = record
    labels_before = len(panel._labels)
    for event in wide_events[head : head + 2]:
        panel.apply(event)
        panel.flush()
    assert calls == [("newest", len(e.candidates)) for e in wide_events[head : head + 2]]
    assert len(panel._labels) == labels_before + sum(len(e.candidates) for e in wide_events[head : head + 2])
    for chunk in panel._chunks:  # a chunk holds CHUNK_STEPS steps at most
        assert len({int(x) for x in chunk.nodes.data["x"]} - {-1}) <= CHUNK_STEPS


def test_nodes_share_pens_and_brushes(panel, wide_events):
    feed(panel, wide_events)
    data = np.concatenate([chunk.nodes.data for chunk in panel._chunks])
    assert len({id(p) for p in data["pen"]}) <= 2
    assert len({id(b) for b in data["brush"]}) == len({b.color().rgba() for b in data["brush"]})


def test_prompt_waits_for_the_first_column(panel, events):
    panel.apply(events[0])
    panel.flush()  # a frame before the first step: the prompt's place is not known yet
    assert scatter_points(panel) == 0
    feed(panel, events[1:3])
    root = panel.tree.nodes[0]
    assert root.y > 0
    first = panel._chunks[0].nodes.data
    assert float(first["y"][first["data"] == 0][0]) == root.y


def test_best_path_is_emphasised(panel, events):
    feed(panel, events)
    tree = panel.tree
    best = panel._best_nodes.data
    assert len(best) == len(tree.best_path)
    assert list(best["x"]) == [tree.nodes[i].x for i in tree.best_path]
    assert list(best["size"]) == [NODE_SIZE[tree.nodes[i].state] + 3 for i in tree.best_path]
    for i in tree.best_path:
        tier, color, bold = panel._labels.style(i)
        assert tier == 0 and bold and color.name() == QColor("#CC3311").name()
    assert panel._labels.style(tree.finished_nodes()[-1].id)[0] in (0, 1)


def test_end_closes_a_run_without_final_event(panel, events):
    feed(panel, events[:-1])
    assert "running…" in panel.header.text() and not panel.penalty_slider.isEnabled()
    panel.end("failed")
    header = panel.header.text()
    assert "running…" not in header and "failed" in header
    assert panel.tree.count(FINISHED) > 0 and panel.penalty_slider.isEnabled()
    assert [h.score for h in panel.ranking] == [h.score for h in panel.tree.rerank(panel.tree.length_penalty)]
    assert "failed before returning" in panel.penalty_label.text()
    panel.penalty_slider.setValue(30)
    assert panel.ranking == panel.tree.rerank(3.0) and "what-if" in panel.penalty_label.text()


def test_end_without_finished_hypotheses_keeps_the_slider_off(panel, wide_events):
    feed(panel, wide_events[:6])
    assert panel.tree.count(FINISHED) == 0
    panel.end("stopped")
    assert "stopped" in panel.header.text() and "running…" not in panel.header.text()
    assert not panel.penalty_slider.isEnabled()
    assert "nothing to re-rank" in panel.penalty_label.text()


def test_end_before_the_first_step(panel, events):
    panel.end("failed")
    assert "failed" in panel.header.text() and scatter_points(panel) == 0
    panel.reset()
    feed(panel, events[:1])
    panel.end("failed")
    assert "failed" in panel.header.text() and "0 steps" in panel.header.text()


def test_end_is_a_no_op_after_run_finished(panel, events):
    feed(panel, events)
    header, ranking = panel.header.text(), panel.ranking
    panel.end("failed")
    assert panel.header.text() == header and panel.ranking == ranking
    assert "failed" not in header and panel.penalty_slider.isEnabled()


def test_stopped_run_at_its_own_penalty_matches_the_run(panel, stopped_events):
    done = stopped_events[-1]
    assert isinstance(done, RunFinished) and done.stop_reason == "stopped"
    feed(panel, stopped_events)
    tree = panel.tree
    assert tree.nodes[tree.best_path[-1]].state == SURVIVING and tree.count(FINISHED) > 0
    assert [h.run_rank for h in panel.ranking[:3]] == [1, 2, 3]
    assert path_points(panel._rerank_path) == 0  # no "best after re-ranking" path: it is the run's best
    assert "the scores the run itself used" in panel.penalty_label.text()
    assert "running beam" in panel.penalty_label.text()
    for node_id in tree.returned_running:  # in the re-ranking pool, so they show their score too
        node = tree.nodes[node_id]
        assert panel._labels._texts[node_id].startswith(f"{node.normalised_score(2.0):.2f} ")
        assert "scored as if it ended here" in panel.tooltip_for(node_id)


def test_slider_covers_the_controls_range(panel, events):
    assert (panel.penalty_slider.minimum(), panel.penalty_slider.maximum()) == (-50, 50)
    started = events[0]
    assert isinstance(started, RunStarted)
    for penalty, low, high in ((-5.0, -50, 50), (5.0, -50, 50), (7.5, -50, 75), (-6.0, -60, 50)):
        run = [dataclasses.replace(started, settings={**started.settings, "beam": {**started.settings["beam"],
                                                                              "length_penalty": penalty}}), *events[1:]]
        feed(panel, run)
        slider = panel.penalty_slider
        assert (slider.minimum(), slider.maximum()) == (low, high)
        assert slider.value() == round(penalty * 10) and panel._rerank_penalty == penalty
        assert "the scores the run itself used" in panel.penalty_label.text()
    feed(panel, events)
    assert (panel.penalty_slider.minimum(), panel.penalty_slider.maximum()) == (-50, 50)


def test_fill_ramp_legend(panel, monkeypatch):
    ramp = panel.ramp
    assert ramp.isVisible()
    monkeypatch.setattr(beam_tree_items, "shade_for_prob", lambda p: pytest.fail("ramp recomputed on paint"))
    image = ramp.grab().toImage()
    width = ramp.width() - 32
    for tick in SHADE_TICKS:
        fraction = shade_fraction(tick)
        x = 16 + min(width - 2, max(1, round(fraction * width)))
        expected = np.array(shade_for_prob(tick).getRgb()[:3])
        assert np.abs(np.array(image.pixelColor(x, 7).getRgb()[:3]) - expected).max() <= 12


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
    settings = RunSettings.from_flat(strategy="beam", num_beams=4, max_new_tokens=32, num_return_sequences=3)
    feed(panel, run_beam_search(default_lm, settings))
    assert "Paris" in panel.header.text()
    labels = set(panel._labels._texts)
    assert {"␣capital", "␣France", "␣Paris"} <= labels
    assert panel.kv_label.text().count("MB") >= 2
    panel.penalty_slider.setValue(0)
    assert panel.ranking[0].score == pytest.approx(max(h.sum_logprobs for h in panel.ranking))
    assert panel.grab().save(str(tmp_path / "beam_tree_default.png"))
    assert scatter_points(panel) == len(panel.tree.nodes)
