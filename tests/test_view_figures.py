"""The headline figures the speculative view and the quantization lab show, read from their labels and table cells
and compared with what the test computes from the run's per-step events (KL per token, top-1 agreement, the panes'
tokens, rounds, the run's and the baseline's speeds)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from playground.config import QuantSettings, RunSettings
from playground.config.words import settings_from_pane
from playground.engine.strategies import run_strategy
from playground.events import RunFinished
from playground.events.panes import PaneFinished, PaneToken
from playground.events.quant import QuantReady, QuantStep
from playground.events.speculative import SpeculativeRound
from playground.state import Run
from playground.ui.style import configure_pyqtgraph, format_percent
from playground.ui.views.quant import QuantView
from playground.ui.views.speculative import SpeculativeView


def plain(html: str) -> str:
    return re.sub(r"<[^>]+>", "", html).replace("&nbsp;", " ")


@pytest.fixture
def view_of(qtbot):
    configure_pyqtgraph()

    def make(cls):
        view = cls()
        qtbot.addWidget(view)
        view.resize(1400, 900)
        view.show()
        return view

    return make


def test_the_quant_labs_figures_line_and_table_are_those_of_its_steps(tiny_lm, view_of):
    settings = RunSettings(prompt="Once upon", chat=False, max_new_tokens=16,
                           groups=(QuantSettings(quant="rtn-int4", group_size=32, compare=True),))
    events = list(run_strategy(tiny_lm, settings))
    view = view_of(QuantView)
    view.show_run(Run.from_events(events))
    steps = [e for e in events if isinstance(e, QuantStep)]
    kl = np.array([s.kl for s in steps])
    agree = sum(s.top1_agrees for s in steps) / len(steps)
    # The free-running panes' first divergence, from their own tokens.
    tokens = {0: [], 1: []}
    for e in events:
        if isinstance(e, PaneToken):
            tokens[e.pane].append(e.token_id)
    reference, quantized = tokens[0], tokens[1]
    first = next((i for i, (a, b) in enumerate(zip(reference, quantized, strict=False)) if a != b),
                 -1 if len(reference) == len(quantized) else min(len(reference), len(quantized)))
    diverged = "never diverged" if first < 0 else f"first divergence at token {first + 1}"
    speeds = {e.pane: e.tokens_per_s for e in events if isinstance(e, PaneFinished)}
    line = plain(view.figures.text())
    assert line.startswith(f"teacher-forced over {len(steps)} tokens: mean KL {kl.mean():.4f} nats, max "
                           f"{kl.max():.3f} · top-1 agreement {format_percent(agree)}"), line
    assert f"free-running: {diverged} · {speeds[0]:.1f} vs {speeds[1]:.1f} tok/s" in line
    # The methods table: this run's row (the method) against the same figures; the reference row against itself.
    ready = next(e for e in events if isinstance(e, QuantReady))
    cells = {view.table.item(r, 0).text(): [view.table.item(r, c).text() for c in range(view.table.columnCount())]
             for r in range(view.table.rowCount())}
    row = cells[f"{ready.method} g{ready.group_size}"]  # the table keeps every method compared in this process
    assert row[2] == f"{ready.weight_bytes / 1e6:.1f} MB" and row[5] == f"{kl.mean():.4f}"
    assert row[6] == format_percent(agree) and row[7] == ("never" if first < 0 else str(first + 1))
    assert cells["reference"][5] == "0.0000" and cells["reference"][6] == format_percent(1.0)
    assert cells["reference"][2] == f"{ready.reference_weight_bytes / 1e6:.1f} MB"
    # The header: the sizes and their ratio.
    header = plain(view.header.text())
    ratio = ready.reference_weight_bytes / ready.weight_bytes
    assert f"{ready.weight_bytes / 1e6:.1f} MB vs {ready.reference_weight_bytes / 1e6:.1f} MB" in header
    assert (f"({ratio:.1f}× smaller)" in header) == (ratio > 1.05)


def test_the_speculative_views_measured_speed_up_and_what_if_are_the_runs(tiny_lm, view_of):
    settings = settings_from_pane(RunSettings(prompt="one two three one two three", chat=False, max_new_tokens=24),
                                  "speculative --draft prompt-lookup --draft-k 4 --prompt-lookup-ngram 1 "
                                  "--baseline-tokens 8")
    events = list(run_strategy(tiny_lm, settings))
    view = view_of(SpeculativeView)
    view.show_run(Run.from_events(events))
    done = events[-1]
    assert isinstance(done, RunFinished)
    baseline = done.figures["baseline_tokens_per_s"]
    figures = plain(view.figures.text())
    assert (f"Speed-up, measured: {done.tokens_per_s / baseline:.2f}× ({done.tokens_per_s:.1f} tokens/s vs "
            f"{baseline:.1f} tokens/s decoding plainly on the same prompt)") in figures
    rounds = [e for e in events if isinstance(e, SpeculativeRound)]
    accepted = sum(r.accepted for r in rounds)
    judged = sum(min(len(r.drafted), r.accepted + 1) for r in rounds)
    drafted = sum(len(r.drafted) for r in rounds)
    note = plain(view.what_if_note.text())
    assert f"with α = {accepted / judged:.2f}" in note
    assert f"c_draft = {sum(r.draft_ms for r in rounds) / drafted:.2f} ms per drafted token".replace("_", "") in \
        note.replace("_", "")
    assert f"against the measured plain decoding, {1000.0 / baseline:.1f} ms per token" in note
    # The header counts rounds and tokens.
    header = plain(view.header.text())
    assert f"{len(rounds)} rounds · {len(done.token_ids)} tokens · finished ({done.stop_reason})" in header
