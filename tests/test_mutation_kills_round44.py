"""Tests written to kill the survivors of round 44's mutation run over DoLa (playground/engine/contrastive/dola.py)
and SuffixDecoding's drafter (playground/engine/speculative/suffix.py), issue 28, point 4. Each test names the bug
it catches; the references are written out here (4.46's float32 filter, the weighted trie by hand)."""

from __future__ import annotations

import json
import math
import random

import torch

from playground.engine.contrastive.dola import DolaAmateur
from playground.engine.layers.lens import LayerStack
from playground.engine.speculative.suffix import MAX_PATTERN, SuffixDrafter
from playground.state.json_path import JsonPathScanner, format_path

# --- dola.py: which contrast each variant runs ----------------------------------------------------------------


def test_a_token_at_the_cut_is_kept_by_the_reference_as_4_46_keeps_it_and_dropped_by_the_formula(tiny_lm):
    """The two variants' plausible sets differ only where a token lies on the cut: 4.46's relative-top filter
    compares float32 log-probabilities with max + log α, the formula compares p / max p with α in float64. A logit
    of exactly top + log α (as float32 writes it) is kept by the first and not by the second; a variant running the
    other's contrast (``variant != "reference"``) is seen here."""
    alpha = 0.5
    logits = torch.tensor([0.0, math.log(alpha), -1.0, -2.0])  # token 1: the cut itself
    premature = torch.tensor([0.3, -0.2, 0.1, 0.0])
    lf = logits.log_softmax(-1)  # float32, as 4.46 computes it
    by_4_46 = ~(lf < lf.max() + math.log(alpha))
    ratio = (lf.double() - lf.double().max()).exp()
    by_formula = ratio >= alpha
    assert by_4_46.tolist() == [True, True, False, False] and by_formula.tolist() == [True, False, False, False]
    stack = LayerStack.of(tiny_lm.model)
    for variant, expected in (("reference", by_4_46), ("formula", by_formula)):
        contrast = DolaAmateur(stack, (0, 1), variant).contrast(logits, premature, alpha, 1.0)
        assert contrast.plausible.tolist() == expected.tolist(), variant
        scores = torch.where(expected, lf - premature.log_softmax(-1), torch.tensor(-math.inf))
        torch.testing.assert_close(contrast.scores, scores, atol=1e-6, rtol=0)


# --- suffix.py: SuffixDecoding's drafter against a tree built by hand ----------------------------------------------


def matches_by_hand(earlier: list[list[int]], ids: list[int], max_pattern: int) -> list[tuple[int, int, int]]:
    """Every (sequence, end, length): a place where the text's last ``length`` tokens end at ``end`` with a token
    after them, in the earlier runs (sequences 0, 1, ...) and the text itself (the last sequence), ``length`` as
    long as the texts agree (at most ``max_pattern`` and the text's length); the longest and those at least half as
    long, in the order the drafter walks them: the text's own, latest first, then the newest run's, latest first."""
    current = len(earlier)
    found = []
    for s, sequence in enumerate([*earlier, ids]):
        for end in range(1, len(sequence)):
            n = 0
            while n < min(max_pattern, len(ids), end) and sequence[end - 1 - n] == ids[-1 - n]:
                n += 1
            if n:
                found.append((s, end, n))
    if not found:
        return []
    floor = max(1, (max(n for _s, _e, n in found) + 1) // 2)
    kept = [f for f in found if f[2] >= floor]
    own = sorted((f for f in kept if f[0] == current), key=lambda f: -f[1])
    runs = [f for s in reversed(range(current)) for f in sorted((f for f in kept if f[0] == s), key=lambda f: -f[1])]
    return own + runs


def likeliest_by_hand(earlier: list[list[int]], ids: list[int], depth: int, width: int, budget: int,
                      max_pattern: int) -> tuple[list[int], list[int]]:
    """(tokens, parents) of the drafter's tree: the trie of the matches' next ``depth`` tokens, each path weighted
    by the lengths of the matches through it; nodes taken best first (weight, then the order they became
    reachable: the root's children as first seen, a node's children when it is taken), at most ``width`` per
    parent and ``budget`` in all."""
    found = matches_by_hand(earlier, ids, max_pattern) if depth > 0 else []
    sequences = [*earlier, ids]
    weight: dict[tuple, int] = {}
    children: dict[tuple, list[tuple]] = {(): []}
    for s, end, n in found:
        path: tuple = ()
        for token in sequences[s][end : end + depth]:
            step = (*path, token)
            if step not in weight:
                weight[step] = 0
                children.setdefault(path, []).append(step)
                children[step] = []
            weight[step] += n
            path = step
    tokens: list[int] = []
    parents: list[int] = []
    frontier = [(path, -1) for path in children[()]]  # reachable, in the order they became so
    taken: dict[int, int] = {}
    while len(tokens) < budget:
        open_ = [(path, parent) for path, parent in frontier if taken.get(parent, 0) < width]
        if not open_:
            break
        best = max(open_, key=lambda item: weight[item[0]])  # max keeps the first of equals
        frontier.remove(best)
        path, parent = best
        taken[parent] = taken.get(parent, 0) + 1
        tokens.append(path[-1])
        parents.append(parent)
        frontier += [(child, len(tokens) - 1) for child in children[path]]
    return tokens, parents


def random_case(rng: random.Random) -> tuple[list[list[int]], list[int]]:
    """A few earlier runs and a text over a small alphabet (so matches of every length recur)."""
    letters = rng.randint(2, 4)
    earlier = [[rng.randrange(letters) for _ in range(rng.randint(2, 14))] for _ in range(rng.randint(0, 3))]
    return earlier, [rng.randrange(letters) for _ in range(rng.randint(1, 12))]


def test_the_suffix_tree_is_the_weighted_trie_taken_best_first_on_random_texts():
    """400 random corpora and texts, every depth, width, budget and pattern limit: the drafter's tree equals the
    one built by hand, node for node (the index's ends, the match lengths and their limits, the half-length floor,
    the walk's order, the weights summed, the best-first order with its ties, the width and the budget)."""
    rng = random.Random(44)
    nonempty = 0
    for _ in range(400):
        earlier, ids = random_case(rng)
        depth, width, budget, pattern = rng.randint(1, 4), rng.randint(1, 3), rng.randint(1, 9), rng.randint(2, 6)
        drafter = SuffixDrafter([list(r) for r in earlier], max_pattern=pattern)
        assert drafter.matches(ids) == matches_by_hand(earlier, ids, pattern), (earlier, ids, pattern)
        tree = drafter.propose_tree(ids, depth, width, budget)
        expected = likeliest_by_hand(earlier, ids, depth, width, budget, pattern)
        assert (tree.tokens, tree.parents) == expected, (earlier, ids, depth, width, budget, pattern)
        nonempty += len(tree) > 1
    assert nonempty > 250, "precondition: most trees have more than one node"


def test_the_text_indexed_as_it_grows_and_anew_when_it_changes():
    """One drafter through a run (the text grows by a few tokens a round) and then given other texts (shorter, or
    a changed earlier token): each answer is a fresh drafter's, so the incremental index neither loses the text's
    first positions nor keeps the old text's."""
    rng = random.Random(7)
    for _ in range(60):
        earlier, ids = random_case(rng)
        drafter = SuffixDrafter([list(r) for r in earlier], max_pattern=5)
        text = ids[:1]
        while len(text) < len(ids):
            assert drafter.matches(text) == matches_by_hand(earlier, text, 5)
            text = ids[: len(text) + rng.randint(1, 3)]
        for other in (ids[: max(1, len(ids) // 2)], [(t + 1) % 3 for t in ids[:3]] + ids[3:], ids[::-1]):
            assert drafter.matches(other) == matches_by_hand(earlier, other, 5), (earlier, ids, other)


def test_a_match_may_be_the_whole_text():
    """The text [1, 2] recurs whole in the earlier run: its match is 2 long (the text's length bounds it)."""
    drafter = SuffixDrafter([[5, 1, 2, 3]])
    assert drafter.matches([1, 2]) == [(0, 3, 2)]
    assert drafter.propose([1, 2], 3).tokens == [3]


def test_the_drafters_detail_names_the_runs_it_reads():
    assert SuffixDrafter([[1, 2], [3, 4]]).detail == ("suffix match over the prompt, the output and 2 earlier runs "
                                                      "on this model")
    assert SuffixDrafter([[1, 2]]).detail.endswith("and 1 earlier run on this model")


def test_a_tree_resumes_the_rejected_branch_within_depth_and_budget():
    """Round 1 drafts, from [9]: 9 → 1 → 2 → 3 → 4 (run A) and 9 → 5 → 6 → 7 (run B); the target accepts 1 alone,
    so the resumed branch is what stood below it: 2, 3, 4. Round 2's text ends on a token seen nowhere (no match):
    a tree (width 2) is that branch cut at the depth; a chain (width 1) resumes nothing. With matches, the drafter's
    own nodes get the budget less the resumed ones, and the branch is grafted after them."""
    a, b = [9, 1, 2, 3, 4, 0], [9, 5, 6, 7, 0]
    drafter = SuffixDrafter([a, b])
    first = drafter.propose_tree([8, 9], depth=4, width=2, budget=16)
    assert first.path_tokens(len(first) - 1) in ([1, 2, 3, 4], [5, 6, 7, 0])  # precondition: both runs drafted
    drafter.after_round(kept=3, target_choices=[1, 7], accepted=1, path_tokens=[1])
    assert drafter.propose_tree([8, 9, 1, 42], depth=2, width=2, budget=16).tokens == [2, 3]  # cut at depth 2
    # width 1: nothing resumed, whatever the last verdict
    drafter = SuffixDrafter([a, b])
    drafter.propose_tree([8, 9], depth=4, width=2, budget=16)
    drafter.after_round(kept=3, target_choices=[1], accepted=1, path_tokens=[1])
    assert drafter.resumed.branch(4) == [2, 3, 4]  # precondition: a branch to resume
    assert drafter.propose_tree([8, 9, 1, 42], depth=4, width=1, budget=16).tokens == []
    # With matches: the drafter's tree within budget - 2, then the branch [2, 3] where it is not there yet.
    drafter = SuffixDrafter([a, b])
    drafter.propose_tree([8, 9], depth=4, width=2, budget=16)
    drafter.after_round(kept=3, target_choices=[1], accepted=1, path_tokens=[1])
    ids = [8, 9, 5]
    tokens, parents = likeliest_by_hand([a, b], ids, 2, 2, 3 - 2, MAX_PATTERN)
    assert (tokens, parents) == ([6], [-1])
    tree = drafter.propose_tree(ids, depth=2, width=2, budget=3)
    assert (tree.tokens, tree.parents) == ([6, 2, 3], [-1, -1, 1])


def test_after_a_round_the_target_choices_stand_in_for_a_missing_path():
    """A verdict without the accepted path (``path_tokens`` None) walks the target's choices; one with it walks
    the path (here the second child, 5, which the target's choices do not name): the resumed branches differ."""
    a, b = [9, 1, 2, 3, 0], [9, 5, 6, 7, 0]
    for path, resumed in ((None, [2, 3]), ([5], [6, 7])):
        drafter = SuffixDrafter([a, b])
        drafter.propose_tree([8, 9], depth=4, width=2, budget=16)
        drafter.after_round(kept=3, target_choices=[1, 4], accepted=1, path_tokens=path)
        assert drafter.propose_tree([8, 9, 1, 42], depth=2, width=2, budget=16).tokens == resumed, path


# --- json_path.py: the scanner says "not JSON" where json.loads does ---------------------------------------------


def random_value(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(7 if depth < 3 else 4)
    if kind == 0:
        return rng.choice([0, -1, 12, 3.5, -0.25, 1e21, 2.5e-8])
    if kind == 1:
        return rng.choice([True, False, None])
    if kind in (2, 3):
        return "".join(rng.choice('ab "\\/\n\té\u2028😀') for _ in range(rng.randint(0, 4)))
    if kind in (4, 5):
        return [random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["a", "b c", 'q"', ""]): random_value(rng, depth + 1) for _ in range(rng.randint(0, 3))}


def loads(text: str) -> bool:
    """Whether ``text`` is one JSON document (NaN and Infinity, which Python's json reads, are not JSON)."""
    def refuse(name: str) -> None:
        raise ValueError(name)

    try:
        json.loads(text, parse_constant=refuse)
    except ValueError:
        return False
    return True


def test_a_whole_text_reads_as_json_exactly_when_json_loads_reads_it():
    """3,000 documents written by json.dumps, each also with one character changed, dropped or doubled, and each
    followed by a space (so a number at the end completes): the scanner's ``valid and complete`` equals json.loads's
    verdict. A scanner that takes ``{"a": 1,}``, ``tfalse``, ``1.2.3``, ``01``, a raw control character in a
    string or an escape JSON lacks fails it (each is met among the edits)."""
    rng = random.Random(44)
    refused = 0
    for _ in range(3000):
        text = json.dumps(random_value(rng), ensure_ascii=rng.random() < 0.5, indent=rng.choice([None, 1]))
        at = rng.randrange(len(text))
        edits = [text, text[:at] + rng.choice('{}[],:"\\x01tfe.-+ \x01\n') + text[at + 1:],
                 text[:at] + text[at + 1:], text[:at] + text[at] + text[at:]]
        for candidate in edits:
            scanner = JsonPathScanner()
            place = scanner.feed(candidate + " ")
            assert (place.valid and place.complete) == loads(candidate), repr(candidate)
            refused += not loads(candidate)
    assert refused > 1500, "precondition: many edits are not JSON"


def test_the_kinds_of_not_json_the_scanner_used_to_take():
    for text in ('{"a": 1,}', '[tfalse]', '[1.2.3]', '[01]', '["a\x01b"]', '{"a\x1f": 0}', '[tru]', '[-]'):
        assert not JsonPathScanner().feed(text + " ").valid, repr(text)
    for text in ('{"a": 1, "b": [true, null, -0.5e+3]}', '[]', '{}', '"\\u00e9"', '0'):
        place = JsonPathScanner().feed(text + " ")
        assert place.valid and place.complete, text
    # a character that begins no value, just after [: the path is still the array's own
    place = JsonPathScanner().feed('{"k": [X')
    assert not place.valid and format_path(place.segments) == "$.k"
    # a text cut inside a scalar is not judged yet
    assert JsonPathScanner().feed('[tru').valid and JsonPathScanner().feed('{"a": 1.').valid
