"""The side-by-side component, the compare view and the quantization lab's view, on real runs of a tiny model.

What the panes mark is checked against the token ids of the events, compared here independently; what the plots
draw against the events' own numbers; a saved trace draws exactly what the live run drew.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from windows import open_window

from playground.config import CompareSettings, QuantSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.events.panes import PaneFinished, PaneStarted, PaneToken
from playground.events.quant import QuantReady, QuantStep, QuantSummary, QuantTable
from playground.state import Run
from playground.state.panes import PanesState
from playground.traces import read_trace, write_trace
from playground.ui.style import configure_pyqtgraph
from playground.ui.views import view_names
from playground.ui.views.compare import CompareView
from playground.ui.views.quant import QuantView
from playground.ui.views.side_by_side import (
    AFTER,
    DIFFERS_BG,
    DIVERGES,
    PLAIN,
    SideBySidePanes,
    pane_pieces,
)


def _pane_events(ref: list[int], other: list[int]) -> list:
    """Hand-made pane events: two panes with these token ids (text "<id>" each)."""
    events: list = [PaneStarted(pane=p, label=f"p{p}", summary="", strategy="greedy", model_name="m") for p in (0, 1)]
    for step in range(max(len(ref), len(other))):
        for pane, ids in ((0, ref), (1, other)):
            if step < len(ids):
                events.append(PaneToken(pane=pane, step=step, token_id=ids[step], text=f"<{ids[step]}>", prob=0.5,
                                        step_ms=1.0))
    for pane, ids in ((0, ref), (1, other)):
        events.append(PaneFinished(pane=pane, token_ids=tuple(ids), text="".join(f"<{i}>" for i in ids),
                                   stop_reason="eos", tokens_per_s=1.0, decode_ms=1.0))
    return events


def _state(events) -> PanesState:
    state = PanesState()
    for event in events:
        state.apply(event)
    return state


def test_the_panes_mark_differences_and_the_first_divergence():
    state = _state(_pane_events([1, 2, 3, 4, 5], [1, 2, 9, 4, 7]))
    assert state.divergence == [None, 2]
    assert pane_pieces(state, 1) == [("<1>", PLAIN), ("<2>", PLAIN),  # the shared start is plain
                                     ("<9>", DIVERGES),
                                     ("<4>", AFTER), ("<7>", AFTER)]  # after the divergence: grey, not tinted
    assert {mark for _, mark in pane_pieces(state, 0)} == {PLAIN}


def test_marks_drawn_early_are_redrawn_when_the_reference_comes_late(qtbot):
    """A beam reference has no token events: the other pane's tokens are drawn tinted at first (nothing to compare
    with), and must be redrawn plain, with the divergence, once the reference's text comes at its end."""
    events = [PaneStarted(pane=p, label=f"p{p}", summary="", strategy="greedy", model_name="m") for p in (0, 1)]
    events += [PaneToken(pane=1, step=s, token_id=t, text=f"<{t}>", prob=0.5, step_ms=1.0)
               for s, t in enumerate([1, 2, 9])]
    events += [PaneFinished(pane=p, token_ids=ids, text="".join(f"<{i}>" for i in ids), stop_reason="eos",
                            tokens_per_s=1.0, decode_ms=1.0) for p, ids in ((1, (1, 2, 9)), (0, (1, 2, 3)))]
    live_state = PanesState()
    live = SideBySidePanes(live_state)
    qtbot.addWidget(live)
    for event in events:  # drawn after every event, as a stream is
        live_state.apply(event)
        live.refresh()
    whole = SideBySidePanes(_state(events))
    qtbot.addWidget(whole)
    whole.refresh()
    assert live.columns[1].text.toHtml() == whole.columns[1].text.toHtml()
    assert pane_pieces(live_state, 1) == [("<1>", PLAIN), ("<2>", PLAIN), ("<9>", DIVERGES)]
    assert DIFFERS_BG.lower() not in live.columns[1].text.toHtml().lower()


def test_a_pane_that_ends_early_diverges_where_it_ended():
    state = _state(_pane_events([1, 2, 3, 4], [1, 2]))
    assert state.divergence == [None, 2]
    same = _state(_pane_events([1, 2, 3], [1, 2, 3]))
    assert same.divergence == [None, None]


def compare_events(tiny_lm) -> list:
    settings = RunSettings(strategy="compare", prompt="Once upon", max_new_tokens=12,
                           groups=(CompareSettings(panes=("greedy", "sample --temperature 1.5 --seed 4")),))
    return list(run_strategy(tiny_lm, settings))


@pytest.fixture
def compare_view(qtbot) -> CompareView:
    configure_pyqtgraph()
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(1400, 800)
    view.show()
    return view


def shown(view: CompareView) -> dict:
    table = [[view.table.item(r, c).text() for c in range(view.table.columnCount())]
             for r in range(view.table.rowCount())]
    return {"panes": [c.text.toHtml() for c in view.panes.columns if c.isVisible()],
            "titles": [c.title.text() for c in view.panes.columns if c.isVisible()], "table": table}


def test_the_compare_view_live_equals_its_saved_trace(qtbot, tiny_lm, compare_view, tmp_path):
    events = compare_events(tiny_lm)
    run = Run(index=0, settings=Run.from_events(events).settings)
    for start in range(0, len(events), 4):
        batch = events[start : start + 4]
        for event in batch:
            run.apply(event)
        compare_view.apply(run, batch)
        compare_view.flush()
    compare_view.end(run)
    live = shown(compare_view)
    done = [e for e in events if isinstance(e, PaneFinished)]
    assert live["table"][2] == [f"{d.figures['tokens']:.0f}" for d in done]
    assert live["table"][3] == [f"{d.figures['log_likelihood']:.1f}" for d in done]
    write_trace(events, tmp_path / "compare.jsonl")
    again = CompareView()
    qtbot.addWidget(again)
    again.resize(1400, 800)
    again.show()
    again.show_run(Run.from_events(read_trace(tmp_path / "compare.jsonl").events))
    assert shown(again) == live


def test_the_compare_view_exports_the_comparison_as_json(tiny_lm, compare_view, tmp_path):
    events = compare_events(tiny_lm)
    compare_view.show_run(Run.from_events(events))
    path = compare_view.export(tmp_path / "comparison.json")
    data = json.loads(path.read_text())
    done = [e for e in events if isinstance(e, PaneFinished)]
    assert [p["token_ids"] for p in data["panes"]] == [list(d.token_ids) for d in done]
    assert [p["label"] for p in data["panes"]] == ["greedy", "sample --temperature 1.5 --seed 4"]
    assert data["prompt"] == events[0].prompt_text
    assert compare_view.export(tmp_path / "comparison.png").stat().st_size > 0


@pytest.fixture
def quant_view(qtbot) -> QuantView:
    configure_pyqtgraph()
    view = QuantView()
    qtbot.addWidget(view)
    view.resize(1400, 900)
    view.show()
    return view


def test_the_quant_view_draws_the_runs_numbers(tiny_lm, quant_view):
    settings = RunSettings(prompt="Once upon", max_new_tokens=12,
                           groups=(QuantSettings(quant="rtn-int4", group_size=32, compare=True),))
    events = list(run_strategy(tiny_lm, settings))
    run = Run.from_events(events)
    assert quant_view.applies_to(run) and quant_view.wants_front(run)
    quant_view.show_run(run)
    steps = [e for e in events if isinstance(e, QuantStep)]
    heights = quant_view.kl_bars.opts["height"]
    assert np.allclose(heights, [s.kl for s in steps])
    xs, _ = quant_view.disagree.getData()
    assert list(xs) == [s.step for s in steps if not s.top1_agrees]
    ready = next(e for e in events if isinstance(e, QuantReady))
    layer0 = [e.relative_error for e in ready.layer_errors if e.name.split(".")[-1] == "q_proj"]
    assert np.allclose(quant_view.error_curves["q_proj"].getData()[1], layer0)
    table = next(e for e in events if isinstance(e, QuantTable))
    assert quant_view.table.rowCount() == len(table.rows)
    assert quant_view.table.item(0, 0).text() == "reference"
    summary = next(e for e in events if isinstance(e, QuantSummary))
    assert f"mean KL <b>{summary.kl_mean:.4f}</b>" in quant_view.figures.text()
    assert "rtn-int4" in quant_view.header.text()


def test_views_are_registered_and_pick_their_runs(tiny_lm, quant_view, compare_view):
    assert {"compare", "quant"} <= set(view_names())
    plain = Run.from_events(list(run_strategy(tiny_lm, RunSettings(prompt="Hi", max_new_tokens=2))))
    assert not quant_view.applies_to(plain) and not compare_view.applies_to(plain)
    side = Run.from_events(compare_events(tiny_lm))
    assert compare_view.applies_to(side) and not quant_view.applies_to(side)


def test_the_window_builds_the_copy_with_progress_and_shows_the_lab(qtbot, tmp_path, tiny_lm):
    from PySide6.QtCore import Qt

    from playground.engine.quantized.apply import clear_cache

    clear_cache()  # the copy is built in this run, with progress
    settings = RunSettings(prompt="Once upon", max_new_tokens=6,
                           groups=(QuantSettings(quant="rtn-int8", compare=True),))
    w = open_window(qtbot, tmp_path, tiny_lm, settings)
    seen: list[int] = []
    w.picker.progress.valueChanged.connect(seen.append)
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=30000)
    run = w.session.runs[0]
    assert run.finished is not None and run.error is None
    assert 100 in seen and len(set(seen)) >= 3  # calibration, quantization, measurement
    assert w.docks["quant"].pages.currentWidget() is w.views["quant"]
    view = w.views["quant"]
    assert len(view.state.steps) == 6 and view.state.summary is not None


def test_a_long_pane_keeps_its_text_when_split_for_speed_and_resized(qtbot):
    """Appends keep the paragraph being written short (block breaks where Qt wrapped anyway); the text stays the
    text, streamed or after a resize that lays it out again."""
    ids = list(range(600))
    events = _pane_events(ids, ids[:300] + [i + 1 for i in ids[300:]])
    state = PanesState()
    panes = SideBySidePanes(state)
    qtbot.addWidget(panes)
    panes.resize(900, 500)
    panes.show()
    for start in range(0, len(events), 7):
        for event in events[start : start + 7]:
            state.apply(event)
        panes.refresh()
    column = panes.columns[1]
    expected = "".join(state.panes[1].texts)
    assert column.text.document().blockCount() > 5  # precondition: the paragraph really was split
    assert column.text.toPlainText().replace("\n", "") == expected
    panes.resize(600, 500)  # narrower: the old splits would end lines early, so the pane is drawn again
    qtbot.waitUntil(lambda: column._split_width == column.text.document().textWidth(), timeout=5000)
    assert column.text.toPlainText().replace("\n", "") == expected
    assert pane_pieces(state, 1)[300] == ("<301>", DIVERGES)


def test_the_figures_table_shows_each_outputs_figures_computed_here(tiny_lm, compare_view):
    """Every cell of the figures table against the figure computed here from the pane's token ids: distinct-n as
    unique n-grams over all, 3-grams that repeat an earlier one, the log-likelihood from a plain forward pass of
    the model, its mean per token, and the first token (1-based) where a pane leaves the reference pane."""
    import torch

    settings = RunSettings(strategy="compare", prompt="Once upon", max_new_tokens=40, groups=(CompareSettings(
        panes=("greedy", "greedy --repetition-penalty 1.3", "sample --temperature 1.5 --seed 4")),))
    events = list(run_strategy(tiny_lm, settings))
    compare_view.show_run(Run.from_events(events))
    table = shown(compare_view)["table"]
    prompt = list(events[0].prompt_token_ids)
    outputs = [list(e.token_ids) for e in events if isinstance(e, PaneFinished)]

    def grams(ids, n):
        return [tuple(ids[i : i + n]) for i in range(len(ids) - n + 1)]

    expected: dict[str, list[str]] = {k: [] for k in ("tokens", "ll", "mean", "d1", "d2", "rep3", "div")}
    for column, ids in enumerate(outputs):
        with torch.no_grad():
            logits = tiny_lm.model(torch.tensor([prompt + ids])).logits[0].double()
        ll = float(sum(logits[len(prompt) - 1 + i].log_softmax(-1)[t] for i, t in enumerate(ids)))
        trigrams = grams(ids, 3)
        repeats = sum(g in trigrams[:i] for i, g in enumerate(trigrams))
        reference = outputs[0]
        differ = next((i for i, (a, b) in enumerate(zip(ids, reference, strict=False)) if a != b),
                      None if len(ids) == len(reference) else min(len(ids), len(reference)))
        expected["tokens"].append(f"{len(ids)}")
        expected["ll"].append(f"{ll:.1f}")
        expected["mean"].append(f"{ll / len(ids):.3f}")
        expected["d1"].append(f"{len(set(ids)) / len(ids):.3f}")
        expected["d2"].append(f"{len(set(grams(ids, 2))) / (len(ids) - 1):.3f}")
        expected["rep3"].append(f"{repeats}")
        expected["div"].append("reference" if column == 0 else "never" if differ is None else f"{differ + 1}")
    assert expected["d1"] != expected["d2"] and expected["rep3"] != ["0"] * 3, "precondition: the figures differ"
    assert "never" not in expected["div"][1:] and expected["div"][1] != "1", "precondition: a pane parts midway"
    assert table[2:9] == [expected[k] for k in ("tokens", "ll", "mean", "d1", "d2", "rep3", "div")]


def test_the_quant_views_kl_median_and_p99_are_those_of_its_steps(tiny_lm, quant_view):
    """The lab's figures line: the median and 99th percentile (linear interpolation) of the teacher-forced KL of
    every step, computed here from the steps' values."""
    import math
    import re

    settings = RunSettings(prompt="Once upon", max_new_tokens=15,
                           groups=(QuantSettings(quant="rtn-int4", group_size=32, compare=True),))
    events = list(run_strategy(tiny_lm, settings))
    quant_view.show_run(Run.from_events(events))
    kl = sorted(e.kl for e in events if isinstance(e, QuantStep))
    middle = len(kl) // 2
    median = kl[middle] if len(kl) % 2 else kl[middle - 1]  # torch's median: the lower of the two middles
    rank = 0.99 * (len(kl) - 1)
    low = math.floor(rank)
    p99 = kl[low] + (rank - low) * (kl[min(low + 1, len(kl) - 1)] - kl[low])
    assert p99 > 1.5 * median, "precondition: the tail differs from the middle"
    shown = re.search(r"median ([0-9.]+), p99 ([0-9.]+)", quant_view.figures.text())
    assert shown is not None
    assert shown.groups() == (f"{median:.4f}", f"{p99:.3f}")


def test_the_quant_views_channel_curves_are_smoothquants_formula(tiny_lm, quant_view):
    """The first plotted input (layer 1's q/k/v input): max |x| per channel on the calibration tokens, caught here
    with a hook; SmoothQuant's s = max|X|^α / max|W|^(1-α) over q, k and v; the "after scaling" curve max|X| / s;
    and the note's largest / median channel before and after."""
    import torch

    from playground.engine.quant.calibration import load_text, text_ids

    alpha, tokens = 0.6, 200
    settings = RunSettings(prompt="Once upon", max_new_tokens=2, groups=(
        QuantSettings(quant="smoothquant", smooth_alpha=alpha, calibration_tokens=tokens),))
    quant_view.show_run(Run.from_events(list(run_strategy(tiny_lm, settings))))
    attention = tiny_lm.model.model.layers[0].self_attn
    seen = []
    handle = attention.q_proj.register_forward_pre_hook(lambda _m, args: seen.append(args[0][0].double()))
    with torch.no_grad():
        tiny_lm.model(input_ids=torch.tensor([text_ids(tiny_lm.tokenizer, load_text("calibration"), tokens)]))
    handle.remove()
    act_max = seen[0].abs().amax(0)
    weights = [attention.q_proj.weight, attention.k_proj.weight, attention.v_proj.weight]
    w_max = torch.cat(weights).detach().abs().amax(0)
    s = act_max.clamp_min(1e-5) ** alpha / w_max.double().clamp_min(1e-5) ** (1 - alpha)
    after = act_max / s
    quant_view.layer_choice.setCurrentIndex(0)
    assert quant_view.layer_choice.currentText() == "input of layers.0.self_attn.q_proj"
    for curve, expected in ((quant_view.before_curve, act_max), (quant_view.after_curve, after),
                            (quant_view.scale_curve, s)):
        xs, ys = curve.getData()
        assert list(xs) == list(range(len(expected)))
        assert np.allclose(ys, expected.numpy(), rtol=1e-4)
    assert not np.allclose(after.numpy(), act_max.numpy(), rtol=0.05), "precondition: scaling moved the channels"
    ratio = lambda v: float(v.max() / np.median(v.numpy()))  # noqa: E731
    assert f"{ratio(act_max):.0f}× before, {ratio(after):.0f}× after scaling" in quant_view.channel_note.text()
