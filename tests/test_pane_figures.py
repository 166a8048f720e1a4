"""A kv-cache pane's cache figures in the side-by-side table (the kv-long-context preset's figures), on a tiny model.

Every KV cell is checked against what this test computes on its own: bytes from the cache's geometry (positions
held × 2 × layers × KV heads × head dim × 4 bytes), the sinks cache's quality from two plain forward passes over
the run's tokens, one with the full causal mask and one with the mask StreamingLLM's kept set makes (the first
``sinks`` and the newest ``window`` positions before each decoded query, the prompt read in one pass).
"""

from __future__ import annotations

import pytest
import torch

from playground.config import CompareSettings, RunSettings
from playground.engine.strategies import run_strategy
from playground.events.panes import PaneFinished
from playground.state import Run
from playground.ui.style import configure_pyqtgraph
from playground.ui.views.compare import CompareView

SINKS, WINDOW = 2, 6
PANES = ("kv-cache --no-compare-no-cache",
         f"kv-cache --kv-keep sinks --kv-sinks {SINKS} --kv-window {WINDOW} --no-compare-no-cache",
         "greedy")


@pytest.fixture(scope="module")
def compare_run(tiny_lm):
    settings = RunSettings(strategy="compare", prompt="Once upon a time there was a little", max_new_tokens=14,
                           groups=(CompareSettings(panes=PANES, log_likelihood=False),))
    events = list(run_strategy(tiny_lm, settings))
    return events, [e for e in events if isinstance(e, PaneFinished)]


def _table(qtbot, events) -> dict[str, list[tuple[str, str]]]:
    """The figures table as shown: per row label, each pane's (text, tooltip)."""
    configure_pyqtgraph()
    view = CompareView()
    qtbot.addWidget(view)
    view.resize(1280, 800)
    view.show()
    view.show_run(Run.from_events(events))
    table = view.table
    return {table.verticalHeaderItem(r).text(): [(table.item(r, c).text(), table.item(r, c).toolTip())
                                                 for c in range(table.columnCount())]
            for r in range(table.rowCount())}


def _bytes_per_position(config) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 4  # float32 keys and values


def _sinks_mask(total: int, prompt: int) -> torch.Tensor:
    """[1, 1, total, total] additive mask: prompt rows causal; a decoded query at p sees j <= p with j < sinks or
    j >= p − window (what the cache held before its pass, plus itself)."""
    p = torch.arange(total)[:, None]
    j = torch.arange(total)[None, :]
    visible = (j <= p) & ((p < prompt) | (j < SINKS) | (j >= p - WINDOW))
    mask = torch.zeros(total, total)
    mask[~visible] = torch.finfo(torch.float32).min
    return mask[None, None]


def test_the_table_shows_each_kv_panes_bytes_and_quality_computed_here(qtbot, tiny_lm, compare_run):
    events, done = compare_run
    prompt = list(events[0].prompt_token_ids)
    full_ids, sinks_ids = list(done[0].token_ids), list(done[1].token_ids)
    n, g = len(prompt), len(sinks_ids)
    assert n > SINKS + WINDOW and g == len(full_ids) == 14, "precondition: the prompt alone outgrows the cache"
    table = _table(qtbot, events)

    # Bytes: the full cache holds every position fed (the last token is never fed), the sinks cache sinks + window.
    per = _bytes_per_position(tiny_lm.model.config)
    held = [(n + g - 1) * per, (SINKS + WINDOW) * per]
    for row in ("KV held at the end", "KV peak"):
        for column, expected in enumerate(held):
            text, tip = table[row][column]
            assert tip == f"{expected:,} bytes"
            assert abs(float(text.split()[0]) * 1e6 - expected) <= 0.005 * expected  # 3 significant digits, MB
        assert table[row][2] == ("", ""), "a greedy pane has no cache figures"

    # Quality: teacher-forced over the sinks pane's own tokens, the full cache's distributions against the kept set's.
    ids = torch.tensor([prompt + sinks_ids[:-1]])
    with torch.no_grad():
        full = tiny_lm.model(ids).logits[0, n - 1 :].double().log_softmax(-1)  # [g, vocab]
        kept = tiny_lm.model(ids, attention_mask=_sinks_mask(n + g - 1, n)).logits[0, n - 1 :].double()
    kept = kept.log_softmax(-1)
    assert kept.argmax(-1).tolist() == sinks_ids, "precondition: the mask here is the cache's (its greedy tokens)"
    kl = (full.exp() * (full - kept)).sum(-1)
    agree = (full.argmax(-1) == kept.argmax(-1)).double().mean().item()
    assert kl.mean() > 1e-3 and agree < 1.0, "precondition: the sinks cache changes the distributions"
    assert abs(float(table["KV mean KL vs full (nats)"][1][0]) - kl.mean().item()) <= 5.1e-5
    assert table["KV top-1 agreement"][1][0] == f"{agree:.1%}"
    differ = next((i for i, (a, b) in enumerate(zip(sinks_ids, full_ids, strict=True)) if a != b), None)
    assert table["KV greedy divergence (token)"][1][0] == ("never" if differ is None else f"{differ + 1}")
    # The full cache is the reference: no quality of its own; the greedy pane none at all.
    for row in ("KV mean KL vs full (nats)", "KV top-1 agreement", "KV greedy divergence (token)"):
        assert table[row][0][0] == "" and table[row][2][0] == ""


def test_a_run_without_kv_panes_shows_no_kv_rows(qtbot, tiny_lm):
    settings = RunSettings(strategy="compare", prompt="Once upon", max_new_tokens=4,
                           groups=(CompareSettings(panes=("greedy", "greedy --repetition-penalty 1.3"),
                                                   log_likelihood=False),))
    table = _table(qtbot, list(run_strategy(tiny_lm, settings)))
    assert not [row for row in table if row.startswith("KV")]
