"""The uncertainty strip (varentropy, entropix's quadrants), the commitment strip (against the lens's top-1 history
computed here from ``output_hidden_states``), attributions kept with a saved run, and the view drawing them."""

from __future__ import annotations

import math

import pytest
import torch
from support.tiny_models import build_tiny_lm

from playground.config import RunSettings
from playground.config.words import settings_from_pane
from playground.engine.strategies import run_strategy
from playground.events import RunStarted, TokenStep, dumps_event, event_from_dict
from playground.events.dla import LogitAttribution
from playground.models.anatomy import anatomy_of
from playground.state import Run
from playground.state.dla import CAREFUL, FLOWING, FORKS, MIDDLE, MIST, DlaFold, commitment, quadrant

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def lm():
    return build_tiny_lm(seed=3, layers=4)


@pytest.fixture(scope="module")
def events(lm):
    settings = settings_from_pane(RunSettings(prompt=PROMPT, chat=False, max_new_tokens=6),
                                  "greedy --lens --attribute-steps 1-2")
    return list(run_strategy(lm, settings))


def test_quadrants_at_entropix_thresholds():
    assert quadrant(0.05, 0.05) == FLOWING and quadrant(0.1, 0.05) == MIDDLE
    assert quadrant(3.5, 0.05) == CAREFUL and quadrant(3.0, 0.05) == MIDDLE
    assert quadrant(4.0, 6.0) == FORKS and quadrant(5.5, 6.0) == MIST and quadrant(5.0, 5.0) == MIDDLE


def test_varentropy_is_the_surprisal_variance(lm, events):
    ids = next(e.prompt_token_ids for e in events if isinstance(e, RunStarted))
    steps = [e for e in events if isinstance(e, TokenStep)]
    with torch.no_grad():
        logits = lm.model(input_ids=torch.tensor([list(ids) + [s.token_id for s in steps]])).logits[0]
    for s in steps:
        p = logits[len(ids) + s.step - 1].double().softmax(-1)
        bits = -torch.log2(p)
        h = float((p * bits).sum())
        v = float((p * bits * bits).sum()) - h * h  # E[s²] − E[s]², another route than the engine's
        assert s.varentropy == pytest.approx(v, rel=1e-3, abs=1e-4)
        assert s.entropy == pytest.approx(h, rel=1e-4)


def test_commitment_equals_the_lens_top1_history(lm, events):
    anatomy = anatomy_of(lm.model)
    ids = next(e.prompt_token_ids for e in events if isinstance(e, RunStarted))
    steps = [e for e in events if isinstance(e, TokenStep)]
    tokens = [s.token_id for s in steps]
    with torch.no_grad():
        out = lm.model(input_ids=torch.tensor([list(ids) + tokens]), output_hidden_states=True)
        # each layer's output through the final norm and head; the last layer's is the model's own output
        lens = [anatomy.lm_head(anatomy.final_norm(h[0])) for h in out.hidden_states[1: anatomy.count]]
        lens.append(out.logits[0])
    fold = DlaFold()
    for event in events:
        fold.apply(event)
    assert len(fold.commitments) == len(steps)
    seen_early = False
    for c, s in zip(fold.commitments, steps, strict=True):
        t = len(ids) + s.step - 1
        top1 = [int(layer[t].argmax()) == s.token_id for layer in lens]
        top5 = [s.token_id in layer[t].topk(5).indices.tolist() for layer in lens]
        first1 = next(i + 1 for i in range(len(top1)) if all(top1[i:]))
        first5 = next(i + 1 for i in range(len(top5)) if all(top5[i:]))
        assert (c.step, c.top1, c.topk) == (s.step, first1, first5)
        seen_early |= first1 < anatomy.count
    assert seen_early, "every token decided at the last layer: the case does not test the strip"


def test_commitment_of_a_token_the_last_layer_does_not_rank_first():
    from playground.events.layers import LensCandidate as C

    layers = [(C(5, "a", 0.5), C(7, "b", 0.2)), (C(7, "b", 0.6), C(5, "a", 0.3)), ()]  # the third did not run
    assert commitment(layers, 7) == (2, 1)
    assert commitment(layers, 5) == (None, 1)
    assert commitment(layers, 9) == (None, None)


def test_attributions_are_kept_with_the_saved_run_and_drawn(qtbot, events):
    from playground.ui.views.dla import DlaView

    attributed = [e for e in events if isinstance(e, LogitAttribution)]
    assert [a.step for a in attributed] == [1, 2]
    assert all(math.isclose(a.components_sum, a.difference, abs_tol=1e-5) for a in attributed)
    reopened = [event_from_dict(__import__("json").loads(dumps_event(e))) for e in events]  # a saved trace
    assert [e for e in reopened if isinstance(e, LogitAttribution)] == attributed
    view = DlaView()
    qtbot.addWidget(view)
    view.resize(1100, 700)
    view.show()
    run = Run.from_events(reopened)
    assert view.applies_to(run)
    view.show_run(run)
    assert view.step_choice.count() == 2 and view.step_choice.currentData() == 2
    heights = list(view.bars.attn_bars.opts["width"])
    assert heights == list(attributed[1].attention)
    assert f"{attributed[1].difference:+.3f}" in view.summary.text()
    assert "flowing" in view.quadrant_note.text() and "H &lt; 0.1" in view.quadrant_note.text()
    # Each step's dot in its quadrant's colour, at its entropy (the quadrant from the thresholds, here).
    from playground.ui.views.dla.view import QUADRANT_COLORS

    steps = [e for e in reopened if isinstance(e, TokenStep)]
    for name, dots in view.quadrant_dots.items():
        x, y = dots.getData()
        mine = [k for k, st in enumerate(steps) if st.varentropy is not None
                and (quadrant(st.entropy, st.varentropy) or MIDDLE) == name]
        assert list(x) == mine and list(y) == pytest.approx([steps[k].entropy for k in mine])
        assert dots.opts["brush"].color().name().upper() == QUADRANT_COLORS[name].upper()
    view.step_choice.setCurrentIndex(0)
    assert list(view.bars.mlp_bars.opts["width"]) == list(attributed[0].mlp)
    asked = []
    view.attribution_requested.connect(lambda step, against: asked.append((step, against)))
    view.ask_step.setValue(3)
    view.ask_button.click()
    step3 = run.steps[3]
    offered = [view.against_choice.itemData(i) for i in range(view.against_choice.count())]
    assert offered == [-1] + [c.token_id for c in step3.candidates if c.token_id != step3.token_id]
    view.against_choice.setCurrentIndex(2)
    view.ask_button.click()
    assert asked == [(3, -1), (3, offered[2])]
    view.reset()
    assert view.step_choice.count() == 0 and not view.bars.attn_bars.opts["width"]


def test_a_steering_vector_is_its_own_component():
    from pathlib import Path

    from playground.engine.dla.attribute import frozen_scale
    from playground.engine.steering.files import load_vector
    from playground.engine.steering.hooks import SteeringHooks

    lm = build_tiny_lm(seed=0)
    vector_file = Path(__file__).parent / "data" / "steering" / "tiny-happy-sad.safetensors"
    settings = settings_from_pane(RunSettings(prompt=PROMPT, chat=False, max_new_tokens=3),
                                  f"greedy --steer {vector_file}:2 --steer-layers 1 --attribute-steps 1")
    events = list(run_strategy(lm, settings))
    (a,) = [e for e in events if isinstance(e, LogitAttribution)]
    assert a.components_sum == pytest.approx(a.difference, abs=1e-5)
    assert abs(a.other[0]) < 1e-5  # block 0 is not steered
    # block 1's other write is 2 × its direction, through the final norm frozen at the steered state
    anatomy = anatomy_of(lm.model)
    ids = list(next(e.prompt_token_ids for e in events if isinstance(e, RunStarted)))
    ids += [e.token_id for e in events if isinstance(e, TokenStep)][:1]
    vector = load_vector(vector_file)
    direction = torch.from_numpy(vector.directions[1]).double()
    hooks = SteeringHooks(lm.model, [vector.within((1, 1))], (2.0,), (1,), None, lm.device)
    seen: list[torch.Tensor] = []
    handle = anatomy.final_norm.register_forward_hook(lambda m, i, o: seen.append(i[0][0, -1].double()))
    with torch.no_grad(), hooks.installed(), hooks.active():
        lm.model(input_ids=torch.tensor([ids]))
    handle.remove()
    u = (anatomy.lm_head.weight[a.token_id] - anatomy.lm_head.weight[a.against_id]).detach().double()
    w = anatomy.final_norm.weight.detach().double()
    expected = float((2.0 * direction * w * frozen_scale(anatomy.final_norm, anatomy.norm_kind, seen[0])) @ u)
    assert a.other[1] == pytest.approx(expected, abs=1e-5) and abs(expected) > 1e-3
