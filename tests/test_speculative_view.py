"""The speculative view and its Qt-free state, on real engine runs of tiny models (and one on the default model).

Every number the view shows is checked against a count made here from the events themselves.
"""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QColor, QImage, QTextCursor
from windows import open_window

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, RunFinished, RunStarted, TokenStep
from playground.events.speculative import DraftToken, SpeculativeRound, SpeculativeStarted
from playground.state import Run, flowing_token_text
from playground.state.speculative import ACCEPTED, FORCED, REJECTED, TARGET, SpeculativeState, expected_tokens
from playground.traces import read_trace, write_trace
from playground.ui.style import configure_pyqtgraph, format_percent
from playground.ui.views.speculative import SpeculativeView
from playground.ui.views.speculative.text import ACCEPTED_COLOR, FORCED_COLOR, REJECTED_COLOR, TARGET_COLOR

PROMPT = "the cat sat on the mat. the cat sat on the mat."
RUN_TIMEOUT_MS = 20000


def speculative(**options) -> RunSettings:
    options.setdefault("max_new_tokens", 32)
    options.setdefault("baseline_tokens", 8)
    return RunSettings.from_flat(strategy="speculative", prompt=PROMPT, **options)


@pytest.fixture(scope="module")
def greedy_events(tiny_lm) -> list:
    """Prompt-lookup drafts on a repetitive prompt: rounds with accepted, rejected and empty drafts."""
    return list(run_strategy(tiny_lm, speculative(draft="prompt-lookup")))


@pytest.fixture(scope="module")
def sampled_events(tiny_lm) -> list:
    """The target's own first layer drafts, sampled and verified by the rejection rule (draws recorded)."""
    return list(run_strategy(tiny_lm, speculative(draft="layers", draft_layers=1, do_sample=True, temperature=0.8,
                                                  max_new_tokens=10)))


def rounds_of(events: list) -> list[SpeculativeRound]:
    return [e for e in events if isinstance(e, SpeculativeRound)]


def as_run(events: list) -> Run:
    return Run.from_events(events)


@pytest.fixture
def view(qtbot) -> SpeculativeView:
    configure_pyqtgraph()
    v = SpeculativeView()
    qtbot.addWidget(v)
    v.resize(1200, 700)
    v.show()
    return v


def test_the_runs_cover_what_the_view_must_show(greedy_events, sampled_events):
    greedy = rounds_of(greedy_events)
    assert any(r.accepted for r in greedy) and any(r.accepted < len(r.drafted) for r in greedy)
    assert any(not r.drafted for r in greedy)  # a round where prompt lookup found nothing
    sampled = rounds_of(sampled_events)
    assert any(d.draw is not None for r in sampled for d in r.drafted)
    assert any(d.draft_prob < 1 for r in sampled for d in r.drafted)


@pytest.mark.parametrize("fixture", ["greedy_events", "sampled_events"])
def test_the_folds_numbers_equal_a_count_from_the_events(fixture, request):
    events = request.getfixturevalue(fixture)
    state = SpeculativeState()
    for event in events:
        state.apply(event)
    rounds = rounds_of(events)
    tokens = [e for e in events if isinstance(e, TokenStep)]
    k = max(len(r.drafted) for r in rounds)
    drafted_at = [sum(1 for r in rounds if len(r.drafted) > i) for i in range(k)]
    judged_at = [sum(1 for r in rounds if len(r.drafted) > i and r.accepted >= i) for i in range(k)]
    accepted_at = [sum(1 for r in rounds for d in r.drafted[i : i + 1] if d.accepted) for i in range(k)]
    assert state.drafted_at == drafted_at and state.reached_at == judged_at and state.accepted_at == accepted_at
    assert state.position_rates() == [a / j if j else None for a, j in zip(accepted_at, judged_at, strict=True)]

    drafted = sum(len(r.drafted) for r in rounds)
    accepted = sum(sum(d.accepted for d in r.drafted) for r in rounds)
    judged = sum(judged_at)
    assert (state.drafted, state.accepted) == (drafted, accepted)
    assert state.acceptance_rate == pytest.approx(accepted / drafted)
    assert state.alpha == pytest.approx(accepted / judged)
    assert state.mean_accepted == pytest.approx(accepted / len(rounds))
    # Plain decoding calls the target once per token (the prompt's pass gives the first); here once per round,
    # the first reading the short prompt with its draft.
    assert state.emitted == len(tokens) == len(events[-1].token_ids)
    assert state.calls_saved == len(tokens) - len(rounds)

    figures = events[-1].figures  # and the engine's own figures agree
    assert state.acceptance_rate == pytest.approx(figures["acceptance_rate"])
    assert state.mean_accepted == pytest.approx(figures["mean_accepted"])
    assert state.target_calls == figures["target_calls"] == len(rounds)
    assert state.speedup == figures["speedup"] and state.baseline_tokens_per_s == figures["baseline_tokens_per_s"]


def test_a_branchs_forced_tokens_are_marks_of_their_own(tiny_lm, greedy_events, view):
    forced = (*greedy_events[-1].token_ids[:4], 7)  # the run's first tokens, then another one
    events = list(run_strategy(tiny_lm, speculative(forced_token_ids=forced, max_new_tokens=12, baseline_tokens=0)))
    state = SpeculativeState()
    for event in events:
        state.apply(event)
    steps = [e for e in events if isinstance(e, TokenStep)]
    assert [m.kind for m in state.marks[: len(forced)]] == [FORCED] * len(forced)
    assert [m.step for m in state.marks[: len(forced)]] == [s.step for s in steps if s.forced]
    # The forced tokens took one target pass (the target's own token after them came from it).
    assert state.target_calls == events[-1].figures["target_calls"] == 1 + len(rounds_of(events))
    assert state.speedup is None
    view.show_run(as_run(events))
    assert "not measured" in view.figures.text()
    probe = QTextCursor(view.text.document())
    probe.setPosition(view.text.starts[0] + 1)
    assert probe.charFormat().fontItalic() and probe.charFormat().foreground().color() == QColor(FORCED_COLOR)


def expected_marks(events: list) -> list[tuple[str, str]]:
    """(kind, text) of every mark in reading order, from the events: a round's accepted drafts, its rejected
    drafts, then the target's own token; emitted tokens with the text their token event added."""
    text_of = {e.step: e.text for e in events if isinstance(e, TokenStep)}
    marks = []
    for r in rounds_of(events):
        marks += [(ACCEPTED, text_of[r.first_step + i]) for i in range(r.accepted)]
        marks += [(REJECTED, d.text) for d in r.drafted[r.accepted :]]
        if r.target_kind != "none":
            marks.append((TARGET, text_of[r.first_step + r.accepted]))
    return marks


def document_marks(view: SpeculativeView) -> list[tuple[str, QColor, bool]]:
    """(text, foreground, struck out) of every mark, read back from the document's character formats."""
    out = []
    doc = view.text.document()
    for start, end in zip(view.text.starts, view.text.ends, strict=True):
        cursor = QTextCursor(doc)
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        probe = QTextCursor(doc)
        probe.setPosition(start + 1)  # the format of the mark's first character
        fmt = probe.charFormat()
        out.append((cursor.selectedText(), fmt.foreground().color(), fmt.fontStrikeOut()))
    return out


@pytest.mark.parametrize("fixture", ["greedy_events", "sampled_events"])
def test_the_text_marks_every_draft_once_in_its_colour(fixture, request, view):
    events = request.getfixturevalue(fixture)
    view.show_run(as_run(events))
    expected = expected_marks(events)
    shown = document_marks(view)
    assert len(shown) == len(expected) == sum(len(r.drafted) + (r.target_kind != "none")
                                              for r in rounds_of(events))
    colours = {ACCEPTED: QColor(ACCEPTED_COLOR), REJECTED: QColor(REJECTED_COLOR), TARGET: QColor(TARGET_COLOR)}
    for (kind, text), (shown_text, colour, struck) in zip(expected, shown, strict=True):
        assert colour == colours[kind], (kind, text)
        assert struck == (kind == REJECTED)
        # Rejected drafts stay on one line (they are not in the output); emitted tokens flow as the output does.
        if kind == REJECTED:
            assert shown_text == (flowing_token_text(text).replace("\n", "") or "∅")
        else:
            assert shown_text.replace("\u2029", "\n") == (flowing_token_text(text) or "·")
    # Without the rejected drafts, the document is exactly the output.
    tokens = [e for e in events if isinstance(e, TokenStep)]
    view.show_rejected.setChecked(False)
    assert view.text.toPlainText() == "".join(flowing_token_text(t.text) or "·" for t in tokens)
    view.show_rejected.setChecked(True)
    assert len(document_marks(view)) == len(expected)


def test_the_timeline_bars_are_the_rounds_counts(greedy_events, view):
    view.show_run(as_run(greedy_events))
    rounds = rounds_of(greedy_events)
    accepted = [r.accepted for r in rounds]
    target = [int(r.target_kind != "none") for r in rounds]
    rejected = [len(r.drafted) - r.accepted for r in rounds]
    bars = view.timeline_bars
    for kind, heights, base in ((ACCEPTED, accepted, [0] * len(rounds)), (TARGET, target, accepted),
                                (REJECTED, rejected, np.add(accepted, target))):
        assert list(bars[kind].opts["x"]) == list(range(len(rounds)))
        assert list(bars[kind].opts["height"]) == heights
        assert list(bars[kind].opts["y0"]) == list(base)  # stacked: accepted, target's own, rejected


def click_round_in_timeline(qtbot, view: SpeculativeView, index: int) -> None:
    box = view.timeline.getPlotItem().getViewBox()
    scene = box.mapViewToScene(QPointF(index, 0.5))
    point = view.timeline.mapFromScene(scene)
    qtbot.mouseClick(view.timeline.viewport(), Qt.MouseButton.LeftButton, pos=point)


def click_mark(qtbot, view: SpeculativeView, mark: int) -> None:
    cursor = QTextCursor(view.text.document())
    cursor.setPosition(view.text.starts[mark])
    view.text.setTextCursor(cursor)
    view.text.ensureCursorVisible()
    point = view.text.cursorRect(cursor).center() + QPoint(3, 0)
    assert view.text.mark_at(point) == mark
    qtbot.mouseClick(view.text.viewport(), Qt.MouseButton.LeftButton, pos=point)


def round_bars(view: SpeculativeView) -> tuple[list[float], list[float], list[float]]:
    return (list(view._q_bars.opts["height"]), list(view._p_bars.opts["height"]),
            list(view._draws.data["y"]))


def test_selecting_a_round_shows_its_q_and_p(qtbot, sampled_events, view):
    view.show_run(as_run(sampled_events))
    rounds = rounds_of(sampled_events)
    assert view.selected_round == view.state.most_interesting_round()  # the run has ended
    for index in (0, len(rounds) - 1):
        click_round_in_timeline(qtbot, view, index)
        assert view.selected_round == index and not view.follow_live
        r = rounds[index]
        q, p, draws = round_bars(view)
        assert q == pytest.approx([d.draft_prob for d in r.drafted])
        assert p == pytest.approx([d.target_prob for d in r.drafted]
                                  + ([r.target_prob] if r.target_kind != "none" else []))
        # The uniform draw, placed at u × q: below p exactly for the accepted drafts.
        judged = [d for d in r.drafted if d.draw is not None]
        assert draws == pytest.approx([d.draw * d.draft_prob for d in judged])
        assert [d.draw * d.draft_prob < d.target_prob for d in judged] == [d.accepted for d in judged]
        verdicts = [label.toPlainText() for label in view._verdicts if label.isVisible()]
        assert len(verdicts) == len(r.drafted) + (r.target_kind != "none")
        assert sum(v.startswith("✓") for v in verdicts) == r.accepted
        (band,) = view.text.extraSelections()
        first, end = view.state.round_marks[index]
        assert (band.cursor.selectionStart(), band.cursor.selectionEnd()) == (view.text.starts[first],
                                                                            view.text.ends[end - 1])

    # A token in the text selects its round.
    target = next(i for i, m in enumerate(view.state.marks) if m.kind == REJECTED and m.round not in (None, 0))
    click_mark(qtbot, view, target)
    assert view.selected_round == view.state.marks[target].round


def test_the_what_if_curve_is_the_formula(view):
    """Hand-made rounds: α = 5 accepted / 6 judged, c_draft = 2 ms, c_verify(k) = 30 + 5·k ms, plain 40 ms."""
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(1.0, 3) == 4

    def draft(accepted: bool) -> DraftToken:
        return DraftToken(token_id=1, text="a", draft_prob=1.0, target_prob=0.9, accepted=accepted, draw=None)

    # The first round found nothing to draft and read the prompt: its 500 ms are not a verification's cost.
    opening = SpeculativeRound(round=0, first_step=0, emitted=1, drafted=(), accepted=0, target_token_id=2,
                               target_text="b", target_kind="bonus", target_prob=0.5, draft_ms=0.0, verify_ms=500.0,
                               kv_cache_bytes=0, prompt_read=3)
    full = SpeculativeRound(round=1, first_step=1, emitted=5, drafted=(draft(True),) * 4, accepted=4, target_token_id=2,
                            target_text="b", target_kind="bonus", target_prob=0.5, draft_ms=8.0, verify_ms=50.0,
                            kv_cache_bytes=0)
    cut = SpeculativeRound(round=2, first_step=6, emitted=2, drafted=(draft(True), draft(False)), accepted=1,
                           target_token_id=2, target_text="b", target_kind="correction", target_prob=0.5,
                           draft_ms=4.0, verify_ms=40.0, kv_cache_bytes=0)
    done = RunFinished(token_ids=(1,) * 8, text="", stop_reason="max_new_tokens", tokens_per_s=30.0, prefill_ms=1.0,
                       decode_ms=1.0, prompt_tokens=3, model_name="m", model_path="m", device="cpu", dtype="float32",
                       figures={"baseline_tokens_per_s": 25.0, "speedup": 1.2, "target_calls": 3.0})
    start = RunStarted(strategy="speculative", prompt_text="p", prompt_token_ids=(1, 2, 3), forced_token_ids=(),
                       model_name="m", model_path="m", device="cpu", dtype="float32",
                       settings={"strategy": "speculative"})
    events = [start, SpeculativeStarted(drafter="prompt-lookup", detail="", draft_k=4, do_sample=False,
                                       baseline_tokens=32),
              PrefillDone(prompt_tokens=3, prefill_ms=0.0, kv_cache_bytes=0, forward_passes=0, deferred_tokens=3),
              opening, full, cut, done]
    run = Run(index=0, settings=speculative())
    for event in events:
        run.apply(event)
    view.show_run(run)

    alpha = 5 / 6
    xs, ys = view._what_if_curve.getData()
    for k in (0, 1, 4, 9):
        by_hand = (1 - alpha ** (k + 1)) / (1 - alpha) * 40.0 / (2.0 * k + 30.0 + 5.0 * k)
        assert ys[list(xs).index(k)] == pytest.approx(by_hand)
    assert view._run_k_line.value() == 4
    assert list(view._measured.data["y"]) == [1.2]  # the measured speed-up, at the run's k
    note = view.what_if_note.text()
    assert "Estimate, not measured" in note and "measured plain decoding, 40.0 ms" in note
    assert "30.0 + 5.0·k" in note and "α = 0.83" in note


def test_a_saved_trace_gives_the_same_state_as_live(greedy_events, tmp_path, qtbot, view):
    # Live: events in small batches, as the window sends them.
    run = Run(index=0, settings=as_run(greedy_events).settings)
    seen_live = False
    for start in range(0, len(greedy_events), 3):
        batch = greedy_events[start : start + 3]
        for event in batch:
            run.apply(event)
        view.apply(run, batch)
        view.flush()
        rounds = len(view.state.rounds)
        if run.running and rounds:
            assert view.selected_round == rounds - 1  # follows the newest round while live
        if rounds >= 3 and not seen_live:  # the plots and figures redraw at most every LIVE_PLOTS_MS when live
            qtbot.waitUntil(lambda: "measured at the end" in view.figures.text(), timeout=2000)
            assert len(view._what_if_curve.getData()[0]) == 17  # k = 0 … 16, from the rounds so far
            seen_live = True
    view.end(run)
    assert seen_live
    live_state, live_text = view.state, view.text.toPlainText()
    live_heights = {kind: list(bars.opts["height"]) for kind, bars in view.timeline_bars.items()}
    assert view.selected_round == live_state.most_interesting_round()
    assert "Speed-up, measured" in view.figures.text()

    write_trace(greedy_events, tmp_path / "spec.jsonl")
    saved = read_trace(tmp_path / "spec.jsonl")
    assert not saved.skipped and not saved.truncated
    again = SpeculativeView()
    qtbot.addWidget(again)
    again.show_run(as_run(saved.events))
    state = again.state
    assert state.marks == live_state.marks and state.rounds == live_state.rounds
    assert (state.drafted_at, state.reached_at, state.accepted_at) == (
        live_state.drafted_at, live_state.reached_at, live_state.accepted_at)
    assert state.calls_saved == live_state.calls_saved and state.figures == live_state.figures
    assert state.what_if() == live_state.what_if()
    assert again.text.toPlainText() == live_text
    assert {kind: list(bars.opts["height"]) for kind, bars in again.timeline_bars.items()} == live_heights
    assert again.selected_round == view.selected_round

    # Every drafted token and every target token, one CSV row each.
    again.export(tmp_path / "rounds.csv")
    rows = list(csv.DictReader((tmp_path / "rounds.csv").read_text(encoding="utf-8").splitlines()))
    rounds = rounds_of(greedy_events)
    assert len(rows) == sum(len(r.drafted) + (r.target_kind != "none") for r in rounds)
    assert sum(row["kind"] == ACCEPTED for row in rows) == state.accepted
    assert sum(row["kind"] == REJECTED for row in rows) == state.rejected


def test_the_window_shows_the_speculative_view_and_the_tokens_view(qtbot, tmp_path, tiny_lm):
    w = open_window(qtbot, tmp_path, tiny_lm, speculative(max_new_tokens=12))
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    run = w.session.runs[0]
    assert run.finished is not None and run.error is None
    for name in ("speculative", "tokens"):
        assert w.docks[name].pages.currentWidget() is w.views[name]
    view = w.views["speculative"]
    assert view.state.rounds == rounds_of(run.events)
    assert view.state.emitted == len(run.steps) and view.text.drawn == len(view.state.marks)
    assert w.views["tokens"].token_view.steps == run.steps
    # A greedy run shows nothing here, and says so.
    w.controls.strategy.setCurrentText("greedy")
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    assert w.docks["speculative"].pages.currentWidget() is w.docks["speculative"].empty
    assert "has nothing for the speculative" in w.docks["speculative"].empty.text()


def colour_share(image: QImage, colour: str) -> float:
    """Share of the picture's pixels within a small distance of ``colour``."""
    image = image.convertToFormat(QImage.Format.Format_RGB888)
    width, height = image.width(), image.height()
    pixels = np.frombuffer(image.constBits(), np.uint8).reshape(height, image.bytesPerLine())[:, : width * 3]
    rgb = pixels.reshape(height, width, 3).astype(int)
    c = QColor(colour)
    distance = np.abs(rgb - np.array([c.red(), c.green(), c.blue()])).sum(axis=2)
    return float((distance < 30).mean())


@pytest.mark.model
def test_the_default_model_run_pictured_from_its_trace(default_lm, tmp_path):
    from playground.ui.screenshot import render_trace

    settings = RunSettings.from_flat(
        strategy="speculative", draft="prompt-lookup", max_new_tokens=24, baseline_tokens=8,
        prompt="Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy "
               "dog.")
    events = list(run_strategy(default_lm, settings))
    state = SpeculativeState()
    for event in events:
        state.apply(event)
    assert state.accepted >= 5 and state.calls_saved > 0  # the repeated sentence is copied from the prompt
    assert state.rejected > 0 and state.speedup is not None and math.isfinite(state.speedup)

    write_trace(events, tmp_path / "spec.jsonl")
    out, problems = render_trace(tmp_path / "spec.jsonl", tmp_path / "spec.png", view="speculative", hover=False)
    image = QImage(str(out))
    assert not problems and image.width() > 800 and image.height() > 450
    for colour in (ACCEPTED_COLOR, REJECTED_COLOR, TARGET_COLOR):  # the three marks, in text and bars
        assert colour_share(image, colour) > 0.001, colour


def test_the_figures_line_shows_counts_made_here_from_the_target_greedy_output(tiny_lm, greedy_events, view):
    """Each round's verdict redone here: its drafts against generate()'s greedy output from where the round
    starts (the kept prefix, then the target's own token); the view's figures line must show those counts."""
    import re

    import torch

    prompt = list(greedy_events[0].prompt_token_ids)
    ids = torch.tensor([prompt])
    output = tiny_lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=32,
                                    pad_token_id=tiny_lm.tokenizer.pad_token_id)[0, len(prompt):].tolist()
    rounds = rounds_of(greedy_events)
    position = drafted = accepted = judged = 0
    for r in rounds:
        draft = [d.token_id for d in r.drafted]
        kept = next((i for i, (a, b) in enumerate(zip(draft, output[position:], strict=False)) if a != b),
                    min(len(draft), len(output) - position))
        drafted += len(draft)
        accepted += kept
        judged += min(len(draft), kept + 1)
        position += kept + 1
    emitted = len(output)
    assert 0 < accepted < drafted and judged < drafted, "precondition: accepted, rejected and unjudged drafts"
    view.show_run(as_run(greedy_events))
    text = re.sub(r"</?b>", "", view.figures.text())
    assert f"Acceptance: {format_percent(accepted / drafted)} of {drafted} drafts ({accepted} accepted, " \
           f"{drafted - accepted} rejected) · α = {accepted / judged:.2f} of the drafts the target judged" in text
    assert f"Mean accepted per round: {accepted / len(rounds):.2f} drafts · {emitted / len(rounds):.2f} tokens " \
           "per target call" in text
    # plain decoding: one pass per token (the prompt's gives the first); here one per round
    assert f"Target calls saved: {emitted - len(rounds)} = {emitted} plain ({emitted} tokens) − {len(rounds)} " \
           "speculative" in text
