"""Dynamic temperature (llama.cpp's ``dynatemp_range``/``dynatemp_exponent``, "entropy-based"): a confident step
is sharpened, a flat one flattened."""

from __future__ import annotations

import math

import torch


def dynamic_temperature(logits: torch.Tensor, temperature: float, spread: float, exponent: float) -> torch.Tensor:
    """The temperature of each row ([batch, 1]): ``low + (high − low) · (H / H_max)^exponent`` with
    ``low = max(0, temperature − spread)``, ``high = temperature + spread``, H the entropy (nats) of the tokens still
    in play and H_max = ln(their count)."""
    low, high = max(0.0, temperature - spread), temperature + spread
    count = torch.isfinite(logits).sum(dim=-1, keepdim=True)
    entropy = torch.special.entr(logits.softmax(dim=-1)).sum(dim=-1, keepdim=True)
    normalised = entropy / torch.log(count.clamp(min=2).to(logits.dtype))
    return low + (high - low) * normalised.clamp(min=0.0) ** exponent


def apply_dynamic_temperature(ids: torch.Tensor, logits: torch.Tensor, temperature: float, spread: float,
                              exponent: float) -> torch.Tensor:
    """Divide each row by its dynamic temperature; a row with one token left is left alone, and a temperature of 0
    keeps only the top token (llama.cpp's rules)."""
    temp = dynamic_temperature(logits, temperature, spread, exponent)
    single = torch.isfinite(logits).sum(dim=-1, keepdim=True) <= 1
    top = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, logits.argmax(dim=-1, keepdim=True), True)
    argmax_only = logits.masked_fill(~top, -math.inf)
    scaled = torch.where(temp > 0, logits / temp.clamp(min=1e-30), argmax_only)
    return torch.where(single, logits, scaled)
