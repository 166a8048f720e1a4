"""Speculation under a constraint (``--json-schema``, ``--regex``, ``--grammar``, ``--choices``): the target verifies
with the constrained distribution, and drafted tokens the grammar forbids are rejected before verification.

- The run's ``Grammar`` sampler follows the emitted tokens, so its matcher is at the round's context. A round walks
  its draft with copies of it (``Grammar.followed_by``, a ``deep_copy`` of the matcher): a node's state is its
  parent's after the node's token. The drafter itself drafts unconstrained (its chain has no grammar).
- A drafted token the mask forbids at its position is *rejected by the grammar*: the target's pass does not read
  it, and its descendants are dropped (they follow a token that cannot be there). The mask is the verification's own
  set: llguidance's ``validate_tokens`` accepts a few tokens more (a shorter piece of bytes the grammar forces,
  where the mask allows only their canonical first token).
- The verification still judges it, as a draft its parent's masked row gives probability 0: greedy never picks it;
  the rejection rule rejects it for certain and draws the correction from the residual normalise(max(0, p − q)) (a
  chain), or goes on to its siblings with that residual (a tree). So the output is still distributed as the
  constrained target's samples; dropping the token before the rule and drawing from p instead would over-weight what
  the drafter under-proposed.
- Each drafted token's span, from the number of tokens the grammar allowed at its position: "forced" (one), "inside"
  a constrained span (fewer than half the vocabulary: keys, punctuation, digits, a choice) or "outside" one (at least
  half: free text inside the constraint, e.g. a JSON string's characters).

Rows: [len(tree) + 1, vocab] as the verification reads them (row 0 after the context, row 1 + i after node i); a
forbidden node's row is a stand-in (a leaf never accepted: no one reads it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from playground.engine.processors import NamedTransform
from playground.engine.samplers.grammar import Grammar
from playground.engine.speculative.tree import DraftTree
from playground.events import StopReason

FORCED, INSIDE, OUTSIDE = "forced", "inside", "outside"
SPANS = (FORCED, INSIDE, OUTSIDE)


def span_of(allowed: int, vocab: int) -> str:
    """Where a token was drafted, from the tokens the grammar allowed there (of ``vocab``)."""
    if allowed == 1:
        return FORCED
    return INSIDE if 2 * allowed < vocab else OUTSIDE


@dataclass
class JudgedDraft:
    """A round's draft as the grammar judged it (node indices: ``tree``'s)."""

    tree: DraftTree  # the nodes the verification judges: the allowed ones and, as leaves, the forbidden ones
    kept: list[int]  # the nodes the target's pass reads (every one on its path allowed), in tree order
    forbidden: frozenset[int]  # rejected by the grammar before verification
    allowed: list[int]  # per node: tokens the grammar allowed at its position
    spans: list[str]  # per node: FORCED | INSIDE | OUTSIDE
    states: dict[int, Grammar] = field(default_factory=dict)  # per kept node: the grammar after its path; -1: start
    dropped: int = 0  # drafted nodes below a forbidden one (never judged)

    def pass_tree(self) -> DraftTree:
        """The kept nodes alone, re-indexed (what the target's pass reads)."""
        index = {node: j for j, node in enumerate(self.kept)}
        out = DraftTree([self.tree.tokens[n] for n in self.kept],
                        [index[self.tree.parents[n]] if self.tree.parents[n] >= 0 else -1 for n in self.kept])
        if self.tree.probs is not None and self.kept:
            out.probs = self.tree.probs[self.kept]
        return out

    def pass_row(self, row: int) -> int:
        """The target pass's row of verification row ``row`` (a kept node's, or the context's)."""
        return 0 if row == 0 else 1 + self.kept.index(row - 1)

    def rows(self, pass_rows: torch.Tensor) -> torch.Tensor:
        """The pass's rows [len(kept) + 1, vocab] spread to the verification's [len(tree) + 1, vocab]."""
        out = pass_rows[:1].repeat(len(self.tree) + 1, 1)  # a forbidden node's stand-in: the context's row
        if self.kept:
            out[torch.tensor([1 + n for n in self.kept], device=out.device)] = pass_rows[1:]
        return out

    def pipeline_at(self, pipeline: tuple[NamedTransform, ...], row: int) -> tuple[NamedTransform, ...]:
        """The chain with the grammar at verification row ``row``'s state (0: the round's start)."""
        state = self.states[row - 1]
        return tuple(state if isinstance(s, Grammar) else s for s in pipeline)


def judge_draft(grammar: Grammar, tree: DraftTree) -> JudgedDraft:
    """Walk ``tree`` (parents before children) from the grammar's state: each node's token is checked against its
    parent's mask; a forbidden node is kept as a leaf for the verification, its descendants are dropped."""
    vocab = grammar.vocab
    states: dict[int, Grammar] = {-1: grammar}
    counts: dict[int, int] = {}  # per state (node, -1: start): tokens its mask allows
    new_index: dict[int, int] = {}
    judged = DraftTree()
    kept: list[int] = []
    forbidden: set[int] = set()
    allowed: list[int] = []
    spans: list[str] = []
    rows: list[int] = []
    dropped = 0
    for node, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        if parent >= 0 and parent not in states:  # below a forbidden node (or one dropped)
            dropped += 1
            continue
        state = states[-1 if parent < 0 else parent]
        key = -1 if parent < 0 else new_index[parent]
        mask = state.allowed().mask
        if key not in counts:
            counts[key] = int(mask.sum().item())
        j = judged.add(token, key)
        new_index[node] = j
        rows.append(node)
        allowed.append(counts[key])
        spans.append(span_of(counts[key], vocab))
        if 0 <= token < mask.shape[0] and bool(mask[token]):
            kept.append(j)
            states[node] = state.followed_by(token)
        else:
            forbidden.add(j)
    if tree.probs is not None and rows:
        judged.probs = tree.probs[rows]
    by_new = {new_index[node]: g for node, g in states.items() if node >= 0}
    by_new[-1] = grammar
    return JudgedDraft(judged, kept, frozenset(forbidden), allowed, spans, by_new, dropped)


def follow_forced(grammar: Grammar, tree: DraftTree) -> JudgedDraft:
    """Forced tokens (branching) are taken whatever the grammar says: every node is kept, each row's state follows
    them (a forbidden one leaves its copy ``broken``: the run ends after it, as a plain run's does)."""
    states: dict[int, Grammar] = {-1: grammar}
    allowed, spans = [], []
    for node, (token, parent) in enumerate(zip(tree.tokens, tree.parents, strict=True)):
        state = states[parent]
        count = int(state.allowed().mask.sum().item())
        allowed.append(count)
        spans.append(span_of(count, grammar.vocab))
        states[node] = state.followed_by(token)
    return JudgedDraft(tree, list(range(len(tree))), frozenset(), allowed, spans, states)


def follow_round(grammar: Grammar, judged: JudgedDraft, path: list[int], emitted: list[int]
                 ) -> tuple[int, tuple[StopReason, str] | None]:
    """Move the run's grammar over the round's ``emitted`` tokens (the accepted ``path``'s, then the target's own);
    returns how many of them the run keeps and, when the constraint ends the run after the last kept one, its stop
    reason and note (complete, or a token it could not follow)."""
    for j, token in enumerate(emitted):
        if j < len(path):
            state = judged.states[path[j]]
            ends = state.finished()
            if ends is not None:
                grammar.restore(state.snapshot())
                return j + 1, ends
            continue
        if path:
            grammar.restore(judged.states[path[-1]].snapshot())
        grammar.accept(token, 0.0)
        ends = grammar.finished()
        return j + 1, ends
    if path:  # no room for the target's own token
        grammar.restore(judged.states[path[-1]].snapshot())
    return len(emitted), None


def count_spans(spans: dict[str, list[int]] | None, judged: JudgedDraft, path: list[int]) -> dict[str, list[int]]:
    """Add a round's nodes to ``spans`` (per span: drafted, accepted, rejected by the grammar); ``path``: the
    accepted nodes."""
    out = spans or {span: [0, 0, 0] for span in SPANS}
    accepted = set(path)
    for node, span in enumerate(judged.spans):
        counts = out[span]
        counts[0] += 1
        counts[1] += node in accepted
        counts[2] += node in judged.forbidden
    return out


def constrained_figures(spans: dict[str, list[int]]) -> dict[str, float]:
    """The acceptance split by span: drafted, accepted and grammar-rejected nodes forced, inside and outside
    constrained spans, and free (inside or outside, not forced); each with its acceptance rate."""
    free = [a + b for a, b in zip(spans[INSIDE], spans[OUTSIDE], strict=True)]
    out: dict[str, float] = {"grammar_rejected": float(sum(c[2] for c in spans.values()))}
    for name, (drafted, accepted, rejected) in (*spans.items(), ("free", free)):
        out[f"drafted_{name}"] = float(drafted)
        out[f"accepted_{name}"] = float(accepted)
        out[f"grammar_rejected_{name}"] = float(rejected)
        out[f"acceptance_{name}"] = accepted / drafted if drafted else 0.0
    return out
