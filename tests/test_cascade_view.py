"""The cascade view and its Qt-free state, on real engine runs of tiny models (and one on the default model).

What the view shows is checked against what is read here from the events themselves: the colour of every token,
the escalation marks, the confidence strip's bars, the threshold and the figures.
"""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QImage, QTextCursor
from windows import open_window

from playground.config import CascadeSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.events import TokenStep
from playground.events.cascade import CHEAP, FORCED, FULL, CascadeResponse, CascadeStep
from playground.state import Run, flowing_token_text
from playground.state.cascade import DISCARDED, CascadeState
from playground.traces import read_trace, write_trace
from playground.ui.style import configure_pyqtgraph, format_percent
from playground.ui.views.cascade import COLORS, ESCALATION_MARK, CascadeView

RUN_TIMEOUT_MS = 20000


def cascade(**options) -> RunSettings:
    options = {"strategy": "cascade", "prompt": "Hello", "max_new_tokens": 30, "cheap": "layers", "cheap_layers": 1,
               "cascade_compare": True, **options}
    return RunSettings.from_flat(**options)


@pytest.fixture(scope="module")
def token_events(tiny_lm) -> list:
    """Per token at a threshold in the middle of the first layer's confidences: many hand-overs; a forced start."""
    return list(run_strategy(tiny_lm, cascade(cascade_threshold=0.12, forced_token_ids=(100,))))


@pytest.fixture(scope="module")
def rewritten_events(tiny_lm) -> list:
    """Per response, thrown away: the cheap response, the verdict, the full model's own response."""
    return list(run_strategy(tiny_lm, cascade(cascade_unit="response", cascade_threshold=1.0, max_new_tokens=12)))


@pytest.fixture(scope="module")
def kept_events(tiny_lm) -> list:
    return list(run_strategy(tiny_lm, cascade(cascade_unit="response", cascade_threshold=0.0, max_new_tokens=12)))


@pytest.fixture
def view(qtbot) -> CascadeView:
    configure_pyqtgraph()
    v = CascadeView()
    qtbot.addWidget(v)
    v.resize(1200, 700)
    v.show()
    return v


def steps_of(events: list) -> list[CascadeStep]:
    return [e for e in events if isinstance(e, CascadeStep)]


def expected_marks(events: list) -> list[tuple[str, str, bool]]:
    """(kind, text, escalation point) of every token in reading order, from the events."""
    steps = steps_of(events)
    verdicts = [e for e in events if isinstance(e, CascadeResponse)]
    if verdicts and verdicts[0].escalated:
        drafts = [(DISCARDED, s.text, False) for s in steps if s.draft]
        output = [s for s in steps if not s.draft]
    else:
        drafts, output = [], steps
    marks, previous = list(drafts), None
    for s in output:
        marks.append((s.producer, s.text, s.producer == FULL and previous != FULL))
        previous = s.producer
    return marks


def document_marks(view: CascadeView) -> list[tuple[str, QColor, bool, bool]]:
    """(text, foreground, struck out, preceded by ▲) of every drawn token, read back from the document."""
    out = []
    doc = view.text.document()
    plain = doc.toPlainText()
    for start, end in zip(view.text.starts, view.text.ends, strict=True):
        cursor = QTextCursor(doc)
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        probe = QTextCursor(doc)
        probe.setPosition(start + 1)  # the format of the token's first character
        fmt = probe.charFormat()
        before = plain[:start].rstrip(" \n\u2029")
        out.append((cursor.selectedText(), fmt.foreground().color(), fmt.fontStrikeOut(),
                    before.endswith(ESCALATION_MARK)))
    return out


def test_the_runs_cover_what_the_view_must_show(token_events, rewritten_events, kept_events):
    producers = [s.producer for s in steps_of(token_events)]
    assert {CHEAP, FULL, FORCED} <= set(producers)
    assert sum(a != FULL and b == FULL for a, b in itertools.pairwise(producers)) >= 3
    assert [e.escalated for e in rewritten_events if isinstance(e, CascadeResponse)] == [True]
    assert [e.escalated for e in kept_events if isinstance(e, CascadeResponse)] == [False]


@pytest.mark.parametrize("fixture", ["token_events", "rewritten_events", "kept_events"])
def test_every_token_is_drawn_once_in_the_colour_of_its_model(fixture, request, view):
    events = request.getfixturevalue(fixture)
    view.show_run(Run.from_events(events))
    expected = expected_marks(events)
    shown = document_marks(view)
    assert len(shown) == len(expected)
    for (kind, text, escalation), (shown_text, colour, struck, marked) in zip(expected, shown, strict=True):
        assert colour == QColor(COLORS[kind]), (kind, text)
        assert struck == (kind == DISCARDED)
        assert marked == escalation, (kind, text)
        flowing = flowing_token_text(text) or "·"
        assert shown_text.replace("\u2029", "\n") == (flowing.replace("\n", "") if kind == DISCARDED else flowing)
    # Without the escalation marks (and a thrown-away response), the document is exactly the output.
    tokens = [e for e in events if isinstance(e, TokenStep)]
    document = view.text.toPlainText()
    output_start = view.text.starts[len(expected) - len(tokens)]
    assert document[output_start:].replace(ESCALATION_MARK, "") == "".join(
        flowing_token_text(t.text) or "·" for t in tokens)


@pytest.mark.parametrize("fixture", ["token_events", "rewritten_events"])
def test_the_strip_is_the_cheap_models_confidence_with_the_threshold(fixture, request, view):
    events = request.getfixturevalue(fixture)
    view.show_run(Run.from_events(events))
    steps = steps_of(events)
    per_response = any(s.draft for s in steps)
    shown_steps = [s for s in steps if s.draft] if per_response else steps
    for kind in COLORS:
        if per_response:  # the thrown-away response's confidences
            mine = shown_steps if kind == DISCARDED else []
        else:
            mine = [s for s in shown_steps if s.producer == kind]
        bars = view.bars[kind].opts
        assert list(bars["x"]) == [s.step for s in mine]
        assert list(bars["height"]) == pytest.approx([s.cheap_prob for s in mine])
    threshold = events[1].threshold
    assert view.threshold_line.value() == threshold
    if per_response:
        (verdict,) = [e for e in events if isinstance(e, CascadeResponse)]
        assert verdict.escalated
        probs = [s.cheap_prob for s in shown_steps]
        assert view.mean_line.isVisible() and view.mean_line.value() == pytest.approx(sum(probs) / len(probs))
        assert "thrown away" in view.figures.text()
        assert len(view.escalation_marks.data) == 0
    else:
        producers = [s.producer for s in steps]
        escalations = [s.step for i, s in enumerate(steps) if s.producer == FULL and (i == 0 or producers[i - 1]
                                                                                      != FULL)]
        assert list(view.escalation_marks.data["x"]) == escalations
        # Figures: tokens by the full model, its share and the escalations, counted here.
        full = producers.count(FULL)
        text = view.figures.text()
        assert f"Full model: <b>{full}</b> of {len(steps)} tokens" in text
        assert f"in {len(escalations)} escalations" in text
        assert "first divergence" in text and "tokens/s" in text


def test_the_folds_counts_equal_a_count_from_the_events(token_events):
    state = CascadeState()
    for event in token_events:
        state.apply(event)
    steps = steps_of(token_events)
    assert state.output == steps and state.counts == {k: sum(s.producer == k for s in steps)
                                                      for k in (CHEAP, FULL, FORCED)}
    assert state.full_passes == sum(s.full_read > 0 for s in steps) == token_events[-1].figures["full_passes"]
    assert state.full_share == pytest.approx(token_events[-1].figures["full_share"])
    assert state.escalations == token_events[-1].figures["escalations"]


def test_a_saved_trace_gives_the_same_view_as_live(token_events, tmp_path, qtbot, view):
    run = Run(index=0, settings=Run.from_events(token_events).settings)
    seen_live = False
    for start in range(0, len(token_events), 4):  # live: small batches, as the window sends them
        batch = token_events[start : start + 4]
        for event in batch:
            run.apply(event)
        view.apply(run, batch)
        view.flush()
        assert view.text.drawn == len(view.state.marks)  # the text follows every batch
        if len(view.state.output) >= 8 and not seen_live:  # the strip and figures at most every LIVE_DRAW_MS
            qtbot.waitUntil(lambda: "come at the end of the run" in view.figures.text(), timeout=2000)
            seen_live = True
    view.end(run)
    assert seen_live
    live_text = view.text.toPlainText()
    live_bars = {kind: list(bars.opts["height"]) for kind, bars in view.bars.items()}
    live_figures = view.figures.text()

    write_trace(token_events, tmp_path / "cascade.jsonl")
    saved = read_trace(tmp_path / "cascade.jsonl")
    assert not saved.skipped and not saved.truncated
    again = CascadeView()
    qtbot.addWidget(again)
    again.show_run(Run.from_events(saved.events))
    assert again.state.marks == view.state.marks and again.state.figures == view.state.figures
    assert again.text.toPlainText() == live_text
    assert {kind: list(bars.opts["height"]) for kind, bars in again.bars.items()} == live_bars
    assert again.figures.text() == live_figures


def test_a_streamed_per_response_verdict_restyles_the_drawn_response(rewritten_events, view):
    run = Run(index=0, settings=Run.from_events(rewritten_events).settings)
    verdict = next(i for i, e in enumerate(rewritten_events) if isinstance(e, CascadeResponse))
    for event in rewritten_events[:verdict]:
        run.apply(event)
    view.apply(run, rewritten_events[:verdict])
    view.flush()
    drafts = [s for s in steps_of(rewritten_events) if s.draft]
    assert [colour for _, colour, _, _ in document_marks(view)] == [QColor(COLORS[CHEAP])] * len(drafts)
    for event in rewritten_events[verdict:]:
        run.apply(event)
    view.apply(run, rewritten_events[verdict:])
    view.flush()
    view.end(run)
    kinds = [(colour, struck) for _, colour, struck, _ in document_marks(view)]
    assert kinds[: len(drafts)] == [(QColor(COLORS[DISCARDED]), True)] * len(drafts)
    assert kinds[len(drafts) :] == [(QColor(COLORS[FULL]), False)] * (len(kinds) - len(drafts))


def test_the_window_shows_the_cascade_view_and_the_tokens_view(qtbot, tmp_path, tiny_lm):
    w = open_window(qtbot, tmp_path, tiny_lm, cascade(max_new_tokens=10, cascade_threshold=0.12))
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=RUN_TIMEOUT_MS)
    run = w.session.runs[0]
    assert run.finished is not None and run.error is None
    for name in ("cascade", "tokens"):
        assert w.docks[name].pages.currentWidget() is w.views[name]
    assert w.views["cascade"].state.output == steps_of(run.events)
    assert w.views["tokens"].token_view.steps == run.steps


def colour_share(image: QImage, colour: str) -> float:
    image = image.convertToFormat(QImage.Format.Format_RGB888)
    width, height = image.width(), image.height()
    pixels = np.frombuffer(image.constBits(), np.uint8).reshape(height, image.bytesPerLine())[:, : width * 3]
    rgb = pixels.reshape(height, width, 3).astype(int)
    c = QColor(colour)
    return float((np.abs(rgb - np.array([c.red(), c.green(), c.blue()])).sum(axis=2) < 30).mean())


@pytest.mark.model
def test_the_preset_on_the_default_model_mixes_both_models_and_is_pictured(default_lm, tmp_path):
    """On SmolLM2 with its int4 copy: threshold 1 is the full model's own greedy output; the preset (threshold 0.5)
    hands many tokens to each model, and its picture shows both colours."""
    from playground.presets import load_preset
    from playground.ui.screenshot import render_trace

    preset = load_preset("cascade")
    always_settings = preset.settings.with_group(
        dataclasses.replace(preset.settings.group(CascadeSettings), cascade_threshold=1.0))
    always = list(run_strategy(default_lm, always_settings.replace(max_new_tokens=12)))
    greedy = list(run_strategy(default_lm, preset.settings.replace(strategy="greedy", max_new_tokens=12)))
    assert always[-1].token_ids == greedy[-1].token_ids and always[-1].figures["identical_fraction"] == 1.0

    # (The comparison with the full model alone is checked on the tiny models; here it would double the time.)
    events = list(run_strategy(default_lm, preset.settings.with_group(
        dataclasses.replace(preset.settings.group(CascadeSettings), cascade_compare=False))))
    producers = [s.producer for s in steps_of(events)]
    assert producers.count(CHEAP) >= 20 and producers.count(FULL) >= 20  # what the preset says it shows
    write_trace(events, tmp_path / "cascade.jsonl")
    out, problems = render_trace(tmp_path / "cascade.jsonl", tmp_path / "cascade.png", view="cascade")
    image = QImage(str(out))
    assert not problems and image.width() > 800 and image.height() > 450
    for colour in (COLORS[CHEAP], COLORS[FULL]):  # the two models, in the text and the strip
        assert colour_share(image, colour) > 0.005, colour


def test_the_figures_say_how_much_agrees_with_the_full_model_alone_computed_here(tiny_lm, token_events, view):
    """The share of output tokens identical to the full model's own greedy output (generate() here, after the same
    forced start) and where they first differ; the full model's share of the tokens."""
    import torch

    prompt = list(token_events[0].prompt_token_ids)
    forced = [100]
    ids = torch.tensor([prompt + forced])
    alone = forced + tiny_lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                            max_new_tokens=29, min_new_tokens=29,
                                            pad_token_id=tiny_lm.tokenizer.pad_token_id)[0, ids.shape[1]:].tolist()
    output = list(token_events[-1].token_ids)
    assert len(output) == len(alone) == 30
    same = [a == b for a, b in zip(output, alone, strict=True)]
    assert 0 < sum(same) < len(same) and sum(same) != len(same) / 2, "precondition: a share that is not its inverse"
    first = same.index(False)
    view.show_run(Run.from_events(token_events))
    text = view.figures.text()
    assert f"<b>{format_percent(sum(same) / len(same))}</b> of tokens identical · first divergence: " \
           f"<b>token {first}</b>" in text
    full = sum(s.producer == FULL for s in steps_of(token_events))
    assert 0 < full < len(output)
    assert f"Full model: <b>{full}</b> of {len(output)} tokens (<b>{format_percent(full / len(output))}</b>)" in text
