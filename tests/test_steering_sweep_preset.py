"""The steering-sweep-happy preset on the default model (one sweep run, five panes): what its description claims.
The figures themselves (mean KL, perplexity under the unsteered model) are checked against references computed
independently in tests/test_steering_view.py."""

from __future__ import annotations

from playground.engine.strategies import run_strategy
from playground.events.panes import PaneFinished
from playground.presets import load_preset


def test_the_happy_sweep_moves_the_text_and_the_figures_grow_with_the_strength(default_lm):
    events = list(run_strategy(default_lm, load_preset("steering-sweep-happy").settings))
    panes = {e.figures["strength"]: e for e in events if isinstance(e, PaneFinished)}
    assert sorted(panes) == [-1.0, -0.5, 0.0, 0.5, 1.0]
    kl = {s: p.figures["mean_kl"] for s, p in panes.items()}
    perplexity = {s: p.figures["perplexity"] for s, p in panes.items()}
    assert kl[0.0] == 0.0
    assert 0 < kl[-0.5] < kl[-1.0] and 0 < kl[0.5] < kl[1.0]  # the KL grows with the strength on both sides
    assert perplexity[0.0] < min(perplexity[-0.5], perplexity[0.5])
    assert perplexity[-0.5] < perplexity[-1.0] and perplexity[0.5] < perplexity[1.0]
    assert "thrilled" in panes[0.5].text and "excited" in panes[1.0].text  # cheerful words on the positive side
    assert "thrilled" not in panes[0.0].text and "excited" not in panes[0.0].text
    assert panes[-1.0].figures["repeated_3grams"] > 5 and panes[-0.5].figures["repeated_3grams"] > 5  # loops
    assert panes[0.0].figures["repeated_3grams"] == 0
