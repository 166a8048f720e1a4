"""The layers view and its Qt-free state: hand-made lens events with hand-checked numbers, and real lens, early-exit
and layer-skip runs of tiny models.

Every number the view shows is checked against a count made here from the events themselves.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt
from windows import open_window

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, RunStarted, TokenStep
from playground.events.layers import LayersStarted, LayerStep, LensCandidate
from playground.state import Run, visible_token_text
from playground.state.columns import FIRST_CAPACITY
from playground.state.layers import LayerState, replay_exit
from playground.traces import read_trace, write_trace
from playground.ui.style import configure_pyqtgraph, format_percent
from playground.ui.views import view_names
from playground.ui.views.layers import LayersView, replay_steps

PROMPT = "the cat sat on the mat"
RUN_TIMEOUT_MS = 20000


# --- hand-made events ---------------------------------------------------------------------------------------
def layer_step(step: int, entropy: tuple, agrees: tuple, top_prob: tuple | None = None, exit_layer: int | None = None,
               skipped: tuple[int, ...] = ()) -> LayerStep:
    """One token's lens; None where a layer did not run. Candidates are named after their layer and rank."""
    top_prob = top_prob or tuple(None if e is None else 2.0 ** -e for e in entropy)
    top = tuple(() if e is None else tuple(LensCandidate(100 * layer + rank, f"L{layer}t{step}r{rank}", p / rank)
                                            for rank in (1, 2, 3))
                for layer, (e, p) in enumerate(zip(entropy, top_prob, strict=True), start=1))
    return LayerStep(step=step, layer_entropy=tuple(entropy), layer_top_prob=tuple(top_prob), layer_top=top,
                     agrees_with_final=tuple(agrees),
                     residual_update=tuple(None if e is None else 0.1 * (i + 1) for i, e in enumerate(entropy)),
                     exit_layer=exit_layer, skipped=skipped, layers_computed=sum(e is not None for e in entropy),
                     layers_total=len(entropy), lens_ms=0.5, forward_ms=5.0)


def token_step(step: int, text: str) -> TokenStep:
    return TokenStep(step=step, token_id=step, text=text, prob=0.5, raw_prob=0.5, logprob=math.log(0.5), raw_rank=1,
                     entropy=1.0, processed_entropy=1.0, candidates=(), shown_raw_mass=0.5, effects=(), forced=False,
                     step_ms=5.0, kv_cache_bytes=0)


def hand_run(mode: str, steps: list[LayerStep], figures: dict | None = None, threshold: float = 1.0,
             min_layer: int = 1) -> list:
    strategy = "greedy" if mode == "lens" else mode
    layers = len(steps[0].layer_entropy)
    events: list = [
        RunStarted(strategy=strategy, prompt_text="p", prompt_token_ids=(1,), forced_token_ids=(), model_name="m",
                   model_path="m", device="cpu", dtype="float32",
                   settings={"strategy": strategy, "lens": {"lens": True}}),
        LayersStarted(mode=mode, layers=layers, lens_top=3, exit_metric="entropy", exit_threshold=threshold,
                      min_exit_layer=min_layer, skip_layers=(), skip_threshold=0.0, kv_fill="copied")]
    for s in steps:
        events += [s, token_step(s.step, f" w{s.step}")]
    events.append(RunFinished(token_ids=tuple(range(len(steps))), text="", stop_reason="max_new_tokens",
                              tokens_per_s=20.0, prefill_ms=1.0, decode_ms=1.0, prompt_tokens=1, model_name="m",
                              model_path="m", device="cpu", dtype="float32", figures=figures or {}))
    return events


T, F = True, False
# A lens run of 4 layers: every layer ran for every token (the last layer answered).
LENS_STEPS = [
    layer_step(0, (5.0, 3.0, 0.8, 0.2), (F, F, T, T), (0.1, 0.3, 0.7, 0.95)),
    layer_step(1, (4.0, 2.0, 1.5, 0.5), (F, T, F, T), (0.2, 0.5, 0.6, 0.9)),
    layer_step(2, (6.0, 5.0, 4.0, 3.0), (F, F, F, T), (0.05, 0.1, 0.2, 0.3)),
]
# An early-exit run (entropy ≤ 1 bit from layer 2): token 0 left at layer 2, token 2 at layer 3.
EXIT_STEPS = [
    layer_step(0, (3.0, 0.9, None, None), (F, T, None, None), exit_layer=2),
    layer_step(1, (3.0, 2.0, 1.5, 1.2), (F, F, T, T)),
    layer_step(2, (4.0, 3.0, 0.5, None), (F, F, T, None), exit_layer=3),
]


def folded(events: list) -> LayerState:
    state = LayerState()
    for event in events:
        state.apply(event)
    return state


def as_run(events: list) -> Run:
    return Run.from_events(events)


@pytest.fixture
def view(qtbot) -> LayersView:
    configure_pyqtgraph()
    v = LayersView()
    qtbot.addWidget(v)
    v.resize(1500, 900)
    v.show()
    return v


# --- the replay, by hand ------------------------------------------------------------------------------------
@pytest.mark.parametrize(("metric", "threshold", "min_layer", "exits", "changes", "computed"), [
    # entropy ≤ 1 bit: token 0 at layer 3 (0.8), tokens 1 and 2 never that sure (the last layer answers).
    ("entropy", 1.0, 1, (3, 4, 4), 0, 11),
    # ≤ 3 bits: token 0 at layer 2 (3.0, inclusive), whose top token is not the last layer's: a change.
    ("entropy", 3.0, 1, (2, 2, 4), 1, 8),
    # ... from layer 3 on: token 1 at layer 3 (1.5), whose top token differs from the last layer's.
    ("entropy", 3.0, 3, (3, 3, 4), 1, 10),
    # top-1 ≥ 0.5: token 0 at layer 3 (0.7), token 1 at layer 2 (0.5, inclusive), token 2 never.
    ("max-prob", 0.5, 1, (3, 2, 4), 0, 9),
    ("max-prob", 0.99, 1, (4, 4, 4), 0, 12),
])
def test_replay_exit_on_a_lens_run_by_hand(metric, threshold, min_layer, exits, changes, computed):
    replay = replay_exit(folded(hand_run("lens", LENS_STEPS)), metric, threshold, min_layer)
    assert replay.exits == exits
    assert replay.changes == changes and replay.unknown == 0
    assert (replay.layers_computed, replay.layers_total) == (computed, 12)
    assert replay.compute_saved == pytest.approx(1 - computed / 12)


def test_replay_exit_after_early_exits_reports_unknowns():
    state = folded(hand_run("early-exit", EXIT_STEPS, threshold=1.0, min_layer=2))
    # The run's own rule gives back the run's own exits, with nothing unknown and nothing changed.
    same = replay_exit(state, "entropy", 1.0, 2)
    assert same.exits == (2, 4, 3) and same.unknown == 0 and same.changes == 0
    assert same.compute_saved == pytest.approx(1 - 9 / 12)
    # Stricter: token 0 would need layer 3, which never ran for it: unknown, and left out of the savings.
    strict = replay_exit(state, "entropy", 0.5, 2)
    assert strict.exits == (None, 4, 3) and strict.changed == (None, False, False)
    assert (strict.unknown, strict.known, strict.layers_computed, strict.layers_total) == (1, 2, 7, 8)
    # Looser: every token exits by layer 2, none with the answering layer's top token.
    loose = replay_exit(state, "entropy", 3.0, 1)
    assert loose.exits == (1, 1, 2) and loose.changes == 3 and loose.layers_computed == 4


def test_replay_exit_passes_skipped_layers_by():
    state = folded(hand_run("layer-skip", [layer_step(0, (3.0, None, None, 0.4), (F, None, None, T),
                                                      skipped=(2, 3))]))
    assert np.array_equal(state.skipped[:, 0], [0, 1, 1, 0])
    passed = replay_exit(state, "entropy", 1.0, 1)  # layers 2-3 were skipped, not cut off: layer 4 answers
    assert passed.exits == (4,) and passed.unknown == 0 and passed.layers_computed == 2  # two layers ran
    assert replay_exit(state, "entropy", 3.0, 1).exits == (1,)


def test_replay_steps_follow_the_top_of_each_exit_cell():
    xs, ys = replay_steps((3, None, 1))
    assert list(xs) == [-0.5, 0.5, 0.5, 1.5, 1.5, 2.5]
    assert list(ys[:2]) == [3.5, 3.5] and np.isnan(ys[2:4]).all() and list(ys[4:]) == [1.5, 1.5]


# --- the fold -----------------------------------------------------------------------------------------------
def test_the_fold_equals_a_count_from_the_events():
    """150 tokens (past two doublings of the matrices' capacity), exits and skips mixed."""
    rng = np.random.default_rng(0)
    steps = []
    for j in range(150):
        entropy = [float(x) for x in rng.uniform(0, 8, 5)]
        exit_layer = int(rng.integers(2, 6)) if j % 3 == 0 else None
        skipped = (2,) if j % 7 == 0 else ()
        entropy = [None if (exit_layer and i + 1 > exit_layer) or i + 1 in skipped else e
                   for i, e in enumerate(entropy)]
        agrees = [None if e is None else bool(rng.integers(2)) for e in entropy]
        steps.append(layer_step(j, tuple(entropy), tuple(agrees), exit_layer=exit_layer, skipped=skipped))
    events = hand_run("early-exit", steps, figures={"compute_saved": 0.3})
    state = folded(events)
    assert 2 * FIRST_CAPACITY < 150 and state.layers == 5 and len(state.tokens) == 150
    expected = np.array([[np.nan if e is None else e for e in s.layer_entropy] for s in steps]).T
    np.testing.assert_array_equal(state.entropy, expected)  # NaN exactly where a layer did not run
    assert [t.lens for t in state.tokens] == steps
    assert [t.text for t in state.tokens] == [e.text for e in events if isinstance(e, TokenStep)]
    assert state.layers_computed == sum(s.layers_computed for s in steps)
    assert state.layers_total == 150 * 5
    assert state.exits == sum(s.exit_layer is not None and s.exit_layer < 5 for s in steps)  # before the last
    assert state.skipped.sum() == sum(len(s.skipped) for s in steps)
    assert state.figures == {"compute_saved": 0.3} and state.stop_reason == "max_new_tokens"
    assert folded(events[:1]).tokens == []  # a new run's start forgets the last one


# --- the view -----------------------------------------------------------------------------------------------
def test_the_view_is_registered():
    assert "layers" in view_names()


def test_the_heatmap_is_the_entropies(view):
    events = hand_run("early-exit", EXIT_STEPS, figures={"identical_fraction": 0.5, "first_divergence": 1.0,
                                                          "full_tokens_per_s": 16.0, "time_saved": 0.2})
    view.show_run(as_run(events))
    expected = np.array([[np.nan if e is None else e for e in s.layer_entropy] for s in EXIT_STEPS]).T
    np.testing.assert_array_equal(view.image.image, expected)  # layers × tokens, row 0 = layer 1
    # Layer 1 at the bottom: cell (token j, layer L) is centred on (j, L).
    assert view.image.mapRectToParent(view.image.boundingRect()) == view._not_run.rect()
    assert (view._not_run.rect().left(), view._not_run.rect().bottom(), view._not_run.rect().width(),
            view._not_run.rect().height()) == (-0.5, 4.5, 3, 4)
    # The early exits outlined where they happened.
    assert list(zip(*view._exit_marks.getData(), strict=True)) == [(0.0, 2.0), (2.0, 3.0)]
    ticks = view.heatmap.getPlotItem().getAxis("bottom")._tickLevels[0]
    assert [label for _, label in ticks] == [visible_token_text(f" w{j}") for j in range(3)]
    figures = view.figures.text()
    assert "9 of 12 layer passes" in figures and format_percent(0.25) in figures
    assert "50.0%</b> of tokens identical" in figures and "at token 1" in figures and "20.0%" in figures


def test_skipped_layers_are_marked(view):
    steps = [layer_step(0, (3.0, None, None, 0.4), (F, None, None, T), skipped=(2, 3)),
             layer_step(1, (3.0, 2.0, None, 0.4), (F, F, None, T), skipped=(3,))]
    view.show_run(as_run(hand_run("layer-skip", steps)))
    assert sorted(zip(*view._skipped.getData(), strict=True)) == [(0.0, 2.0), (0.0, 3.0), (1.0, 3.0)]
    view.select_cell(0, 2)
    assert "did not run" in view.cell_panel.text() and "skipped" in view.cell_panel.text()


def click_cell(qtbot, view: LayersView, token: int, layer: int) -> None:
    box = view.heatmap.getPlotItem().getViewBox()
    point = view.heatmap.mapFromScene(box.mapViewToScene(QPointF(token, layer)))
    qtbot.mouseClick(view.heatmap.viewport(), Qt.MouseButton.LeftButton, pos=point)


def test_a_click_on_a_cell_shows_its_candidates(qtbot, view):
    view.show_run(as_run(hand_run("lens", LENS_STEPS)))
    for token, layer in ((1, 3), (0, 2), (2, 4)):
        click_cell(qtbot, view, token, layer)
        assert (view.selected_token, view.selected_layer) == (token, layer) and not view.follow_live
        lens = LENS_STEPS[token]
        panel = view.cell_panel.text()
        for candidate in lens.layer_top[layer - 1]:
            assert candidate.text in panel and format_percent(candidate.prob) in panel
        others = {c.text for s in LENS_STEPS for top in s.layer_top for c in top} - {
            c.text for c in lens.layer_top[layer - 1]}
        assert not any(text in panel for text in others)
        assert f"{lens.layer_entropy[layer - 1]:.2f}" in panel
        assert ("✓" in panel) == lens.agrees_with_final[layer - 1]
        assert f"{lens.residual_update[layer - 1]:.3f}" in panel
        # The token across layers: its entropies and top-1 probabilities, the answering layer marked.
        xs, ys = view._entropy_curve.getData()
        assert list(xs) == [1, 2, 3, 4] and list(ys) == list(lens.layer_entropy)
        assert list(view._prob_curve.getData()[1]) == list(lens.layer_top_prob)
        assert view._exit_line.value() == 4
        assert list(zip(*view._selected.getData(), strict=True)) == [(token, layer)]


def test_the_slider_replays_without_regenerating(view):
    events = hand_run("lens", LENS_STEPS, threshold=1.0)
    run = as_run(events)
    view.show_run(run)
    assert view.metric_box.currentText() == "entropy" and view.threshold_value() == pytest.approx(1.0)
    assert view.replay.exits == (3, 4, 4)
    view.threshold_slider.setValue(round(3.0 / 0.05))  # entropy ≤ 3 bits
    assert view.replay.exits == (2, 2, 4) and view.replay.changes == 1
    note = view.replay_note.text()
    assert format_percent(1 - 8 / 12) in note and "8 of 12 layer passes" in note and "<b>1</b> of 3" in note
    assert "First-order estimate" in note
    ys = view._replay_steps.getData()[1]
    assert list(ys) == [2.5, 2.5, 2.5, 2.5, 4.5, 4.5]
    view.min_layer_box.setValue(3)
    assert view.replay.exits == (3, 3, 4)
    view.metric_box.setCurrentText("max-prob")
    assert view.threshold_value() == pytest.approx(0.5)
    assert view.replay == replay_exit(view.state, "max-prob", 0.5, 3)
    assert len(run.events) == len(events)  # nothing was added to the run: the replay reads what was recorded


# --- real runs ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def deep_lm():
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=5, layers=6)


@pytest.fixture(scope="module")
def lens_events(tiny_lm) -> list:
    return list(run_strategy(tiny_lm, RunSettings.from_flat(strategy="greedy", lens=True, prompt=PROMPT,
                                                            max_new_tokens=12)))


@pytest.fixture(scope="module")
def early_events(deep_lm) -> list:
    settings = RunSettings.from_flat(strategy="early-exit", prompt=PROMPT, max_new_tokens=30, exit_threshold=6.0,
                                     min_exit_layer=2, compare_full=True)
    return list(run_strategy(deep_lm, settings))


def test_the_early_exit_run_has_exits_to_show(early_events):
    steps = [e for e in early_events if isinstance(e, LayerStep)]
    assert any(s.exit_layer for s in steps) and any(s.exit_layer is None for s in steps)


def test_a_real_early_exit_run_replays_to_its_own_exits(early_events, view):
    view.show_run(as_run(early_events))
    state = view.state
    steps = [e for e in early_events if isinstance(e, LayerStep)]
    assert view.replay.exits == tuple(s.exit_layer or s.layers_total for s in steps)
    assert view.replay.unknown == 0 and view.replay.changes == 0
    assert state.compute_saved == pytest.approx(early_events[-1].figures["compute_saved"])
    assert view.image.image.shape == (6, len(steps))
    assert "of tokens identical" in view.figures.text()
    view.threshold_slider.setValue(0)  # entropy ≤ 0: no layer that sure, so tokens that left early are unknown
    assert view.replay.unknown == sum(s.exit_layer is not None for s in steps)


def test_a_saved_trace_gives_the_same_state_as_live(lens_events, tmp_path, qtbot, view):
    run = Run(index=0, settings=as_run(lens_events).settings)
    for start in range(0, len(lens_events), 3):  # live: small batches, as the window sends them
        batch = lens_events[start : start + 3]
        for event in batch:
            run.apply(event)
        view.apply(run, batch)
        view.flush()
        if view.state.tokens:
            assert view.selected_token == len(view.state.tokens) - 1  # follows the newest token while live
    view.end(run)
    live = view.state
    assert len(live.tokens) == 12 and live.layers == 2 and live.compute_saved == 0
    np.testing.assert_array_equal(view.image.image, live.entropy)

    write_trace(lens_events, tmp_path / "lens.jsonl")
    saved = read_trace(tmp_path / "lens.jsonl")
    assert not saved.skipped and not saved.truncated
    again = LayersView()
    qtbot.addWidget(again)
    again.show_run(as_run(saved.events))
    assert again.state.tokens == live.tokens
    np.testing.assert_array_equal(again.state.entropy, live.entropy)
    np.testing.assert_array_equal(again.image.image, view.image.image)
    assert again.replay == view.replay and again.figures.text() == view.figures.text()


def test_the_window_shows_the_layers_of_a_lens_run(qtbot, tmp_path, tiny_lm):
    settings = RunSettings.from_flat(strategy="greedy", lens=True, prompt=PROMPT, max_new_tokens=8)
    w = open_window(qtbot, tmp_path, tiny_lm, settings)
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    run = w.session.runs[0]
    assert run.finished is not None and run.error is None
    assert w.docks["layers"].pages.currentWidget() is w.views["layers"]
    view = w.views["layers"]
    assert [t.lens for t in view.state.tokens] == [e for e in run.events if isinstance(e, LayerStep)]
    assert view.image.image.shape == (2, len(run.steps))
    picture = view.grab()
    assert not picture.isNull() and picture.width() > 0


def hidden_through_layers(model, ids: list[int]) -> list[tuple]:
    """Each decoder layer's input and output hidden states [positions, hidden] over ``ids`` in one plain forward
    pass without a cache, caught with hooks on the layers (hidden_states would hand back the last one normed)."""
    import torch

    caught: list[tuple] = []
    hooks = []
    for layer in model.model.layers:
        def hook(module, args, kwargs, out):
            h_in = args[0] if args else kwargs["hidden_states"]
            h_out = out[0] if isinstance(out, tuple) else out
            caught.append((h_in[0].double(), h_out[0].double()))
        hooks.append(layer.register_forward_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            model(torch.tensor([ids]), use_cache=False)
    finally:
        for h in hooks:
            h.remove()
    return caught


def test_the_cell_panel_shows_each_layers_residual_update_computed_here(deep_lm, view):
    """‖h_out − h_in‖ / ‖h_in‖ of the layer at the token's position, from hooks on a plain forward pass; dividing
    by another norm (‖h_out‖) shows other numbers."""
    import re

    events = list(run_strategy(deep_lm, RunSettings.from_flat(strategy="greedy", lens=True, prompt=PROMPT,
                                                              chat=False, max_new_tokens=6, lens_precision="model")))
    view.show_run(as_run(events))
    prompt = list(next(e for e in events if isinstance(e, RunStarted)).prompt_token_ids)
    generated = list(events[-1].token_ids)
    caught = hidden_through_layers(deep_lm.model, prompt + generated)
    for token in range(len(generated)):
        position = len(prompt) + token - 1  # the position whose output predicts the token
        for layer in range(1, 7):
            h_in, h_out = (h[position] for h in caught[layer - 1])
            expected = float((h_out - h_in).norm() / h_in.norm())
            view.select_cell(token, layer)
            shown = re.search(r"residual update ‖Δh‖/‖h‖ = ([0-9.]+)", view.cell_panel.text())
            assert shown is not None
            assert float(shown.group(1)) == pytest.approx(expected, abs=6e-4), (token, layer)
