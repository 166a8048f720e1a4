"""The ranking of one contrastive-search step, as transformers 4.46's ``_ranking_fast``: for each of the k
candidates, the degeneration penalty max_j cos(h_candidate, h_j) over every earlier position j (prompt included)
and the score (1 − α)·p − α·penalty; the winner is the best score (the first on a tie, as ``max`` picks)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Ranking:
    penalty: torch.Tensor  # [k] max cosine similarity to the context
    similar: torch.Tensor  # [k] the context position of that maximum
    score: torch.Tensor  # [k] (1 − α)·p − α·penalty
    winner: int  # index of the best score


def rank_candidates(context: torch.Tensor, candidates: torch.Tensor, probs: torch.Tensor, alpha: float) -> Ranking:
    """``context`` [positions, hidden]: the last hidden states (after the final norm) of every token so far;
    ``candidates`` [k, hidden]: each candidate's, from its own step; ``probs`` [k]: their probabilities."""
    norm_context = context / context.norm(dim=-1, keepdim=True)  # [positions, hidden]
    norm_next = candidates / candidates.norm(dim=-1, keepdim=True)  # [k, hidden]
    cosine = norm_next @ norm_context.T  # [k, positions]
    penalty, similar = cosine.max(dim=-1)  # [k]
    score = (1.0 - alpha) * probs - alpha * penalty  # [k]
    return Ranking(penalty, similar, score, int(score.max(dim=-1).indices))
