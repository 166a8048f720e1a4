"""Samplers that remove tokens from the distribution: typical-p, epsilon and eta cutoffs (transformers' warpers),
top-nσ, XTC and mirostat v2's surprise cut (llama.cpp's definitions). Each keeps at least one token.

ids: [batch, seq]; logits: [batch, vocab] (``-inf`` where an earlier sampler removed a token).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from playground.engine.samplers.base import BuildContext, Sampler, engine_sampler, stateless

NEG_INF = float("-inf")


def _protect_top(remove: torch.Tensor, logits: torch.Tensor, min_keep: int) -> torch.Tensor:
    """``remove`` with the ``min_keep`` highest logits kept whatever it said."""
    keep = torch.topk(logits, min(min_keep, logits.shape[-1]), dim=-1).indices
    return remove.scatter(-1, keep, False)


def keep_typical(ids: torch.Tensor, logits: torch.Tensor, mass: float, min_keep: int = 1) -> torch.Tensor:
    """Locally typical sampling (Meister et al.): rank tokens by how far their surprise −log p is from the entropy,
    and keep the closest ones until their probability exceeds ``mass``."""
    logprobs = logits.log_softmax(dim=-1)
    probs = logprobs.exp()
    entropy = torch.special.entr(probs).sum(dim=-1, keepdim=True)
    distance = (-logprobs - entropy).abs()  # inf for removed tokens
    if logits.shape[-1] > TYPICAL_FAST_VOCAB and logits.shape[0] == 1:
        kept = _typical_among_top(logprobs, probs, entropy, distance, mass, min_keep)
        if kept is not None:
            return logits.masked_fill(~kept, NEG_INF)
    ranked, order = torch.sort(distance, dim=-1)
    cumulative = probs.gather(-1, order).cumsum(dim=-1)
    # The token that brings the mass to ``mass``: as many as lie below it, plus itself.
    last = (cumulative < mass).sum(dim=-1, keepdim=True).clamp(max=logits.shape[-1] - 1)
    remove = distance > ranked.gather(-1, last)
    keep = order[..., :min_keep]
    return logits.masked_fill(remove.scatter(-1, keep, False), NEG_INF)


# Above this vocabulary typical-p first ranks the likeliest 1024 tokens only (sorting 49k distances costs ~10 ms):
# a token outside them is more surprising than all of them, so it can only come later in the ranking.
TYPICAL_FAST_VOCAB, TYPICAL_TOP = 4096, 1024


def _typical_among_top(logprobs: torch.Tensor, probs: torch.Tensor, entropy: torch.Tensor, distance: torch.Tensor,
                       mass: float, min_keep: int) -> torch.Tensor | None:
    """The kept mask [1, vocab] ranked among the likeliest tokens, or None when the cut may reach past them."""
    top_logprobs, top_ids = logprobs.topk(TYPICAL_TOP, dim=-1)
    # Every token outside is at least this far from the entropy (its surprise is at least the last one's).
    outside = float(-top_logprobs[0, -1] - entropy[0, 0])
    ranked, order = torch.sort(distance.gather(-1, top_ids), dim=-1)
    cumulative = probs.gather(-1, top_ids).gather(-1, order).cumsum(dim=-1)
    last = int((cumulative < mass).sum())
    if last >= TYPICAL_TOP - 1 or min_keep > TYPICAL_TOP or not float(ranked[0, last]) < outside:
        return None
    kept = distance <= ranked[0, last]
    return kept.scatter(-1, top_ids.gather(-1, order[..., :min_keep]), True)


def keep_above_epsilon(ids: torch.Tensor, logits: torch.Tensor, epsilon: float, min_keep: int = 1) -> torch.Tensor:
    """Epsilon sampling (Hewitt et al.): drop tokens whose probability is below ``epsilon``."""
    remove = logits.softmax(dim=-1) < epsilon
    return logits.masked_fill(_protect_top(remove, logits, min_keep), NEG_INF)


def keep_above_eta(ids: torch.Tensor, logits: torch.Tensor, epsilon: float, min_keep: int = 1) -> torch.Tensor:
    """Eta sampling (Hewitt et al.): the cutoff is ``min(epsilon, √epsilon · e^−H)``, H the entropy in nats: a flat
    distribution keeps more of its tail."""
    probs = logits.softmax(dim=-1)
    entropy = torch.special.entr(probs).sum(dim=-1, keepdim=True)
    eta = torch.clamp(math.sqrt(epsilon) * torch.exp(-entropy), max=epsilon)
    return logits.masked_fill(_protect_top(probs < eta, logits, min_keep), NEG_INF)


def keep_top_n_sigma(ids: torch.Tensor, logits: torch.Tensor, n: float) -> torch.Tensor:
    """Top-nσ (Tang et al.; llama.cpp): keep logits at least ``max − n·σ``, σ the standard deviation of the logits
    still in play (population, over the finite ones)."""
    finite = torch.isfinite(logits)
    count = finite.sum(dim=-1, keepdim=True).clamp(min=1)
    zeroed = torch.where(finite, logits, 0.0)
    mean = zeroed.sum(dim=-1, keepdim=True) / count
    spread = torch.where(finite, (logits - mean) ** 2, 0.0).sum(dim=-1, keepdim=True) / count
    floor = logits.amax(dim=-1, keepdim=True) - n * spread.sqrt()
    return logits.masked_fill(logits < floor, NEG_INF)


def exclude_top_choices(ids: torch.Tensor, logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """XTC's cut (applied when its draw says so): when two or more tokens are at least ``threshold`` likely,
    remove all of them but the least likely one, so the text leaves its most predictable path."""
    probs = logits.softmax(dim=-1)
    above = probs >= threshold
    least = torch.where(above, probs, math.inf).argmin(dim=-1, keepdim=True)  # the least likely of them stays
    remove = above.scatter(-1, least, False) & (above.sum(dim=-1, keepdim=True) >= 2)
    return logits.masked_fill(remove, NEG_INF)


def truncate_by_surprise(ids: torch.Tensor, logits: torch.Tensor, mu: float) -> torch.Tensor:
    """Mirostat v2's cut: drop tokens whose surprise −log2 p exceeds ``mu`` (the top token always stays)."""
    surprise = -torch.log2(logits.softmax(dim=-1))
    return logits.masked_fill(_protect_top(surprise > mu, logits, 1), NEG_INF)


stateless("typical_p", lambda s, c: ("typical_p", lambda i, x: keep_typical(i, x, s.typical_p)))
stateless("epsilon_cutoff", lambda s, c: ("epsilon_cutoff", lambda i, x: keep_above_epsilon(i, x, s.epsilon_cutoff)))
stateless("eta_cutoff", lambda s, c: ("eta_cutoff", lambda i, x: keep_above_eta(i, x, s.eta_cutoff)))
stateless("top_n_sigma", lambda s, c: ("top_n_sigma", lambda i, x: keep_top_n_sigma(i, x, s.top_n_sigma)))


@engine_sampler
class Xtc(Sampler):
    """XTC: llama.cpp draws once per step from the run's seeded generator and cuts when the draw is within the
    probability (runs are reproducible). Its state is the generator's."""

    declares = "xtc"
    name = "xtc"

    def __init__(self, probability: float, threshold: float, generator: torch.Generator) -> None:
        self.probability, self.threshold, self.generator = probability, threshold, generator
        self.start = generator.get_state()

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        return cls(settings.xtc_probability, settings.xtc_threshold, context.run.generator)

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        generator = self.generator
        draw = float(torch.rand((), generator=generator, device=generator.device).item())
        return exclude_top_choices(ids, logits, self.threshold) if draw < self.probability else logits

    def reset(self) -> None:
        self.generator.set_state(self.start)

    def snapshot(self) -> torch.Tensor:
        return self.generator.get_state()

    def restore(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)
