"""The attention fold and view on a real recorded run (tiny model, an evicting cache): the heatmap is the
recorded rows laid out by hand here, the head selector picks one head or the mean, a clicked position's per-layer
weights are its column, the summary's sink share and heavy hitters are recounted from the rows."""

from __future__ import annotations

import numpy as np
import pytest

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events.attention import AttentionRow
from playground.state import Run
from playground.state.attention import AttentionState
from playground.ui.style import configure_pyqtgraph


@pytest.fixture(scope="module")
def events(tiny_lm):
    return list(run_strategy(tiny_lm, RunSettings.from_flat(
        prompt="the cat sat on the mat and then the dog", chat=False, strategy="kv-cache", max_new_tokens=6,
        compare_no_cache=False, record_attention=True, attention_top=0, kv_keep="sinks", kv_sinks=2, kv_window=4)))


def by_hand(row: AttentionRow, head: int | None) -> np.ndarray:
    layers, heads = len(row.positions), len(row.positions[0])
    out = np.zeros((layers, row.query_position + 1))
    for layer in range(layers):
        for h in range(heads) if head is None else [head]:
            for p, w in zip(row.positions[layer][h], row.weights[layer][h], strict=True):
                out[layer, p] += w / (heads if head is None else 1)
    return out


def test_the_fold_lays_out_each_row_and_recounts_the_summary(events):
    state = AttentionState()
    for event in events:
        state.apply(event)
    rows = [e for e in events if isinstance(e, AttentionRow)]
    assert state.steps == len(rows) == 6
    for step, row in enumerate(rows):
        assert np.allclose(state.matrix(step, None), by_hand(row, None))
        assert np.allclose(state.matrix(step, 1), by_hand(row, 1))
    sink = np.mean([by_hand(r, None)[:, :4].sum(1).mean() for r in rows])
    assert state.sink_share() == pytest.approx(sink)
    total = np.zeros(rows[-1].query_position + 1)
    for r in rows:
        m = by_hand(r, None).mean(0)
        total[: m.size] += m
    assert [p for p, _ in state.heavy_hitters(3)] == list(np.argsort(-total, kind="stable")[:3])
    assert sorted(state.evicted) == list(range(2, rows[-1].query_position - 3))  # all but the sinks and window
    assert state.quality is not None


def test_the_view_draws_the_selected_step_head_and_position(events, qtbot, tmp_path):
    from playground.ui.views.attention import AttentionView

    configure_pyqtgraph()
    view = AttentionView()
    qtbot.addWidget(view)
    view.resize(1300, 900)
    view.show()
    view.show_run(Run.from_events(events))
    rows = [e for e in events if isinstance(e, AttentionRow)]
    view.select(3, head=None, position=0)
    assert np.allclose(view.heatmap.image.image, by_hand(rows[3], None))
    assert np.allclose(view.profile.bars.opts["height"], by_hand(rows[3], None)[:, 0])
    view.select(4, head=2, position=1)
    assert np.allclose(view.heatmap.image.image, by_hand(rows[4], 2))
    # Before any click the profile shows the position the token attends to most, summed over the layers.
    view.select(2, head=None, position=None)
    heaviest = int(by_hand(rows[2], None).sum(axis=0).argmax())
    assert np.allclose(view.profile.bars.opts["height"], by_hand(rows[2], None)[:, heaviest])
    assert "background:#ffe066" in view.text.text()
    path = tmp_path / "attention.png"
    view.grab().save(str(path))
    assert path.stat().st_size > 10_000


def test_a_special_tokens_text_shows_in_the_profiles_title(qtbot):
    """The title is rich text: '<|im_start|>' must be escaped, or Qt reads it as a tag and shows nothing."""
    from playground.ui.views.attention.heatmap import LayerProfilePanel

    panel = LayerProfilePanel()
    qtbot.addWidget(panel)
    panel.draw(np.array([0.5, 0.25, 0.125]), 0, "<|im_start|>")
    title = panel.plot.getPlotItem().titleLabel
    assert "&lt;|im_start|&gt;" in title.text
    assert np.allclose(panel.bars.opts["height"], [0.5, 0.25, 0.125])
