"""Eta sampling (transformers' ``EtaLogitsWarper``), and its engine object. It keeps at least one token.

ids: [batch, seq]; logits: [batch, vocab] (``-inf`` where an earlier sampler removed a token).
"""

from __future__ import annotations

import math

import torch

from playground.engine.samplers.base import stateless
from playground.engine.samplers.cuts import NEG_INF, protect_top


def keep_above_eta(ids: torch.Tensor, logits: torch.Tensor, epsilon: float, min_keep: int = 1) -> torch.Tensor:
    """Eta sampling (Hewitt et al.): the cutoff is ``min(epsilon, √epsilon · e^−H)``, H the entropy in nats: a flat
    distribution keeps more of its tail."""
    probs = logits.softmax(dim=-1)
    entropy = torch.special.entr(probs).sum(dim=-1, keepdim=True)
    eta = torch.clamp(math.sqrt(epsilon) * torch.exp(-entropy), max=epsilon)
    return logits.masked_fill(protect_top(probs < eta, logits, min_keep), NEG_INF)


stateless("eta_cutoff", lambda s, c: ("eta_cutoff", lambda i, x: keep_above_eta(i, x, s.eta_cutoff)))
