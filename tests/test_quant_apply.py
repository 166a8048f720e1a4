"""`--quant METHOD` for every strategy: runs on the quantized copy equal plain loops over a copy built here, the copy
is cached, its QuantReady figures equal hand computations, and the reference model is left alone."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from support.strategy_needs import NEEDS

from playground.config import ConfigError, QuantSettings, RunSettings
from playground.config.catalog import STRATEGIES
from playground.engine import variants
from playground.engine.quant.awq import AwqResult, awq
from playground.engine.quant.calibration import load_text, text_ids
from playground.engine.quant.linear import quantize_model
from playground.engine.quantized.apply import QuantCancelled, clear_cache, quantized_lm
from playground.engine.run_context import RunContext
from playground.engine.strategies import run_strategy
from playground.events import BeamStep, RunFinished, RunStarted, TokenStep, event_from_dict
from playground.events.quant import ChannelScales, LayerError, QuantReady
from playground.models.loaded import LoadedModel

PROMPT = "The weather in Paris"
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def settings(**changes) -> RunSettings:
    return RunSettings.from_flat(**{"prompt": PROMPT, "chat": False, "max_new_tokens": 10, **changes})


def copy_lm(lm: LoadedModel, model) -> LoadedModel:
    return dataclasses.replace(lm, model=model)


def int4_asym(w: torch.Tensor, group: int) -> torch.Tensor:
    """Asymmetric int4 round to nearest in groups of ``group`` input columns, written out (columns divide evenly)."""
    g = w.detach().double().reshape(w.shape[0], -1, group)
    lo, hi = g.amin(-1, keepdim=True), g.amax(-1, keepdim=True)
    scale = (hi - lo) / 15
    zero = -8 - lo / scale
    codes = torch.clamp(torch.round(g / scale + zero), -8, 7)
    return ((codes - zero) * scale).reshape(w.shape)


def int8_rows(w: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 per row: round(w / (max|row| / 127)) * scale."""
    w = w.detach().double()
    scale = w.abs().amax(-1, keepdim=True) / 127
    return torch.clamp(torch.round(w / scale), -127, 127) * scale


def frobenius_ratio(approx: torch.Tensor, exact: torch.Tensor) -> float:
    approx, exact = approx.detach().double(), exact.detach().double()
    return float(torch.linalg.norm(approx - exact) / torch.linalg.norm(exact))


def plain_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """n greedy tokens, the whole sequence re-read every step (no cache, no engine code)."""
    ids = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


def linear_inputs(model, ids: list[int], names: list[str]) -> dict[str, torch.Tensor]:
    """The input [tokens, in] of the named linears (``model.layers.0.self_attn.q_proj``) on one pass over ids."""
    seen: dict[str, torch.Tensor] = {}
    handles = [model.get_submodule(name).register_forward_pre_hook(
        lambda _m, args, name=name: seen.__setitem__(name, args[0][0].detach().clone())) for name in names]
    with torch.no_grad():
        model(input_ids=torch.tensor([ids]))
    for handle in handles:
        handle.remove()
    return seen


def test_greedy_with_rtn_int8_equals_a_plain_loop_over_a_copy_quantized_here(tiny_lm):
    events = list(run_strategy(tiny_lm, settings(quant="rtn-int8")))
    copy = quantize_model(tiny_lm.model, "rtn-int8", None)
    prompt_ids = tiny_lm.tokenizer(PROMPT)["input_ids"]
    assert list(events[-1].token_ids) == plain_greedy(copy, prompt_ids, 10)
    # and the quantized copy decodes differently from the reference somewhere in its logits (it is not the original)
    with torch.no_grad():
        ref = tiny_lm.model(input_ids=torch.tensor([prompt_ids])).logits
        quant = copy(input_ids=torch.tensor([prompt_ids])).logits
    assert not torch.equal(ref, quant)
    assert isinstance(events[0], RunStarted) and isinstance(events[1], QuantReady)
    assert events[0].model_name == f"{tiny_lm.name} · rtn-int8" and events[-1].model_name == events[0].model_name
    assert events[0].settings["quant"]["quant"] == "rtn-int8"  # a saved trace says how it was made


def test_sampling_equals_the_plain_sampler_on_a_copy_quantized_here(tiny_lm):
    run = settings(strategy="sample", quant="rtn-int4", group_size=32, temperature=0.9, top_k=20, seed=7)
    events = list(run_strategy(tiny_lm, run))
    copy = copy_lm(tiny_lm, quantize_model(tiny_lm.model, "rtn-int4", 32))
    plain = list(run_strategy(copy, run.with_group(QuantSettings())))
    assert [e.token_id for e in events if isinstance(e, TokenStep)] == \
        [e.token_id for e in plain if isinstance(e, TokenStep)]
    assert events[-1].token_ids == plain[-1].token_ids


def test_beam_equals_transformers_generate_on_a_copy_quantized_here(tiny_lm):
    run = settings(strategy="beam", quant="zeroquant", group_size=32, num_beams=3, max_new_tokens=8)
    events = list(run_strategy(tiny_lm, run))
    assert isinstance(events[1], QuantReady) and any(isinstance(e, BeamStep) for e in events)
    copy = quantize_model(tiny_lm.model, "zeroquant", 32)
    prompt = torch.tensor([tiny_lm.tokenizer(PROMPT)["input_ids"]])
    with torch.inference_mode():
        out = copy.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=8, num_beams=3,
                            do_sample=False, length_penalty=1.0, early_stopping=False, output_scores=True,
                            return_dict_in_generate=True)
    length = int((out.beam_indices[0] != -1).sum())
    best = events[-1].sequences[0]
    assert list(best.token_ids) == out.sequences[0, prompt.shape[1]: prompt.shape[1] + length].tolist()
    assert best.score == pytest.approx(float(out.sequences_scores[0]), abs=1e-5)


@pytest.mark.parametrize("name", [n for n, s in STRATEGIES.items() if QuantSettings in s.groups])
def test_every_strategy_that_takes_quant_runs_on_the_copy(tiny_lm, name):
    events = list(run_strategy(tiny_lm, RunSettings.from_flat(strategy=name, prompt="Hello", max_new_tokens=3,
                                                              quant="rtn-int8", **NEEDS.get(name, {}))))
    assert isinstance(events[0], RunStarted) and isinstance(events[1], QuantReady)
    assert sum(isinstance(e, QuantReady) for e in events) == 1
    # A strategy that decodes (not patching, whose rows are maps) makes its tokens on the copy.
    assert isinstance(events[-1], RunFinished) and len(events[-1].token_ids) == (3 if STRATEGIES[name].decodes else 0)
    assert events[-1].model_name.endswith("· rtn-int8")


def test_the_copy_is_cached_per_model_and_method(tiny_lm):
    clear_cache()
    quant = QuantSettings(quant="rtn-int4", group_size=32)
    first_lm, first = quantized_lm(tiny_lm, quant)
    assert not first.cached and first.seconds > 0
    second_lm, second = quantized_lm(tiny_lm, quant)
    assert second.cached and second.seconds == 0.0 and second_lm.model is first_lm.model
    assert dataclasses.replace(second, seconds=first.seconds, cached=False) == first
    # The second run of a strategy takes the same copy (its QuantReady says so).
    ready = next(e for e in run_strategy(tiny_lm, settings(quant="rtn-int4", group_size=32, max_new_tokens=2))
                 if isinstance(e, QuantReady))
    assert ready.cached and ready.seconds == 0.0
    # Another group size is another copy; rtn-int8 is per channel, so the group size does not change it.
    other_lm, other = quantized_lm(tiny_lm, dataclasses.replace(quant, group_size=64))
    assert not other.cached and other_lm.model is not first_lm.model and other.group_size == 64
    quantized_lm(tiny_lm, QuantSettings(quant="rtn-int8", group_size=32))
    assert quantized_lm(tiny_lm, QuantSettings(quant="rtn-int8", group_size=128))[1].cached
    # One copy at a time: going back to group 32 builds it again.
    assert not quantized_lm(tiny_lm, quant)[1].cached


def test_quant_ready_figures_equal_hand_computations(tiny_lm):
    clear_cache()
    model = tiny_lm.model
    _, ready = quantized_lm(tiny_lm, QuantSettings(quant="rtn-int4", group_size=32))
    assert (ready.method, ready.group_size, ready.stored, ready.reference_dtype) == ("rtn-int4", 32, "packed int4",
                                                                                  "float32")
    linears = [m for name, m in model.named_modules() if name.split(".")[-1] in LINEARS]
    float_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert ready.reference_weight_bytes == float_bytes  # untied embeddings: every parameter once
    # int4 codes two per byte, one float32 scale and one float32 zero per group of 32 inputs.
    low_bit = sum(m.out_features * m.in_features // 2 + m.out_features * (m.in_features // 32) * 8 for m in linears)
    assert ready.weight_bytes == float_bytes - sum(m.weight.numel() * 4 for m in linears) + low_bit
    # Every decoder linear has its error, layer by layer; one of them by hand.
    assert [e.name for e in ready.layer_errors] == [f"layers.{i}.{part}.{name}" for i in range(2)
                                                   for part, name in [("self_attn", n) for n in LINEARS[:4]]
                                                   + [("mlp", n) for n in LINEARS[4:]]]
    assert all(isinstance(e, LayerError) for e in ready.layer_errors)
    w = model.model.layers[1].mlp.down_proj.weight
    error = next(e for e in ready.layer_errors if e.name == "layers.1.mlp.down_proj").relative_error
    assert error == pytest.approx(frobenius_ratio(int4_asym(w, 32), w), rel=1e-5)
    # Plain RTN moves no activation: the channel plots show one curve and no scales.
    assert [c.name for c in ready.channels] == ["layers.0.self_attn.q_proj", "layers.1.mlp.gate_proj",
                                                "layers.1.mlp.down_proj"]
    assert all(c.scales == () and c.act_max_after == c.act_max_before for c in ready.channels)
    # Perplexity of both models on the evaluation text, by hand.
    ids = text_ids(tiny_lm.tokenizer, load_text("evaluation"), 256)
    copy = quantize_model(model, "rtn-int4", 32)
    for name, m in (("reference", model), ("rtn-int4", copy)):
        with torch.no_grad():
            logits = m(input_ids=torch.tensor([ids])).logits[0, :-1]
        nll = torch.nn.functional.cross_entropy(logits.double(), torch.tensor(ids[1:]))
        assert ready.perplexity[name] == pytest.approx(math.exp(float(nll)), rel=1e-6)


def test_smoothquant_errors_and_channel_scales_equal_the_formula(tiny_lm):
    model, alpha = tiny_lm.model, 0.6
    _, ready = quantized_lm(tiny_lm, QuantSettings(quant="smoothquant", smooth_alpha=alpha, calibration_tokens=200))
    ids = text_ids(tiny_lm.tokenizer, load_text("calibration"), 200)
    name = "model.layers.0.self_attn.q_proj"
    x = linear_inputs(model, ids, [name])[name]  # [tokens, in]
    attn = model.model.layers[0].self_attn
    act_max = x.abs().amax(0).double()
    w_max = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).abs().amax(0).double()
    s = act_max.clamp_min(1e-5) ** alpha / w_max.clamp_min(1e-5) ** (1 - alpha)
    channel = ready.channels[0]
    assert isinstance(channel, ChannelScales) and channel.name == "layers.0.self_attn.q_proj"
    assert channel.act_max_before == pytest.approx(act_max.tolist(), rel=1e-5)
    assert channel.scales == pytest.approx(s.tolist(), rel=1e-4)
    assert channel.act_max_after == pytest.approx((act_max / s).tolist(), rel=1e-4)
    # The q weight the smoothed model applies to the original input is Q8(W diag s) diag(1/s).
    w = attn.q_proj.weight.double()
    error = next(e for e in ready.layer_errors if e.name == "layers.0.self_attn.q_proj").relative_error
    assert error == pytest.approx(frobenius_ratio(int8_rows(w * s) / s, w), rel=1e-3)
    # down_proj is quantized but not smoothed (the paper's Llama recipe).
    assert ready.channels[2].scales == ()
    # Stored as int8 codes with one float32 scale per output channel: the smoothing lives in the norms' weights.
    linears = [m for name, m in model.named_modules() if name.split(".")[-1] in LINEARS]
    assert ready.stored == "int8 (per channel, smoothed)"
    assert ready.weight_bytes == ready.reference_weight_bytes - sum(
        m.weight.numel() * 4 - m.out_features * (m.in_features + 4) for m in linears)
    down = model.model.layers[1].mlp.down_proj.weight
    assert ready.layer_errors[-1].relative_error == pytest.approx(frobenius_ratio(int8_rows(down), down), rel=1e-3)


def test_awq_errors_count_the_scales_folded_into_rows_and_inputs(tiny_lm):
    model, group = tiny_lm.model, 32
    _, ready = quantized_lm(tiny_lm, QuantSettings(quant="awq", group_size=group, calibration_tokens=200))
    results: list[AwqResult] = []
    awq(model, tiny_lm.tokenizer, load_text("calibration"), group_size=group, max_tokens=200, results=results)
    scales = {r.group: r.scales.double() for r in results}
    layer = model.model.layers[0]
    errors = {e.name: e.relative_error for e in ready.layer_errors}
    # up_proj: Q(W diag s_gate_up) diag(1/s_gate_up), its rows later divided by down's scales (undone here).
    s = scales["model.layers.0.mlp.gate_up"]
    w = layer.mlp.up_proj.weight.double()
    assert errors["layers.0.mlp.up_proj"] == pytest.approx(frobenius_ratio(int4_asym(w * s, group) / s, w), rel=1e-4)
    # o_proj (grouped-query attention: the scale stays in front of it as an input scale).
    s = scales["model.layers.0.self_attn.o"]
    w = layer.self_attn.o_proj.weight.double()
    assert errors["layers.0.self_attn.o_proj"] == pytest.approx(frobenius_ratio(int4_asym(w * s, group) / s, w),
                                                                rel=1e-4)
    down = next(c for c in ready.channels if c.name == "layers.1.mlp.down_proj")
    assert down.scales == pytest.approx(scales["model.layers.1.mlp.down"].tolist(), rel=1e-5)
    # Stored as packed int4 with a float32 scale and zero per group, plus o_proj's float32 input scale per layer.
    linears = {name: m for name, m in model.named_modules() if name.split(".")[-1] in LINEARS}
    assert ready.stored == "packed int4 (AWQ-scaled)" and "o_proj keeps its own" in ready.note
    assert ready.weight_bytes == ready.reference_weight_bytes - sum(
        m.weight.numel() * 4 - m.out_features * m.in_features // 2 - m.out_features * (m.in_features // group) * 8
        - (m.in_features * 4 if name.endswith("o_proj") else 0) for name, m in linears.items())


def test_the_reference_model_is_left_unchanged(tiny_lm):
    before = {k: v.clone() for k, v in tiny_lm.model.state_dict().items()}
    for method in ("rtn-int4", "smoothquant", "awq", "naive-w8a8"):
        list(run_strategy(tiny_lm, settings(quant=method, group_size=32, max_new_tokens=2)))
    after = tiny_lm.model.state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert all(type(m).__name__ != "QuantLinear" for m in tiny_lm.model.modules())


def test_impossible_combinations_are_refused_before_any_build(tiny_lm):
    clear_cache()
    with pytest.raises(ConfigError, match="quantized drafter"):
        run_strategy(tiny_lm, settings(strategy="speculative", draft="quantized", quant="rtn-int4"))
    # The strategy's own checks come first: a beam run with stop strings builds nothing.
    with pytest.raises(ConfigError, match="stop strings"):
        run_strategy(tiny_lm, settings(strategy="beam", stop_strings=("x",), quant="awq"))
    assert not variants.held(kind=variants.QuantizedCopy)


def test_stop_during_the_build_keeps_nothing(tiny_lm):
    clear_cache()
    reports: list[tuple[str, float]] = []
    with pytest.raises(QuantCancelled, match="nothing was kept"):
        quantized_lm(tiny_lm, QuantSettings(quant="awq", group_size=32),
                     RunContext(progress=lambda message, fraction: reports.append((message, fraction)),
                                should_stop=lambda: len(reports) >= 2))
    assert not variants.held(kind=variants.QuantizedCopy) and reports[0][0].startswith("awq g32: ")


def test_cli_trace_with_quant(model_folder, tmp_path, capsys):
    from playground.cli import main

    out = tmp_path / "run.jsonl"
    assert main(["trace", "--model", str(model_folder), "--device", "cpu", "--quant", "rtn-int4", "--group-size",
                 "32", "--prompt", "Hello", "--max-new-tokens", "3", "--out", str(out)]) == 0
    events = [event_from_dict(json.loads(line)) for line in out.read_text().splitlines()]
    assert isinstance(events[0], RunStarted) and isinstance(events[1], QuantReady)
    ready = events[1]
    assert (ready.method, ready.group_size, ready.cached) == ("rtn-int4", 32, False)
    assert all(isinstance(e, LayerError) for e in ready.layer_errors) and len(ready.layer_errors) == 14
    assert set(ready.perplexity) == {"reference", "rtn-int4"}
    assert isinstance(events[-1], RunFinished) and len(events[-1].token_ids) == 3
    err = capsys.readouterr().err
    assert "rtn-int4 g32: quantizing layer 2/2" in err and "rtn-int4 g32: ready in" in err


def test_default_model_int4_decodes_and_loses_perplexity(default_lm):
    clear_cache()
    try:
        events = list(run_strategy(default_lm, RunSettings.from_flat(
            prompt="What is the capital of France?", max_new_tokens=16, quant="rtn-int4", group_size=128)))
        ready = events[1]
        assert isinstance(ready, QuantReady) and "Q4_1" in ready.note
        assert ready.perplexity["rtn-int4"] > ready.perplexity["reference"]
        assert ready.weight_bytes < 0.4 * ready.reference_weight_bytes
        assert len(ready.layer_errors) == 30 * 7 and all(0 < e.relative_error < 0.5 for e in ready.layer_errors)
        steps = [e for e in events if isinstance(e, TokenStep)]
        assert steps and events[-1].text.strip()
    finally:
        clear_cache()  # do not keep a 180 MB copy for the rest of the session


def test_a_strategy_without_quant_refuses_it_by_name(tiny_lm):
    others = [n for n, s in STRATEGIES.items() if QuantSettings not in s.groups]
    if not others:
        pytest.skip("every registered strategy takes --quant")
    with pytest.raises(ConfigError, match=f"{others[0]} does not take it"):
        run_strategy(tiny_lm, settings(strategy=others[0], quant="rtn-int8"))
