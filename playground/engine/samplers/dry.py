"""DRY, "don't repeat yourself" (text-generation-webui / llama.cpp): its match lengths and penalty from the
torch-free ``playground.sampler_maths`` (the what-if's too), its breakers from ``breakers``.

It reads the whole context (prompt included), as llama-server (which feeds the prompt through its DRY sampler) does.
"""

from __future__ import annotations

import torch

from playground.config.errors import ConfigError
from playground.engine.samplers.base import stateless
from playground.engine.samplers.breakers import breaker_token_ids
from playground.sampler_maths import DRY_MAX_MATCH, dry_match_lengths, dry_penalty

__all__ = ["DRY_MAX_MATCH", "apply_dry", "dry_match_lengths"]


def apply_dry(ids: torch.Tensor, logits: torch.Tensor, multiplier: float, base: float, allowed_length: int,
              breakers: frozenset[int]) -> torch.Tensor:
    """DRY (text-generation-webui / llama.cpp): a token that would extend a repeat of ``n >= allowed_length``
    tokens loses ``multiplier · base^(n − allowed_length)`` from its logit."""
    out = logits.clone()
    for row, tokens in enumerate(ids.tolist()):
        lengths = dry_match_lengths(tokens, breakers)
        hit = [(token, n) for token, n in lengths.items() if n >= allowed_length]
        if hit:
            index = torch.tensor([t for t, _ in hit], device=logits.device)
            penalty = torch.tensor([dry_penalty(n, multiplier, base, allowed_length) for _, n in hit],
                                   dtype=logits.dtype, device=logits.device)
            out[row, index] -= penalty
    return out


def _dry(s, context):
    if context.tokenizer is None and s.dry_sequence_breakers:
        raise ConfigError(f"DRY's sequence breakers are words, which the {s.strategy} strategy cannot read here")
    breakers = (breaker_token_ids(s.dry_sequence_breakers, context.tokenizer) if s.dry_sequence_breakers
                else frozenset())
    return "dry", lambda i, x: apply_dry(i, x, s.dry_multiplier, s.dry_base, s.dry_allowed_length, breakers)


stateless("dry", _dry)
