"""Which modules a quantization method replaces: every projection of every decoder layer, as the model's anatomy
names them (separate, fused such as Phi-3's ``qkv_proj`` or NeoX's ``query_key_value``, or GPT-2's ``Conv1D``).

Every method reads its targets here and nowhere else. ``quant_targets`` refuses, with a ``ConfigError`` naming the
family and the method, a model whose family the anatomy table does not know or whose projections are not plain
linears (``nn.Linear`` or ``Conv1D``: an already quantized copy, say). A ``Conv1D`` (weight [in, out]) becomes an
equivalent ``nn.Linear`` (weight transposed) in the copy before it is quantized (``float_linear_copy``), so the
methods only ever see ``[out, in]`` weights.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from playground.config import ConfigError
from playground.models.anatomy import Anatomy, anatomy_of


@dataclass(frozen=True)
class Target:
    """One decoder projection: its layer, its path under the layer and its full module name."""

    index: int
    path: str  # "self_attn.q_proj", "attn.c_attn", "mlp.gate_up_proj"
    name: str  # as named_modules spells it: "model.layers.3.self_attn.q_proj", "transformer.h.0.attn.c_attn"

    @property
    def short(self) -> str:
        """The events' name: ``layers.<i>.<path>`` whatever the family calls its stack."""
        return f"layers.{self.index}.{self.path}"


def model_anatomy(model: Any, method: str = "quantization") -> Anatomy:
    """``anatomy_of(model)``, its refusal prefixed with the method that needed it."""
    try:
        return anatomy_of(model)
    except ConfigError as error:
        raise ConfigError(f"{method} cannot open this model up: {error}") from error


def targets_of(anatomy: Anatomy) -> list[Target]:
    """Every projection of every layer, layer by layer, attention first, in forward order."""
    return [Target(layer.index, path, anatomy.linear_name(layer.index, path))
            for layer in anatomy.all_layers() for path, _ in layer.linears()]


def quant_targets(model: Any, method: str) -> tuple[Anatomy, list[Target]]:
    """The model's anatomy and the projections ``method`` will replace, or ``ConfigError`` naming the family and the
    method when it cannot replace them all."""
    anatomy = model_anatomy(model, method)
    found = targets_of(anatomy)
    if not found:
        raise ConfigError(f"{method} found no decoder projections in this {anatomy.family} model: nothing to quantize")
    other = [(t, type(model.get_submodule(t.name)).__name__) for t in found
             if not isinstance(model.get_submodule(t.name), (nn.Linear, Conv1D))]
    if other:
        kinds = ", ".join(sorted({kind for _, kind in other}))
        raise ConfigError(f"{method} cannot quantize this {anatomy.family} model: {len(other)} of its {len(found)} "
                          f"decoder projections (e.g. {other[0][0].short}) are {kinds}, not nn.Linear or Conv1D"
                          + (" (it is already quantized)" if "QuantLinear" in kinds or "InputScaledLinear" in kinds
                             else ""))
    return anatomy, found


def decoder_linears(model: Any) -> dict[str, nn.Module]:
    """Every decoder projection by its full module name, layer by layer (the model's own modules)."""
    return {t.name: model.get_submodule(t.name) for t in targets_of(anatomy_of(model))}


def linear_weight(module: nn.Module) -> torch.Tensor:
    """A float projection's weight as ``nn.Linear`` holds it, [out, in] (a ``Conv1D``'s transposed; no copy)."""
    linear: Any = module  # an nn.Linear or a Conv1D
    return linear.weight.t() if isinstance(module, Conv1D) else linear.weight


def out_features(module: nn.Module) -> int:
    linear: Any = module
    return int(linear.nf if isinstance(module, Conv1D) else linear.out_features)


def in_features(module: nn.Module) -> int:
    linear: Any = module
    return int(linear.nx if isinstance(module, Conv1D) else linear.in_features)


def as_linear(module: nn.Module) -> nn.Linear:
    """``module`` as an ``nn.Linear`` computing the same function: a ``Conv1D`` (x @ W + b, W [in, out]) becomes
    ``nn.Linear`` with weight W^T; anything else is returned as it is."""
    if not isinstance(module, Conv1D):
        return cast(nn.Linear, module)  # an nn.Linear already, or what computes as one
    weight = module.weight.detach()
    linear = nn.Linear(module.nx, module.nf, bias=module.bias is not None, device=weight.device, dtype=weight.dtype)
    with torch.no_grad():
        linear.weight.copy_(weight.t())
        if module.bias is not None:
            linear.bias.copy_(module.bias.detach())
    linear.requires_grad_(module.weight.requires_grad)
    return linear


def set_module(model: nn.Module, name: str, module: nn.Module) -> None:
    parent, _, attr = name.rpartition(".")
    setattr(model.get_submodule(parent) if parent else model, attr, module)


def float_linear_copy(model: Any, method: str) -> tuple[Any, Anatomy, list[Target]]:
    """A deep copy of ``model`` in which every decoder ``Conv1D`` is an equivalent ``nn.Linear``; the copy's
    anatomy and targets (``ConfigError`` naming the family and method when the targets cannot be quantized)."""
    quant_targets(model, method)  # refuse before copying
    copied = copy.deepcopy(model)
    anatomy = anatomy_of(copied)
    found = targets_of(anatomy)
    converted = False
    for target in found:
        module = copied.get_submodule(target.name)
        if isinstance(module, Conv1D):
            set_module(copied, target.name, as_linear(module))
            converted = True
    if converted:  # the anatomy's handles point at the replaced modules
        anatomy = anatomy_of(copied)
    return copied, anatomy, found
