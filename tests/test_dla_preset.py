"""The "why-paris" preset on the default model: ' Paris' over ' Lyon' attributed, the identity holding on SmolLM2,
the late layers' attention raising it, and the strips filled."""

from __future__ import annotations

import pytest

from playground.engine.strategies import run_strategy
from playground.events import TokenStep
from playground.events.dla import LogitAttribution
from playground.presets import load_preset
from playground.state.dla import DlaFold


@pytest.mark.model
def test_why_paris_on_the_default_model(default_lm):
    events = list(run_strategy(default_lm, load_preset("why-paris").settings))
    steps = [e for e in events if isinstance(e, TokenStep)]
    (a,) = [e for e in events if isinstance(e, LogitAttribution)]
    assert (a.token_text, a.against_text) == (" Paris", " Lyon") and steps[a.step].text == " Paris"
    assert a.components_sum == pytest.approx(a.difference, abs=1e-3)  # float32 over 30 layers
    assert a.lens[-1] == pytest.approx(a.difference, abs=1e-3)
    assert a.difference > 5 and sum(a.attention) > 0
    layers = len(a.attention)
    strongest = max(range(layers), key=lambda i: a.attention[i])
    assert strongest >= 2 * layers // 3, "the attention that raises ' Paris' most is in the last third"
    assert min(a.mlp) < -1, "a late MLP pushes back"
    fold = DlaFold()
    for event in events:
        fold.apply(event)
    assert len(fold.commitments) == len(steps) and all(s.varentropy is not None for s in fold.steps)
    paris = next(c for c in fold.commitments if c.step == a.step)
    print(f"Δ {a.difference:.3f}: attention L{strongest + 1} {a.attention[strongest]:+.2f}, MLP "
          f"L{a.mlp.index(min(a.mlp)) + 1} {min(a.mlp):+.2f}; ' Paris' kept top-1 from layer {paris.top1}, "
          f"top-5 from {paris.topk}")
    assert paris.top1 is not None and paris.topk is not None and paris.topk <= paris.top1
