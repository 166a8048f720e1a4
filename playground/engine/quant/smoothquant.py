"""SmoothQuant (Xiao et al., 2023): move activation outliers into the weights, then quantize both to int8.

For the linears fed by one RMSNorm (q/k/v after ``input_layernorm``; gate/up after ``post_attention_layernorm``)
each input channel j gets a factor s_j = max|X_j|^alpha / max|W_j|^(1-alpha) (max|W_j| over the column j of all
linears in the group). The norm's weight is divided by s and the linears' input columns multiplied by s: in
exact arithmetic the float model computes the same function, and the activations the linears see are flatter.

W8A8 here is *fake quantization* (simulated in float32, no int8 kernels): weights int8 symmetric per output
channel, activations int8 symmetric per token, recomputed on every call ("dynamic"). It measures the accuracy
of W8A8, not its speed. o_proj and down_proj are quantized but not smoothed (as in the paper's Llama recipe);
the LM head and embeddings stay float.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from playground.engine.quant.calibration import ActivationStats, decoder_layers

INT8_MAX = 127.0

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


def fake_quant_int8_rows(w: torch.Tensor) -> torch.Tensor:
    """Symmetric int8 per row (per output channel for a weight, per token for activations), dequantized."""
    scale = w.abs().amax(dim=-1, keepdim=True).clamp_min(1e-8) / INT8_MAX
    return (w / scale).round().clamp(-INT8_MAX, INT8_MAX) * scale


class W8A8Linear(nn.Module):
    """A linear with int8 per-channel weights and dynamic per-token int8 activations (fake-quantized)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        with torch.no_grad():
            self.weight = nn.Parameter(fake_quant_int8_rows(linear.weight.float()).to(linear.weight.dtype),
                                       requires_grad=False)
        self.bias = linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(fake_quant_int8_rows(x), self.weight, self.bias)


def to_w8a8(model: Any) -> Any:
    """Replace every decoder linear of ``model`` (in place) by a ``W8A8Linear``; returns ``model``."""
    for layer in decoder_layers(model):
        for path in W8A8_LINEARS:
            parent_path, _, attr = path.rpartition(".")
            parent = layer.get_submodule(parent_path)
            setattr(parent, attr, W8A8Linear(getattr(parent, attr)))
    return model


def naive_w8a8(model: Any) -> Any:
    """W8A8 without smoothing: a copy of ``model`` with every decoder linear fake-quantized to W8A8."""
    return to_w8a8(copy.deepcopy(model))


def smoothquant(model: Any, stats: dict[str, ActivationStats], alpha: float = 0.5) -> Any:
    """SmoothQuant W8A8: a copy of ``model`` smoothed with ``alpha`` on ``stats``, then fake-quantized to W8A8."""
    smoothed, _ = smooth_model(model, stats, alpha)
    return to_w8a8(smoothed)
