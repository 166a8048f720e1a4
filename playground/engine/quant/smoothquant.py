"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights, then quantize both to int8.

For the linears fed by one RMSNorm (q/k/v after ``input_layernorm``; gate/up after ``post_attention_layernorm``)
each input channel j gets a factor s_j = max|X_j|^alpha / max|W_j|^(1-alpha) (max|W_j| over the column j of all
linears in the group). The norm's weight is divided by s and the linears' input columns multiplied by s: in
exact arithmetic the float model computes the same function, and the activations the linears see are flatter.

W8A8: every decoder linear becomes a ``QuantLinear`` storing int8 codes, symmetric, one float32 scale per output
channel, with ``activation_quant="int8-token"``: activations quantized to int8 symmetric per token, recomputed on
every call ("dynamic"). On the CPU the product runs on torch's integer GEMM (``QuantLinear``'s ``int8mm`` kernel);
elsewhere it is emulated in float (same numbers up to float rounding). The smoothing division lives in the norms'
weights (folded there, as the paper does), so nothing is stored beyond the int8 weights and their scales.
o_proj and down_proj are quantized but not smoothed (as in the paper's Llama recipe); the LM head and embeddings
stay float.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from playground.engine.quant.calibration import ActivationStats, decoder_layers
from playground.engine.quant.linear import QuantLinear
from playground.engine.quant.rtn import quantize

# (norm attribute on the decoder layer, the linears it feeds)
SMOOTH_GROUPS = (
    ("input_layernorm", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("post_attention_layernorm", ("mlp.gate_proj", "mlp.up_proj")),
)
W8A8_LINEARS = (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
)


def smoothing_factors(act_max: torch.Tensor, weights: list[torch.Tensor], alpha: float) -> torch.Tensor:
    """s [in] = max|X_j|^alpha / max_j|W|^(1-alpha), both clamped at 1e-5 (as the reference code does).

    ``act_max`` [in] is the per-channel max |x|; ``weights`` are the [out_k, in] matrices sharing that input."""
    weight_max = torch.cat([w.detach().abs().float() for w in weights], dim=0).amax(dim=0).clamp_min(1e-5)
    s = act_max.float().clamp_min(1e-5).pow(alpha) / weight_max.pow(1.0 - alpha)
    return s.clamp_min(1e-5)


def smooth_model(model: Any, stats: dict[str, ActivationStats], alpha: float = 0.5) -> tuple[Any, dict[str, Any]]:
    """A float copy of ``model`` with SmoothQuant's scaling folded in, and the factors used (by norm name)."""
    smoothed = copy.deepcopy(model)
    factors: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for i, layer in enumerate(decoder_layers(smoothed)):
            for norm_name, linear_paths in SMOOTH_GROUPS:
                norm = getattr(layer, norm_name)
                linears = [layer.get_submodule(p) for p in linear_paths]
                act_max = stats[f"model.layers.{i}.{linear_paths[0]}"].max_abs
                s = smoothing_factors(act_max, [lin.weight for lin in linears], alpha).to(norm.weight)
                norm.weight.div_(s)
                for lin in linears:
                    lin.weight.mul_(s)  # [out, in] * [in]: column j scaled by s_j
                factors[f"model.layers.{i}.{norm_name}"] = s.cpu()
    return smoothed, factors


def w8a8_linear(linear: nn.Linear, kernel: str = "auto") -> QuantLinear:
    """``linear`` as W8A8: int8 symmetric per-output-channel weights, int8 per-token activations."""
    return QuantLinear(linear, quantize(linear.weight, 8, group_size=None, symmetric=True), kernel=kernel,
                       activation_quant="int8-token")


def to_w8a8(model: Any, kernel: str = "auto") -> Any:
    """Replace every decoder linear of ``model`` (in place) by a W8A8 ``QuantLinear``; returns ``model``."""
    for layer in decoder_layers(model):
        for path in W8A8_LINEARS:
            parent_path, _, attr = path.rpartition(".")
            parent = layer.get_submodule(parent_path)
            setattr(parent, attr, w8a8_linear(getattr(parent, attr), kernel))
    return model


def naive_w8a8(model: Any, kernel: str = "auto") -> Any:
    """W8A8 without smoothing: a copy of ``model`` with every decoder linear quantized to W8A8."""
    return to_w8a8(copy.deepcopy(model), kernel)


def smoothquant(model: Any, stats: dict[str, ActivationStats], alpha: float = 0.5, kernel: str = "auto") -> Any:
    """SmoothQuant W8A8: a copy of ``model`` smoothed with ``alpha`` on ``stats``, then quantized to W8A8."""
    smoothed, _ = smooth_model(model, stats, alpha)
    return to_w8a8(smoothed, kernel)
