"""The why-this-token view's layers open to their heads, and a candidate's "Why this and not it?" in the tokens view
attributes the step against that candidate: in the real window, against logit differences and per-head shares
computed here from hooks on the tiny Llama's own modules (not from the attribution's events)."""

from __future__ import annotations

import re

import pytest
import torch
from PySide6.QtCore import QPointF, Qt
from support.tiny_models import build_tiny_lm
from windows import module_window

from playground.config import RunSettings

LAYERS = 3
STEP = 2


@pytest.fixture(scope="module")
def window(tmp_path_factory):
    lm = build_tiny_lm(seed=3, layers=LAYERS)
    settings = RunSettings(prompt="The capital of France is", chat=False, max_new_tokens=5)
    yield from module_window(tmp_path_factory.mktemp("dla_heads"), lm, settings)


@torch.no_grad()
def by_hand(model, ids: list[int], position: int, a: int, b: int) -> tuple[float, list[list[float]]]:
    """(logit[a] − logit[b], each layer's heads' shares of it) at ``position``: each head's slice of o_proj's input
    through its slice of o_proj, then the final RMSNorm with its scale frozen at this position, then the LM head's
    rows a − b."""
    inner = model.model
    z: dict[int, torch.Tensor] = {}
    final_in: list[torch.Tensor] = []
    handles = [layer.self_attn.o_proj.register_forward_pre_hook(
        lambda _m, args, i=i: z.__setitem__(i, args[0][0, position].double())) for i, layer in enumerate(inner.layers)]
    handles.append(inner.norm.register_forward_pre_hook(
        lambda _m, args: final_in.append(args[0][0, position].double())))
    try:
        logits = model(input_ids=torch.tensor([ids])).logits[0, position].double()
    finally:
        for handle in handles:
            handle.remove()
    h = final_in[0]
    scale = inner.norm.weight.double() / torch.sqrt(h.pow(2).mean() + inner.norm.variance_epsilon)
    w_u = model.lm_head.weight.double()
    u = (w_u[a] - w_u[b]) * scale
    d = model.config.hidden_size // model.config.num_attention_heads
    heads = []
    for i, layer in enumerate(inner.layers):
        w_o = layer.self_attn.o_proj.weight.double()
        n = w_o.shape[1] // d
        heads.append([float((w_o[:, k * d:(k + 1) * d] @ z[i][k * d:(k + 1) * d]) @ u) for k in range(n)])
    return float(logits[a] - logits[b]), heads


def tip_value(tip: str) -> float:
    return float(re.search(r": ([+-]\d+\.\d+) logits", tip).group(1))


def test_why_not_a_candidate_then_open_a_layer_to_its_heads(qtbot, window):
    w = window
    qtbot.mouseClick(w.generate_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not w.busy, timeout=30000)
    run = w.session.selected
    assert run is not None and run.finished is not None and len(run.steps) > STEP

    # A later step attributed first (the Attribute button): the step asked for below is not the newest in the list.
    dla = w.views["dla"]
    dla.ask_step.setMaximum(len(run.steps) - 1)
    dla.ask_step.setValue(len(run.steps) - 1)
    dla.ask_button.click()
    qtbot.waitUntil(lambda: not w.busy, timeout=30000)

    # The tokens view's chart of the step: a right-click on a candidate that is not the runner-up.
    tokens = w.views["tokens"]
    w.docks["tokens"].raise_()
    tokens.show_chart_step(STEP)
    chart = tokens.chart
    step = run.steps[STEP]
    others = [r for r in chart.rows if r.token_id is not None and not r.chosen]
    assert len(others) >= 2
    row = chart.rows.index(others[-1])  # the runner-up is others[0]: picking it would hide an ignored alternative
    against = others[-1].token_id
    view_box = chart.plot.getPlotItem().getViewBox()
    point = chart.plot.mapFromScene(view_box.mapViewToScene(QPointF(0.5, float(row))))
    qtbot.mouseClick(chart.plot.viewport(), Qt.MouseButton.RightButton, pos=point)
    assert chart.menu is not None
    (why,) = [action for action in chart.menu.actions() if action.text().startswith("Why")]
    assert f"'{others[-1].label}'" in why.text()
    chart.menu.hide()
    why.trigger()
    qtbot.waitUntil(lambda: not w.busy, timeout=30000)

    assert dla.isVisible()  # brought to the front
    assert dla.ask_step.value() == STEP and dla.against_choice.currentData() == against
    assert dla.step_choice.count() == 2 and dla.step_choice.currentData() == STEP
    ids = list(run.started.prompt_token_ids) + [s.token_id for s in run.steps[:STEP]]
    difference, heads = by_hand(w.lm.model, ids, len(run.started.prompt_token_ids) + STEP - 1, step.token_id,
                                against)
    assert f"by Δ {difference:+.3f} logits" in dla.summary.text()
    bars = dla.bars
    assert list(bars.attn_bars.opts["width"]) == pytest.approx([sum(h) for h in heads], abs=1e-6)  # no o_proj bias
    assert not list(bars.head_bars.opts["width"])  # every layer closed

    # Open layer 2 with a click on its label: its heads come beneath it, the others stay closed.
    layer = 1
    label_row = next(i for i, r in enumerate(bars.rows) if r.is_layer and r.layer == layer)
    qtbot.mouseClick(bars.viewport(), Qt.MouseButton.LeftButton,
                     pos=bars.mapFromScene(bars.row_scene_pos(label_row)))
    assert bars.expanded == {layer}
    head_rows = [r for r in bars.rows if not r.is_layer]
    assert [(r.layer, r.head) for r in head_rows] == [(layer, k) for k in range(len(heads[layer]))]
    assert [bars.rows.index(r) for r in head_rows] == list(range(label_row + 1, label_row + 1 + len(head_rows)))
    assert bars.head_values(layer) == pytest.approx(dict(enumerate(heads[layer])), abs=1e-6)
    assert [tip_value(r.tip) for r in head_rows] == pytest.approx(heads[layer], abs=2e-6)
    assert bars.rows[label_row].label.startswith("▾")
    # Hovering a head's row shows its tooltip (the exact value).
    k = max(range(len(heads[layer])), key=lambda j: abs(heads[layer][j]))
    head_row = bars.rows.index(head_rows[k])
    view_box = bars.getPlotItem().getViewBox()
    qtbot.mouseMove(bars.viewport(), bars.mapFromScene(view_box.mapViewToScene(QPointF(0.0, float(head_row)))))
    qtbot.waitUntil(lambda: bars.toolTip() == head_rows[k].tip, timeout=3000)
    assert bars.height() == bars.needed_height() and dla.content.minimumHeight() >= bars.needed_height()

    # A click on the open layer's bars closes it again.
    qtbot.mouseClick(bars.viewport(), Qt.MouseButton.LeftButton,
                     pos=bars.mapFromScene(view_box.mapViewToScene(QPointF(0.0, float(label_row)))))
    assert not bars.expanded and all(r.is_layer for r in bars.rows)
    assert not list(bars.head_values(layer))

    # Asked again for the same pair, it is shown from the run's events: no second job.
    before = len(run.events)
    w.docks["tokens"].raise_()
    why.trigger()
    assert not w.busy and len(run.events) == before and dla.isVisible()
    assert dla.step_choice.currentData() == STEP and dla.against_choice.currentData() == against
