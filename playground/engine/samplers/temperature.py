"""Dynamic temperature (llama.cpp's ``dynatemp_range``/``dynatemp_exponent``, "entropy-based"): a confident step
is sharpened, a flat one flattened."""

from __future__ import annotations

import math

import torch

from playground.engine.samplers.base import stateless


def apply_temperature(ids: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


def dynamic_temperature(logits: torch.Tensor, temperature: float, spread: float, exponent: float,
                        count: torch.Tensor | None = None) -> torch.Tensor:
    """The temperature of each row ([batch, 1]): ``low + (high − low) · (H / H_max)^exponent`` with
    ``low = max(0, temperature − spread)``, ``high = temperature + spread``, H the entropy (nats) of the tokens still
    in play and H_max = ln(their count) (``count``: [batch, 1], when the caller has it)."""
    low, high = max(0.0, temperature - spread), temperature + spread
    if count is None:
        count = torch.isfinite(logits).sum(dim=-1, keepdim=True)
    entropy = torch.special.entr(logits.softmax(dim=-1)).sum(dim=-1, keepdim=True)
    normalised = entropy / torch.log(count.clamp(min=2).to(logits.dtype))
    return low + (high - low) * normalised.clamp(min=0.0) ** exponent


def apply_dynamic_temperature(ids: torch.Tensor, logits: torch.Tensor, temperature: float, spread: float,
                              exponent: float) -> torch.Tensor:
    """Divide each row by its dynamic temperature; a row with one token left is left alone, and a temperature of 0
    keeps only the top token (llama.cpp's rules)."""
    count = torch.isfinite(logits).sum(dim=-1, keepdim=True)
    temp = dynamic_temperature(logits, temperature, spread, exponent, count)
    single = count <= 1
    scaled = logits / temp.clamp(min=1e-30)
    # The rare rows (a temperature of 0, one token left) only when there are any: each is a pass over the vocabulary.
    if bool((temp <= 0).any()):
        top = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.argmax(dim=-1, keepdim=True), True)
        scaled = torch.where(temp > 0, scaled, logits.masked_fill(~top, -math.inf))
    return torch.where(single, logits, scaled) if bool(single.any()) else scaled


def _build(s, context):  # the stage is named "dynatemp" when the temperature has a range
    if s.dynatemp_range > 0:
        return "dynatemp", lambda i, x: apply_dynamic_temperature(i, x, s.temperature, s.dynatemp_range,
                                                                  s.dynatemp_exponent)
    return "temperature", lambda i, x: apply_temperature(i, x, s.temperature)


stateless("temperature", _build)
