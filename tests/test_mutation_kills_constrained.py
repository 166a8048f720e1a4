"""Kill tests for playground/engine/speculative/constrained.py's mutation survivors: judging a draft tree against the
grammar (kept, forbidden, dropped nodes, each position's allowed count and span, the re-indexed pass tree and its
rows), ``follow_forced`` (forcing: every node kept, a forbidden one breaks its copy), ``follow_round`` (the run's
grammar moved over a round's emitted tokens), and the span counts and figures.

The grammar is a hand-built automaton over an 8-token vocabulary behind a stand-in for llguidance's matcher, wrapped
in the real ``Grammar`` sampler; every expected value is walked by hand from ``RULES`` (comments at each table).
"""

from __future__ import annotations

import pytest
import torch

from playground.engine.samplers.grammar import Grammar
from playground.engine.speculative.constrained import (
    FORCED,
    INSIDE,
    OUTSIDE,
    JudgedDraft,
    constrained_figures,
    count_spans,
    follow_forced,
    follow_round,
    judge_draft,
    span_of,
)
from playground.engine.speculative.tree import DraftTree, chain

VOCAB = 8
# state: {allowed token: next state}; END is stopped (nothing allowed, nothing can follow)
RULES: dict[str, dict[int, str]] = {
    "S0": {0: "S1", 1: "S2", 2: "S1", 3: "S3"},  # 4 of 8 allowed: not fewer than half -> outside
    "S1": {5: "S2"},  # forced
    "S2": {0: "S0", 6: "S1", 7: "END"},  # 3 of 8 -> inside
    "S3": {t: "S0" for t in range(VOCAB)},  # all 8 -> outside
    "END": {},
}


class HandMatcher:
    """The few calls of llguidance's ``LLMatcher`` that ``Grammar`` makes, over ``RULES``."""

    def __init__(self, state: str = "S0") -> None:
        self.state = state

    def compute_bitmask(self) -> bytes:
        return sum(1 << t for t in RULES[self.state]).to_bytes(4, "little")

    def compute_ff_tokens(self) -> list[int]:
        return list(RULES[self.state]) if len(RULES[self.state]) == 1 else []

    def is_stopped(self) -> bool:
        return self.state == "END"

    def is_accepting(self) -> bool:
        return self.state == "END"

    def consume_token(self, token: int) -> bool:
        if token not in RULES[self.state]:
            return False
        self.state = RULES[self.state][token]
        return True

    def deep_copy(self) -> HandMatcher:
        return HandMatcher(self.state)

    def get_error(self) -> str:
        return ""

    def reset(self) -> None:
        self.state = "S0"


def grammar_at(state: str = "S0") -> Grammar:
    return Grammar(HandMatcher(state), VOCAB, (), "regex")


def state_of(g: Grammar) -> str:
    """The hand automaton's state of a grammar copy ("broken" when a taken token was forbidden)."""
    return "broken" if g.broken else g.matcher.state


# The draft tree (node: token, parent) and its judgement, walked by hand from S0:
#   n0: 0 under the context   S0 allows {0,1,2,3} (4: outside), 0 allowed -> S1           judged 0, kept
#   n1: 5 under n0            S1 allows {5} (1: forced), allowed -> S2                    judged 1, kept
#   n2: 4 under the context   S0 (4: outside), 4 forbidden                                judged 2, forbidden
#   n3: 7 under n2            below a forbidden node                                      dropped
#   n4: 6 under n3            below a dropped node                                        dropped
#   n5: 0 under n1            S2 allows {0,6,7} (3: inside), 0 allowed -> S0              judged 3, kept
#   n6: 8 under n1            S2 (3: inside), 8 is past the vocabulary: forbidden         judged 4, forbidden
#   n7: 3 under n5            S0 (4: outside), 3 allowed -> S3                            judged 5, kept
#   n8: 2 under n7            S3 allows all 8 (outside), 2 allowed -> S0                  judged 6, kept
TOKENS = [0, 5, 4, 7, 6, 0, 8, 3, 2]
PARENTS = [-1, 0, -1, 2, 3, 1, 1, 5, 7]
JUDGED_FROM = [0, 1, 2, 5, 6, 7, 8]  # the drafted node of each judged node
JUDGED_TOKENS = [0, 5, 4, 0, 8, 3, 2]
JUDGED_PARENTS = [-1, 0, -1, 1, 1, 3, 5]
KEPT = [0, 1, 3, 5, 6]
FORBIDDEN = {2, 4}
ALLOWED = [4, 1, 4, 3, 3, 4, 8]
SPANS = [OUTSIDE, FORCED, OUTSIDE, INSIDE, INSIDE, OUTSIDE, OUTSIDE]
STATES = {-1: "S0", 0: "S1", 1: "S2", 3: "S0", 5: "S3", 6: "S0"}  # per kept judged node: the state after its path


def drafted_tree() -> DraftTree:
    tree = DraftTree(list(TOKENS), list(PARENTS))
    tree.probs = torch.arange(len(TOKENS) * VOCAB, dtype=torch.float32).reshape(len(TOKENS), VOCAB)  # row i: node i
    return tree


def judged_draft() -> tuple[Grammar, JudgedDraft]:
    grammar = grammar_at("S0")
    return grammar, judge_draft(grammar, drafted_tree())


# -- span_of -----------------------------------------------------------------------------------------------------------

def test_span_of_follows_the_rule_at_its_boundaries():
    """One allowed token: forced; fewer than half the vocabulary (2n < vocab): inside; else outside. Catches == 2 /
    != 1 for the forced test, 3n, n/2 (2 / n), <= and a constant condition for the inside one."""
    assert span_of(1, 8) == FORCED
    assert span_of(2, 8) == INSIDE
    assert span_of(3, 8) == INSIDE  # 6 < 8 (3·3 = 9 would not be)
    assert span_of(4, 8) == OUTSIDE  # exactly half: 8 is not < 8
    assert span_of(8, 8) == OUTSIDE  # 2/8 < 8 would call it inside
    assert span_of(100, 8) == OUTSIDE


# -- judge_draft -------------------------------------------------------------------------------------------------------

def test_judge_draft_keeps_forbids_and_drops_as_walked_by_hand():
    """Catches: every non-root node dropped (``or``), ``break`` at the first dropped node, the judged parent of n0's
    child taken as the context (parent <= 0 / < 1, or always -1), token 0 refused (0 < t, 1 <= t), a token past the
    vocabulary read from the mask (t <= vocab: an IndexError), the per-node allowed counts lost (None), and the
    dropped count (start 1, = 1, -= 1, += 2, or left out)."""
    grammar, judged = judged_draft()
    assert judged.tree.tokens == JUDGED_TOKENS
    assert judged.tree.parents == JUDGED_PARENTS
    assert judged.kept == KEPT
    assert judged.forbidden == frozenset(FORBIDDEN)
    assert judged.allowed == ALLOWED
    assert judged.spans == SPANS
    assert judged.dropped == 2  # n3 and n4
    assert set(judged.states) == set(STATES)
    assert {node: state_of(g) for node, g in judged.states.items()} == STATES
    assert judged.states[-1] is grammar and state_of(grammar) == "S0"  # the run's grammar itself, not moved


def test_judge_draft_keeps_each_judged_nodes_drafter_row():
    """The judged tree's q rows are the drafted nodes' own (n0, n1, n2, n5, ...), not lost (None)."""
    _, judged = judged_draft()
    assert judged.tree.probs is not None
    expected = torch.stack([torch.arange(VOCAB, dtype=torch.float32) + VOCAB * n for n in JUDGED_FROM])
    assert torch.equal(judged.tree.probs, expected)


def test_judge_draft_refuses_a_tree_whose_tokens_and_parents_differ_in_length():
    """A tree with a token more than parents is an error, not a silently shorter judgement (strict zip)."""
    with pytest.raises(ValueError):
        judge_draft(grammar_at(), DraftTree([0, 5, 6], [-1, 0]))


# -- the pass tree and its rows ----------------------------------------------------------------------------------------

def test_pass_tree_is_the_kept_nodes_reindexed():
    """Kept judged nodes 0, 1, 3, 5, 6 become pass nodes 0..4; their parents -1, 0, 1, 3, 5 become -1, 0, 1, 2, 3.
    Catches the parents left out, every parent -1, parent 0 read as the context (> 0, >= 1), roots given -2, and
    the q rows lost."""
    _, judged = judged_draft()
    out = judged.pass_tree()
    assert out.tokens == [0, 5, 0, 3, 2]
    assert out.parents == [-1, 0, 1, 2, 3]
    assert out.probs is not None
    expected = torch.stack([torch.arange(VOCAB, dtype=torch.float32) + VOCAB * n for n in (0, 1, 5, 7, 8)])
    assert torch.equal(out.probs, expected)


def test_pass_row_maps_verification_rows_to_the_pass():
    """Row 0 (the context) is the pass's row 0; row 1 + judged node n is 1 + n's place among the kept nodes."""
    _, judged = judged_draft()
    assert judged.pass_row(0) == 0
    assert [judged.pass_row(1 + n) for n in KEPT] == [1, 2, 3, 4, 5]


def test_rows_spread_the_pass_rows_with_the_context_row_for_forbidden_nodes():
    """[len(kept) + 1, vocab] -> [len(tree) + 1, vocab]: kept node n's row 1 + n is the pass's row for it; a forbidden
    node's row is the context's. Catches a stand-in of two rows, or one row too many."""
    _, judged = judged_draft()
    pass_rows = torch.arange(6 * VOCAB, dtype=torch.float32).reshape(6, VOCAB)  # pass row r: r·8 .. r·8 + 7
    out = judged.rows(pass_rows)
    # verification rows 0..7: context, judged nodes 0..6 (kept 0, 1, 3, 5, 6 -> pass rows 1..5; forbidden 2, 4 -> 0)
    expected = pass_rows[[0, 1, 2, 0, 3, 0, 4, 5]]
    assert out.shape == (8, VOCAB)
    assert torch.equal(out, expected)


# -- follow_forced -----------------------------------------------------------------------------------------------------

def test_follow_forced_keeps_every_node_and_breaks_a_copy_on_a_forbidden_token():
    """Forcing (node: token, parent): n0 0 under the context (S0: 4 allowed) -> S1; n1 5 under n0 (S1: forced) -> S2;
    n2 4 under n1 (S2: 3 allowed) is forbidden there -> its copy is broken; n3 3 under the context (S0: 4) -> S3.
    Every node is kept, none is forbidden or dropped, the tree is the drafted one."""
    grammar = grammar_at("S0")
    tree = DraftTree([0, 5, 4, 3], [-1, 0, 1, -1])
    judged = follow_forced(grammar, tree)
    assert judged.tree is tree
    assert judged.kept == [0, 1, 2, 3]
    assert judged.forbidden == frozenset()
    assert judged.allowed == [4, 1, 3, 4]
    assert judged.spans == [OUTSIDE, FORCED, INSIDE, OUTSIDE]
    assert judged.dropped == 0
    assert set(judged.states) == {-1, 0, 1, 2, 3}
    assert judged.states[-1] is grammar and state_of(grammar) == "S0"
    assert {node: state_of(g) for node, g in judged.states.items() if node >= 0} == {
        0: "S1", 1: "S2", 2: "broken", 3: "S3"}
    reason = judged.states[2].finished()
    assert reason is not None and reason[0] == "grammar_blocked"


def test_follow_forced_states_feed_the_chain_at_each_row():
    """The forced round's rows read the grammar at each node's state (pipeline_at), the states' own copies."""
    grammar = grammar_at("S0")
    judged = follow_forced(grammar, chain([0, 5]))
    other = object()
    pipeline = (other, grammar)
    assert judged.pipeline_at(pipeline, 0) == (other, grammar)
    row2 = judged.pipeline_at(pipeline, 2)
    assert row2[0] is other and state_of(row2[1]) == "S2"  # type: ignore[arg-type]


def test_follow_forced_refuses_a_tree_whose_tokens_and_parents_differ_in_length():
    """A token more than parents is an error (strict zip), not a shorter round."""
    with pytest.raises(ValueError):
        follow_forced(grammar_at(), DraftTree([0, 5, 6], [-1, 0]))


# -- follow_round ------------------------------------------------------------------------------------------------------

def test_follow_round_ends_where_an_accepted_nodes_state_completes():
    """Chain 0, 5, 7: S0 -> S1 -> S2 -> END (stopped). All three accepted and the target's token 1 after them: the run
    keeps 3 tokens and ends with "grammar" there, the run's grammar at END. Catches the completion not asked (the
    target's token would then break the grammar: 4 kept, grammar_blocked) and j - 1 / j + 2 kept."""
    grammar = grammar_at("S0")
    judged = judge_draft(grammar, chain([0, 5, 7]))
    keep, ends = follow_round(grammar, judged, [0, 1, 2], [0, 5, 7, 1])
    assert keep == 3
    assert ends is not None and ends[0] == "grammar"
    assert state_of(grammar) == "END"


def test_follow_round_takes_the_targets_token_after_the_path():
    """Chain 0, 5 accepted (S0 -> S1 -> S2), the target's own 6 after it (S2 -> S1): 3 kept, no end, the run's grammar
    at S1."""
    grammar = grammar_at("S0")
    judged = judge_draft(grammar, chain([0, 5]))
    keep, ends = follow_round(grammar, judged, [0, 1], [0, 5, 6])
    assert (keep, ends) == (3, None)
    assert state_of(grammar) == "S1"


def test_follow_round_without_room_for_the_targets_token_stops_at_the_last_accepted_node():
    """Chain 0, 5, 6 (S0 -> S1 -> S2 -> S1) all accepted and nothing more emitted: 3 kept, the run's grammar at the
    last node's state S1 (not node 1's S2: path[+1], path[-2]; not a restore of nothing)."""
    grammar = grammar_at("S0")
    judged = judge_draft(grammar, chain([0, 5, 6]))
    keep, ends = follow_round(grammar, judged, [0, 1, 2], [0, 5, 6])
    assert (keep, ends) == (3, None)
    assert state_of(grammar) == "S1"
    assert grammar.matcher is not judged.states[2].matcher  # a copy of the node's state


# -- count_spans and constrained_figures -------------------------------------------------------------------------------

def test_count_spans_counts_drafted_accepted_and_rejected_per_span():
    """The judged draft above with judged nodes 0, 1, 3 accepted. By span (drafted, accepted, grammar-rejected):
    forced: node 1 -> (1, 1, 0); inside: nodes 3, 4 -> (2, 1 (node 3), 1 (node 4)); outside: nodes 0, 2, 5, 6 ->
    (4, 1 (node 0), 1 (node 2)). A second round adds the same again."""
    _, judged = judged_draft()
    first = {FORCED: [1, 1, 0], INSIDE: [2, 1, 1], OUTSIDE: [4, 1, 1]}
    out = count_spans(None, judged, [0, 1, 3])
    assert out == first
    again = count_spans(out, judged, [0, 1, 3])
    assert again == {span: [2 * c for c in counts] for span, counts in first.items()}


def test_constrained_figures_by_hand():
    """Forced: nothing drafted (acceptance 0.0); inside 3 of 4 accepted, 1 rejected; outside 1 of 4, 2 rejected; free
    (inside + outside): 4 of 8, 3 rejected. Catches every renamed key, a value lost, free as inside - outside, the
    rate as a product or always 0, and 1.0 for a span with nothing drafted."""
    spans = {FORCED: [0, 0, 0], INSIDE: [4, 3, 1], OUTSIDE: [4, 1, 2]}
    expected = {"grammar_rejected": 3.0}
    for name, (drafted, accepted, rejected, rate) in {FORCED: (0, 0, 0, 0.0), INSIDE: (4, 3, 1, 0.75),
                                                      OUTSIDE: (4, 1, 2, 0.25), "free": (8, 4, 3, 0.5)}.items():
        expected |= {f"drafted_{name}": drafted, f"accepted_{name}": accepted,
                     f"grammar_rejected_{name}": rejected, f"acceptance_{name}": rate}
    out = constrained_figures(spans)
    assert out == expected
    assert all(isinstance(v, float) for v in out.values())
