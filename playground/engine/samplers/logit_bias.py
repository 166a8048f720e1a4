"""Logit bias: tokens or words boosted, lowered or banned, as transformers' ``SequenceBiasLogitsProcessor``.

A bias on one token always applies; a word of several tokens biases its last token when the text ends with the
word's other tokens (so banning " Paris" stops the word from being completed, whatever splits it).
"""

from __future__ import annotations

from typing import Any

import torch

from playground.config.errors import ConfigError
from playground.config.samplers import parse_logit_bias
from playground.engine.samplers.base import stateless

SequenceBias = tuple[tuple[tuple[int, ...], float], ...]


def resolve_logit_bias(entries: tuple[str, ...], tokenizer: Any, vocab_size: int) -> SequenceBias:
    """The settings' ``TOKEN=BIAS`` entries as token sequences (a later entry for the same sequence wins)."""
    resolved: dict[tuple[int, ...], float] = {}
    for key, value in parse_logit_bias(entries):
        if isinstance(key, int):
            sequence: tuple[int, ...] = (key,)
        elif tokenizer is None:
            raise ConfigError(f"logit bias {key!r}: this strategy cannot read words; give a token id instead")
        else:
            sequence = tuple(tokenizer.encode(key, add_special_tokens=False))
            if not sequence:
                raise ConfigError(f"logit bias {key!r}: the word is no token at all")
        outside = [t for t in sequence if not 0 <= t < vocab_size]
        if outside:
            raise ConfigError(f"logit bias {key!r}: token {outside[0]} is outside the vocabulary (0-{vocab_size - 1})")
        resolved[sequence] = value
    return tuple(resolved.items())


def apply_sequence_bias(ids: torch.Tensor, logits: torch.Tensor, biases: SequenceBias) -> torch.Tensor:
    """ids: [batch, seq]; logits: [batch, vocab]; ``biases``: (token sequence, bias) pairs. Only the biased tokens'
    logits are touched (summed on a [batch, n] tensor: a pass over the whole vocabulary costs more than all of it)."""
    if not biases:
        return logits
    targets = sorted({sequence[-1] for sequence, _ in biases})
    column = {token: j for j, token in enumerate(targets)}
    bias = torch.zeros((logits.shape[0], len(targets)), dtype=logits.dtype, device=logits.device)
    for sequence, value in biases:
        *prefix, last = sequence
        if not prefix:
            bias[:, column[last]] += value
        elif len(prefix) <= ids.shape[1]:
            ends_with = (ids[:, -len(prefix):] == torch.tensor(prefix, device=ids.device)).all(dim=-1)
            bias[:, column[last]] += torch.where(ends_with, value, 0.0).to(bias.dtype)
    index = torch.tensor(targets, device=logits.device)
    out = logits.clone()
    out[:, index] = logits[:, index] + bias
    return out


def _build(s, context):
    tokenizer, vocab_size = context.tokenizer, context.vocab_size
    size = vocab_size if vocab_size is not None else (len(tokenizer) if tokenizer is not None else 2**31)
    biases = resolve_logit_bias(s.logit_bias, tokenizer, size)
    return "logit_bias", lambda i, x: apply_sequence_bias(i, x, biases)


stateless("logit_bias", _build)
