"""Contrastive search's events (Su et al. 2022): the run's α and k, and every step's candidates with the model's
confidence, the degeneration penalty, the earlier token each candidate resembles most, and the combined score.

A contrastive-search run also yields an ordinary ``token`` event per step (right after its ``search`` event, same
``step``), so the tokens view and the candidates chart work unchanged; there ``prob`` is the model's probability of
the chosen token after the penalties (the candidates' confidence), not a contrastive distribution.

Positions count the whole sequence: 0 is the prompt's first token (chat template included), the prompt's
``len(context_tokens)`` tokens come first, and step s's token sits at ``len(context_tokens) + s``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class SearchStarted:
    """Right after ``start``: the rule's two numbers and the prompt's tokens (what a candidate may resemble)."""

    type: ClassVar[str] = "search_start"
    alpha: float  # score = (1 − alpha)·confidence − alpha·penalty
    k: int  # candidates weighed per step (the run's top_k)
    context_tokens: tuple[str, ...]  # the prompt's tokens' texts, position by position (decoded incrementally)


@dataclass(frozen=True)
class SearchCandidate:
    """One of a step's k candidates."""

    token_id: int
    text: str
    confidence: float  # p(token): the model's probability after the penalties (softmax of the processed logits)
    penalty: float  # degeneration penalty: max over earlier positions of cos(h_candidate, h_position)
    similar_position: int  # the earlier position that maximum was found at (0 = the prompt's first token)
    score: float  # (1 − alpha)·confidence − alpha·penalty


@dataclass(frozen=True)
class SearchStep:
    """One step: the k candidates in the model's order (the likeliest first) and which one won."""

    type: ClassVar[str] = "search"
    step: int  # the step of the ``token`` event that follows
    candidates: tuple[SearchCandidate, ...]
    token_id: int  # the token the text continues with (the winner, or the forced token when forced)
    text: str
    winner: int  # index into ``candidates`` of the best score (-1: a forced token outside them was taken)
    overturned: bool  # the penalty overturned the model's top choice (the winner is not candidate 0)
    forced: bool  # forced by branching
