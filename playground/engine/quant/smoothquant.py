"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights, then quantize both to int8.

For the projections fed by one norm (each layer's attention inputs, q/k/v separate or fused, after the norm that
feeds attention; the MLP's inputs, gate/up or fc, after the norm that feeds the MLP: Gemma's
``pre_feedforward_layernorm``, not its ``post_attention_layernorm``; all read from the model's anatomy) each input
channel j gets a factor s_j = max|X_j|^alpha / max|W_j|^(1-alpha) (max|W_j| over the column j of all linears in the
group). The norm's output is divided by s (``scale_norm_output`` for the family's norm kind: RMSNorm w / s, Gemma's
(1 + w) norms w -> (1 + w) / s - 1, LayerNorm's weight and bias both / s) and the linears' input columns multiplied
by s: in exact arithmetic the float model computes the same function, and the activations the linears see are
flatter.

W8A8: every decoder projection becomes a ``QuantLinear`` storing int8 codes, symmetric, one float32 scale per output
channel, with ``activation_quant="int8-token"``: activations quantized to int8 symmetric per token, recomputed on
every call ("dynamic"). On the CPU the product runs on torch's integer GEMM (``QuantLinear``'s ``int8mm`` kernel);
elsewhere it is emulated in float (same numbers up to float rounding). The smoothing division lives in the norms'
parameters (folded there, as the paper does), so nothing is stored beyond the int8 weights and their scales.
The output projections (o_proj, down_proj, GPT-2's c_proj, ...) are quantized but not smoothed (as in the paper's
Llama recipe); the LM head and embeddings stay float. GPT-2's ``Conv1D`` projections become ``nn.Linear`` in the copy.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

from playground.engine.quant.calibration import ActivationStats
from playground.engine.quant.linear import QuantLinear, check_replaced
from playground.engine.quant.rtn import quantize
from playground.engine.quant.targets import as_linear, float_linear_copy, quant_targets, set_module
from playground.models.anatomy import scale_norm_output


def smoothing_factors(act_max: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """s [in] = max|X_j|^alpha / max_j|W|^(1-alpha), both clamped at 1e-5 (as the reference code does).

    ``act_max`` [in] is the per-channel max |x|; ``weights`` are the [out_k, in] matrices sharing that input."""
    weight_max = torch.cat([w.detach().abs().float() for w in weights], dim=0).amax(dim=0).clamp_min(1e-5)
    s = act_max.float().clamp_min(1e-5).pow(alpha) / weight_max.pow(1.0 - alpha)
    return s.clamp_min(1e-5)


def smooth_model(model: Any, stats: dict[str, ActivationStats], alpha: float = 0.5) -> tuple[Any, dict[str, Any]]:
    """A float copy of ``model`` with SmoothQuant's scaling folded in (no rounding: the same function up to float
    rounding), and the factors used, by the full name of the norm they were folded into."""
    smoothed, anatomy, _ = float_linear_copy(model, "smoothquant")
    factors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for layer in anatomy.all_layers():
            for block in (layer.attention, layer.mlp):
                linears: list[Any] = [module for _, module, _ in block.inputs]  # nn.Linear or Conv1D
                act_max = stats[anatomy.linear_name(layer.index, block.inputs[0][0])].max_abs
                s = smoothing_factors(act_max, [lin.weight for lin in linears], alpha).to(
                    cast(torch.Tensor, block.norm.weight))
                scale_norm_output(block.norm, anatomy.norm_kind, s)
                for lin in linears:
                    lin.weight.mul_(s)  # [out, in] * [in]: column j scaled by s_j
                factors[anatomy.linear_name(layer.index, block.norm_path)] = s.cpu()
    return smoothed, factors


def w8a8_linear(linear: nn.Module, kernel: str = "auto") -> QuantLinear:
    """``linear`` (an ``nn.Linear`` or ``Conv1D``) as W8A8: int8 symmetric per-output-channel weights, int8
    per-token activations."""
    linear = as_linear(linear)
    return QuantLinear(linear, quantize(linear.weight, 8, group_size=None, symmetric=True), kernel=kernel,
                       activation_quant="int8-token")


def to_w8a8(model: Any, kernel: str = "auto", method: str = "naive-w8a8") -> Any:
    """Replace every decoder projection of ``model`` (in place) by a W8A8 ``QuantLinear``; returns ``model``
    (``ConfigError`` naming the family and ``method`` when they cannot all be replaced)."""
    anatomy, targets = quant_targets(model, method)
    for target in targets:
        set_module(model, target.name, w8a8_linear(model.get_submodule(target.name), kernel))
    check_replaced(model, method, targets, anatomy.family)
    return model


def naive_w8a8(model: Any, kernel: str = "auto") -> Any:
    """W8A8 without smoothing: a copy of ``model`` with every decoder projection quantized to W8A8."""
    copied, _, _ = float_linear_copy(model, "naive-w8a8")
    return to_w8a8(copied, kernel, "naive-w8a8")


def smoothquant(model: Any, stats: dict[str, ActivationStats], alpha: float = 0.5, kernel: str = "auto") -> Any:
    """SmoothQuant W8A8: a copy of ``model`` smoothed with ``alpha`` on ``stats``, then quantized to W8A8."""
    smoothed, _ = smooth_model(model, stats, alpha)
    return to_w8a8(smoothed, kernel, "smoothquant")
