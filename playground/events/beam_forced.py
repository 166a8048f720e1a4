"""Constrained beam search's events (forced words): the constraints, each step's banks, what the returned met.

A run with ``--force-words`` yields ``ForcedWordsStarted`` right after ``start``; before each ``BeamStep`` a
``BeamBanks`` with one entry per candidate of that step (same order as ``BeamStep.candidates``: the top-K
continuations first, then the candidates the constraints proposed that were not among them); before ``done`` a
``ForcedWordsDone`` saying which constraints each returned sequence meets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class ForcedWord:
    """One constraint: a phrase, or a disjunctive set (met by any one alternative)."""

    text: str  # as the user wrote it (" cat| kitten")
    alternatives: tuple[tuple[int, ...], ...]  # each alternative's token ids
    alternative_texts: tuple[tuple[str, ...], ...]  # each alternative's tokens' own texts
    disjunctive: bool


@dataclass(frozen=True)
class ForcedWordsStarted:
    type: ClassVar[str] = "forced_words_started"
    constraints: tuple[ForcedWord, ...]
    bank_unit: int  # L, the longest constraint's tokens: bank = met × L + (L − tokens still to go in progress)
    prompt_met: tuple[int, ...]  # constraints the prompt already meets (4.46 reads the whole sequence)


@dataclass(frozen=True)
class BankedCandidate:
    """Where a candidate stands with the constraints (4.46's ``ConstraintListState`` after its token)."""

    bank: int  # the bank it was sorted into (for a candidate the search did not sort: its own progress's)
    met: tuple[int, ...]  # constraints met, by index, in the order they were
    current: int  # the constraint in progress (-1: none)
    matched: int  # its tokens matched so far
    proposed: bool  # a constraint proposed it (a token that advances one), beside the top-K continuations
    sorted: bool  # it entered the bank sort: one of the best non-EOS continuations, or proposed


@dataclass(frozen=True)
class BeamBanks:
    """One step's banks: the search keeps the best candidate of each bank (best bank first), then the second..."""

    type: ClassVar[str] = "beam_banks"
    step: int
    candidates: tuple[BankedCandidate, ...]  # one per candidate of the step's BeamStep, same order
    survivor_banks: tuple[int, ...]  # bank of each surviving beam, in the next step's beam order


@dataclass(frozen=True)
class ForcedWordsDone:
    type: ClassVar[str] = "forced_words_done"
    met: tuple[tuple[int, ...], ...]  # for each returned sequence: the constraints it meets
    # Fewer finished hypotheses than return sequences met every constraint: 4.46 then fills in with the running
    # beams that do not ("due to overly complex constraints ... we simply return the highest scoring outputs").
    filled_in: bool
