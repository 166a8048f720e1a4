"""What quantization did to a model, in numbers a view can draw: per-linear weight error and per-channel activation
scales of a few representative layers.

Every weight is compared in the reference's own input space. A method that rescales input channels (SmoothQuant's
smoothing factors, AWQ's searched scales; ``input_scales``: the linear then sees x / s) stores the codes of
Q(W diag s) (a ``QuantLinear``; dequantized here), so the weight it effectively applies to the original x is
Q(W diag s) diag(1/s). AWQ also divides the output rows of the linear before ``down_proj`` (``up_proj``) by down's
scales after quantizing it (folded into its int4 group scales; ``row_scales``): multiplying them back gives the
weight in the reference's output space. The error is ‖W_eff − W‖_F / ‖W‖_F.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from playground.engine.quant.awq import AwqResult, InputScaledLinear, layer_groups
from playground.engine.quant.calibration import ActivationStats, decoder_layers, decoder_linears
from playground.engine.quant.linear import QuantLinear
from playground.engine.quant.rtn import dequantize
from playground.engine.quant.smoothquant import SMOOTH_GROUPS
from playground.events.quant import ChannelScales, LayerError

Scales = dict[str, torch.Tensor]  # full linear name ("model.layers.3.mlp.up_proj") -> [in] or [out] factors


def short_name(name: str) -> str:
    """``model.layers.3.mlp.down_proj`` -> ``layers.3.mlp.down_proj`` (the events' naming)."""
    return name.removeprefix("model.")


def stored_weight(module: nn.Module) -> torch.Tensor:
    """The weight a (possibly quantized) decoder linear holds, float32 [out, in], as it multiplies its input."""
    if isinstance(module, QuantLinear):
        return dequantize(module.qt)
    if isinstance(module, InputScaledLinear):  # the 1/s in front is an input scale, accounted for by the caller
        return stored_weight(module.linear)
    return module.weight.detach().float()


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """‖approx − exact‖_F / ‖exact‖_F (0 for an all-zero ``exact`` that is reproduced)."""
    exact = exact.detach().double()
    norm = float(torch.linalg.norm(exact))
    diff = float(torch.linalg.norm(approx.detach().double() - exact))
    return diff / norm if norm > 0 else diff


def layer_errors(reference: Any, quantized: Any, input_scales: Scales | None = None,
                 row_scales: Scales | None = None) -> tuple[LayerError, ...]:
    """The relative weight error of every decoder linear, layer by layer, in the reference's input space."""
    input_scales, row_scales = input_scales or {}, row_scales or {}
    originals = decoder_linears(reference)
    errors = []
    for name, module in decoder_linears(quantized).items():
        w = stored_weight(module)  # [out, in]
        if name in row_scales:
            w = w * row_scales[name].float().to(w.device)[:, None]
        if name in input_scales:
            w = w / input_scales[name].float().to(w.device)[None, :]
        errors.append(LayerError(short_name(name), relative_error(w, originals[name].weight)))
    return tuple(errors)


def smoothquant_input_scales(model: Any, factors: dict[str, torch.Tensor]) -> Scales:
    """SmoothQuant's factors (by norm name, from ``smooth_model``) as the input scale of each linear they feed."""
    scales: Scales = {}
    for i in range(len(decoder_layers(model))):
        for norm_name, linear_paths in SMOOTH_GROUPS:
            s = factors[f"model.layers.{i}.{norm_name}"]
            for path in linear_paths:
                scales[f"model.layers.{i}.{path}"] = s
    return scales


def awq_scales_by_linear(model: Any, results: list[AwqResult]) -> tuple[Scales, Scales]:
    """(input scales, row scales) per linear from AWQ's search results (``awq(..., results=...)``)."""
    by_group = {r.group: r.scales for r in results}
    inputs: Scales = {}
    rows: Scales = {}
    for i in range(len(decoder_layers(model))):
        for group in layer_groups(model, i):
            s = by_group[group.name]
            for path in group.linears:
                inputs[f"model.layers.{i}.{path}"] = s
            kind, _, target = group.fold.partition(":")
            if kind == "rows":  # the previous linear's output rows were divided by s after it was quantized
                rows[f"model.layers.{i}.{target}"] = s
    return inputs, rows


def representative_linears(model: Any) -> list[str]:
    """Three inputs to plot: the first layer's attention input (q_proj), the middle layer's MLP input
    (gate_proj) and the last layer's MLP inner activation (down_proj, where LLM outliers are largest)."""
    n = len(decoder_layers(model))
    return ["model.layers.0.self_attn.q_proj", f"model.layers.{n // 2}.mlp.gate_proj",
            f"model.layers.{n - 1}.mlp.down_proj"]


def channel_scales(stats: dict[str, ActivationStats], names: list[str],
                   input_scales: Scales | None = None) -> tuple[ChannelScales, ...]:
    """Per input channel of each named linear: max |x| on the calibration text, the same after dividing by the
    method's scales (x / s is what the quantized weights see), and the scales (empty where there are none)."""
    input_scales = input_scales or {}
    found = []
    for name in names:
        before = stats[name].max_abs.float()
        s = input_scales.get(name)
        after = before if s is None else before / s.float().cpu()
        found.append(ChannelScales(short_name(name), tuple(before.tolist()), tuple(after.tolist()),
                                   () if s is None else tuple(s.float().cpu().tolist())))
    return tuple(found)
