"""Speculative decoding's events: who drafts, and every round's proposals and verdicts.

A speculative run also yields an ordinary ``token`` event for every token it emits (accepted drafts and the
target's own), so the tokens view and the candidates chart work unchanged; these events add what was drafted,
what the target thought of it, and what was thrown away.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class SpeculativeStarted:
    """Right after ``start``: the drafter, described once for the view."""

    type: ClassVar[str] = "spec_start"
    drafter: str  # "prompt-lookup" | "layers" | "model" | "jacobi"
    detail: str  # e.g. "first 8 of 30 layers", "SmolLM2-135M (…)", "longest n-gram 3"
    draft_k: int
    do_sample: bool
    baseline_tokens: int  # a plain run of this many tokens measures the speed-up at the end (0: none)
    tree_width: int = 1  # candidates per depth: 1 = a chain; more = each round drafts a tree (one target pass)
    tree_nodes: int = 0  # a tree's node budget (0: a chain)
    constraint: str = ""  # the run's constraint ("json_schema", "regex", "grammar", "choices"; "" none)


@dataclass(frozen=True)
class DraftToken:
    """One drafted token and the verdict on it."""

    token_id: int
    text: str
    draft_prob: float  # q: its probability under the drafter's processed distribution (1.0: a deterministic draft)
    target_prob: float  # p: its probability under the target's processed distribution at that position
    accepted: bool
    draw: float | None  # sampling: the uniform draw compared with min(1, p/q); greedy: None (accepted iff argmax)
    rank: int = 0  # a tree's node: its place among its parent's children as the drafter ranked them (0 = first)
    # Sampling: what ``draw`` was compared with, min(1, p'/q): a tree's later sibling is judged against the target's
    # distribution left after the earlier siblings' rejections (p' = p for a chain and a first child). None: greedy.
    accept_prob: float | None = None
    # Under a constraint: the grammar forbade it at its position, so it was rejected before verification (the
    # target's pass did not read it; the rejection rule judged it with p = 0, and nodes drafted below it were
    # dropped). ``allowed``: tokens the grammar allowed there; ``span``: "forced" (one), "inside" a constrained span
    # (fewer than half the vocabulary), "outside" (at least half: free text inside the constraint). "" / 0: no
    # constraint (and saved runs from before).
    grammar_rejected: bool = False
    span: str = ""
    allowed: int = 0


@dataclass(frozen=True)
class SpeculativeRound:
    """Draft k tokens (a chain, or a tree of candidates), verify them in one target forward pass, keep the longest
    acceptable prefix (of a tree: path from the context), add one."""

    type: ClassVar[str] = "spec_round"
    round: int  # 0 = the first round
    first_step: int  # output position of the round's first token (the step of its first ``token`` event)
    emitted: int  # tokens of this round that reached the output (fewer than accepted + 1 when the run ended in it)
    drafted: tuple[DraftToken, ...]
    accepted: int  # how many drafted tokens were kept (a prefix)
    target_token_id: int  # the target's own token: a correction after a rejection, or the bonus after all accepted
    target_text: str
    target_kind: str  # "correction" | "bonus" | "none" (the run ended inside the draft: EOS, stop string, budget)
    target_prob: float  # the target token's processed probability
    draft_ms: float
    verify_ms: float
    kv_cache_bytes: int  # the target's cache after the rollback
    prompt_read: int = 0  # prompt tokens this verification pass also read (the first round reads the prompt's tail)
    # A tree round: each drafted token's parent, an index into ``drafted`` (-1: it follows the context). ``drafted``
    # then lists the accepted path first (its first ``accepted`` entries), then the other nodes, parents before
    # children. Empty: a chain (each drafted token follows the one before).
    parents: tuple[int, ...] = ()

    @property
    def is_tree(self) -> bool:
        return bool(self.parents)

    def depths(self) -> list[int]:
        """Each drafted token's depth (0: right after the context); a chain's token i is at depth i."""
        if not self.parents:
            return list(range(len(self.drafted)))
        out: list[int] = []
        for parent in self.parents:
            out.append(0 if parent < 0 else out[parent] + 1)
        return out
