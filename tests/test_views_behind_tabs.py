"""A view whose dock is a tab behind another holds its streaming draws (nobody sees them, and on a 2-core CPU each
is taken from the model) and draws what it held as its tab comes to the front, before a picture of it is taken,
and when the run ends.

The events go into the real window the way a run job's batches do (``_apply_events``), so the test can look
between batches; the steps counted are those fed, the entropies those a plain forward pass gives."""

from __future__ import annotations

import numpy as np
import torch
from support.tiny_models import build_tiny_lm
from windows import open_window

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import LayerStep, RunFinished, TokenStep

NEW = 12


def _batches(lm, settings: RunSettings):
    events = list(run_strategy(lm, settings))
    end = next(i for i, e in enumerate(events) if isinstance(e, RunFinished))
    steps = [i for i, e in enumerate(events) if isinstance(e, TokenStep)]
    half = steps[NEW // 2 - 1] + 1
    return events[:half], events[half:end], events[end:]


def _entropies_by_hand(lm, prompt_ids: list[int], tokens: list[int]) -> list[float]:
    """Each step's entropy of the next-token distribution, bits, from one forward pass over prompt + tokens."""
    ids = torch.tensor([prompt_ids + tokens])
    with torch.no_grad():
        logits = lm.model(ids).logits[0, len(prompt_ids) - 1:-1].double()
    p = torch.softmax(logits, -1)
    return (-(p * torch.log2(p.clamp_min(1e-300))).sum(-1)).tolist()


def test_a_tab_behind_holds_its_draws_until_it_comes_to_the_front(qtbot, tmp_path):
    lm = build_tiny_lm(seed=0, layers=3)
    settings = RunSettings.from_flat(prompt="Once upon a time", chat=False, max_new_tokens=NEW, lens=True)
    w = open_window(qtbot, tmp_path, lm, settings)
    first, second, end = _batches(lm, settings)
    w._running_run = run = w.session.start_run(settings)  # as Generate does, with the batches fed by hand
    w._list_and_show(run)
    w._apply_events(first)
    dla, layers, tokens = w.views["dla"], w.views["layers"], w.views["tokens"]
    qtbot.waitUntil(lambda: layers.image.image is not None and layers.image.image.shape[1] == NEW // 2)
    assert w.docks["dla"].visibleRegion().isEmpty() and dla.isVisible()  # behind, though Qt calls it visible
    assert dla.entropy_curve.getData()[0] is None or len(dla.entropy_curve.getData()[0]) == 0
    # The lens run brought the layers view to the front: the tokens view's text waits too.
    assert tokens.behind and tokens.token_view.steps == [] and tokens.token_view.text.toPlainText() == settings.prompt
    fed = [e.token_id for e in first if isinstance(e, TokenStep)]
    w.docks["tokens"].raise_()
    qtbot.waitUntil(lambda: [s.token_id for s in tokens.token_view.steps] == fed)
    assert tokens.token_view.text.toPlainText() != settings.prompt

    w.docks["dla"].raise_()  # its tab to the front: the layers view's goes behind
    qtbot.waitUntil(lambda: dla.entropy_curve.getData()[0] is not None
                    and len(dla.entropy_curve.getData()[0]) == NEW // 2)
    assert layers.behind and not dla.behind

    w._apply_events(second)
    qtbot.wait(400)  # past every throttle: a view in front would have drawn by now
    assert layers.image.image.shape[1] == NEW // 2  # held
    qtbot.waitUntil(lambda: len(dla.entropy_curve.getData()[0]) == NEW)

    layers.export(tmp_path / "layers.png")  # a picture of it shows every step folded so far
    assert layers.image.image.shape[1] == NEW

    w.docks["tokens"].raise_()  # dla behind again; the run ends: its end is drawn whatever tab is in front
    w._apply_events(end)
    steps = [e for e in run.events if isinstance(e, TokenStep)]
    assert len(steps) == NEW and sum(isinstance(e, LayerStep) for e in run.events) == NEW
    w._run_ended(None)
    x, y = dla.entropy_curve.getData()
    prompt_ids = lm.tokenizer(settings.prompt)["input_ids"]
    expected = _entropies_by_hand(lm, prompt_ids, [s.token_id for s in steps])
    assert len(x) == NEW
    np.testing.assert_allclose(y, expected, rtol=1e-4, atol=1e-5)
