"""What quantization did to a model, in numbers a view can draw: per-linear weight error and per-channel activation
scales of a few representative layers.

Every weight is compared in the reference's own input space. A method that rescales input channels (SmoothQuant's
smoothing factors, AWQ's searched scales; ``input_scales``: the linear then sees x / s) stores the codes of
Q(W diag s) (a ``QuantLinear``; dequantized here), so the weight it effectively applies to the original x is
Q(W diag s) diag(1/s). AWQ also divides the output rows of the linear before ``down_proj`` (``up_proj``, or the up
half of a fused ``gate_up_proj``) by down's scales after quantizing it (folded into its int4 group scales;
``row_scales``): multiplying them back gives the weight in the reference's output space. The error is
‖W_eff − W‖_F / ‖W‖_F. Names come from the model's anatomy (``layers.<i>.<path>``: any family, fused projections
whole, GPT-2's ``Conv1D`` weights compared transposed, as [out, in]).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from playground.engine.quant.awq import AwqResult, InputScaledLinear, awq_groups, row_factors
from playground.engine.quant.calibration import ActivationStats
from playground.engine.quant.linear import QuantLinear
from playground.engine.quant.rtn import dequantize
from playground.engine.quant.targets import Target, linear_weight, out_features, targets_of
from playground.events.quant import ChannelScales, LayerError
from playground.models.anatomy import anatomy_of

Scales = dict[str, torch.Tensor]  # full linear name ("model.layers.3.mlp.up_proj") -> [in] or [out] factors


def stored_weight(module: nn.Module) -> torch.Tensor:
    """The weight a (possibly quantized) decoder linear holds, float32 [out, in], as it multiplies its input."""
    if isinstance(module, QuantLinear):
        return dequantize(module.qt)
    if isinstance(module, InputScaledLinear):  # the 1/s in front is an input scale, accounted for by the caller
        return stored_weight(module.linear)
    return linear_weight(module).detach().float()


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    """‖approx − exact‖_F / ‖exact‖_F (0 for an all-zero ``exact`` that is reproduced)."""
    exact = exact.detach().double()
    norm = float(torch.linalg.norm(exact))
    diff = float(torch.linalg.norm(approx.detach().double() - exact))
    return diff / norm if norm > 0 else diff


def layer_errors(reference: Any, quantized: Any, input_scales: Scales | None = None,
                 row_scales: Scales | None = None) -> tuple[LayerError, ...]:
    """The relative weight error of every decoder projection, layer by layer, in the reference's input space; named
    ``layers.<i>.<path under the layer>`` whatever the family calls its stack."""
    input_scales, row_scales = input_scales or {}, row_scales or {}
    errors = []
    for target in targets_of(anatomy_of(reference)):
        w = stored_weight(quantized.get_submodule(target.name))  # [out, in]
        if target.name in row_scales:
            w = w * row_scales[target.name].float().to(w.device)[:, None]
        if target.name in input_scales:
            w = w / input_scales[target.name].float().to(w.device)[None, :]
        exact = linear_weight(reference.get_submodule(target.name))
        errors.append(LayerError(target.short, relative_error(w, exact)))
    return tuple(errors)


def smoothquant_input_scales(model: Any, factors: dict[str, torch.Tensor]) -> Scales:
    """SmoothQuant's factors (by norm name, from ``smooth_model``) as the input scale of each linear they feed."""
    anatomy = anatomy_of(model)
    scales: Scales = {}
    for layer in anatomy.all_layers():
        for block in (layer.attention, layer.mlp):
            s = factors[anatomy.linear_name(layer.index, block.norm_path)]
            for path, _, _ in block.inputs:
                scales[anatomy.linear_name(layer.index, path)] = s
    return scales


def awq_scales_by_linear(model: Any, results: list[AwqResult]) -> tuple[Scales, Scales]:
    """(input scales, row scales) per linear from AWQ's search results (``awq(..., results=...)``); a row scale has
    one factor per output row (1 on the rows of a fused linear that no fold touched)."""
    anatomy = anatomy_of(model)
    by_group = {r.group: r.scales for r in results}
    inputs: Scales = {}
    rows: Scales = {}
    for group in awq_groups(anatomy):
        s = by_group[group.name]
        for path in group.linears:
            inputs[anatomy.linear_name(group.index, path)] = s
        if group.fold == "rows":  # the earlier linear's output rows were divided by s after it was quantized
            assert group.target is not None  # a "rows" fold names the earlier linear
            name = anatomy.linear_name(group.index, group.target)
            rows[name] = row_factors(anatomy, group, s.float(), out_features(model.get_submodule(name)))
    return inputs, rows


def representative_linears(model: Any) -> list[Target]:
    """Three inputs to plot: the first layer's attention input (q_proj, or the fused q/k/v), the middle layer's MLP
    input (gate_proj, gate_up_proj or fc) and the last layer's MLP inner activation (the input of down_proj, where
    LLM outliers are largest)."""
    anatomy = anatomy_of(model)
    n = anatomy.count
    picks = [(0, anatomy.layer(0).attention.inputs[0][0]), (n // 2, anatomy.layer(n // 2).mlp.inputs[0][0]),
             (n - 1, anatomy.layer(n - 1).mlp.output_path)]
    return [Target(i, path, anatomy.linear_name(i, path)) for i, path in picks]


def channel_scales(stats: dict[str, ActivationStats], targets: list[Target],
                   input_scales: Scales | None = None) -> tuple[ChannelScales, ...]:
    """Per input channel of each target: max |x| on the calibration text, the same after dividing by the method's
    scales (x / s is what the quantized weights see), and the scales (empty where there are none)."""
    input_scales = input_scales or {}
    found = []
    for target in targets:
        before = stats[target.name].max_abs.float()
        s = input_scales.get(target.name)
        after = before if s is None else before / s.float().cpu()
        found.append(ChannelScales(target.short, tuple(before.tolist()), tuple(after.tolist()),
                                   () if s is None else tuple(s.float().cpu().tolist())))
    return tuple(found)
