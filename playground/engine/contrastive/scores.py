"""Contrastive decoding's maths (Li et al. 2022, "Contrastive Decoding: Open-ended Text Generation as Optimization"):

    V_head = { x : p_expert(x) ≥ α · max_w p_expert(w) }            the plausibility cut
    score(x) = log p_expert(x) − log p_amateur(x)   for x in V_head,   −∞ elsewhere

then the token with the highest score (greedy) or a draw from softmax(score) over V_head (sampled). The amateur's
distribution is softmax(amateur logits / T_amateur). Pure functions on one position's [vocab] rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

NEG_INF = float("-inf")


@dataclass
class Contrast:
    """One position's distributions and scores, all [vocab] float32 (the amateur's padded to the expert's width)."""

    expert_logprobs: torch.Tensor
    amateur_logprobs: torch.Tensor
    plausible: torch.Tensor  # bool
    scores: torch.Tensor  # −∞ outside the plausible set
    cut_logprob: float  # log α + max log p_expert (−∞ for α = 0)


def amateur_logprobs(logits: torch.Tensor, temperature: float, width: int) -> torch.Tensor:
    """[vocab_a] amateur logits → [width] log-probabilities at ``temperature``. A narrower amateur (a smaller model
    whose LM head has fewer padding rows) gets +∞ past its width, so those tokens score −∞ (never chosen); a wider
    one is cut to the expert's width before its softmax (its padding rows are not tokens)."""
    logprobs = (logits[:width].float() / temperature).log_softmax(dim=-1)
    if logprobs.shape[-1] < width:
        logprobs = torch.cat([logprobs, logprobs.new_full((width - logprobs.shape[-1],), math.inf)])
    return logprobs


def plausible_set(expert_logprobs: torch.Tensor, alpha: float) -> tuple[torch.Tensor, float]:
    """The tokens with p ≥ α · max p (and p > 0), and the cut as a log-probability.

    Decided on p / max p = exp(log p − max log p) in float64: the ratio is compared with α exactly as written, so a
    token exactly at the boundary is in."""
    top = expert_logprobs.max()
    relative = (expert_logprobs.double() - top.double()).exp()  # p / max p
    mask = (relative >= alpha) & (relative > 0)
    cut = float(top) + math.log(alpha) if alpha > 0 else NEG_INF
    return mask, cut


def contrast(expert_logits: torch.Tensor, amateur_logits: torch.Tensor, alpha: float,
             amateur_temperature: float) -> Contrast:
    """``expert_logits`` [vocab] (after the penalties), ``amateur_logits`` [vocab_a] raw → the step's contrast."""
    expert = expert_logits.float().log_softmax(dim=-1)
    amateur = amateur_logprobs(amateur_logits, amateur_temperature, expert.shape[-1])
    mask, cut = plausible_set(expert, alpha)
    scores = torch.where(mask, expert - amateur, expert.new_tensor(NEG_INF))
    return Contrast(expert, amateur, mask, scores, cut)
