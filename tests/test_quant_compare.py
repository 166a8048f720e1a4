"""The quantization lab's comparison run: both panes decode as each model alone does, and the teacher-forced
statistics equal a direct computation over the whole sequence."""

from __future__ import annotations

import math

import pytest
import torch

from playground.config import QuantSettings, RunSettings
from playground.engine.quant.linear import quantize_model
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, RunStarted, TokenStep
from playground.events.panes import PaneFinished, PaneToken
from playground.events.quant import QuantReady, QuantStep, QuantSummary, QuantTable

NEW = 10


def lab(method="rtn-int4", group=32, **shared) -> RunSettings:
    return RunSettings(prompt="The weather today", max_new_tokens=NEW, **shared,
                       groups=(QuantSettings(quant=method, group_size=group, compare=True),))


@pytest.fixture(scope="module")
def lab_events(tiny_lm):
    return list(run_strategy(tiny_lm, lab()))


def greedy(model, prompt_ids, n):
    out = model.generate(torch.tensor([prompt_ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def test_both_panes_decode_as_each_model_alone(tiny_lm, lab_events):
    start = lab_events[0]
    assert isinstance(start, RunStarted) and isinstance(lab_events[1], QuantReady)
    assert start.settings["quant"]["compare"] is True  # the run records what it was
    prompt = list(start.prompt_token_ids)
    quantized = quantize_model(tiny_lm.model, "rtn-int4", 32)  # built here, independently of the lab's cache
    done = {e.pane: e for e in lab_events if isinstance(e, PaneFinished)}
    assert list(done[0].token_ids) == greedy(tiny_lm.model, prompt, NEW)
    assert list(done[1].token_ids) == greedy(quantized, prompt, NEW)
    assert [e.token_id for e in lab_events if isinstance(e, TokenStep)] == list(done[0].token_ids)
    assert [e.token_id for e in lab_events if isinstance(e, PaneToken) and e.pane == 1] == list(done[1].token_ids)


def test_teacher_forced_figures_equal_a_whole_sequence_computation(tiny_lm, lab_events):
    start = lab_events[0]
    steps = [e for e in lab_events if isinstance(e, QuantStep)]
    reference_ids = [e.token_id for e in lab_events if isinstance(e, TokenStep)]
    assert [s.token_id for s in steps] == reference_ids and [s.step for s in steps] == list(range(NEW))
    quantized = quantize_model(tiny_lm.model, "rtn-int4", 32)
    ids = torch.tensor([[*start.prompt_token_ids, *reference_ids]])
    n = len(start.prompt_token_ids)
    with torch.inference_mode():  # positions n-1 .. n+NEW-2 predict the reference's tokens
        p = torch.log_softmax(tiny_lm.model(ids).logits[0, n - 1 : -1].double(), -1)
        q = torch.log_softmax(quantized(ids).logits[0, n - 1 : -1].double(), -1)
    kl = (p.exp() * (p - q)).sum(-1)
    for i, step in enumerate(steps):
        assert math.isclose(step.kl, float(kl[i]), rel_tol=2e-3, abs_tol=1e-6), (i, step.kl, float(kl[i]))
        token = reference_ids[i]
        assert math.isclose(step.reference_prob, float(p[i, token].exp()), rel_tol=1e-4)
        assert math.isclose(step.quantized_prob, float(q[i, token].exp()), rel_tol=1e-4)
        assert step.quantized_top_id == int(q[i].argmax())
        assert step.top1_agrees == (int(q[i].argmax()) == int(p[i].argmax()))
    summary = next(e for e in lab_events if isinstance(e, QuantSummary))
    assert math.isclose(summary.kl_mean, float(kl.mean()), rel_tol=2e-3)
    assert math.isclose(summary.kl_max, float(kl.max()), rel_tol=2e-3)
    assert summary.top1_agreement == float((q.argmax(-1) == p.argmax(-1)).double().mean())
    done = {e.pane: e for e in lab_events if isinstance(e, PaneFinished)}
    a, b = list(done[0].token_ids), list(done[1].token_ids)
    expected = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), -1)
    assert summary.first_divergence == expected


def test_the_methods_table_keeps_every_method_compared_on_the_model(tiny_lm, lab_events):
    list(run_strategy(tiny_lm, lab("rtn-int8")))
    table = [e for e in run_strategy(tiny_lm, lab()) if isinstance(e, QuantTable)][-1]
    methods = [row.method for row in table.rows]
    assert methods[0] == "reference" and {"rtn-int4 g32", "rtn-int8"} <= set(methods)
    int8 = next(r for r in table.rows if r.method == "rtn-int8")
    int4 = next(r for r in table.rows if r.method == "rtn-int4 g32")
    assert int4.weight_bytes < int8.weight_bytes < table.rows[0].weight_bytes
    assert isinstance(lab_events[-1], RunFinished)


def test_sampling_panes_share_the_seed(tiny_lm):
    events = list(run_strategy(tiny_lm, lab("rtn-int8", strategy="sample", temperature=0.8, seed=11)))
    alone = list(run_strategy(tiny_lm, RunSettings(prompt="The weather today", max_new_tokens=NEW,
                                                   strategy="sample", temperature=0.8, seed=11)))
    done = {e.pane: e for e in events if isinstance(e, PaneFinished)}
    assert done[0].token_ids == alone[-1].token_ids
