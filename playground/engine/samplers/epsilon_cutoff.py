"""Epsilon sampling (transformers' ``EpsilonLogitsWarper``), and its engine object. It keeps at least one token.

ids: [batch, seq]; logits: [batch, vocab] (``-inf`` where an earlier sampler removed a token).
"""

from __future__ import annotations

import torch

from playground.engine.samplers.base import stateless
from playground.engine.samplers.cuts import NEG_INF, protect_top


def keep_above_epsilon(ids: torch.Tensor, logits: torch.Tensor, epsilon: float, min_keep: int = 1) -> torch.Tensor:
    """Epsilon sampling (Hewitt et al.): drop tokens whose probability is below ``epsilon``."""
    remove = logits.softmax(dim=-1) < epsilon
    return logits.masked_fill(protect_top(remove, logits, min_keep), NEG_INF)


stateless("epsilon_cutoff", lambda s, c: ("epsilon_cutoff", lambda i, x: keep_above_epsilon(i, x, s.epsilon_cutoff)))
