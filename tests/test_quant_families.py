"""Quantization on every model family's tiny model (``tiny_models.FAMILIES``): the folds keep the float function, every
method's copy replaces exactly the projections it claims and reports the bytes they hold, ``--quant`` decodes the
copy, and what cannot be quantized is refused naming the family.

Expectations are computed here from the models' own modules (``nn.Linear`` / ``Conv1D`` under the decoder, the LM
head left out), not from the anatomy table the engine reads.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from support.tiny_models import FAMILIES, TRAINING_TEXT, build_tiny_lm, build_tokenizer, tiny_config
from torch import nn
from transformers.pytorch_utils import Conv1D

from playground.config import ConfigError, QuantSettings, RunSettings
from playground.engine.quant import awq as awq_module
from playground.engine.quant.awq import InputScaledLinear, awq, fold_scales
from playground.engine.quant.calibration import activation_stats, text_ids
from playground.engine.quant.linear import QuantLinear, model_weight_bytes, quantize_model
from playground.engine.quant.rtn import dequantize
from playground.engine.quant.smoothquant import naive_w8a8, smooth_model
from playground.engine.quantized.apply import clear_cache, quantized_lm
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, RunStarted
from playground.events.quant import QuantReady
from playground.models.anatomy import anatomy_of, family_name
from playground.models.loaded import LoadedModel
from playground.state.quant import QuantState

TEXT = TRAINING_TEXT * 2
TOKENS = 48
PROMPT = "The weather in Paris"
NEW_TOKENS = 8
# How each method stores a projection: (bits, group size or None for per channel, symmetric), with group 32.
STORAGE = {"rtn-int8": (8, None, True), "rtn-int8-asym": (8, None, False), "rtn-int4": (4, 32, False),
           "zeroquant": (8, 32, True), "naive-w8a8": (8, None, True), "smoothquant": (8, None, True),
           "awq": (4, 32, False)}
GATED = {"llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3", "llama-mha"}  # down(act(gate) * up)
FOLD_CASES = (*FAMILIES, "llama-mha")  # + a Llama with a value head per head: AWQ folds o into v_proj's rows


def build(case: str) -> LoadedModel:
    if case != "llama-mha":
        return build_tiny_lm(seed=3, family=case)
    tokenizer = build_tokenizer()
    config, model_class = tiny_config("llama", tokenizer, layers=2, max_positions=256)
    config.num_key_value_heads = config.num_attention_heads
    torch.manual_seed(3)
    model = model_class(config).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name="tiny-llama-mha", path="<memory>",
                       device=torch.device("cpu"), dtype=torch.float32)


_MODELS: dict[str, LoadedModel] = {}


def tiny(case: str) -> LoadedModel:
    """The case's tiny model with every norm's weight and bias and every projection's bias made random (random init
    leaves RMSNorm weights at 1, Gemma's w at 0 and every bias at 0, which hides a fold that forgets one)."""
    if case not in _MODELS:
        lm = build(case)
        generator = torch.Generator().manual_seed(11)
        with torch.no_grad():
            for module in lm.model.modules():
                norm = is_norm(module)
                if norm and getattr(module, "weight", None) is not None:
                    module.weight.add_(0.3 * torch.randn(module.weight.shape, generator=generator))
                if (norm or isinstance(module, (nn.Linear, Conv1D))) and getattr(module, "bias", None) is not None:
                    module.bias.add_(0.3 * torch.randn(module.bias.shape, generator=generator))
        _MODELS[case] = lm
    return _MODELS[case]


def is_norm(module: nn.Module) -> bool:
    return "norm" in type(module).__name__.lower() or isinstance(module, nn.LayerNorm)


def changed_norms(model, other) -> list[str]:
    """The norms whose parameters differ between ``model`` and its copy ``other``."""
    return [name for name, m in model.named_modules() if is_norm(m) and any(
        not torch.equal(p, other.get_submodule(name).get_parameter(k)) for k, p in m.named_parameters())]


def logits_of(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits[0]


def relative_change(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max())


def projections(model) -> dict[str, nn.Module]:
    """Every nn.Linear / Conv1D of the model but its LM head, by module name (what 'every decoder projection'
    means, counted without the anatomy)."""
    head = model.get_output_embeddings()
    return {name: m for name, m in model.named_modules() if isinstance(m, (nn.Linear, Conv1D)) and m is not head}


def shape(module: nn.Module) -> tuple[int, int]:
    """(out, in) of a float projection."""
    w = module.weight
    return (w.shape[1], w.shape[0]) if isinstance(module, Conv1D) else (w.shape[0], w.shape[1])


def stored_bytes(out: int, cols: int, bits: int, group: int | None, symmetric: bool) -> int:
    """Codes of whole groups (two int4 codes a byte) + a float32 scale per group (+ a float32 zero point)."""
    group = cols if group is None else group
    groups = -(-cols // group)
    return out * groups * group * bits // 8 + out * groups * 4 * (1 if symmetric else 2)


def quant_linears(model) -> dict[str, nn.Module]:
    """The copy's QuantLinears by the name of the projection they replaced (an AWQ input scale wraps one)."""
    return {name.removesuffix(".linear"): m for name, m in model.named_modules() if isinstance(m, QuantLinear)}


def input_scaled(case: str, model) -> set[str]:
    """Where AWQ must keep an input scale, from the model's own modules: in front of the attention's output
    projection unless v is a linear of its own with one value head per head, in front of the MLP's down
    projection unless the MLP is gated."""
    found = set()
    for name, module in projections(model).items():
        last = name.rpartition(".")[2]
        if last in ("o_proj", "dense") or name.endswith("attn.c_proj"):
            v = name.rpartition(".")[0] + ".v_proj"
            v_module = dict(model.named_modules()).get(v)
            if v_module is None or shape(v_module)[0] != shape(module)[1]:
                found.add(name)
        if (last in ("dense_4h_to_h", "down_proj") or name.endswith("mlp.c_proj")) and case not in GATED:
            found.add(name)
    return found


# -- the folds alone keep the float function --------------------------------------------------------------------


@pytest.mark.parametrize("case", FOLD_CASES)
def test_smoothquant_fold_without_rounding_keeps_the_logits(case):
    lm = tiny(case)
    ids = text_ids(lm.tokenizer, TEXT, TOKENS)
    stats = activation_stats(lm.model, lm.tokenizer, TEXT, TOKENS)
    smoothed, factors = smooth_model(lm.model, stats, alpha=0.5)
    assert len(factors) == 2 * lm.model.config.num_hidden_layers  # one group per block
    assert max(float(s.log().abs().max()) for s in factors.values()) > 1.0  # the scaling is far from a no-op
    assert len(changed_norms(lm.model, smoothed)) == len(factors)  # two norms a layer took the division
    original = logits_of(lm.model, ids)
    assert relative_change(logits_of(smoothed, ids), original) < 1e-4, case


@pytest.mark.parametrize("case", FOLD_CASES)
def test_awq_fold_without_rounding_keeps_the_logits(case):
    lm = tiny(case)
    ids = text_ids(lm.tokenizer, TEXT, TOKENS)
    generator = torch.Generator().manual_seed(5)
    groups = awq_module.awq_groups(anatomy_of(lm.model))
    linears = dict(lm.model.named_modules())
    scales = {}
    for group in groups:  # random positive scales, one per input channel of the group
        first = linears[f"{anatomy_of(lm.model).linear_name(group.index, group.linears[0])}"]
        scales[group.name] = torch.exp(0.7 * torch.randn(shape(first)[1], generator=generator))
    folded = fold_scales(lm.model, scales)
    kept = {name for name, m in folded.named_modules() if isinstance(m, InputScaledLinear)}
    assert kept == input_scaled(case, lm.model), case  # and everywhere else the scale went into a norm or rows
    assert not any(isinstance(m, QuantLinear) for m in folded.modules())  # no rounding
    assert len(changed_norms(lm.model, folded)) == 2 * lm.model.config.num_hidden_layers
    original = logits_of(lm.model, ids)
    assert relative_change(logits_of(folded, ids), original) < 1e-4, case


# -- every method's copy: what it replaced, its bytes, and --quant decoding it ----------------------------------


def plain_greedy(model, prompt_ids: list[int], n: int) -> list[int]:
    """n argmax tokens, the whole sequence re-read every step (no cache, no engine code)."""
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(n):
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt_ids):]


@pytest.mark.parametrize("method", list(STORAGE))
@pytest.mark.parametrize("family", FAMILIES)
def test_every_method_replaces_every_projection_and_reports_their_bytes(family, method):
    lm = tiny(family)
    model = lm.model
    clear_cache()
    quant = QuantSettings(quant=method, group_size=32, calibration_tokens=TOKENS)
    qlm, ready = quantized_lm(lm, quant)
    copied = qlm.model
    claimed = projections(model)
    replaced = quant_linears(copied)
    assert set(replaced) == set(claimed), family  # every projection, fused and Conv1D ones included
    assert not projections(copied)  # no float projection left in the decoder
    assert not any(isinstance(m, QuantLinear) for m in model.modules())  # the reference is untouched
    bits, group, symmetric = STORAGE[method]
    for name, module in replaced.items():
        assert (module.out_features, module.in_features) == shape(claimed[name])
        assert (module.bits, module.group_size, module.zero is None) == (bits, group, symmetric), name
        if method not in ("smoothquant", "awq"):  # unscaled: the codes hold the weight itself, as [out, in]
            original = claimed[name].weight.detach()
            original = original.t() if isinstance(claimed[name], Conv1D) else original
            error = torch.linalg.norm(dequantize(module.qt) - original) / torch.linalg.norm(original)
            assert error < (0.2 if bits == 4 else 0.02), name
    kept = {name for name, m in copied.named_modules() if isinstance(m, InputScaledLinear)}
    assert kept == (input_scaled(family, model) if method == "awq" else set())
    float_bytes = sum(p.numel() * p.element_size() for p in {p.data_ptr(): p for p in model.parameters()}.values())
    expected = float_bytes + sum(
        stored_bytes(*shape(m), bits, group, symmetric) - m.weight.numel() * 4 for m in claimed.values()) + sum(
        shape(claimed[name])[1] * 4 for name in kept)  # AWQ's float32 input scales
    assert ready.reference_weight_bytes == float_bytes
    assert ready.weight_bytes == expected == model_weight_bytes(copied)
    assert len(ready.layer_errors) == len(claimed) and all(e.relative_error > 0 for e in ready.layer_errors)
    assert f"All {len(claimed)} decoder projections of this {family_name(model)} model" in ready.note
    # --quant greedy decodes that copy: an argmax loop over it, and not the float model's numbers
    run = RunSettings.from_flat(prompt=PROMPT, chat=False, max_new_tokens=NEW_TOKENS, quant=method, group_size=32,
                                calibration_tokens=TOKENS)
    events = list(run_strategy(lm, run))
    assert isinstance(events[0], RunStarted) and isinstance(events[1], QuantReady) and events[1].cached
    assert isinstance(events[-1], RunFinished) and events[-1].model_name == qlm.name
    got = list(events[-1].token_ids)
    prompt_ids = lm.tokenizer(PROMPT)["input_ids"]
    want = plain_greedy(copied, prompt_ids, NEW_TOKENS)
    assert got == want[:len(got)] and (len(got) == NEW_TOKENS or got[-1] in lm.eos_token_ids), family
    assert not torch.equal(logits_of(copied, prompt_ids), logits_of(model, prompt_ids))


@pytest.mark.parametrize("family", FAMILIES)
def test_rtn_copies_for_drafters_quantize_every_projection_and_the_head(family):
    """``quantize_model`` also makes the int4 drafter, contrastive amateur and cascade cheap model."""
    model = tiny(family).model
    claimed = projections(model)
    head_name = next(name for name, m in model.named_modules() if m is model.get_output_embeddings())
    for head in (False, True):
        copied = quantize_model(model, "rtn-int4", 32, quantize_lm_head=head)
        replaced = quant_linears(copied)
        assert set(replaced) == set(claimed) | ({head_name} if head else set())
        assert (copied.get_output_embeddings() is replaced.get(head_name)) == head  # the head the forward uses
        assert all(m.bits == 4 and m.packed for m in replaced.values())


def test_the_quant_view_names_and_colours_each_familys_projection_kinds(qtbot):
    """The state keeps GPT-2's attn.c_proj and mlp.c_proj apart; the view's legend and curves follow the loaded
    family's kinds, Llama's seven then GPT-2's four."""
    from playground.state import Run
    from playground.ui.style import configure_pyqtgraph
    from playground.ui.views.quant import QuantView

    configure_pyqtgraph()
    view = QuantView()
    qtbot.addWidget(view)
    llama = [(name, f"{block}.{name}") for block, names in (("self_attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
                                                            ("mlp", ("gate_proj", "up_proj", "down_proj")))
             for name in names]
    gpt2 = [("c_attn", "attn.c_attn"), ("attn.c_proj", "attn.c_proj"), ("c_fc", "mlp.c_fc"),
            ("mlp.c_proj", "mlp.c_proj")]
    for family, expected in (("llama", llama), ("gpt2", gpt2)):
        lm = tiny(family)
        clear_cache()
        events = list(run_strategy(lm, RunSettings.from_flat(prompt=PROMPT, chat=False, max_new_tokens=2,
                                                             quant="rtn-int8", calibration_tokens=TOKENS)))
        ready = next(e for e in events if isinstance(e, QuantReady))
        state = QuantState()
        state.apply(ready)
        kinds, series = state.layer_errors_by_layer()
        assert kinds == [kind for kind, _ in expected]
        errors = {e.name: e.relative_error for e in ready.layer_errors}
        for kind, path in expected:
            assert list(series[kind]) == [errors[f"layers.{i}.{path}"] for i in range(2)]
        view.show_run(Run.from_events(events))
        legend = view.error_legend.text()
        assert all(f"━ {kind.removesuffix('_proj') if '.' not in kind else kind}</span>" in legend for kind in kinds)
        assert legend.count("━") == len(kinds)
        drawn = {kind: list(curve.getData()[1] if curve.getData()[1] is not None else [])
                 for kind, curve in view.error_curves.items()}
        assert {kind for kind, ys in drawn.items() if len(ys)} == set(kinds)  # the other family's curves emptied
        assert drawn[kinds[-1]] == list(series[kinds[-1]])


# -- refusals ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("family", FAMILIES)
def test_quantizing_a_quantized_copy_is_refused_naming_the_family(family):
    lm = tiny(family)
    already = dataclasses.replace(lm, model=quantize_model(lm.model, "rtn-int8"))
    name = family_name(lm.model)
    for method in STORAGE:
        with pytest.raises(ConfigError, match=f"{method} cannot quantize this {name} model.*already quantized"):
            quantized_lm(already, QuantSettings(quant=method, calibration_tokens=TOKENS))
    with pytest.raises(ConfigError, match=name):
        naive_w8a8(already.model)
    with pytest.raises(ConfigError, match=name):
        awq(already.model, lm.tokenizer, TEXT, group_size=32, max_tokens=TOKENS)


def test_a_copy_that_quantized_nothing_is_refused(monkeypatch):
    """The last guard: were a builder to leave its targets float, the copy is an error, never 'int4'."""
    lm = tiny("gpt2")
    monkeypatch.setattr(awq_module, "quantized_linear", lambda linear, *args, **kwargs: copy.deepcopy(linear))
    clear_cache()
    with pytest.raises(ConfigError, match="awq quantized none of the 8 decoder projections of this GPT-2 model"):
        quantized_lm(lm, QuantSettings(quant="awq", group_size=32, calibration_tokens=TOKENS))


def test_a_family_outside_the_anatomy_table_is_refused_by_every_method():
    import transformers as tf

    tokenizer = build_tokenizer()
    config = tf.OPTConfig(vocab_size=len(tokenizer), hidden_size=32, ffn_dim=64, num_hidden_layers=2,
                          num_attention_heads=4, word_embed_proj_dim=32, max_position_embeddings=128)
    lm = LoadedModel(model=tf.OPTForCausalLM(config).eval(), tokenizer=tokenizer, name="tiny-opt", path="<memory>",
                     device=torch.device("cpu"), dtype=torch.float32)
    for method in STORAGE:
        with pytest.raises(ConfigError, match=f"{method} cannot open this model up: the OPTForCausalLM family"):
            quantized_lm(lm, QuantSettings(quant=method, calibration_tokens=TOKENS))
    with pytest.raises(ConfigError, match="OPTForCausalLM"):
        quantize_model(lm.model, "rtn-int4", 32)
