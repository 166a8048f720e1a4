"""The constraint in the tokens view, read off what the view displays and compared with numbers computed here: a
fresh llguidance matcher fed the run's tokens gives each step's mask, and the model's own logits over the whole
output (one teacher-forced pass, softmax in float64 here) give the raw distribution. From those two:

- the candidates the mask forbids are the ones struck through (the chart's ✗ label, stroke and reason; the tooltip's
  <s> rows), and only those;
- the text's "mass removed" shading, the strip's cells (their colours' opacity, and the pixels drawn) and its rows
  (forced / overrode top / free) follow the raw mass removed and the raw top token;
- the summary's counts and cost equal Σ −ln(raw mass allowed) over the steps, as its text defines it;
- the JSON path in the tooltips names the key whose value is being written;
- a run saved before ``GrammarStep.forbidden`` still opens and strikes the same candidates;
- "Continue without the constraint from here" (the token's menu and the button) starts a child run that has no
  constraint, forces the parent's tokens before the step, and from there equals unconstrained greedy on the model.

The model is tiny and random, on the default model's tokenizer (test_grammar.py's), so the schema overrides it at
most steps and forces some."""

from __future__ import annotations

import dataclasses
import html
import json
import math
import re

import llguidance
import numpy as np
import pytest
import torch
from PySide6.QtGui import QColor, QTextCursor
from test_grammar import PERSON, _tiny_on, smol_tokenizer  # noqa: F401  (the fixture: the default model's tokenizer)

from playground.config import RunSettings
from playground.config.samplers.grammar import GrammarSettings, check_constraint
from playground.engine.samplers.grammar import ll_tokenizer
from playground.engine.sampling import run_sampling
from playground.events import TokenStep, dumps_event, event_from_dict
from playground.state import Session, chart_rows
from playground.state.json_path import json_place
from playground.traces import read_trace, write_trace

SCHEMA = GrammarSettings(json_schema=json.dumps(PERSON))
RED = QColor("#CC3311")  # the removed-mass colour the view documents (constraint.REMOVED_COLOR)


def _settings(group: GrammarSettings = SCHEMA, **flat) -> RunSettings:
    base = dict(prompt="Answer:", chat=False, strategy="greedy", max_new_tokens=40, num_candidates=10)
    return RunSettings.from_flat(**{**base, **flat}).with_group(group).validate()


@pytest.fixture(scope="module")
def lm(smol_tokenizer):  # noqa: F811
    return _tiny_on(smol_tokenizer)


def teacher_forced_probs(lm, prompt_ids, tokens) -> np.ndarray:
    """[steps, vocab] raw next-token distributions at the run's tokens, from one pass here (float64 softmax)."""
    ids = torch.tensor([list(prompt_ids) + list(tokens)])
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].double()
    return logits.softmax(dim=-1).numpy()


def fresh_masks(tokenizer, group: GrammarSettings, tokens) -> np.ndarray:
    """[steps, vocab] bool: what a fresh matcher allows before each of the run's tokens (bit i % 32 of word
    i // 32 is token i; the end token where the grammar accepts)."""
    vocab = len(tokenizer)
    # The library's tokenizer for it as the run built it (~2 s to build; cached), and a matcher of our own.
    ll_tok = ll_tokenizer(tokenizer, vocab, (tokenizer.eos_token_id,))
    matcher = llguidance.LLMatcher(ll_tok, check_constraint(group), log_level=0)
    out = np.zeros((len(tokens), vocab), dtype=bool)
    for i, token in enumerate(tokens):
        words = np.frombuffer(matcher.compute_bitmask(), dtype="<u4")
        out[i] = ((words[np.arange(vocab) // 32] >> (np.arange(vocab) % 32)) & 1).astype(bool)
        out[i, tokenizer.eos_token_id] = matcher.is_accepting()
        if not (token == tokenizer.eos_token_id and matcher.is_accepting()):
            assert matcher.consume_token(token), matcher.get_error()
    return out


@pytest.fixture(scope="module")
def constrained(lm):
    """One greedy schema run and its references: masks, raw probabilities, mass removed and allowed."""
    events = list(run_sampling(lm, _settings()))
    steps = [e for e in events if isinstance(e, TokenStep)]
    tokens = [s.token_id for s in steps]
    probs = teacher_forced_probs(lm, events[0].prompt_token_ids, tokens)
    masks = fresh_masks(lm.tokenizer, SCHEMA, tokens)
    removed = np.where(masks, 0.0, probs).sum(axis=1)
    allowed = np.where(masks, probs, 0.0).sum(axis=1)
    return dict(events=events, steps=steps, tokens=tokens, probs=probs, masks=masks, removed=removed,
                allowed=allowed)


def tokens_view(qtbot, events):
    from playground.ui.views.tokens.view import TokensView

    run = Session().add_saved_run(list(events), "test")
    view = TokensView()
    qtbot.addWidget(view)
    view.resize(1300, 700)
    view.show()
    view.show_run(run)
    return view, run


TIP_ROW = re.compile(r"<tr><td><code>(.*?)</code></td><td align=right>[^<]*</td><td align=right>[^<]*</td>"
                     r"<td>([^<]*)</td></tr>")


def check_struck(view, steps, masks) -> int:
    """Every charted step's rows and tooltip rows against the fresh mask; the number of struck rows seen."""
    struck_seen = 0
    text = view.token_view.text
    for i, step in enumerate(steps):
        view.show_chart_step(i)
        chart = view.chart
        ticks = dict(chart.plot.getPlotItem().getAxis("left")._tickLevels[0])
        labels = chart._value_labels.labels
        for row, r in enumerate(chart.rows[:-1]):
            forbidden = not masks[i, r.token_id]
            assert (row in chart.forbidden_rows) == forbidden, (i, r.token_id)
            assert ticks[row].startswith("✗ ") == forbidden, (i, ticks[row])
            assert (labels[2 * row + 1].text == "forbidden by the schema") == forbidden, (i, labels[2 * row + 1].text)
            struck_seen += forbidden
        stroke_y = sorted(chart._struck.opts["y"])
        assert len(stroke_y) == len(chart.forbidden_rows)
        assert stroke_y == pytest.approx(sorted(r - 0.18 for r in chart.forbidden_rows))  # through each raw bar
        cells = TIP_ROW.findall(text.tooltip_html(i))
        rows = chart_rows(step, 10)[:-1]
        assert len(cells) == len(rows)
        for (token, mark), r in zip(cells, rows, strict=True):
            forbidden = not masks[i, r.token_id]
            assert token.startswith("<s>") == forbidden and ("forbidden by the schema" in mark) == forbidden, (i, mark)
    return struck_seen


def test_the_candidates_the_mask_forbids_are_struck_through_with_the_reason(qtbot, constrained):
    view, _ = tokens_view(qtbot, constrained["events"])
    seen = check_struck(view, constrained["steps"], constrained["masks"])
    assert seen > 0 and seen < 10 * len(constrained["steps"])  # some shown candidates allowed, some forbidden
    assert "✗" in view.chart.legend.text() and "forbidden by the schema" in view.chart.legend.text()


def test_a_run_saved_before_the_forbidden_field_opens_and_strikes_the_same(qtbot, constrained, tmp_path):
    path = write_trace(constrained["events"], tmp_path / "run.jsonl")
    again = read_trace(path).events
    assert not read_trace(path).skipped and again == constrained["events"]  # the new fields round-trip
    old = []
    for event in constrained["events"]:
        plain = json.loads(dumps_event(event))
        if plain["type"] == "token":
            del plain["grammar"]["forbidden"], plain["grammar"]["allowed_mass"]
        old.append(event_from_dict(plain))
    old_steps = [e for e in old if isinstance(e, TokenStep)]
    assert all(s.grammar.forbidden is None and s.grammar.allowed_mass is None for s in old_steps)
    view, _ = tokens_view(qtbot, old)
    check_struck(view, old_steps, constrained["masks"])  # from the candidates' cuts (the chain has one stage)


def test_shading_strip_and_summary_follow_the_raw_mass_removed(qtbot, constrained):
    steps, probs, masks = constrained["steps"], constrained["probs"], constrained["masks"]
    removed, allowed = constrained["removed"], constrained["allowed"]
    n = len(steps)
    view, _ = tokens_view(qtbot, constrained["events"])
    forced = [i for i in range(n) if masks[i].sum() == 1]
    overrode = [i for i in range(n) if not masks[i, int(probs[i].argmax())]]
    free = [i for i in range(n) if i not in forced and i not in overrode]
    assert forced and overrode and free and 0 < removed.min() < 0.9 < removed.max()

    # The text in "mass removed" shading: each token's background is the red at an opacity of the mass removed.
    token_view = view.token_view
    token_view.mode.setCurrentIndex(token_view.mode.findData("constraint"))
    text = token_view.text
    for i in range(n):
        cursor = QTextCursor(text.document())
        cursor.setPosition(text._starts[i] + 1)
        color = cursor.charFormat().background().color()
        assert color.rgb() == RED.rgb() and abs(color.alpha() - 255 * removed[i]) <= 1.0, (i, color.alpha())

    # The strip: its rows, its cells' colours, and the pixels it draws.
    strip = view.constraint_strip
    assert strip.isVisible()
    assert (strip.marked["forced"], strip.marked["overrode"], strip.marked["free"]) == (forced, overrode, free)
    view.show_chart_step(free[0])  # the charted column is drawn yellow: read the others
    image = strip.grab().toImage()
    for row, (key, _, color) in enumerate(strip.ROWS):
        for i in strip.marked[key]:
            fill = strip.cell_color(key, i)
            assert fill.rgb() == QColor(color).rgb() and abs(fill.alpha() - 255 * removed[i]) <= 1.0, (key, i)
            if i == free[0] or strip.cell_rect(row, i).width() < 5:
                continue
            centre = strip.cell_rect(row, i).center()
            pixel = image.pixelColor(centre.x(), centre.y())
            over_white = [removed[i] * c + (1 - removed[i]) * 255 for c in QColor(color).getRgb()[:3]]
            assert np.allclose(pixel.getRgb()[:3], over_white, atol=3), (key, i, pixel.getRgb(), over_white)
    assert "overrode the model's top token" in strip.tooltip_at(overrode[0])

    # The summary: counts and Σ −ln(raw mass allowed), the cost its text defines.
    cost = float(np.sum(-np.log(allowed)))
    line = token_view.constraint_bar.label.text()
    assert "Σ −ln(1 − raw mass removed)" in line
    shown = re.search(r"top token at <b>(\d+)</b> of (\d+) steps · forced \(1 token allowed\) at <b>(\d+)</b> · "
                      r"cost <b>([\d.]+) nats</b>", line)
    assert shown is not None, line
    assert [int(shown[1]), int(shown[2]), int(shown[3])] == [len(overrode), n, len(forced)]
    assert float(shown[4]) == pytest.approx(cost, abs=0.006), (shown[4], cost)
    kept = re.search(r"probability e<sup>−([\d.]+)</sup> = ([\d.]+e[+-]\d+)", line)
    assert kept is not None and float(kept[1]) == float(shown[4])
    assert float(kept[2]) == pytest.approx(math.exp(-cost), rel=0.06)  # the chance the raw model kept to it


def test_the_tooltips_name_the_json_path_being_written(qtbot, constrained, lm):
    steps = constrained["steps"]
    view, _ = tokens_view(qtbot, constrained["events"])
    text = view.token_view.text
    output = "".join(s.text for s in steps)
    assert json.loads(output).keys() == PERSON["properties"].keys()
    checked = 0
    for i in range(len(steps)):
        before = "".join(s.text for s in steps[:i])
        tip, strip_tip = text.tooltip_html(i), view.constraint_strip.tooltip_at(i)
        shown = re.search(r"JSON path being written: <code>([^<]*)</code>", tip)[1]
        assert f"<code>{shown}</code>" in strip_tip
        path = html.unescape(shown)
        # by hand: the last key whose colon is written, while its value is (its own quote after a key's is text)
        keys = re.findall(r'"(name|age|pet|tags)":', before)
        if keys and before.rstrip().endswith(tuple(f'"{k}":' for k in keys[-1:])):
            assert path.startswith(f"$.{keys[-1]}"), (before, path)
            checked += 1
        if before.endswith('"tags":["'):
            assert path == "$.tags[0]", path
        assert path == json_place(before).describe()
    assert checked >= 2
    # A regex run has no JSON path.
    events = list(run_sampling(lm, _settings(GrammarSettings(regex="[a-z]{3}"), max_new_tokens=4)))
    view, _ = tokens_view(qtbot, events)
    assert view.constraint_strip.isVisible() and "JSON path" not in view.token_view.text.tooltip_html(0)
    assert "forbidden by the regex" in view.token_view.text.tooltip_html(0)


def test_continue_without_the_constraint_from_a_step(qtbot, tmp_path, lm):
    from PySide6.QtCore import Qt
    from windows import let_go, open_window

    settings = _settings(max_new_tokens=12)  # the schema unfinished: enough steps to branch from
    w = open_window(qtbot, tmp_path, lm, settings)
    try:
        w.set_run_settings(settings)
        qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: not w.busy and w.session.runs and w.session.runs[-1].finished is not None,
                        timeout=60_000)
        parent = w.session.runs[-1]
        tokens = [s.token_id for s in parent.steps]
        view = w.views["tokens"]
        overrode = [i for i, s in enumerate(parent.steps) if s.grammar.top_forbidden and i >= 3]
        children = []
        # From the token's menu at one step, from the button at another (the charted step).
        for how, step in (("menu", overrode[0]), ("button", overrode[1])):
            if how == "menu":
                menu = view.token_view.text.alternatives_menu(step)
                action = next(a for a in menu.actions() if a.text() == "Continue without the constraint from here")
                action.trigger()
            else:
                w.select_run(parent.index)
                view.show_chart_step(step)
                assert view.token_view.constraint_bar.isVisible()
                view.token_view.constraint_bar.button.click()
            runs = len(children) + 2
            qtbot.waitUntil(lambda: len(w.session.runs) == runs and not w.busy  # noqa: B023 (waited on here)
                            and w.session.runs[-1].finished is not None, timeout=60_000)
            child = w.session.runs[-1]
            children.append(child)
            assert child.branch.parent == parent.index and child.branch.step == step
            assert not child.settings.group(GrammarSettings).active()
            assert all(s.grammar is None for s in child.steps)
            assert dataclasses.replace(child.settings, forced_token_ids=(), groups=()) == dataclasses.replace(
                parent.settings, forced_token_ids=(), groups=())  # the same settings but the constraint
            assert child.settings.groups == tuple(g for g in parent.settings.groups
                                                  if not isinstance(g, GrammarSettings))
            child_tokens = [s.token_id for s in child.steps]
            assert child_tokens[:step] == tokens[:step]
            assert all(s.forced for s in child.steps[:step]) and not any(s.forced for s in child.steps[step:])
            # From the step on: unconstrained greedy on the model (argmax of a fresh pass), starting from the raw
            # top token the schema had forbidden there.
            probs = teacher_forced_probs(lm, child.started.prompt_token_ids, child_tokens)
            assert child_tokens[step:] == [int(probs[i].argmax()) for i in range(step, len(child_tokens))]
            assert child_tokens[step] != tokens[step]
            assert not view.constraint_strip.isVisible() and not view.token_view.constraint_bar.isVisible()
        assert w.runs_list.count() == 3
    finally:
        let_go(w)
