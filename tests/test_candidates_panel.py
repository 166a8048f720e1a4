"""The candidates chart and the token tooltip show what the sampler picked from, checked against distributions
computed here from a plain forward pass of the model (not from the step's own fields)."""

from __future__ import annotations

import html
import re

import pytest
import torch

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import RunStarted, TokenStep
from playground.ui.style import configure_pyqtgraph, format_percent
from playground.ui.views.tokens.candidates import CandidatesPanel
from playground.ui.views.tokens.tooltip import token_tooltip_html

TEMPERATURE, TOP_K = 0.6, 4


@pytest.fixture(scope="module")
def sampled(tiny_lm):
    """A sampled run with temperature and top-k, and each step's raw and processed distributions recomputed."""
    events = list(run_strategy(tiny_lm, RunSettings(prompt="The capital of France is", strategy="sample",
                                                    temperature=TEMPERATURE, top_k=TOP_K, max_new_tokens=6,
                                                    num_candidates=10, seed=3)))
    prompt = list(next(e for e in events if isinstance(e, RunStarted)).prompt_token_ids)
    steps = [e for e in events if isinstance(e, TokenStep)]
    ids = prompt + [s.token_id for s in steps]
    with torch.no_grad():
        logits = tiny_lm.model(torch.tensor([ids]), use_cache=False).logits[0].double()
    references = []
    for step in steps:
        row = logits[len(prompt) + step.step - 1]  # predicts the step's token
        raw = torch.softmax(row, -1)
        scaled = row / TEMPERATURE
        kept = torch.full_like(scaled, float("-inf"))
        top = scaled.topk(TOP_K).indices
        kept[top] = scaled[top]
        references.append((raw, torch.softmax(kept, -1)))
    return steps, references


def test_the_reference_differs_from_raw_where_it_matters(sampled):
    _, references = sampled
    assert all((raw - processed).abs().max() > 0.05 for raw, processed in references)


def test_the_chart_draws_the_processed_distribution_beside_the_raw(qtbot, sampled):
    configure_pyqtgraph()
    panel = CandidatesPanel()
    qtbot.addWidget(panel)
    steps, references = sampled
    for step, (raw, processed) in zip(steps, references, strict=True):
        panel.show_step(step)
        raw_widths = panel._raw.opts["width"]
        processed_widths = panel._processed.opts["width"]
        assert len(panel.rows) == len(raw_widths) == len(processed_widths)
        shown_processed = 0.0
        for i, row in enumerate(panel.rows[:-1]):
            assert raw_widths[i] == pytest.approx(100 * float(raw[row.token_id]), abs=1e-3)
            expected = 100 * float(processed[row.token_id])
            assert processed_widths[i] == pytest.approx(expected, abs=1e-3), f"row {i} of step {step.step}"
            shown_processed += float(processed[row.token_id])
            label = panel._value_labels.labels[2 * i + 1].text
            assert label == (f"cut by {row.cut_by}" if expected == 0 else format_percent(expected / 100))
        # The rest row: what the top-k pipeline leaves to tokens not shown (here nothing: the top 4 are shown).
        assert processed_widths[-1] == pytest.approx(100 * max(0.0, 1 - shown_processed), abs=1e-3)


def tooltip_cells(tip: str) -> list[list[str]]:
    rows = re.findall(r"<tr>(.*?)</tr>", tip)
    return [[html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", r)]
            for r in rows[1:]]


def test_the_tooltip_shows_both_distributions(sampled, tiny_lm):
    steps, references = sampled
    for step, (raw, processed) in zip(steps, references, strict=True):
        cells = tooltip_cells(token_tooltip_html(step, limit=10))
        by_raw = raw.argsort(descending=True)[:10].tolist()  # the top candidates by raw probability
        assert len(cells) == len(by_raw) + 1
        for token_id, (_, raw_cell, processed_cell, _) in zip(by_raw, cells, strict=False):
            assert raw_cell == format_percent(float(raw[token_id]))
            p = float(processed[token_id])
            assert processed_cell == (format_percent(p) if p > 0 else "—"), f"token {token_id}, step {step.step}"
        # The rest of the vocabulary: raw, what the ten leave; processed, nothing (the top 4 are among them).
        assert float(processed[by_raw].sum()) == pytest.approx(1.0)
        assert cells[-1][1:3] == [format_percent(1 - float(raw[by_raw].sum())), "0%"]
