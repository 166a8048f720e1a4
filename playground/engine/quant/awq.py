"""AWQ, activation-aware weight quantization (Lin et al., 2024), as a per-group scale search.

For each group of linears that share an input, the input channels that carry large activations are protected
by scaling: W' = W diag(s) is quantized (int4, group-wise, round to nearest) and the input divided by s, so the
quantized output is (X / s) Q(W diag(s))^T. The scales are s = mean|X|^alpha (normalised so that
sqrt(max(s) min(s)) = 1), alpha searched over {0, 1/grid, ..., 1}, keeping the alpha with the smallest mean
squared output error on the calibration activations. alpha = 0 gives s = 1, plain round-to-nearest, so the
chosen scales can never do worse than RTN on the calibration loss.

Where the division by s goes, per decoder layer (read from the model's anatomy, ``awq_groups``):
- the attention inputs (q/k/v, separate or fused): into the norm that feeds attention; the MLP inputs (gate/up or
  fc): into the norm that feeds the MLP (Gemma's ``pre_feedforward_layernorm``); each by ``scale_norm_output`` for
  the family's norm kind (RMSNorm's w, Gemma's 1 + w, LayerNorm's weight and bias);
- down: into up's output rows where the MLP is gated (silu(gate) * up is linear in up; for Phi-3's fused
  ``gate_up_proj`` the up half of its rows), else (GPT-2, NeoX: act(fc(x)) is not) kept as an input scale in front
  of down (``InputScaledLinear``);
- o: into v's output rows where v is its own linear and every attention head has its own value head, else
  (grouped-query attention, as SmolLM2, or a fused q/k/v) kept as an input scale in front of o.
The activations are captured once from the float model (the scaling leaves its function unchanged).

Storage is truly low-bit: each linear becomes a ``QuantLinear`` holding Q(W diag s) as packed int4 codes with float32
group scales and zero points (torch's int4 kernel where ``choose_kernel`` picks it). A fold into a previous linear's
rows comes after that linear is quantized (the groups are done in order: q/k/v, o, gate/up, down), so it divides
that ``QuantLinear``'s group scales (``QuantLinear.scale_rows``: exact up to float rounding, codes unchanged). The
norm folds change the norms' float parameters in place; the only extra storage is the input scales kept in front of
o (and of down where the MLP is not gated), one float per input channel, counted in the weight bytes. The paper's
code folds the same places (llm-awq's ``scale_ln_fcs`` / ``scale_fc_fc``); under GQA it and AutoAWQ skip o_proj's
scaling (only when v_proj's and o_proj's shapes match, llm-awq PR 67), whereas this keeps the search and the vector.
Not done: AWQ's second step, the search for a clipping range of each weight group.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn

from playground.config.catalog import Progress
from playground.engine.quant.calibration import capture_inputs, text_ids
from playground.engine.quant.linear import InputScaledLinear, QuantLinear, check_replaced
from playground.engine.quant.rtn import dequantize, quantize
from playground.engine.quant.targets import float_linear_copy, in_features, out_features, quant_targets, set_module
from playground.models.anatomy import Anatomy, part_rows, scale_norm_output


def fake_quantize(w: torch.Tensor, bits: int, group_size: int | None, symmetric: bool) -> torch.Tensor:
    """``w`` quantized and dequantized with the lab's round-to-nearest quantizer (``rtn``), same shape: what the
    search scores (the stored model holds the codes themselves, see ``quantized_linear``)."""
    return dequantize(quantize(w, bits, group_size=group_size, symmetric=symmetric)).reshape(w.shape).to(w.dtype)


@dataclass(frozen=True)
class AwqGroup:
    """Linears sharing one input, and where 1/s goes: ``fold`` "norm" (``target`` the norm's path), "rows" (the
    output rows of the earlier linear ``target`` that hold ``part``) or "input" (an input scale in front)."""

    name: str  # e.g. "model.layers.3.mlp.gate_up"
    index: int  # the decoder layer
    linears: tuple[str, ...]  # paths under the layer
    fold: str  # "norm", "rows" or "input"
    target: str | None = None  # the norm's or the earlier linear's path under the layer
    part: str | None = None  # "v" or "up": which rows of ``target`` (all of them unless it is fused)
    parts: tuple[str, ...] = ()  # what ``target``'s rows hold, in order (the anatomy's parts)


def _layer_groups(anatomy: Anatomy, index: int) -> list[AwqGroup]:
    layer = anatomy.layer(index)
    prefix = anatomy.linear_name(index, "").rstrip(".")
    attn, mlp = layer.attention, layer.mlp
    attn_name, mlp_name = attn.output_path.rpartition(".")[0], mlp.output_path.rpartition(".")[0]
    v = next(((path, module) for path, module, parts in attn.inputs if parts == ("v",)), None)
    if v is not None and out_features(v[1]) == in_features(attn.output):  # a value head per head
        o_group = AwqGroup(f"{prefix}.{attn_name}.o", index, (attn.output_path,), "rows", v[0], "v", ("v",))
    else:
        o_group = AwqGroup(f"{prefix}.{attn_name}.o", index, (attn.output_path,), "input")
    up = next(((path, parts) for path, _, parts in mlp.inputs if "up" in parts), None)
    if anatomy.row.gated_mlp and up is not None:
        down = AwqGroup(f"{prefix}.{mlp_name}.down", index, (mlp.output_path,), "rows", up[0], "up", up[1])
    else:
        down = AwqGroup(f"{prefix}.{mlp_name}.down", index, (mlp.output_path,), "input")
    mlp_parts = "_".join(part for _, _, parts in mlp.inputs for part in parts)  # "gate_up", "fc"
    return [
        AwqGroup(f"{prefix}.{attn_name}.qkv", index, tuple(p for p, _, _ in attn.inputs), "norm", attn.norm_path),
        o_group,
        AwqGroup(f"{prefix}.{mlp_name}.{mlp_parts}", index, tuple(p for p, _, _ in mlp.inputs), "norm",
                 mlp.norm_path),
        down,
    ]


def awq_groups(anatomy: Anatomy) -> list[AwqGroup]:
    """Every layer's groups in the order they are quantized: attention inputs, o, MLP inputs, down."""
    return [group for i in range(anatomy.count) for group in _layer_groups(anatomy, i)]


def row_factors(anatomy: Anatomy, group: AwqGroup, s: torch.Tensor, rows: int) -> torch.Tensor:
    """The factors [rows] a "rows" fold divides ``group.target``'s output rows by: s on the rows holding
    ``group.part``, 1 elsewhere (Phi-3's gate half of ``gate_up_proj`` is left alone)."""
    factors = torch.ones(rows, dtype=s.dtype)
    assert group.part is not None  # a "rows" fold names its part
    factors[part_rows(anatomy, group.parts, group.part, rows)] = s.to(factors)
    return factors


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


def quantized_linear(linear: nn.Linear, s: torch.Tensor, bits: int, group_size: int | None, symmetric: bool,
                     kernel: str = "auto") -> nn.Module:
    """The ``QuantLinear`` storing Q(W diag s): the linear's columns scaled by s, then round-to-nearest."""
    return QuantLinear(linear, quantize(linear.weight.detach().float() * s.float(), bits, group_size, symmetric),
                       kernel=kernel)


def float_scaled_linear(linear: nn.Linear, s: torch.Tensor, *_args: Any, **_kwargs: Any) -> nn.Module:
    """In place of ``quantized_linear`` when folding without rounding: a float ``nn.Linear`` holding W diag s."""
    scaled = copy.deepcopy(linear)
    with torch.no_grad():
        scaled.weight.mul_(s.to(scaled.weight))
    return scaled


def apply_group(anatomy: Anatomy, group: AwqGroup, s: torch.Tensor, bits: int,
                group_size: int | None, symmetric: bool, kernel: str = "auto", *, rounding: bool = True) -> None:
    """Fold 1/s into what comes before the group and replace its linears by ``QuantLinear``s of Q(W diag s)
    (``rounding=False``: by float linears holding W diag s, the fold alone)."""
    layer = anatomy.layers[group.index]
    with torch.no_grad():
        target = group.target or ""  # a "norm" or "rows" fold names what it folds into
        if group.fold == "norm":
            norm = layer.get_submodule(target)
            scale_norm_output(norm, anatomy.norm_kind, s)
        elif group.fold == "rows":  # the earlier linear, already replaced (earlier group): divide its rows
            prev: Any = layer.get_submodule(target)  # a QuantLinear or a float linear
            factors = row_factors(anatomy, group, s.float(), prev.out_features)
            if isinstance(prev, QuantLinear):
                prev.scale_rows(factors)
            else:
                prev.weight.div_(factors.to(prev.weight)[:, None])
                if prev.bias is not None:
                    prev.bias.div_(factors.to(prev.bias))
        make = quantized_linear if rounding else float_scaled_linear
        for path in group.linears:
            linear: Any = layer.get_submodule(path)  # an nn.Linear or a Conv1D
            set_module(layer, path, make(linear, s, bits, group_size, symmetric, kernel))
        if group.fold == "input":  # float32 [in]; cast to the input's dtype on use
            (path,) = group.linears
            set_module(layer, path, InputScaledLinear(layer.get_submodule(path), 1.0 / s.float()))


def fold_scales(model: Any, scales: dict[str, torch.Tensor]) -> Any:
    """A float copy of ``model`` with AWQ's scales (by group name, ``awq_groups``) folded where ``awq`` folds them,
    without rounding: the same function as ``model`` up to float rounding (the fold step on its own)."""
    folded, anatomy, _ = float_linear_copy(model, "awq")
    for group in awq_groups(anatomy):
        apply_group(anatomy, group, scales[group.name].float(), 4, None, False, rounding=False)
    return folded


def awq(model: Any, tokenizer: Any, text: str, group_size: int | None = 128, grid: int = 20, *, bits: int = 4,
        symmetric: bool = False, max_tokens: int = 512, kernel: str = "auto", progress: Progress | None = None,
        results: list[AwqResult] | None = None) -> Any:
    """An AWQ-quantized copy of ``model`` (int4 group-wise by default, stored packed), calibrated on ``text``.

    ``kernel`` is each ``QuantLinear``'s ("auto": the measured rule). ``progress(message, fraction)`` is called
    after each layer; ``results``, if given, receives the search result of every group (chosen alpha, its loss
    and plain RTN's). ``ConfigError`` naming the family when its projections cannot all be quantized."""
    reference, targets = quant_targets(model, "awq")
    ids = text_ids(tokenizer, text, min(max_tokens, getattr(model.config, "max_position_embeddings", max_tokens)))
    inputs = capture_inputs(model, ids, {reference.linear_name(g.index, g.linears[0]) for g in awq_groups(reference)})
    quantized, anatomy, _ = float_linear_copy(model, "awq")
    groups = awq_groups(anatomy)  # paths and shapes, read before any module is replaced
    last = {group.index: group for group in groups}  # each layer's last group
    for group in groups:
        layer = anatomy.layers[group.index]
        x = inputs.pop(anatomy.linear_name(group.index, group.linears[0]))
        weights = [cast(torch.Tensor, layer.get_submodule(p).weight) for p in group.linears]
        found = search_group(x, weights, bits=bits, group_size=group_size, grid=grid, symmetric=symmetric,
                             name=group.name)
        apply_group(anatomy, group, found.scales, bits, group_size, symmetric, kernel)
        if results is not None:
            results.append(found)
        if progress is not None and last[group.index] is group:
            progress(f"AWQ: layer {group.index + 1}/{anatomy.count}", (group.index + 1) / anatomy.count)
    check_replaced(quantized, "awq", targets, anatomy.family)
    return quantized
