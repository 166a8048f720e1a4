"""Beam search's events: every beam expanded at each step, with what survived and what finished."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class BeamCandidate:
    """A continuation a beam proposed at a step (top 2 x width overall, as transformers does)."""

    beam: int  # index of the parent beam among the previous step's beams
    token_id: int
    text: str
    token_logprob: float  # log-prob of the token given the beam (after processors)
    score: float  # cumulative log-prob of the beam plus this token
    survived: bool  # became one of the next step's running beams
    finished: bool  # ended with EOS (or reached max length) and became a finished hypothesis
    finished_score: float | None  # length-normalised score if finished


@dataclass(frozen=True)
class BeamStep:
    """One step of beam search, all beams expanded in one batched forward pass."""

    type: ClassVar[str] = "beam_step"
    unit: ClassVar[str] = "step"  # one step grows every beam by a token
    step: int
    parents: tuple[int, ...]  # for each surviving beam: its parent beam at the previous step
    token_ids: tuple[int, ...]  # for each surviving beam: the token it appended
    scores: tuple[float, ...]  # for each surviving beam: cumulative log-prob
    candidates: tuple[BeamCandidate, ...]
    step_ms: float
    kv_cache_bytes: int
