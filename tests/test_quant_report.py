"""`playground quant-report`: one JSON line per method, the reference first, figures checked independently."""

from __future__ import annotations

import json
import math

import pytest
import torch

from playground.engine.quant.calibration import load_text, text_ids
from playground.engine.quant.rtn import expected_nbytes


def test_quant_report_prints_one_checked_line_per_method(model_folder, tiny_lm, capsys):
    from playground.cli import main

    methods = ["rtn-int8", "rtn-int4", "naive-w8a8", "smoothquant", "awq"]
    assert main(["quant-report", "--model", str(model_folder), "--device", "cpu", "--methods", ",".join(methods),
                 "--group-size", "16", "--eval-tokens", "64"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["method"] for r in rows] == ["reference", *methods]
    for row in rows:
        assert {"method", "group_size", "weight_bytes", "perplexity", "kl_mean", "top1_agreement"} <= set(row)

    # The reference's perplexity, by hand: exp of the mean next-token NLL over the evaluation tokens.
    ids = text_ids(tiny_lm.tokenizer, load_text("evaluation"), 64)
    with torch.no_grad():
        logits = tiny_lm.model(input_ids=torch.tensor([ids])).logits[0, :-1].float()
    nll = torch.nn.functional.cross_entropy(logits, torch.tensor(ids[1:]))
    reference = rows[0]
    assert math.isclose(reference["perplexity"], math.exp(float(nll)), rel_tol=1e-4)
    assert (reference["kl_mean"], reference["top1_agreement"], reference["tokens"]) == (0.0, 1.0, 64)

    # int4 group 16 stores each decoder linear as packed codes with a float scale and zero per group.
    model = tiny_lm.model
    linears = [m for name, m in model.named_modules() if name.split(".")[-1] in
               ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")]
    float_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) - sum(
        m.weight.numel() * m.weight.element_size() for m in linears)
    int4 = next(r for r in rows if r["method"] == "rtn-int4")
    assert int4["group_size"] == 16
    assert int4["weight_bytes"] == float_bytes + sum(
        expected_nbytes(m.out_features, m.in_features, 4, 16, symmetric=False) for m in linears)
    # Quantization moves the distribution: KL above zero, int8 closer than int4.
    rtn8 = next(r for r in rows if r["method"] == "rtn-int8")
    assert 0 < rtn8["kl_mean"] < int4["kl_mean"]


def by_hand_median_p99(values: list[float]) -> tuple[float, float]:
    """The middle value of an odd count, and the 99th percentile by linear interpolation between the two sorted
    values around rank 0.99 (n - 1)."""
    ordered = sorted(values)
    assert len(ordered) % 2 == 1
    rank = 0.99 * (len(ordered) - 1)
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[len(ordered) // 2], ordered[low] + (rank - low) * (ordered[high] - ordered[low])


def test_quant_report_kl_median_and_p99_equal_a_hand_computation(tiny_lm):
    """Per-token KL(P_reference ‖ P_quantized) written out on two plain forward passes, over the 64 - 1 positions
    that predict a next token; its median, 99th percentile, mean and max."""
    from playground.engine.quant.linear import quantize_model
    from playground.engine.quant.report import report_rows

    rows = list(report_rows(tiny_lm.model, tiny_lm.tokenizer, ["rtn-int4"], group_size=16, eval_tokens=64))
    int4 = rows[1]
    ids = text_ids(tiny_lm.tokenizer, load_text("evaluation"), 64)
    copy = quantize_model(tiny_lm.model, "rtn-int4", 16)
    with torch.no_grad():
        p = tiny_lm.model(input_ids=torch.tensor([ids])).logits[0, :-1].double().log_softmax(-1)
        q = copy(input_ids=torch.tensor([ids])).logits[0, :-1].double().log_softmax(-1)
    kl = [float((p[i].exp() * (p[i] - q[i])).sum()) for i in range(len(ids) - 1)]
    median, p99 = by_hand_median_p99(kl)
    assert p99 > 1.5 * median, "precondition: the tail differs from the middle"
    assert int4["kl_median"] == pytest.approx(median, rel=1e-6)
    assert int4["kl_p99"] == pytest.approx(p99, rel=1e-6)
    assert int4["kl_mean"] == pytest.approx(sum(kl) / len(kl), rel=1e-6)
    assert int4["kl_max"] == pytest.approx(max(kl), rel=1e-6)
