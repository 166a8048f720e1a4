"""The contrastive view and its Qt-free state: hand-made steps with hand-checked numbers (what the bars, the cut,
the marks, the step strip and the α what-if show), and a real run of a tiny model, live and from a saved trace."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PySide6.QtCore import QPointF, Qt
from windows import open_window

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, RunFinished, RunStarted, TokenStep
from playground.events.contrastive import ContrastCandidate, ContrastiveStarted, ContrastStep
from playground.state import Run
from playground.state.contrastive import ContrastiveState, replay_alpha
from playground.traces import read_trace, write_trace
from playground.ui.style import configure_pyqtgraph
from playground.ui.views import view_names
from playground.ui.views.contrastive import CHANGED_COLOR, FLOOR, SAME_COLOR, ContrastiveView

PROMPT = "the cat sat on the mat"
RUN_TIMEOUT_MS = 20000
LN = math.log


# --- hand-made events ---------------------------------------------------------------------------------------
def hand_step(step: int, rows: list[tuple[str, float, float]], alpha: float, chosen: str) -> ContrastStep:
    """A step from (text, p_expert, p_amateur) rows in the expert's order; token ids are 10 + the row's index
    (+ 100 × step); the plausible set is exactly the rows with p / max p ≥ alpha."""
    top = rows[0][1]
    inside = [p / top >= alpha for _, p, _ in rows]
    scores = [LN(p) - LN(a) if ok else -math.inf for (_, p, a), ok in zip(rows, inside, strict=True)]
    total = sum(math.exp(s) for s in scores if s > -math.inf)
    ids = {text: 100 * step + 10 + i for i, (text, _, _) in enumerate(rows)}
    candidates = tuple(
        ContrastCandidate(token_id=ids[text], text=text, expert_logprob=LN(p), amateur_logprob=LN(a), score=s,
                          plausible=ok, expert_rank=i + 1, prob=math.exp(s) / total if ok else 0.0)
        for i, ((text, p, a), s, ok) in enumerate(zip(rows, scores, inside, strict=True)))
    expert = rows[0][0]
    return ContrastStep(step=step, candidates=candidates, cut_logprob=LN(top) + LN(alpha),
                        plausible_count=sum(inside), token_id=ids[chosen], text=chosen,
                        expert_token_id=ids[expert], expert_text=expert, changed=chosen != expert, forced=False,
                        contrast_token_id=ids[chosen], amateur_ms=0.5, contrast_ms=0.1)


def token_step(step: ContrastStep) -> TokenStep:
    return TokenStep(step=step.step, token_id=step.token_id, text=step.text, prob=0.5, raw_prob=0.5,
                     logprob=math.log(0.5), raw_rank=1, entropy=1.0, processed_entropy=1.0, candidates=(),
                     shown_raw_mass=0.5, effects=(), forced=False, step_ms=8.0, kv_cache_bytes=0)


# Step 0: C has the highest score (log 10) among the plausible A, B, C; D (0.04 / 0.5 < 0.1) is cut.
STEP0 = hand_step(0, [(" A", 0.5, 0.6), (" B", 0.3, 0.1), (" C", 0.1, 0.01), (" D", 0.04, 0.2)], 0.1, " C")
# Step 1: only A is plausible at α = 0.1 (B: 0.05 / 0.9 < 0.1): the expert's own token.
STEP1 = hand_step(1, [(" A", 0.9, 0.5), (" B", 0.05, 0.001), (" C", 0.03, 0.3), (" D", 0.01, 0.5)], 0.1, " A")


def hand_run(steps: list[ContrastStep], figures: dict | None = None) -> list:
    events: list = [
        RunStarted(strategy="contrastive", prompt_text="p", prompt_token_ids=(1,), forced_token_ids=(),
                   model_name="m", model_path="m", device="cpu", dtype="float32",
                   settings={"strategy": "contrastive", "contrastive": {"alpha": 0.1}}),
        ContrastiveStarted(amateur="layer", detail="layer 1 of 2", amateur_layer=1, layers=2, alpha=0.1,
                           amateur_temperature=1.0, do_sample=False, expert_top=4),
        PrefillDone(prompt_tokens=1, prefill_ms=1.0, kv_cache_bytes=0)]
    for s in steps:
        events += [s, token_step(s)]
    events.append(RunFinished(token_ids=tuple(s.token_id for s in steps), text="", stop_reason="max_new_tokens",
                              tokens_per_s=20.0, prefill_ms=1.0, decode_ms=1.0, prompt_tokens=1, model_name="m",
                              model_path="m", device="cpu", dtype="float32", figures=figures or {}))
    return events


def folded(events: list) -> ContrastiveState:
    state = ContrastiveState()
    for event in events:
        state.apply(event)
    return state


@pytest.fixture
def view(qtbot) -> ContrastiveView:
    configure_pyqtgraph()
    v = ContrastiveView()
    qtbot.addWidget(v)
    v.resize(1400, 900)
    v.show()
    return v


# --- the state and the what-if, by hand -----------------------------------------------------------------------
@pytest.mark.parametrize(("alpha", "choices", "changed", "differs"), [
    (0.1, (12, 110), (True, False), (False, False)),  # the run's own α gives back the run's own choices
    (0.3, (11, 110), (True, False), (True, False)),  # C (0.2 of the top) is cut: B has the best score left
    (0.09, (12, 110), (True, False), (False, False)),  # D (0.08) still cut; the cut (0.045) is above D's 0.04
    # Looser than D: step 0's cut (0.025) lets in tokens less likely than D, which were not recorded: unknown.
    # Step 1's cut (0.045) is above its least recorded token (0.01): B (score log 50) comes in and wins.
    (0.05, (None, 111), (None, True), (None, True)),
    (1.0, (10, 110), (False, False), (True, False)),  # only the expert's top: plain greedy
])
def test_replay_alpha_by_hand(alpha, choices, changed, differs):
    state = folded(hand_run([STEP0, STEP1]))
    replay = replay_alpha(state, alpha)
    assert (replay.choices, replay.changed, replay.differs) == (choices, changed, differs)
    assert replay.unknown == sum(c is None for c in choices)
    assert replay.changes == sum(bool(c) for c in changed)


def test_the_fold_counts_the_steps():
    events = hand_run([STEP0, STEP1], figures={"step_cost": 1.1})
    state = folded(events)
    assert [r.contrast for r in state.steps] == [STEP0, STEP1]
    assert [r.text for r in state.steps] == [" C", " A"]
    assert state.changed == 1 and state.mean_plausible == pytest.approx((3 + 1) / 2)
    assert state.mean_ms(state.amateur_ms) == pytest.approx(0.5) and state.step_ms == pytest.approx(16.0)
    assert state.figures == {"step_cost": 1.1} and state.stop_reason == "max_new_tokens"
    assert state.most_interesting_step() == 0
    assert folded(events[:1]).steps == []


# --- the view -----------------------------------------------------------------------------------------------
def test_the_view_is_registered():
    assert "contrastive" in view_names()


def bar_data(bars) -> tuple[list[float], list[float]]:
    return list(bars.opts["x"]), list(bars.opts["height"])


def test_the_chart_draws_the_steps_numbers(view):
    view.show_run(Run.from_events(hand_run([STEP0, STEP1])))
    assert view.selected == 0  # the changed step comes first
    xs, expert = bar_data(view.expert_bars)
    assert expert == [LN(0.5), LN(0.3), LN(0.1), LN(0.04)]
    assert xs == [0.0, 1.0, 2.0, 3.0]
    assert bar_data(view.amateur_bars) == ([0.0, 1.0, 2.0, 3.0], [LN(0.6), LN(0.1), LN(0.01), LN(0.2)])
    xs, scores = bar_data(view.contrast_bars)  # D is outside the cut: no score bar
    assert xs == [0.0, 1.0, 2.0] and scores == pytest.approx([LN(5 / 6), LN(3), LN(10)])
    for shade, band in zip(view._shades, view._bands, strict=True):  # in each of the three panels
        assert list(shade.opts["x"]) == [3.0]  # D's column shaded
        assert list(band.opts["x"]) == [2.0]  # the chosen C banded
    assert view._cut_line.value() == pytest.approx(LN(0.5) + LN(0.1)) and view._cut_line.isVisible()
    marks = {round(label.pos().x()): label.textItem.toPlainText() for label in view._marks if label.isVisible()}
    assert marks == {0: "▲", 2: "★"}
    ticks = [label for _, label in view.panels[2].getAxis("bottom")._tickLevels[0]]
    assert ticks == ["␣A", "␣B", "␣C", "␣D"]
    panel = view.step_panel.text()
    assert "changed" in panel and "+2.30" in panel and "+1.10" in panel and "cut" in panel
    assert "50.0%" in panel and "60.0%" in panel  # A's p expert and p amateur
    # The strip: step 0 changed (magenta), step 1 kept (grey), in both rows at the run's α.
    colours = [b.color().name().upper() for b in view._strip_run.opts["brushes"]]
    assert colours == [CHANGED_COLOR, SAME_COLOR]
    assert "changed the expert's choice at <b>1</b> of 2 steps (50.0%)" in view.figures.text()
    assert view.strip.getPlotItem().titleLabel.text.endswith("the contrast changed the expert's choice at 1 of 2 "
                                                             "(50.0%)")


def test_the_what_if_alpha_moves_the_cut_without_regenerating(view):
    events = hand_run([STEP0, STEP1])
    run = Run.from_events(events)
    view.show_run(run)
    assert view.what_if_alpha() == pytest.approx(0.1)
    view.alpha_box.setValue(0.3)
    assert view.replay.choices == (11, 110)
    assert list(view._cut_shade.opts["x"]) == [2.0, 3.0]  # C and D shaded
    assert bar_data(view.contrast_bars)[1] == pytest.approx([LN(5 / 6), LN(3)])
    marks = {round(label.pos().x()): label.textItem.toPlainText() for label in view._marks if label.isVisible()}
    assert marks == {0: "▲", 1: "◆", 2: "★"}
    assert "at <b>1</b> of 2 steps" in view.what_if_note.text()
    assert "differs from the run's choice at <b>1</b>" in view.what_if_note.text()
    view.alpha_box.setValue(0.05)
    assert view.replay.choices == (None, 111) and "<b>1</b> unknown" in view.what_if_note.text()
    colours = [b.color().name().upper() for b in view._strip_what_if.opts["brushes"]]
    assert colours == ["#E6E6E6", CHANGED_COLOR]
    view.alpha_reset.click()
    assert view.what_if_alpha() == pytest.approx(0.1) and view.replay.choices == (12, 110)
    assert len(run.events) == len(events)  # nothing was added to the run


def strip_point(view: ContrastiveView, step: int):
    box = view.strip.getPlotItem().getViewBox()
    return view.strip.mapFromScene(box.mapViewToScene(QPointF(step, 1.0)))


def test_hover_shows_a_step_and_click_keeps_it(qtbot, view):
    view.show_run(Run.from_events(hand_run([STEP0, STEP1])))
    view.hover_step(1)
    assert view.shown_step == 1 and bar_data(view.expert_bars)[1] == [LN(0.9), LN(0.05), LN(0.03), LN(0.01)]
    view.hover_step(None)
    assert view.shown_step == 0
    qtbot.mouseClick(view.strip.viewport(), Qt.MouseButton.LeftButton, pos=strip_point(view, 1))
    assert view.selected == 1 and not view.follow_live
    assert "Step 1</b>: chose “␣A”, the expert's own top token too" in view.step_panel.text()


def test_log_probabilities_below_the_floor_are_drawn_at_it(view):
    step = hand_step(0, [(" A", 0.9, 1e-40), (" B", 0.05, 0.5)], 0.01, " A")
    view.show_run(Run.from_events(hand_run([step])))
    assert bar_data(view.amateur_bars)[1] == [FLOOR, LN(0.5)]


# --- real runs ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def contrast_events(tiny_lm) -> list:
    settings = RunSettings.from_flat(strategy="contrastive", prompt=PROMPT, max_new_tokens=12, alpha=0.2)
    return list(run_strategy(tiny_lm, settings))


def test_a_saved_trace_gives_the_same_view_as_live(contrast_events, tmp_path, qtbot, view):
    run = Run(index=0, settings=Run.from_events(contrast_events).settings)
    for start in range(0, len(contrast_events), 3):  # live: small batches, as the window sends them
        batch = contrast_events[start : start + 3]
        for event in batch:
            run.apply(event)
        view.apply(run, batch)
        view.flush()
        if view.state.steps:
            assert view.selected == len(view.state.steps) - 1  # follows the newest step while live
    view.end(run)
    steps = [e for e in contrast_events if isinstance(e, ContrastStep)]
    assert [r.contrast for r in view.state.steps] == steps
    assert view.state.changed == sum(s.changed for s in steps)

    write_trace(contrast_events, tmp_path / "contrast.jsonl")
    saved = read_trace(tmp_path / "contrast.jsonl")
    assert not saved.skipped and not saved.truncated
    again = ContrastiveView()
    qtbot.addWidget(again)
    again.resize(1400, 900)
    again.show_run(Run.from_events(saved.events))
    assert [r.contrast for r in again.state.steps] == steps
    assert again.selected == view.selected and again.replay == view.replay
    for name in ("expert_bars", "amateur_bars", "contrast_bars", "_cut_shade"):
        np.testing.assert_array_equal(getattr(again, name).opts["height"], getattr(view, name).opts["height"])
    assert again.step_panel.text() == view.step_panel.text()
    assert again.figures.text() == view.figures.text() and again.header.text() == view.header.text()
    # What the chart shows is the selected step's recorded numbers.
    shown = steps[view.selected]
    assert set(bar_data(view.expert_bars)[1]) <= {max(c.expert_logprob, FLOOR) for c in shown.candidates}


def test_the_window_shows_a_contrastive_run(qtbot, tmp_path, tiny_lm):
    settings = RunSettings.from_flat(strategy="contrastive", prompt=PROMPT, max_new_tokens=8)
    w = open_window(qtbot, tmp_path, tiny_lm, settings)
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    run = w.session.runs[0]
    assert run.finished is not None and run.error is None
    assert w.docks["contrastive"].pages.currentWidget() is w.views["contrastive"]
    view = w.views["contrastive"]
    assert [r.contrast for r in view.state.steps] == [e for e in run.events if isinstance(e, ContrastStep)]
    picture = view.grab()
    assert not picture.isNull() and picture.width() > 0


def test_the_csv_holds_every_recorded_candidate(view, tmp_path):
    import csv

    view.show_run(Run.from_events(hand_run([STEP0, STEP1])))
    with view.export(tmp_path / "contrast.csv").open(encoding="utf-8", newline="") as file:
        rows = list(csv.reader(file))
    assert rows[0][:4] == ["step", "token_id", "token", "expert_rank"] and len(rows) == 1 + 8
    c = rows[3]  # step 0's C: chosen, plausible, score log 10
    assert (c[0], c[2], float(c[6]), c[7], c[9], c[10]) == ("0", " C", pytest.approx(LN(10)), "1", "1", "0")


def test_the_command_line_renders_it_live_and_from_a_saved_trace(qapp, tmp_path, tiny_lm):
    from playground.cli import main

    folder = tmp_path / "tiny"
    tiny_lm.model.save_pretrained(folder)
    tiny_lm.tokenizer.save_pretrained(folder)
    options = ["--model", str(folder), "--strategy", "contrastive", "--amateur", "layer", "--alpha", "0.2",
               "--amateur-temperature", "0.8", "--max-new-tokens", "6"]
    assert main(["shot", *options, "--view", "contrastive", "--out", str(tmp_path / "live.png")]) == 0
    assert main(["trace", *options, "--out", str(tmp_path / "run.jsonl")]) == 0
    saved = read_trace(tmp_path / "run.jsonl")
    started = next(e for e in saved.events if isinstance(e, ContrastiveStarted))
    assert (started.alpha, started.amateur_temperature, started.amateur) == (0.2, 0.8, "layer")
    assert main(["shot", "--from-trace", str(tmp_path / "run.jsonl"), "--view", "contrastive", "--out",
                 str(tmp_path / "saved.png")]) == 0
    for name in ("live.png", "saved.png"):
        assert (tmp_path / name).stat().st_size > 10_000
