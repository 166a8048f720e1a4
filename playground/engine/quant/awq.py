"""AWQ, activation-aware weight quantization (Lin et al., 2024), as a per-group scale search.

For each group of linears that share an input, the input channels that carry large activations are protected
by scaling: W' = W diag(s) is quantized (int4, group-wise, round to nearest) and the input divided by s, so the
quantized output is (X / s) Q(W diag(s))^T. The scales are s = mean|X|^alpha (normalised so that
sqrt(max(s) min(s)) = 1), alpha searched over {0, 1/grid, ..., 1}, keeping the alpha with the smallest mean
squared output error on the calibration activations. alpha = 0 gives s = 1, plain round-to-nearest, so the
chosen scales can never do worse than RTN on the calibration loss.

Where the division by s goes, per decoder layer:
- q/k/v: into ``input_layernorm``'s weight;  gate/up: into ``post_attention_layernorm``'s weight;
- down: into ``up_proj``'s output rows (silu(gate) * up is linear in up);
- o: into ``v_proj``'s output rows when every attention head has its own value head, else (grouped-query
  attention, as SmolLM2) kept as an input scale in front of o_proj (``InputScaledLinear``).
The activations are captured once from the float model (the scaling leaves its function unchanged).

Storage is truly low-bit: each linear becomes a ``QuantLinear`` holding Q(W diag s) as packed int4 codes with float32
group scales and zero points (torch's int4 kernel where ``choose_kernel`` picks it). A fold into a previous linear's
rows comes after that linear is quantized (the groups are done in order: q/k/v, o, gate/up, down), so it divides
that ``QuantLinear``'s group scales (``QuantLinear.scale_rows``: exact up to float rounding, codes unchanged). The
norm folds change the norms' float weights in place; the only extra storage is o_proj's input scale under
grouped-query attention (one float per input channel, counted in the weight bytes). The paper's code folds the
same places (llm-awq's ``scale_ln_fcs`` / ``scale_fc_fc``); under GQA it and AutoAWQ skip o_proj's scaling (only
when v_proj's and o_proj's shapes match, llm-awq PR 67), whereas this keeps the search and the vector. Not done:
AWQ's second step, the search for a clipping range of each weight group.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from playground.engine.quant.calibration import capture_inputs, decoder_layers, text_ids
from playground.engine.quant.linear import QuantLinear
from playground.engine.quant.rtn import dequantize, quantize

Progress = Callable[[str, float], None]


def fake_quantize(w: torch.Tensor, bits: int, group_size: int | None, symmetric: bool) -> torch.Tensor:
    """``w`` quantized and dequantized with the lab's round-to-nearest quantizer (``rtn``), same shape: what the
    search scores (the stored model holds the codes themselves, see ``quantized_linear``)."""
    return dequantize(quantize(w, bits, group_size=group_size, symmetric=symmetric)).reshape(w.shape).to(w.dtype)


@dataclass(frozen=True)
class AwqGroup:
    """Linears sharing one input; ``fold`` says where 1/s goes: a norm, a previous linear's rows, or the input."""

    name: str  # e.g. "model.layers.3.mlp.gate_up"
    linears: tuple[str, ...]  # paths under the layer
    fold: str  # "norm:<attr>", "rows:<linear path>" or "input"


def layer_groups(model: Any, index: int) -> list[AwqGroup]:
    layer = decoder_layers(model)[index]
    v, o = layer.self_attn.v_proj, layer.self_attn.o_proj
    o_fold = "rows:self_attn.v_proj" if v.out_features == o.in_features else "input"
    prefix = f"model.layers.{index}"
    return [
        AwqGroup(f"{prefix}.self_attn.qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
                 "norm:input_layernorm"),
        AwqGroup(f"{prefix}.self_attn.o", ("self_attn.o_proj",), o_fold),
        AwqGroup(f"{prefix}.mlp.gate_up", ("mlp.gate_proj", "mlp.up_proj"), "norm:post_attention_layernorm"),
        AwqGroup(f"{prefix}.mlp.down", ("mlp.down_proj",), "rows:mlp.up_proj"),
    ]


def awq_scales(mean_abs: torch.Tensor, alpha: float) -> torch.Tensor:
    """s = mean|X|^alpha, normalised by sqrt(max * min); exactly ones at alpha = 0."""
    s = mean_abs.float().clamp_min(1e-4).pow(alpha)
    return s / (s.max() * s.min()).sqrt()


def group_loss(x: torch.Tensor, weights: list[torch.Tensor], s: torch.Tensor, bits: int,
               group_size: int | None, symmetric: bool, reference: list[torch.Tensor] | None = None) -> float:
    """Mean squared error over the group's outputs of (X / s) Q(W diag(s))^T against X W^T."""
    total, count = 0.0, 0
    for k, w in enumerate(weights):
        y = reference[k] if reference is not None else x @ w.T  # [tokens, out]
        w_eff = fake_quantize(w * s, bits, group_size, symmetric) / s  # Q(W diag s) diag(1/s)
        total += float(((x @ w_eff.T) - y).pow(2).sum())
        count += y.numel()
    return total / count


@dataclass(frozen=True)
class AwqResult:
    group: str
    alpha: float
    loss: float  # calibration loss at the chosen alpha
    rtn_loss: float  # calibration loss at alpha = 0 (round to nearest)
    scales: torch.Tensor


def search_group(x: torch.Tensor, weights: list[torch.Tensor], *, bits: int = 4, group_size: int | None = 128,
                 grid: int = 20, symmetric: bool = False, name: str = "") -> AwqResult:
    """The alpha in {0, 1/grid, ..., 1} with the smallest calibration loss (ties keep the smaller alpha)."""
    weights = [w.detach().float() for w in weights]
    reference = [x @ w.T for w in weights]
    mean_abs = x.abs().mean(dim=0)
    best: tuple[float, float, torch.Tensor] | None = None
    rtn_loss = float("nan")
    for i in range(grid + 1):
        alpha = i / grid
        s = awq_scales(mean_abs, alpha)
        loss = group_loss(x, weights, s, bits, group_size, symmetric, reference)
        if i == 0:
            rtn_loss = loss
        if best is None or loss < best[0]:
            best = (loss, alpha, s)
    assert best is not None
    return AwqResult(name, best[1], best[0], rtn_loss, best[2])


class InputScaledLinear(nn.Module):
    """``linear(x * inv_scale)``: an AWQ scale that could not be folded into the operation before it.

    ``inv_scale`` [in] is a (frozen) parameter, not a buffer, so ``model_weight_bytes`` counts it."""

    def __init__(self, linear: nn.Module, inv_scale: torch.Tensor):
        super().__init__()
        self.linear = linear
        self.inv_scale = nn.Parameter(inv_scale.detach().clone(), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x * self.inv_scale.to(x.dtype))


def quantized_linear(linear: nn.Linear, s: torch.Tensor, bits: int, group_size: int | None, symmetric: bool,
                     kernel: str = "auto") -> nn.Module:
    """The ``QuantLinear`` storing Q(W diag s): the linear's columns scaled by s, then round-to-nearest."""
    return QuantLinear(linear, quantize(linear.weight.detach().float() * s.float(), bits, group_size, symmetric),
                       kernel=kernel)


def _set(layer: nn.Module, path: str, module: nn.Module) -> None:
    parent_path, _, attr = path.rpartition(".")
    setattr(layer.get_submodule(parent_path), attr, module)


def apply_group(layer: nn.Module, group: AwqGroup, s: torch.Tensor, bits: int, group_size: int | None,
                symmetric: bool, kernel: str = "auto") -> None:
    """Fold 1/s into what comes before the group and replace its linears by ``QuantLinear``s of Q(W diag s)."""
    with torch.no_grad():
        kind, _, target = group.fold.partition(":")
        if kind == "norm":
            norm = layer.get_submodule(target)
            norm.weight.div_(s.to(norm.weight))
        elif kind == "rows":  # the previous linear, already quantized (earlier group): divide its rows
            prev = layer.get_submodule(target)
            if isinstance(prev, QuantLinear):
                prev.scale_rows(s)
            else:
                prev.weight.div_(s.to(prev.weight)[:, None])
                if prev.bias is not None:
                    prev.bias.div_(s.to(prev.bias))
        for path in group.linears:
            linear = layer.get_submodule(path)
            _set(layer, path, quantized_linear(linear, s, bits, group_size, symmetric, kernel))
        if kind == "input":  # float32 [in]; cast to the input's dtype on use
            (path,) = group.linears
            _set(layer, path, InputScaledLinear(layer.get_submodule(path), 1.0 / s.float()))


def awq(model: Any, tokenizer: Any, text: str, group_size: int | None = 128, grid: int = 20, *, bits: int = 4,
        symmetric: bool = False, max_tokens: int = 512, kernel: str = "auto", progress: Progress | None = None,
        results: list[AwqResult] | None = None) -> Any:
    """An AWQ-quantized copy of ``model`` (int4 group-wise by default, stored packed), calibrated on ``text``.

    ``kernel`` is each ``QuantLinear``'s ("auto": the measured rule). ``progress(message, fraction)`` is called
    after each layer; ``results``, if given, receives the search result of every group (chosen alpha, its loss
    and plain RTN's)."""
    ids = text_ids(tokenizer, text, min(max_tokens, getattr(model.config, "max_position_embeddings", max_tokens)))
    layers_n = len(decoder_layers(model))
    wanted = {f"model.layers.{i}.{g.linears[0]}" for i in range(layers_n) for g in layer_groups(model, i)}
    inputs = capture_inputs(model, ids, wanted)
    quantized = copy.deepcopy(model)
    for i, layer in enumerate(decoder_layers(quantized)):
        for group in layer_groups(quantized, i):
            x = inputs.pop(f"model.layers.{i}.{group.linears[0]}")
            weights = [layer.get_submodule(p).weight for p in group.linears]
            found = search_group(x, weights, bits=bits, group_size=group_size, grid=grid, symmetric=symmetric,
                                 name=group.name)
            apply_group(layer, group, found.scales, bits, group_size, symmetric, kernel)
            if results is not None:
                results.append(found)
        if progress is not None:
            progress(f"AWQ: layer {i + 1}/{layers_n}", (i + 1) / layers_n)
    return quantized
