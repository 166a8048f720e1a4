"""Forced words as transformers 4.46 tracks them (``generation/beam_constraints.py``), as immutable values.

A *phrase* is met by its tokens in a row; a *disjunctive set* by the tokens of any one of its alternatives (a trie;
no alternative may be the start of another, as 4.46 refuses). ``Progress`` is 4.46's ``ConstraintListState``: the
constraints met (in the order they were), the one in progress (at most one: a token that starts a constraint while
another is under way does not count), and the pending ones, in 4.46's order (a constraint a wrong token broke goes
to the back of the queue, and the first pending one a token starts is the one it starts). The breaking token is not
read again as the start of anything (4.46: " big big cat" does not meet " big cat").

The *bank* of a progress is 4.46's ``get_bank``: ``met × L + (L − remaining of the one in progress)`` with ``L``
the longest constraint's length in tokens. The search sorts its candidates by bank first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

Trie = dict[int, Any]  # token id -> the trie of what may follow (an empty dict: a word ends there)


@dataclass(frozen=True)
class Constraint:
    """One forced word: a phrase (one alternative) or a disjunctive set (several)."""

    text: str  # as the user wrote it
    alternatives: tuple[tuple[int, ...], ...]  # each alternative's token ids
    disjunctive: bool
    trie: Trie

    @classmethod
    def of(cls, text: str, alternatives: tuple[tuple[int, ...], ...]) -> Constraint:
        trie: Trie = {}
        for ids in alternatives:
            level = trie
            for token in ids:
                level = level.setdefault(token, {})
        return cls(text, alternatives, len(alternatives) > 1, trie)

    @property
    def length(self) -> int:
        """4.46's ``seqlen``: the phrase's tokens, the longest alternative's for a set."""
        return max(len(ids) for ids in self.alternatives)

    def next_tokens(self, done: tuple[int, ...]) -> list[int]:
        """Tokens that continue ``done`` (the tokens matched so far), in 4.46's order."""
        if not self.disjunctive:
            return [self.alternatives[0][len(done)]] if len(done) < self.length else []
        level = self.trie
        for token in done:
            level = level[token]
        return list(level)


def count_leaves(trie: Trie) -> int:
    return sum(count_leaves(child) for child in trie.values()) if trie else 1


@dataclass(frozen=True)
class Progress:
    """Where a sequence stands with every constraint (indices into the run's constraints)."""

    met: tuple[int, ...] = ()
    current: int | None = None  # the constraint in progress
    done: tuple[int, ...] = ()  # its tokens matched so far
    pending: tuple[int, ...] = ()

    @property
    def completed(self) -> bool:
        return self.current is None and not self.pending


def start(constraints: tuple[Constraint, ...]) -> Progress:
    return Progress(pending=tuple(range(len(constraints))))


def add(progress: Progress, token: int, constraints: tuple[Constraint, ...]) -> Progress:
    """``ConstraintListState.add``: the progress after one more token."""
    if progress.completed:
        return progress
    if progress.current is not None:
        c = constraints[progress.current]
        if token in c.next_tokens(progress.done):
            done = (*progress.done, token)
            if c.next_tokens(done):
                return Progress(progress.met, progress.current, done, progress.pending)
            return Progress((*progress.met, progress.current), None, (), progress.pending)
        return Progress(progress.met, None, (), (*progress.pending, progress.current))  # broken: back of the queue
    for k, index in enumerate(progress.pending):
        if token in constraints[index].next_tokens(()):
            rest = progress.pending[:k] + progress.pending[k + 1 :]
            if constraints[index].next_tokens((token,)):
                return Progress(progress.met, index, (token,), rest)
            return Progress((*progress.met, index), None, (), rest)
    return progress


def add_all(progress: Progress, tokens: list[int], constraints: tuple[Constraint, ...]) -> Progress:
    for token in tokens:
        if progress.completed:
            break
        progress = add(progress, token, constraints)
    return progress


def advance_tokens(progress: Progress, constraints: tuple[Constraint, ...]) -> list[int]:
    """``ConstraintListState.advance``: the tokens that take a step towards the constraints (the one in progress's
    next tokens, else every pending one's first), duplicates kept, in 4.46's order."""
    if progress.current is not None:
        return constraints[progress.current].next_tokens(progress.done)
    return [t for index in progress.pending for t in constraints[index].next_tokens(())]


def bank_unit(constraints: tuple[Constraint, ...]) -> int:
    return max(c.length for c in constraints)


def bank(progress: Progress, constraints: tuple[Constraint, ...]) -> int:
    """``ConstraintListState.get_bank``."""
    unit = bank_unit(constraints)
    partial = 0
    if progress.current is not None:
        partial = unit - (constraints[progress.current].length - len(progress.done))
    return len(progress.met) * unit + partial


def advance_banks(progress: Progress, tokens: list[int], constraints: tuple[Constraint, ...]) -> list[int]:
    """The banks 4.46 gives the candidates ``tokens`` (``advance_tokens(progress)``) of one beam.

    It is ``bank(add(progress, token))`` but for one 4.46 quirk: a disjunctive set's stateful copy shares its list of
    matched tokens (``DisjunctiveConstraint.copy`` does not copy ``current_seq``), so while a set is in progress each
    candidate's token is appended to the list the next candidates' copies start from, and a candidate still under
    way reads the list as it is after the last one. The search's own progress (what a beam meets next step) is the
    true one: 4.46 rebuilds it from the sequence every step.
    """
    if progress.current is None or not constraints[progress.current].disjunctive:
        return [bank(add(progress, token, constraints), constraints) for token in tokens]
    c, unit = constraints[progress.current], bank_unit(constraints)
    shared = list(progress.done)
    banks: list[int | None] = []  # None: still under way, read from the shared list at the end
    for token in tokens:
        if token not in c.next_tokens(tuple(shared)):
            banks.append(len(progress.met) * unit)  # broken, back to pending
            continue
        shared.append(token)
        banks.append((len(progress.met) + 1) * unit if not c.next_tokens(tuple(shared)) else None)
    under_way = len(progress.met) * unit + unit - (c.length - len(shared))
    return [under_way if b is None else b for b in banks]
