"""The what-if in the window: a finished sample run on the tiny model, the switch on, the form's top-k, temperature,
top-p, repetition penalty and order changed. What the tokens view shows (the chart's bar widths, the tooltip's
percentages, the struck-through tokens, the strip's marks) equals a re-derivation computed here by hand: softmax of
the model's logits at the run's tokens (teacher forcing) with the chain applied in the test, not by
``state/what_if.py``. Switching off draws the run's own numbers again; "Continue from here with these settings"
starts a child run forcing the run's tokens before the charted step, with the new settings."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from windows import let_go, open_window

from playground.config import RunSettings
from playground.state import chart_rows

WAIT_MS = 30000
RUN = RunSettings(prompt="one two three four", chat=False, strategy="sample", temperature=1.2, seed=5,
                  max_new_tokens=14, num_candidates=10)


def teacher_forced_logits(lm, prompt_ids, tokens) -> np.ndarray:
    ids = torch.tensor([list(prompt_ids) + list(tokens)])
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0, len(prompt_ids) - 1: -1].double()
    return logits.numpy()  # [steps, vocab]


def hand_chain(logits: np.ndarray, context: list[int], chain: list[tuple[str, float]]) -> np.ndarray:
    """Processed probabilities [vocab] of one step: each sampler as the engine documents it, in order."""
    x = logits.copy()
    for name, value in chain:
        if name == "repetition_penalty":
            seen = np.array(sorted(set(context)))
            x[seen] = np.where(x[seen] > 0, x[seen] / value, x[seen] * value)
        elif name == "temperature":
            x = x / value
        elif name == "top_k":
            kth = np.sort(x)[-int(value)]
            x = np.where(x < kth, -np.inf, x)
        elif name == "top_p":  # ascending cumulative probability <= 1 - p removed, the likeliest always kept
            p = np.exp(x - x.max())
            p /= p.sum()
            order = np.argsort(p, kind="stable")
            remove = np.cumsum(p[order]) <= 1 - value
            remove[-1] = False
            x[order[remove]] = -np.inf
    p = np.exp(x - x.max())
    return p / p.sum()


def reference(logits, prompt_ids, tokens, chain) -> np.ndarray:
    return np.stack([hand_chain(logits[i], [*prompt_ids, *tokens[:i]], chain) for i in range(len(tokens))])


def set_form(w, qtbot, **values) -> None:
    """Edit the form's widgets as a user does, then wait for the debounced re-derivation."""
    view = w.views["tokens"]
    before = view.what_if_state.what_if if view.what_if_state is not None else None
    for name, value in values.items():
        widget = w.controls.widgets[name]
        if name == "samplers":
            widget.set_text(value)
            widget.order_changed.emit()
        else:
            widget.setValue(value)
    qtbot.waitUntil(lambda: view.what_if is not None and view.what_if is not before, timeout=5000)


def chart_numbers(view) -> dict[int, float | None]:
    """Token id -> the processed bar's width in percent, None where the chart marks it cut."""
    widths = view.chart._processed.opts["width"]
    return {r.token_id: (None if r.cut_by else widths[i]) for i, r in enumerate(view.chart.rows[:-1])}


def tooltip_processed(html_text: str) -> list[str]:
    """The processed column of the tooltip's candidate rows, in order."""
    cells = re.findall(r"<tr><td><code>.*?</code></td><td align=right>[^<]*</td><td align=right>([^<]*)</td>",
                       html_text)
    return [c.replace("&lt;", "<") for c in cells]


def percent_close(text: str, prob: float) -> bool:
    """A displayed percentage ("12.3%", "0.43%", "<0.01%", "—" for cut) against a probability."""
    if text == "—":
        return prob == 0
    if text.startswith("<"):
        return 0 < prob < 1e-4
    number = text.rstrip("%")
    decimals = len(number.split(".")[1]) if "." in number else 0
    return abs(float(number) - prob * 100) <= 0.5 * 10 ** -decimals + 1e-3 * prob * 100


def struck_steps(text) -> set[int]:
    return {text._starts.index(s.cursor.selectionStart()) for s in text.extraSelections()
            if s.format.fontStrikeOut()}


def check_view(view, run, ref, tokens):
    """The chart at several steps, their tooltips, the text's cut tokens and the strip's marks against ``ref``."""
    text = view.token_view.text
    for i in range(len(tokens)):
        view.show_chart_step(i)
        for token_id, width in chart_numbers(view).items():
            if width is None:
                assert ref[i, token_id] == 0, (i, token_id)
            else:
                assert width == pytest.approx(100 * ref[i, token_id], rel=2e-3, abs=1e-6), (i, token_id)
        tip = text.tooltip_html(i)
        assert "what-if (display only)" in tip
        shown = tooltip_processed(tip)
        rows = chart_rows(run.steps[i], 10)[:-1]
        assert len(shown) == len(rows)
        for cell, row in zip(shown, rows, strict=True):
            assert percent_close(cell, ref[i, row.token_id]), (i, row.token_id, cell, ref[i, row.token_id])
    cut = {i for i, t in enumerate(tokens) if ref[i, t] == 0}
    assert struck_steps(text) == cut
    assert view.strip.marked["cut"] == sorted(cut)
    greedy = [i for i, t in enumerate(tokens) if int(np.argmax(ref[i])) != t]
    assert view.strip.marked["greedy"] == greedy
    assert view.strip.inexact == []  # each chain here cuts within the recorded candidates: exact at every step
    return cut, greedy


def test_what_if_chart_tooltips_text_and_strip_equal_a_hand_derivation(qtbot, tiny_lm, tmp_path):
    w = open_window(qtbot, tmp_path, tiny_lm, RUN)
    try:
        w.generate()
        qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
        run = w.session.selected
        view = w.views["tokens"]
        tokens = [s.token_id for s in run.steps]
        prompt = list(run.started.prompt_token_ids)
        logits = teacher_forced_logits(tiny_lm, prompt, tokens)
        own = reference(logits, prompt, tokens, [("temperature", 1.2)])
        index = view.chart_index
        before = list(view.chart._processed.opts["width"])
        for token_id, width in chart_numbers(view).items():  # the run's own numbers, before the switch
            assert width == pytest.approx(100 * own[index, token_id], rel=1e-4)

        view.what_if_switch.setChecked(True)
        assert view.what_if is not None and "what-if: display only" in view.chart.header.text()

        # Top-k and temperature (transformers' order: temperature, then top-k).
        set_form(w, qtbot, top_k=4, temperature=0.7)
        assert "top-k" in view.chart.header.text() and "0.7" in view.chart.header.text()
        ref = reference(logits, prompt, tokens, [("temperature", 0.7), ("top_k", 4)])
        cut, _ = check_view(view, run, ref, tokens)
        assert cut and len(cut) < len(tokens)  # some of the run's tokens fall outside the top 4, not all

        # Top-p against temperature in both orders: the kept sets differ, and each equals its order by hand.
        # (The nucleus of 0.3 lies well inside the recorded 256 candidates: every step exact.)
        set_form(w, qtbot, top_k=0, top_p=0.3, temperature=0.7)
        ref_default = reference(logits, prompt, tokens, [("temperature", 0.7), ("top_p", 0.3)])
        check_view(view, run, ref_default, tokens)
        set_form(w, qtbot, samplers="top_p;temperature;top_k")
        ref_order = reference(logits, prompt, tokens, [("top_p", 0.3), ("temperature", 0.7)])
        check_view(view, run, ref_order, tokens)
        assert ((ref_order > 0) != (ref_default > 0)).any()
        assert "top_p → temperature → top_k" in view.what_if_note.toolTip()

        # A repetition penalty moves greedy's pick at some steps.
        set_form(w, qtbot, samplers="", top_p=1.0, top_k=5, repetition_penalty=3.0, temperature=1.0)
        ref_penalty = reference(logits, prompt, tokens, [("repetition_penalty", 3.0), ("top_k", 5)])
        _, greedy = check_view(view, run, ref_penalty, tokens)
        assert greedy

        # No cut within the recorded candidates (320-token vocabulary, 256 recorded): every step an estimate.
        set_form(w, qtbot, top_k=0, repetition_penalty=1.0, temperature=1.5)
        assert view.strip.inexact == list(range(len(tokens)))
        assert "not exact" in view.strip.tooltip_at(0)

        # Off: the run's own numbers, exactly as before; no marks, no what-if in the tooltips.
        view.what_if_switch.setChecked(False)
        view.show_chart_step(index)
        assert list(view.chart._processed.opts["width"]) == before
        assert struck_steps(view.token_view.text) == set()
        assert "what-if" not in view.token_view.text.tooltip_html(index)
        assert "what-if" not in view.chart.header.text()
        view.what_if_switch.setChecked(True)
        set_form(w, qtbot, top_k=4, temperature=0.7)
        view.resize(1100, 560)
        view.grab().save(str(tmp_path / "what-if.png"))
    finally:
        let_go(w)


def test_continue_from_here_branches_with_the_new_settings(qtbot, tiny_lm, tmp_path):
    w = open_window(qtbot, tmp_path, tiny_lm, RUN)
    try:
        w.generate()
        qtbot.waitUntil(lambda: not w.busy, timeout=WAIT_MS)
        parent = w.session.selected
        view = w.views["tokens"]
        view.what_if_switch.setChecked(True)
        set_form(w, qtbot, top_k=3, temperature=0.8)
        step = 5
        view.show_chart_step(step)
        assert view.continue_button.isEnabled()
        view.continue_button.click()
        qtbot.waitUntil(lambda: len(w.session.runs) == 2 and not w.busy, timeout=WAIT_MS)
        child = w.session.runs[1]
        tokens = [s.token_id for s in parent.steps]
        assert child.branch.parent == parent.index and child.branch.step == step
        assert child.settings.forced_token_ids == tuple(tokens[:step])
        assert (child.settings.top_k, child.settings.temperature, child.settings.seed) == (3, 0.8, RUN.seed)
        assert [s.token_id for s in child.steps[:step]] == tokens[:step]
        assert all(s.forced for s in child.steps[:step]) and not any(s.forced for s in child.steps[step:])
        assert w.runs_list.count() == 2
        # From the step on, the child decodes under the new chain: each of its tokens is among the top 3.
        child_tokens = [s.token_id for s in child.steps]
        logits = teacher_forced_logits(tiny_lm, child.started.prompt_token_ids, child_tokens)
        for i in range(step, len(child_tokens)):
            assert child_tokens[i] in np.argsort(logits[i])[-3:]
    finally:
        let_go(w)
