"""Diverse (group) beam search's events: beam search's, with each candidate's beam group and the diversity penalty
it paid (``playground.engine.beam_groups``). Subclasses, so that what reads beam search's steps reads these."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from playground.events.beam import BeamCandidate, BeamStep


@dataclass(frozen=True)
class DiverseBeamCandidate(BeamCandidate):
    """A continuation a beam of a group proposed (its group's top ``2 x group size``)."""

    group: int  # its beam's group: 0 is decided first at every step
    # What the diversity penalty took off its log-prob (``token_logprob`` and ``score`` are after it): D x the
    # beams of earlier groups that chose this token at this step.
    diversity_penalty: float


@dataclass(frozen=True)
class DiverseBeamStep(BeamStep):
    """One step of diverse beam search: every group's beams expanded in one pass, the groups decided in order."""

    type: ClassVar[str] = "diverse_beam_step"
    candidates: tuple[DiverseBeamCandidate, ...]  # group by group, each group's best first
