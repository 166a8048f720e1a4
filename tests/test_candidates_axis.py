"""The candidates chart's probability axis holds the widest extent that the run's steps up to the shown one needed
(it only widens while a run streams, and going back to a step shows the axis it streamed with). Each extent is
computed here from a plain forward pass of the model, not from the chart or the step's fields."""

from __future__ import annotations

import pytest
import torch

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunStarted, TokenStep
from playground.state import Run
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.tokens.candidates import X_EXTENTS

TEMPERATURE, CANDIDATES = 1.3, 10


@pytest.fixture(scope="module")
def streamed(tiny_lm):
    """A sampled run, and each step's own extent: the widest bar (a raw or processed share of one of the 10
    recorded candidates and the chosen token, or of the rest of the vocabulary) plus room for its label, on the
    chart's ticks."""
    settings = RunSettings(prompt="The capital of France is", strategy="sample", temperature=TEMPERATURE,
                           max_new_tokens=12, num_candidates=CANDIDATES, seed=5, chat=False)
    events = list(run_strategy(tiny_lm, settings))
    prompt = list(next(e for e in events if isinstance(e, RunStarted)).prompt_token_ids)
    steps = [e for e in events if isinstance(e, TokenStep)]
    ids = prompt + [s.token_id for s in steps]
    with torch.no_grad():
        logits = tiny_lm.model(torch.tensor([ids]), use_cache=False).logits[0].double()
    own = []
    for step in steps:
        row = logits[len(prompt) + step.step - 1]
        raw, processed = torch.softmax(row, -1), torch.softmax(row / TEMPERATURE, -1)
        shown = list(dict.fromkeys([*raw.topk(CANDIDATES).indices.tolist(), step.token_id]))  # and the chosen one
        widest = 100 * max(float(raw[shown].max()), float(processed[shown].max()),
                           1 - float(raw[shown].sum()), 1 - float(processed[shown].sum()))
        needed = max(8.0, widest * 1.18 + 6)
        own.append(next(x for x in X_EXTENTS if x >= needed))
    return events, own


def _axis_end(view) -> float:
    return view.chart.plot.getPlotItem().viewRange()[0][1]


def test_the_axis_holds_the_widest_extent_of_the_steps_so_far(qtbot, streamed):
    from playground.ui.views.tokens import TokensView

    configure_pyqtgraph()
    events, own = streamed
    held = [max(own[:k + 1]) for k in range(len(own))]
    assert any(h > o for h, o in zip(held, own, strict=True)), "the run must have a step narrower than one before"
    view = TokensView()
    qtbot.addWidget(view)
    view.show()
    run = Run.from_events(events)
    view.show_run(run)
    forward = []
    for k in range(len(own)):
        view.show_chart_step(k)
        forward.append(_axis_end(view))
    assert forward == pytest.approx(held, abs=1e-6)
    for k in reversed(range(len(own))):  # back again: each step with the axis it had going forward
        view.show_chart_step(k)
        assert _axis_end(view) == pytest.approx(held[k], abs=1e-6)
    fresh = Run.from_events(events)  # a new run starts from its own steps, not the last run's widest
    view.show_run(fresh)
    view.show_chart_step(0)
    assert _axis_end(view) == pytest.approx(own[0], abs=1e-6)


def test_a_gif_frame_leaves_only_long_unchanged_runs_transparent():
    import numpy as np

    from playground.ui.animation import lasting

    same = np.array([[True] * 16 + [False] + [True] * 15 + [False] + [True] * 17,
                     [False] * 3 + [True] * 46 + [False]])
    kept = lasting(same, 16)
    expected = np.zeros_like(same)
    expected[0, :16] = True  # 16 in a run: kept; 15: not; the row's last 17: kept
    expected[0, 33:] = True
    expected[1, 3:49] = True
    assert (kept == expected).all()
    # A run does not continue into the next row.
    wrap = np.array([[False] * 10 + [True] * 8, [True] * 8 + [False] * 10])
    assert not lasting(wrap, 16).any()
