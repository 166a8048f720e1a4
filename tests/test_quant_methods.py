"""Quantization lab methods on tiny random models: calibration statistics, SmoothQuant, AWQ and the metrics,
each against a computation done here by hand."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from support.tiny_models import TRAINING_TEXT, build_tiny_lm

from playground.engine.quant import awq as awq_module
from playground.engine.quant.awq import InputScaledLinear, awq, awq_scales, fold_scales
from playground.engine.quant.calibration import (
    activation_stats,
    capture_inputs,
    decoder_linears,
    load_text,
    text_ids,
)
from playground.engine.quant.linear import QuantLinear, model_weight_bytes, quantize_model
from playground.engine.quant.metrics import first_divergence, kl_stats, perplexity
from playground.engine.quant.rtn import dequantize, quantize
from playground.engine.quant.smoothquant import (
    naive_w8a8,
    smooth_model,
    smoothing_factors,
    smoothquant,
)
from playground.models.anatomy import anatomy_of

TEXT = TRAINING_TEXT * 2
MAX_TOKENS = 120


def logits_of(model, ids):
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]


@pytest.fixture(scope="module")
def ids(tiny_lm):
    return text_ids(tiny_lm.tokenizer, TEXT, MAX_TOKENS)


@pytest.fixture(scope="module")
def stats(tiny_lm):
    return activation_stats(tiny_lm.model, tiny_lm.tokenizer, TEXT, MAX_TOKENS)


# -- calibration -------------------------------------------------------------------------------------------------


def test_calibration_texts_are_held_apart():
    calibration, evaluation = load_text("calibration"), load_text("evaluation")
    assert calibration.startswith("In Congress, July 4, 1776.")
    assert "Four score and seven years ago" in evaluation and "With malice toward none" in evaluation
    def sentences(text):
        return {s.strip() for s in text.split(".") if len(s.strip()) > 20}

    assert not sentences(calibration) & sentences(evaluation)
    with pytest.raises(FileNotFoundError):
        load_text("no-such-text")


def test_activation_stats_equal_a_manual_computation(tiny_lm, ids, stats):
    model = tiny_lm.model
    assert set(stats) == set(decoder_linears(model))
    assert len(stats) == 7 * len(model.model.layers)
    mlp_inputs = {}
    handles = [layer.mlp.register_forward_pre_hook(lambda _m, args, i=i: mlp_inputs.__setitem__(i, args[0][0]))
               for i, layer in enumerate(model.model.layers)]
    with torch.inference_mode():
        hidden = model(input_ids=torch.tensor([ids]), output_hidden_states=True).hidden_states
    for h in handles:
        h.remove()
    for i, layer in enumerate(model.model.layers):
        with torch.inference_mode():
            attn_in = layer.input_layernorm(hidden[i][0]).abs()  # the input of q/k/v: [tokens, hidden]
            x = mlp_inputs[i]
            down_in = (layer.mlp.act_fn(layer.mlp.gate_proj(x)) * layer.mlp.up_proj(x)).abs()
        for name in ("q_proj", "k_proj", "v_proj"):
            got = stats[f"model.layers.{i}.self_attn.{name}"]
            torch.testing.assert_close(got.max_abs, attn_in.amax(0), rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got.mean_abs, attn_in.mean(0), rtol=1e-5, atol=1e-6)
            assert got.tokens == len(ids)
        for name in ("gate_proj", "up_proj"):
            torch.testing.assert_close(stats[f"model.layers.{i}.mlp.{name}"].max_abs, x.abs().amax(0))
        torch.testing.assert_close(stats[f"model.layers.{i}.mlp.down_proj"].max_abs, down_in.amax(0))
        torch.testing.assert_close(stats[f"model.layers.{i}.mlp.down_proj"].mean_abs, down_in.mean(0))
        assert stats[f"model.layers.{i}.self_attn.o_proj"].max_abs.shape == (layer.self_attn.o_proj.in_features,)


# -- SmoothQuant -------------------------------------------------------------------------------------------------


def test_smoothing_factors_follow_the_formula():
    act_max = torch.tensor([4.0, 1.0, 9.0])
    w1 = torch.tensor([[1.0, -2.0, 0.5], [0.1, 0.2, -0.3]])
    w2 = torch.tensor([[-3.0, 1.0, 0.25]])
    # max |W_j| over both matrices: [3, 2, 0.5]
    torch.testing.assert_close(smoothing_factors(act_max, [w1, w2], 0.5),
                               torch.tensor([2 / math.sqrt(3), 1 / math.sqrt(2), 3 / math.sqrt(0.5)]))
    torch.testing.assert_close(smoothing_factors(act_max, [w1, w2], 0.75),
                               torch.tensor([4**0.75 / 3**0.25, 1 / 2**0.25, 9**0.75 / 0.5**0.25]))
    torch.testing.assert_close(smoothing_factors(act_max, [w1, w2], 0.0), 1 / torch.tensor([3.0, 2.0, 0.5]))


def test_smooth_model_uses_the_groups_stats_and_weights(tiny_lm, stats):
    model = tiny_lm.model
    smoothed, factors = smooth_model(model, stats, alpha=0.5)
    for i, layer in enumerate(model.model.layers):
        attn = layer.self_attn
        weight_max = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).abs().amax(0)
        expected = stats[f"model.layers.{i}.self_attn.q_proj"].max_abs.sqrt() / weight_max.sqrt()
        torch.testing.assert_close(factors[f"model.layers.{i}.input_layernorm"], expected)
        mlp = layer.mlp
        weight_max = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).abs().amax(0)
        expected = stats[f"model.layers.{i}.mlp.gate_proj"].max_abs.sqrt() / weight_max.sqrt()
        torch.testing.assert_close(factors[f"model.layers.{i}.post_attention_layernorm"], expected)
        new = smoothed.model.layers[i]
        s_attn = factors[f"model.layers.{i}.input_layernorm"]
        torch.testing.assert_close(new.self_attn.k_proj.weight, attn.k_proj.weight * s_attn)
        torch.testing.assert_close(new.input_layernorm.weight,
                                   layer.input_layernorm.weight / factors[f"model.layers.{i}.input_layernorm"])


def test_smoothquant_scaling_leaves_the_float_output_unchanged(tiny_lm, ids, stats):
    model = tiny_lm.model
    smoothed, factors = smooth_model(model, stats, alpha=0.5)
    assert max(float((s.log()).abs().max()) for s in factors.values()) > 0.5  # the scaling is not a no-op
    q_before, q_after = model.model.layers[0].self_attn.q_proj.weight, smoothed.model.layers[0].self_attn.q_proj.weight
    assert not torch.equal(q_after, q_before)
    torch.testing.assert_close(logits_of(smoothed, ids), logits_of(model, ids), rtol=0, atol=1e-5)
    # and the original is untouched
    assert smoothed is not model


def test_w8a8_copies_change_the_output_a_little(tiny_lm, ids, stats):
    ref = logits_of(tiny_lm.model, ids)
    for quantized in (naive_w8a8(tiny_lm.model), smoothquant(tiny_lm.model, stats, alpha=0.5)):
        diff = (logits_of(quantized, ids) - ref).abs().max()
        assert 0 < diff < 0.1 * ref.abs().max()


# -- AWQ ---------------------------------------------------------------------------------------------------------


def mse_of(x, weights, s, group_size):
    """By hand: mean over the group's outputs of ((X / s) Q(W diag s)^T - X W^T)^2, with rtn's int4 asymmetric."""
    total, count = 0.0, 0
    for w in weights:
        wq = dequantize(quantize(w * s, 4, group_size=group_size, symmetric=False))
        y = x @ w.T
        total += float(((x / s) @ wq.T - y).pow(2).sum())
        count += y.numel()
    return total / count


GROUP_LINEARS = {
    "self_attn.qkv": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
    "self_attn.o": ("self_attn.o_proj",),
    "mlp.gate_up": ("mlp.gate_proj", "mlp.up_proj"),
    "mlp.down": ("mlp.down_proj",),
}


def test_awq_never_makes_the_calibration_loss_worse_than_rtn(tiny_lm, ids):
    model = tiny_lm.model
    results = []
    progress = []
    quantized = awq(model, tiny_lm.tokenizer, TEXT, group_size=16, grid=10, max_tokens=MAX_TOKENS,
                    results=results, progress=lambda msg, f: progress.append(f))
    assert progress[-1] == 1.0 and len(progress) == len(model.model.layers)
    inputs = capture_inputs(model, ids)
    assert len(results) == 4 * len(model.model.layers)
    improved = 0
    for r in results:
        layer_index = int(r.group.split(".")[2])
        paths = GROUP_LINEARS[r.group.split(".", 3)[3]]
        layer = model.model.layers[layer_index]
        x = inputs[f"model.layers.{layer_index}.{paths[0]}"]
        weights = [layer.get_submodule(p).weight.detach() for p in paths]
        rtn = mse_of(x, weights, torch.ones(x.shape[1]), 16)
        chosen = mse_of(x, weights, r.scales, 16)
        assert r.rtn_loss == pytest.approx(rtn, rel=1e-4)
        assert r.loss == pytest.approx(chosen, rel=1e-4)
        assert chosen <= rtn * (1 + 1e-6), r.group
        torch.testing.assert_close(r.scales, awq_scales(x.abs().mean(0), r.alpha))
        improved += chosen < rtn * 0.999
        # the weights stored are the ones scored: the codes of Q(W diag s) (up to a row scale where down's 1/s was
        # folded), packed two per byte
        if r.group.endswith("qkv"):
            new_q = quantized.model.layers[layer_index].self_attn.q_proj
            expected = quantize(weights[0] * r.scales, 4, group_size=16, symmetric=False)
            assert isinstance(new_q, QuantLinear) and new_q.q.dtype == torch.uint8
            assert torch.equal(new_q.q, expected.q) and torch.equal(new_q.scale, expected.scale)
            torch.testing.assert_close(dequantize(new_q.qt), dequantize(expected), rtol=0, atol=0)
    assert improved > 0  # the search does something on this model


def test_awq_folding_keeps_the_float_function(tiny_lm, ids, monkeypatch):
    """With quantization switched off in the search every alpha ties (alpha 0 kept); and the scales alone, folded
    without rounding (into norms, rows or an input scale: ``fold_scales``), leave the model's output unchanged."""
    monkeypatch.setattr(awq_module, "fake_quantize", lambda w, *args: w)
    results = []
    awq(tiny_lm.model, tiny_lm.tokenizer, TEXT, group_size=16, grid=4, max_tokens=MAX_TOKENS, results=results)
    assert results and all(r.alpha == 0.0 for r in results)  # no quantization error: alpha 0 kept
    # non-trivial scales through the fold: s = mean|X|^1 of each group's input
    inputs = capture_inputs(tiny_lm.model, ids)
    groups = awq_module.awq_groups(anatomy_of(tiny_lm.model))
    scales = {g.name: awq_scales(inputs[f"model.layers.{g.index}.{g.linears[0]}"].abs().mean(0), 1.0)
              for g in groups}
    scaled = fold_scales(tiny_lm.model, scales)
    assert not torch.equal(scaled.model.layers[0].mlp.up_proj.weight, tiny_lm.model.model.layers[0].mlp.up_proj.weight)
    torch.testing.assert_close(logits_of(scaled, ids), logits_of(tiny_lm.model, ids), rtol=0, atol=1e-4)


def test_awq_searches_s_equal_mean_abs_x_to_the_alpha_over_the_grid(tiny_lm, ids):
    """Each group's chosen alpha is the grid point whose scales s = mean|X|^alpha (normalised so that
    sqrt(max s * min s) = 1), written out here, give the smallest calibration loss; its scales are those."""
    model, grid = tiny_lm.model, 10
    results = []
    awq(model, tiny_lm.tokenizer, TEXT, group_size=16, grid=grid, max_tokens=MAX_TOKENS, results=results)
    inputs = capture_inputs(model, ids)
    chosen_alphas, checked = [], 0
    for r in results:
        layer_index = int(r.group.split(".")[2])
        paths = GROUP_LINEARS[r.group.split(".", 3)[3]]
        layer = model.model.layers[layer_index]
        x = inputs[f"model.layers.{layer_index}.{paths[0]}"]
        weights = [layer.get_submodule(p).weight.detach() for p in paths]
        mean_abs = x.abs().mean(dim=0).clamp_min(1e-4)

        def scales(alpha, mean_abs=mean_abs):
            s = mean_abs ** alpha
            return s / torch.sqrt(s.max() * s.min())

        losses = [mse_of(x, weights, scales(i / grid), 16) for i in range(grid + 1)]
        best = min(range(grid + 1), key=lambda i, losses=losses: (losses[i], i))  # ties keep the smaller alpha
        # a near-tie between grid points could go either way in float32: only a clear winner is checked
        runner_up = min(v for i, v in enumerate(losses) if i != best)
        if runner_up > losses[best] * (1 + 1e-4):
            assert r.alpha == best / grid, r.group
            checked += 1
        torch.testing.assert_close(r.scales, scales(r.alpha), rtol=1e-5, atol=1e-6)
        chosen_alphas.append(r.alpha)
    assert any(a > 0 for a in chosen_alphas), "precondition: some group chose scales other than RTN's"
    assert checked >= len(results) // 2, "precondition: most groups have a clear best alpha"


# -- metrics -----------------------------------------------------------------------------------------------------


def test_kl_of_a_model_with_itself_is_zero(tiny_lm, ids):
    stats = kl_stats(tiny_lm.model, tiny_lm.model, ids)
    assert stats["mean"] == stats["median"] == stats["p99"] == stats["max"] == 0.0
    assert stats["top1_agreement"] == 1.0


def test_kl_and_perplexity_equal_a_hand_computation(tiny_lm, ids):
    other = build_tiny_lm(seed=3).model
    ref, quant = logits_of(tiny_lm.model, ids).double(), logits_of(other, ids).double()
    nll, kls, agree = [], [], 0
    for t in range(len(ids) - 1):
        p = torch.softmax(ref[t], -1)
        q = torch.softmax(quant[t], -1)
        nll.append(-math.log(float(p[ids[t + 1]])))
        kls.append(float((p * (p / q).log()).sum()))
        agree += int(ref[t].argmax() == quant[t].argmax())
    assert perplexity(tiny_lm.model, ids) == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-9)
    got = kl_stats(tiny_lm.model, other, ids)
    assert got["mean"] == pytest.approx(sum(kls) / len(kls), rel=1e-9)
    assert got["max"] == pytest.approx(max(kls), rel=1e-9)
    assert got["median"] == pytest.approx(float(torch.tensor(kls, dtype=torch.float64).median()), rel=1e-9)
    assert got["top1_agreement"] == pytest.approx(agree / len(kls))
    assert got["mean"] > 0.01
    # precomputed logits are accepted in place of a model
    assert kl_stats(ref, quant, ids)["mean"] == pytest.approx(got["mean"], rel=1e-9)


def test_first_divergence_of_greedy_outputs(tiny_lm, ids):
    model, other = tiny_lm.model, build_tiny_lm(seed=3).model
    prompt = ids[:8]
    assert first_divergence(model, model, prompt, 12) == -1
    runs = [m.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=12, min_new_tokens=12)[0, 8:].tolist()
            for m in (model, other)]
    expected = next((i for i, (a, b) in enumerate(zip(*runs, strict=True)) if a != b), -1)
    assert expected != -1
    assert first_divergence(model, other, prompt, 12) == expected


# -- true low-bit storage: the stored copies compute what the fake-quantized ones did ----------------------------


def int4_asym(w: torch.Tensor, group: int) -> torch.Tensor:
    """Asymmetric int4 round to nearest in groups of ``group`` input columns, dequantized, written out."""
    g = w.detach().double().reshape(w.shape[0], -1, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = (hi - lo) / 15
    zero = -8 - lo / scale
    return ((torch.clamp(torch.round(g / scale + zero), -8, 7) - zero) * scale).reshape(w.shape).float()


def int8_rows(x: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 per row (an output channel of a weight, a token of activations), dequantized."""
    scale = x.abs().amax(-1, keepdim=True) / 127
    return torch.clamp(torch.round(x / scale), -127, 127) * scale


class FakeW8A8(torch.nn.Module):
    """The former fake-quantized W8A8 linear on the unsmoothed input: int8(x / s) int8(W diag s)^T, in float."""

    def __init__(self, weight: torch.Tensor, s: torch.Tensor):
        super().__init__()
        self.s, self.w = s, int8_rows(weight.detach() * s)

    def forward(self, x):
        return torch.nn.functional.linear(int8_rows(x / self.s), self.w)


def with_linears(model, make):
    """A copy of ``model`` with every decoder linear replaced by ``make(name, linear)``."""
    out = copy.deepcopy(model)
    for name, linear in decoder_linears(out).items():
        parent, _, attr = name.rpartition(".")
        setattr(out.get_submodule(parent), attr, make(name, linear))
    return out


def float_bytes_outside_linears(model) -> int:
    linears = decoder_linears(model).values()
    return sum(p.numel() * p.element_size() for p in model.parameters()) - sum(m.weight.numel() * 4 for m in linears)


def stored(module):
    return module.linear if isinstance(module, InputScaledLinear) else module


@pytest.mark.parametrize("kernel", ["dequant", "int4pack"])
def test_awq_stores_packed_int4_and_computes_the_fake_quantized_function(tiny_lm, ids, kernel):
    model, group = tiny_lm.model, 32
    results = []
    quantized = awq(model, tiny_lm.tokenizer, TEXT, group_size=group, grid=10, max_tokens=MAX_TOKENS, kernel=kernel,
                    results=results)
    scales = {}
    for r in results:  # "model.layers.1.mlp.gate_up" -> the scales of both linears
        prefix, part = r.group.split(".", 3)[:3], r.group.split(".", 3)[3]
        for path in GROUP_LINEARS[part]:
            scales[".".join([*prefix, path])] = r.scales
    assert any(not torch.equal(s, torch.ones_like(s)) for s in scales.values())
    # Storage: packed int4 codes, float32 scale and zero per group of 32, o_proj's input scale (grouped-query
    # attention: 4 heads share 2 value heads, so it stays a vector), nothing else beyond the float model's rest.
    linears = decoder_linears(quantized)
    assert all(isinstance(stored(m), QuantLinear) and stored(m).kernel == kernel and stored(m).q.dtype == torch.uint8
               for m in linears.values())
    assert [n for n, m in linears.items() if isinstance(m, InputScaledLinear)] == \
        [f"model.layers.{i}.self_attn.o_proj" for i in range(len(model.model.layers))]
    expected = float_bytes_outside_linears(model) + sum(
        m.out_features * m.in_features // 2 + m.out_features * (m.in_features // group) * 8
        + (m.in_features * 4 if name.endswith("o_proj") else 0) for name, m in decoder_linears(model).items())
    assert model_weight_bytes(quantized) == expected
    # Function: every linear applies Q(W diag s) diag(1/s) to the reference's input (no folding anywhere).
    reference = with_linears(model, lambda name, m: torch.nn.Linear(m.in_features, m.out_features, bias=False))
    with torch.no_grad():
        for name, m in decoder_linears(reference).items():
            w, s = decoder_linears(model)[name].weight.detach(), scales[name]
            m.weight.copy_(int4_asym(w * s, group) / s)
    got, want, original = logits_of(quantized, ids), logits_of(reference, ids), logits_of(model, ids)
    quantization = float((want - original).abs().max())
    error = float((got - want).abs().max())
    if kernel == "dequant":  # exact but for float32 rounding (the folds reassociate products)
        assert error < 1e-4 * float(want.abs().max())
    else:  # the int4 kernel rounds activations and scales to bfloat16: small against the quantization itself
        assert 1e-6 < error < 0.1 * quantization
    assert quantization > 1e-3


@pytest.mark.parametrize("kernel", ["dequant", "auto"])
def test_w8a8_copies_store_int8_and_compute_the_fake_quantized_function(tiny_lm, ids, stats, kernel):
    model, alpha = tiny_lm.model, 0.5
    smooth = {}  # SmoothQuant's factors by linear, from the formula: max|X_j|^a / max|W_j|^(1-a) over the group
    for i, layer in enumerate(model.model.layers):
        for group in (("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), ("mlp.gate_proj", "mlp.up_proj")):
            w_max = torch.cat([layer.get_submodule(p).weight for p in group]).abs().amax(0)
            s = stats[f"model.layers.{i}.{group[0]}"].max_abs ** alpha / w_max.detach() ** (1 - alpha)
            smooth.update({f"model.layers.{i}.{p}": s for p in group})
    ones = torch.ones(model.config.intermediate_size)
    copies = {"naive": (naive_w8a8(model, kernel=kernel), {}),
              "smoothquant": (smoothquant(model, stats, alpha, kernel=kernel), smooth)}
    for label, (quantized, factors) in copies.items():
        linears = decoder_linears(quantized)
        expected_kernel = "int8mm" if kernel == "auto" else "dequant"  # the integer GEMM on this CPU
        assert all(isinstance(m, QuantLinear) and m.q.dtype == torch.int8 and m.kernel == expected_kernel
                   and m.activation_quant == "int8-token" for m in linears.values()), label
        # int8 codes, one float32 scale per output channel
        assert model_weight_bytes(quantized) == float_bytes_outside_linears(model) + sum(
            m.out_features * m.in_features + m.out_features * 4 for m in decoder_linears(model).values())
        reference = with_linears(model, lambda name, m, f=factors: FakeW8A8(
            m.weight, f.get(name, ones[: m.in_features])))
        got, want = logits_of(quantized, ids), logits_of(reference, ids)
        # up to float rounding (int32 vs float32 accumulation, the norm fold vs x / s), which can move an
        # activation that sits on a rounding boundary by one int8 step
        error = float((got - want).abs().max())
        assert error < 1e-3 * float(want.abs().max()), label
        assert float((want - logits_of(model, ids)).abs().max()) > 20 * error, label
        if kernel == "dequant" and label == "naive":  # the same float operations as the former fake path
            assert error == 0.0


def test_int8mm_kernel_and_row_scaling_of_a_quant_linear_with_bias():
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 24)
    x = torch.randn(2, 5, 48)
    layer = QuantLinear(linear, quantize(linear.weight, 8), activation_quant="int8-token")
    assert layer.kernel == "int8mm"  # chosen on this CPU for per-channel W8A8
    w = int8_rows(linear.weight.detach())
    expected = torch.nn.functional.linear(int8_rows(x), w, linear.bias.detach())  # the emulated int8 product
    torch.testing.assert_close(layer(x), expected, rtol=1e-5, atol=1e-5)
    assert layer.runtime_bytes == 48 * 24 + 24 * 4  # transposed int8 codes and the channel scales
    # Dividing the output rows by s divides the group scales and the bias: the layer then computes y / s.
    s = torch.rand(24) + 0.5
    layer4 = QuantLinear(linear, quantize(linear.weight, 4, 16, symmetric=False))
    before = layer4(x)
    codes = layer4.q.clone()
    layer4.scale_rows(s)
    assert torch.equal(layer4.q, codes)
    torch.testing.assert_close(layer4(x), before / s, rtol=1e-5, atol=1e-6)


def int8_groups(w: torch.Tensor, group: int | None, symmetric: bool) -> torch.Tensor:
    """int8 round to nearest in groups of ``group`` input columns (None: per output channel), dequantized, written
    out: symmetric codes ±127 with scale max|w| / 127; asymmetric codes -128..127 with scale (max - min) / 255 and
    zero point -128 - min / scale."""
    g = w.detach().double().reshape(w.shape[0], -1, group or w.shape[1])
    if symmetric:
        scale = g.abs().amax(-1, keepdim=True) / 127
        return (torch.clamp(torch.round(g / scale), -127, 127) * scale).reshape(w.shape).float()
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = (hi - lo) / 255
    zero = -128 - lo / scale
    return ((torch.clamp(torch.round(g / scale + zero), -128, 127) - zero) * scale).reshape(w.shape).float()


class HandLinear(torch.nn.Module):
    """A linear with a given (dequantized) weight, its input optionally rounded to int8 per token first."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, per_token: bool):
        super().__init__()
        self.w, self.b, self.per_token = weight, bias, per_token

    def forward(self, x):
        return torch.nn.functional.linear(int8_rows(x) if self.per_token else x, self.w, self.b)


@pytest.mark.parametrize(("method", "group", "symmetric", "per_token"), [
    ("zeroquant", 32, True, True),  # W8A8: int8 group-wise weights, int8 per-token activations
    ("rtn-int8-asym", None, False, False),  # weights only, per channel, with a zero point
    ("rtn-int8", None, True, False),
])
def test_int8_methods_compute_what_their_recipe_written_here_computes(tiny_lm, ids, method, group, symmetric,
                                                                      per_token):
    model = tiny_lm.model
    copied = quantize_model(model, method, group, kernel="dequant")
    for name, linear in decoder_linears(model).items():
        stored = decoder_linears(copied)[name]
        torch.testing.assert_close(dequantize(stored.qt), int8_groups(linear.weight, group, symmetric),
                                   rtol=0, atol=1e-6)
    reference = with_linears(model, lambda name, m: HandLinear(int8_groups(m.weight, group, symmetric), m.bias,
                                                               per_token))
    other = with_linears(model, lambda name, m: HandLinear(int8_groups(m.weight, group, symmetric), m.bias,
                                                           not per_token))
    got, want, unlike = logits_of(copied, ids), logits_of(reference, ids), logits_of(other, ids)
    error = float((got - want).abs().max())
    # float rounding can move an activation sitting on a rounding boundary by one int8 step
    assert error < 1e-4 * float(want.abs().max()), method
    # the activations' rounding is visible in the logits: with it dropped (or added) they move far more
    assert float((unlike - want).abs().max()) > 20 * error, method
