"""Tree speculation against references computed here: a tree pass's logits per node equal a cache-free forward pass
of the context + that node's path (every family, past a sliding window); the cache kept after a round equals a
fresh prefill of the confirmed tokens; greedy tree runs equal ``generate``; every round's verdict is a walk down the
tree by the target's argmax computed here; sampled verification (SpecInfer's rule) emits the target's distribution
(chi-square); the suffix drafter proposes what followed the text's suffix in the prompt and earlier runs.
"""

from __future__ import annotations

import itertools
import json
import math
from collections import Counter

import pytest
import torch
from support.tiny_models import FAMILIES, TINY_WINDOW, build_tiny_lm
from transformers import DynamicCache

from playground.config import ConfigError, RunSettings
from playground.engine.speculative import decode as decode_module
from playground.engine.speculative.drafters import lookup_branches
from playground.engine.speculative.rollback import keep_past
from playground.engine.speculative.suffix import SuffixDrafter
from playground.engine.speculative.tree import DraftTree, chain, graft, trie
from playground.engine.speculative.tree_pass import keep_path, tree_inputs
from playground.engine.speculative.verify import verify_tree_greedy, verify_tree_sampled
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, RunStarted, TokenStep, dumps_event, event_from_dict
from playground.events.speculative import SpeculativeRound, SpeculativeStarted
from playground.models.anatomy import anatomy_of
from playground.models.run_history import RunHistory

CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88}
REPEATING = "the cat sat on the mat and the cat sat on the hat and the cat ran to the mat and the cat"


def spec(lm, **flat) -> list:
    flat = {"strategy": "speculative", "baseline_tokens": 0, "chat": False, **flat}
    return list(run_strategy(lm, RunSettings.from_flat(**flat)))


def rounds_of(events: list) -> list[SpeculativeRound]:
    return [e for e in events if isinstance(e, SpeculativeRound)]


def generate(lm, ids: list[int], n: int, **kwargs) -> list[int]:
    tensor = torch.tensor([ids])
    with torch.no_grad():
        out = lm.model.generate(tensor, attention_mask=torch.ones_like(tensor), do_sample=False, max_new_tokens=n,
                                pad_token_id=lm.tokenizer.pad_token_id, **kwargs)
    return out[0, len(ids):].tolist()


def logits_after(model, ids: list[int]) -> torch.Tensor:
    """The last position's raw logits of one cache-free pass [vocab]."""
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].double()


def chi_square(counts: Counter, expected: dict[int, float], total: int) -> tuple[float, int]:
    assert min(total * p for p in expected.values()) >= 5
    assert set(counts) <= set(expected), f"drew tokens outside the support: {set(counts) - set(expected)}"
    chi2 = sum((counts.get(t, 0) - total * p) ** 2 / (total * p) for t, p in expected.items())
    return chi2, len(expected) - 1


# ------------------------------------------------------------------------------------------ 1. one pass, a tree


@pytest.fixture(scope="module", params=FAMILIES)
def family_lm(request):
    return build_tiny_lm(seed=3, layers=4, family=request.param)


def test_a_tree_pass_gives_every_node_its_own_paths_logits_and_keeps_the_accepted_path(family_lm):
    """Context 20 tokens (past the tiny sliding window, 12), a tree of 4 overlapping branches read with a 2-token
    tail; then the same tree read in two passes (what a drafter does depth by depth); then a path that is not a
    prefix of the node order kept, and one more token read on top of it."""
    model = family_lm.model
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(5, vocab, (20,), generator=generator).tolist()
    assert len(context) > TINY_WINDOW
    tree = trie([[7, 8, 9], [7, 10], [11, 12, 13, 14], [7, 8, 15]], budget=16)
    assert tree.parents == [-1, 0, 1, 0, -1, 4, 5, 6, 1]
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        keep_past(cache)
        model(input_ids=torch.tensor([context[:-2]]), cache=cache, use_cache=True)
        mask, positions = tree_inputs(model, cache, 2, tree, torch.device("cpu"))
        assert positions[0].tolist() == [18, 19, 20, 21, 22, 21, 20, 21, 22, 23, 22]
        out = model(input_ids=torch.tensor([context[-2:] + tree.tokens]), cache=cache, use_cache=True,
                    attention_mask=mask, position_ids=positions).logits[0].double()
        assert torch.allclose(out[1], logits_after(model, context), atol=1e-4)
        for node in range(len(tree)):
            reference = logits_after(model, context + tree.path_tokens(node))
            assert torch.allclose(out[2 + node], reference, atol=1e-4), f"node {node}"

        # The same tree in two passes: the first four nodes, then the rest on top of them.
        split = DynamicCache(config=model.config)
        keep_past(split)
        model(input_ids=torch.tensor([context]), cache=split, use_cache=True)
        head = DraftTree(tree.tokens[:4], tree.parents[:4])
        mask, positions = tree_inputs(model, split, 0, head, torch.device("cpu"))
        model(input_ids=torch.tensor([head.tokens]), cache=split, use_cache=True, attention_mask=mask,
              position_ids=positions)
        if anatomy_of(model).has_sliding_layers:  # the window would hold nodes, not the context a node sees
            with pytest.raises(ConfigError, match="sliding-window"):
                tree_inputs(model, split, 0, tree, torch.device("cpu"), read=4)
        else:
            mask, positions = tree_inputs(model, split, 0, tree, torch.device("cpu"), read=4)
            rest = model(input_ids=torch.tensor([tree.tokens[4:]]), cache=split, use_cache=True,
                         attention_mask=mask, position_ids=positions).logits[0].double()
            for j, node in enumerate(range(4, len(tree))):
                reference = logits_after(model, context + tree.path_tokens(node))
                assert torch.allclose(rest[j], reference, atol=1e-4), f"node {node} read in the second pass"

        path = tree.path_to(7)  # 11, 12, 13, 14: nodes 4..7, not the first nodes of the pass
        keep_path(cache, len(context), path)
        assert cache.get_seq_length() == len(context) + len(path)
        extra = 3 % vocab
        confirmed = context + tree.path_tokens(7)
        after = model(input_ids=torch.tensor([[extra]]), cache=cache, use_cache=True).logits[0, -1].double()
        assert torch.allclose(after, logits_after(model, [*confirmed, extra]), atol=1e-4)


def test_keep_path_moves_the_paths_entries_and_drops_the_rest():
    cache = DynamicCache()
    keys = torch.arange(10, dtype=torch.float32).view(1, 1, 10, 1)
    cache.update(keys, keys + 100, 0)
    keep_path(cache, 6, [2, 3])  # 6 context entries, then 4 nodes; keep nodes 2 and 3
    assert cache.layers[0].keys.flatten().tolist() == [0, 1, 2, 3, 4, 5, 8, 9]
    assert cache.layers[0].values.flatten().tolist() == [100, 101, 102, 103, 104, 105, 108, 109]


def test_tree_helpers():
    tree = trie([[1, 2, 3], [1, 4], [5]], budget=4)
    assert tree.tokens == [1, 2, 3, 4] and tree.parents == [-1, 0, 1, 0]  # the budget cut the branch [5]
    assert tree.depths() == [0, 1, 2, 1] and tree.ranks() == [0, 0, 0, 1]
    assert tree.children(-1) == [0] and tree.children(0) == [1, 3]
    assert tree.first_branch() == [1, 2, 3] and not tree.is_chain() and chain([4, 5]).is_chain()
    assert chain([4, 5]).parents == [-1, 0] and chain([]).parents == []
    assert tree.path_to(2) == [0, 1, 2] and tree.path_tokens(3) == [1, 4] and tree.path_to(-1) == []
    # graft: shared prefixes are reused, new nodes go under them, the budget cuts the rest
    grown = graft(trie([[1, 2]], budget=8), [1, 5, 6], budget=8)
    assert grown.tokens == [1, 2, 5, 6] and grown.parents == [-1, 0, 0, 2]
    assert graft(trie([[1, 2]], budget=3), [1, 5, 6], budget=3).tokens == [1, 2, 5]
    assert graft(trie([[1, 2]], budget=8), [1, 2], budget=8).tokens == [1, 2]
    assert graft(trie([[1, 2]], budget=8), [7], budget=8).parents == [-1, 0, -1]


def test_keep_path_refuses_a_layer_that_does_not_hold_the_tree():
    cache = DynamicCache()
    keys = torch.zeros((1, 1, 4, 1))
    cache.update(keys, keys, 0)  # layer 0: 4 entries, all of them the tree's
    keep_path(cache, 0, [1])  # the tree may fill a layer
    assert cache.get_seq_length() == 1
    short = DynamicCache()
    short.update(torch.zeros((1, 1, 6, 1)), torch.zeros((1, 1, 6, 1)), 0)
    short.update(torch.zeros((1, 1, 2, 1)), torch.zeros((1, 1, 2, 1)), 1)  # holds 2 of the 4 nodes
    with pytest.raises(ConfigError, match="does not hold the tree's nodes"):
        keep_path(short, 2, [0])


# ------------------------------------------------------------------------------------- 2. verification rules


def test_greedy_tree_verification_walks_down_by_the_targets_choice():
    tree = trie([[1, 2, 3], [1, 4], [5, 6]], budget=16)  # nodes: 1, 2, 3, 4, 5, 6
    # choices[0]: after the context; choices[1 + i]: after node i
    verdict = verify_tree_greedy(tree, [1, 4, 9, 9, 7, 9, 9])
    assert verdict.path == (0, 3) and verdict.accepted == 2 and verdict.token_id == 7
    verdict = verify_tree_greedy(tree, [5, 0, 0, 0, 0, 6, 8])
    assert verdict.path == (4, 5) and verdict.token_id == 8  # a leaf: the target's token is a bonus
    verdict = verify_tree_greedy(tree, [9, 0, 0, 0, 0, 0, 0])
    assert verdict.path == () and verdict.token_id == 9


P = torch.tensor([0.10, 0.30, 0.25, 0.20, 0.15], dtype=torch.float64)
P_AFTER_1 = torch.tensor([0.40, 0.05, 0.15, 0.10, 0.30], dtype=torch.float64)
Q = torch.tensor([0.05, 0.10, 0.40, 0.35, 0.10], dtype=torch.float64)


def test_sampled_tree_verification_with_fixed_children_emits_the_targets_distribution():
    """Two deterministic children at the root (tokens 1 and 3), node 1 with a child (0): the first token follows
    p, and the token after an accepted 1 follows p's row after 1 (chi-square, 6,000 draws)."""
    tree = trie([[1, 0], [3]], budget=8)  # nodes: 1, 0 (child of 1), 3
    rows = torch.stack([P, P_AFTER_1, P, P])  # after the context, after node 0 (token 1), nodes 1 and 2
    generator = torch.Generator().manual_seed(1)
    first, second = Counter(), Counter()
    trials = 6000
    for _ in range(trials):
        verdict = verify_tree_sampled(tree, rows, generator)
        tokens = [tree.tokens[n] for n in verdict.path] + [verdict.token_id]
        first[tokens[0]] += 1
        if tokens[0] == 1:
            second[tokens[1]] += 1
    chi2, df = chi_square(first, dict(enumerate(P.tolist())), trials)
    assert chi2 < CHI2_999[df], f"first token: chi-square {chi2:.1f}"
    chi2, df = chi_square(second, dict(enumerate(P_AFTER_1.tolist())), sum(second.values()))
    assert chi2 < CHI2_999[df], f"after the first child: chi-square {chi2:.1f}"


def test_sampled_tree_verification_with_children_drawn_from_q_emits_the_targets_distribution():
    """SpecInfer's case: three children drawn independently from q each trial (a token may come twice): the
    emitted token follows p, whatever q is (chi-square, 6,000 trials)."""
    generator = torch.Generator().manual_seed(2)
    counts = Counter()
    trials = 6000
    accepted_first = 0
    for _ in range(trials):
        tokens = torch.multinomial(Q, 3, replacement=True, generator=generator).tolist()
        tree = DraftTree(tokens, [-1, -1, -1], torch.stack([Q, Q, Q]).float())
        verdict = verify_tree_sampled(tree, torch.stack([P, P, P, P]), generator)
        emitted = tree.tokens[verdict.path[0]] if verdict.path else verdict.token_id
        counts[emitted] += 1
        accepted_first += bool(verdict.path)
    chi2, df = chi_square(counts, dict(enumerate(P.tolist())), trials)
    assert chi2 < CHI2_999[df], f"chi-square {chi2:.1f}"
    assert 0.3 * trials < accepted_first < trials, "the test should see both accepted and rejected children"


# ---------------------------------------------------------------------------------------- 3. greedy = plain


TREE_DRAFTERS = {
    "prompt-lookup": {"draft": "prompt-lookup"},
    "layers": {"draft": "layers", "draft_layers": 1},
    "quantized": {"draft": "quantized", "draft_quant": "rtn-int8"},
    "suffix": {"draft": "suffix"},
}


@pytest.mark.parametrize("penalties", [{}, {"repetition_penalty": 1.2}], ids=["plain", "rep1.2"])
@pytest.mark.parametrize("width", [2, 3])
@pytest.mark.parametrize("drafter", sorted(TREE_DRAFTERS))
def test_greedy_tree_speculation_equals_generate(tiny_lm, drafter, width, penalties):
    events = spec(tiny_lm, prompt=REPEATING, max_new_tokens=30, draft_k=4, tree_width=width, tree_nodes=12,
                  **TREE_DRAFTERS[drafter], **penalties)
    start = events[0]
    assert isinstance(start, RunStarted)
    assert list(events[-1].token_ids) == generate(tiny_lm, list(start.prompt_token_ids), 30, **penalties)
    rounds = rounds_of(events)
    assert all(len(r.drafted) <= 12 for r in rounds)
    assert all(max(r.depths(), default=0) < 4 for r in rounds)
    if drafter in ("layers", "quantized"):
        assert any(r.is_tree and len(set(r.parents)) < len(r.parents) for r in rounds), "no round branched"


def test_every_tree_round_matches_a_recomputation(tiny_lm):
    """The layers drafter, 3 wide: every node's p is the target's cache-free probability after its parent's path;
    the accepted path is the walk by the target's argmax computed here; the root's children are the drafter's
    three likeliest tokens, with their q; each emitted token's step event holds the target's numbers there."""
    events = spec(tiny_lm, prompt="Hello there, Hello", max_new_tokens=24, draft="layers", draft_layers=1,
                  draft_k=3, tree_width=3, tree_nodes=12)
    start, finished = events[0], events[-1]
    full = list(start.prompt_token_ids) + list(finished.token_ids)
    steps = [e for e in events if isinstance(e, TokenStep)]
    model = tiny_lm.model
    walked_deeper = 0
    for r in rounds_of(events):
        assert r.is_tree
        context = full[: len(start.prompt_token_ids) + r.first_step]
        depths = r.depths()
        paths = []  # each drafted token's path of tokens from the context
        for i, parent in enumerate(r.parents):
            paths.append((paths[parent] if parent >= 0 else []) + [r.drafted[i].token_id])
        for i, d in enumerate(r.drafted):
            p = logits_after(model, context + paths[i][:-1]).softmax(dim=-1)
            assert d.target_prob == pytest.approx(float(p[d.token_id]), abs=1e-4)
            assert d.draw is None
        # The walk: from the context, follow the child that is the target's argmax.
        node, path = -1, []
        while True:
            choice = int(logits_after(model, context + (paths[node] if node >= 0 else [])).argmax())
            match = [i for i, parent in enumerate(r.parents) if parent == node and r.drafted[i].token_id == choice]
            if not match:
                break
            node = match[0]
            path.append(node)
        assert r.accepted == len(path) and path == list(range(len(path)))  # the path is listed first
        assert [d.accepted for d in r.drafted] == [i < len(path) for i in range(len(r.drafted))]
        assert r.target_token_id == choice
        walked_deeper += len(path) > 1
        # The root's children: the drafter's (first layer + norm + head) three likeliest tokens, ranked.
        with torch.no_grad():
            hidden = model(torch.tensor([context]), output_hidden_states=True, use_cache=False).hidden_states[1]
            q = model.lm_head(model.model.norm(hidden))[0, -1].double().softmax(dim=-1)
        root = sorted((i for i, parent in enumerate(r.parents) if parent < 0), key=lambda i: r.drafted[i].rank)
        assert [r.drafted[i].token_id for i in root] == torch.topk(q, 3).indices.tolist()
        for i in root:
            assert r.drafted[i].draft_prob == pytest.approx(float(q[r.drafted[i].token_id]), abs=1e-4)
        assert max(depths) <= 2
        # The round's token events: the path, then the target's own token, with the target's raw numbers.
        own = steps[r.first_step : r.first_step + r.emitted]
        assert [s.token_id for s in own] == [r.drafted[i].token_id for i in path] + [choice][: r.emitted - len(path)]
        for j, s in enumerate(own):
            raw = logits_after(model, full[: len(start.prompt_token_ids) + r.first_step + j]).softmax(dim=-1)
            assert s.raw_prob == pytest.approx(float(raw[s.token_id]), abs=1e-5)
    assert walked_deeper > 0, "precondition: some round accepted more than one drafted token"


def test_the_cache_after_every_tree_round_equals_a_fresh_prefill(tiny_lm, monkeypatch):
    kept: list[tuple[int, torch.Tensor, torch.Tensor]] = []
    real = decode_module.keep_path

    def spy(cache, tree_start, path):
        real(cache, tree_start, path)
        kept.append((cache.get_seq_length(), cache.layers[0].keys.clone(), cache.layers[-1].values.clone()))

    monkeypatch.setattr(decode_module, "keep_path", spy)
    events = spec(tiny_lm, prompt=REPEATING, max_new_tokens=24, draft="layers", draft_layers=1, draft_k=4,
                  tree_width=2)
    full = list(events[0].prompt_token_ids) + list(events[-1].token_ids)
    assert len(kept) > 3
    with torch.no_grad():
        for length, keys, values in kept:
            fresh = DynamicCache(config=tiny_lm.model.config)
            tiny_lm.model(input_ids=torch.tensor([full[:length]]), cache=fresh, use_cache=True)
            assert torch.allclose(keys, fresh.layers[0].keys, atol=1e-5)
            assert torch.allclose(values, fresh.layers[-1].values, atol=1e-5)


# -------------------------------------------------------------------------------------- 4. sampled tree runs


def top_k_probs(logits: torch.Tensor, k: int) -> dict[int, float]:
    top = torch.topk(logits, k + 1)
    assert top.values[k - 1] > top.values[k]
    return dict(zip(top.indices[:k].tolist(), torch.softmax(top.values[:k], dim=-1).tolist(), strict=True))


def test_a_sampled_tree_run_emits_the_targets_distribution(tiny_lm):
    """The layers drafter draws 3 children per node from its q (SpecInfer); over 1,000 seeds the first emitted
    token follows the target's top-8 distribution computed here, and rounds both accept and reject."""
    prompt = "The capital of France is"
    ids = tiny_lm.tokenizer(prompt)["input_ids"]
    p = top_k_probs(logits_after(tiny_lm.model, ids), 8)
    settings = RunSettings.from_flat(strategy="speculative", baseline_tokens=0, chat=False, prompt=prompt,
                                     do_sample=True, top_k=8, temperature=1.0, max_new_tokens=2, draft="layers",
                                     draft_layers=1, draft_k=2, tree_width=3)
    counts, accepted = Counter(), 0
    seeds = 1000
    for seed in range(seeds):
        first_round = first = None
        events = run_strategy(tiny_lm, settings.replace(seed=seed))
        for event in events:
            if isinstance(event, SpeculativeRound) and first_round is None:
                first_round = event
            if isinstance(event, TokenStep):
                first = event.token_id
                break
        events.close()
        counts[first] += 1
        accepted += first_round.accepted > 0
        assert first_round.is_tree and any(d.draw is not None for d in first_round.drafted)
    chi2, df = chi_square(counts, p, seeds)
    assert chi2 < CHI2_999[df], f"first token: chi-square {chi2:.1f} over {df} degrees of freedom"
    assert 100 < accepted < seeds - 50


# ------------------------------------------------------------------------------------------- 5. the drafters


def test_prompt_lookup_branches_are_the_matches_continuations_latest_first():
    ids = [1, 2, 3, 9, 1, 2, 4, 8, 1, 2, 5, 1, 2]
    # The last 2-gram (1, 2) recurs three times; the chain's choice (latest with 2 tokens after it) comes first.
    assert lookup_branches(ids, 2, 3, 3) == [[5, 1], [4, 8], [3, 9]]
    assert lookup_branches(ids, 2, 3, 1) == [[5, 1]]
    assert lookup_branches([1, 2, 3], 2, 3, 3) == []


def test_the_suffix_drafter_matches_the_longest_suffix_and_weights_by_match_length():
    history = RunHistory()  # a run's history (a loaded model holds its own)
    history.remember([7, 1, 2, 3, 4, 5])
    drafter = SuffixDrafter(history.earlier_runs())
    ids = [9, 1, 2, 3, 6, 8, 2, 3]
    found = drafter.matches(ids)
    # (2, 3) occurs in the earlier run (then 4) and in the text (then 6); (1, 2, 3) is no suffix of the text.
    assert sorted(found) == [(0, 4, 2), (1, 4, 2)]
    tree = drafter.propose_tree(ids, depth=2, width=2, budget=8)
    paths = {tuple(tree.path_tokens(n)) for n in range(len(tree))}
    assert paths == {(6,), (6, 8), (4,), (4, 5)}
    assert tree.tokens[tree.children(-1)[0]] == 6  # equal weights: the current text's match ranks first
    assert drafter.propose_tree(ids, depth=2, width=1, budget=8).tokens == [6, 8]


def suffix_scores_by_hand(corpus: list[list[int]], ids: list[int], max_pattern: int) -> dict[int, float]:
    """Each next token's weight: over every place in ``corpus`` (earlier runs, then the text itself) where the text's
    ending recurs with a token after it, the match's length (at most ``max_pattern`` and the text's length), for
    the matches at least half as long as the longest."""
    found = []
    for sequence in corpus:
        for end in range(1, len(sequence)):
            n = 0
            while n < min(max_pattern, len(ids), end) and sequence[end - 1 - n] == ids[-1 - n]:
                n += 1
            if n:
                found.append((sequence[end], n))
    floor = max(1, (max(n for _t, n in found) + 1) // 2)
    scores: dict[int, float] = Counter()
    for token, n in found:
        if n >= floor:
            scores[token] += n
    return scores


def test_the_suffix_drafter_weights_continuations_by_match_length_not_by_count():
    """Two long matches (length 6, then token 10) against three short ones (length 3, then 11), all kept (3 is half
    of 6): weighted, 10 wins 12 to 9; counted, 11 would win 3 to 2."""
    history = RunHistory()
    history.remember([9, 1, 2, 3, 4, 5, 6, 10, 12])
    history.remember([8, 1, 2, 3, 4, 5, 6, 10, 13])
    history.remember([7, 4, 5, 6, 11, 14, 0, 4, 5, 6, 11, 15, 7, 4, 5, 6, 11, 16])
    ids = [50, 1, 2, 3, 4, 5, 6]
    drafter = SuffixDrafter(history.earlier_runs())
    scores = suffix_scores_by_hand([*history.earlier_runs(), ids], ids, drafter.max_pattern)
    counts = Counter(t for run in history.earlier_runs() for i, t in enumerate(run) if i >= 3 and run[i - 3:i] ==
                     [4, 5, 6])
    assert counts.most_common(1)[0][0] == 11 and counts[10] < counts[11], "precondition: counting picks 11"
    expected = max(scores, key=lambda t: scores[t])
    assert expected == 10 and scores[10] > scores[11]
    assert sorted(length for _s, _e, length in drafter.matches(ids)) == [3, 3, 3, 6, 6]
    assert drafter.propose_tree(ids, depth=1, width=1, budget=1).tokens == [expected]
    assert drafter.propose(ids, 2).tokens == [expected, 13]  # then a tie (6 each): the newest run first
    # Both continuations in a 2-wide tree, the heavier first.
    tree = drafter.propose_tree(ids, depth=1, width=2, budget=2)
    assert [tree.tokens[n] for n in tree.children(-1)] == [10, 11]


def test_a_second_suffix_run_drafts_what_the_first_one_wrote(tiny_lm):
    tiny_lm.history.forget()
    first = spec(tiny_lm, prompt="Once upon a time", max_new_tokens=20, draft="suffix", tree_width=2)
    second = spec(tiny_lm, prompt="Once upon a time", max_new_tokens=20, draft="suffix", tree_width=2)
    assert list(first[-1].token_ids) == list(second[-1].token_ids)
    assert "1 earlier run" in next(e for e in second if isinstance(e, SpeculativeStarted)).detail
    # Every drafted path of the second run's first round is what followed the prompt in the first run.
    written = list(first[0].prompt_token_ids) + list(first[-1].token_ids)
    n = len(first[0].prompt_token_ids)
    r = rounds_of(second)[0]
    assert r.accepted == 4  # draft tokens (4): the whole depth
    assert [d.token_id for d in r.drafted[: r.accepted]] == written[n : n + 4]
    # Every round of the second run accepts its whole depth (4 + the target's token = 20 tokens in 4 rounds).
    assert [r.accepted for r in rounds_of(second)] == [4, 4, 4, 4]
    assert sum(r.accepted for r in rounds_of(first)) < 16


# ----------------------------------------------------------------------------------------- 6. events, settings


def test_tree_rounds_round_trip_through_a_saved_run(tiny_lm):
    events = spec(tiny_lm, prompt=REPEATING, max_new_tokens=12, draft="layers", draft_layers=1, tree_width=2)
    start = next(e for e in events if isinstance(e, SpeculativeStarted))
    assert start.tree_width == 2 and start.tree_nodes == 16
    for event in rounds_of(events):
        back = event_from_dict(json.loads(dumps_event(event)))
        assert back == event and back.parents == event.parents and back.is_tree
    assert isinstance(events[-1], RunFinished)


def test_the_jacobi_drafter_refuses_a_tree():
    with pytest.raises(ConfigError, match="jacobi drafter refines one guess"):
        RunSettings.from_flat(strategy="speculative", draft="jacobi", tree_width=2).validate()


def test_a_lookup_tree_resumes_the_last_rounds_rejected_draft_after_the_targets_token(tiny_lm):
    """After a round that rejected a drafted token, the next round's tree holds, from the context down, the
    rejected child of the last accepted node (rank 0) and its rank-0 descendants: read from the events here."""
    events = spec(tiny_lm, prompt=REPEATING, max_new_tokens=60, draft="prompt-lookup", draft_k=4, tree_width=2,
                  tree_nodes=12)
    rounds = rounds_of(events)
    checked = 0
    for before, after in itertools.pairwise(rounds):
        if before.target_kind != "correction":
            continue
        parents = before.parents or tuple(range(-1, len(before.drafted) - 1))  # a tree round that drew a chain
        last = before.accepted - 1  # the path is listed first; -1: nothing accepted
        rest, node = [], last
        while True:
            kids = [i for i, p in enumerate(parents) if p == node and before.drafted[i].rank == 0]
            if not kids:
                break
            node = kids[0]
            rest.append(before.drafted[node].token_id)
        depth = max(after.depths()) + 1 if after.drafted else 0
        branch, node = [], -1
        for token in rest[:depth]:
            kids = [i for i, p in enumerate(after.parents or range(-1, len(after.drafted) - 1))
                    if p == node and after.drafted[i].token_id == token]
            assert kids, f"round {after.round}: the resumed draft {rest[:depth]} is not in the tree"
            node = kids[0]
            branch.append(token)
        checked += bool(rest)
    assert checked >= 3, "precondition: rounds with a rejection followed by a tree"


def test_after_an_inserted_token_the_lookup_tree_resumes_the_copy():
    """The text copies [10, 11, 12, 13, 14, 15]; the target accepts 10, 11 and then inserts 99 (a token the text
    never had, so no lookup matches after it): the next tree is the rejected rest, 12 13 14 ..., resumed."""
    from playground.engine.speculative.drafters import PromptLookupDrafter

    source = [10, 11, 12, 13, 14, 15, 16, 17]
    ids = [5, *source, 6, 7, 8, 10]
    drafter = PromptLookupDrafter(2)
    tree = drafter.propose_tree(ids, 4, 2, 12)
    assert tree.first_branch() == [11, 12, 13, 14]
    drafter.after_round(len(ids) + 1, [11, 99], 1)  # accepted 11; the target's own token: 99
    after = [*ids, 11, 99]
    assert drafter.propose_tree(after, 4, 2, 12).first_branch() == [12, 13, 14]
    plain = PromptLookupDrafter(2)
    assert len(plain.propose_tree(after, 4, 2, 12)) == 0, "precondition: no lookup matches after 99"


def test_the_lens_of_a_tree_run_reads_each_emitted_tokens_own_position(tiny_lm):
    """--lens on a tree run: every emitted token's layer entropies are those of the lens (final norm + head on
    ``output_hidden_states``) after its own context, computed cache-free here; a row of another node would differ."""
    events = spec(tiny_lm, prompt=REPEATING, max_new_tokens=16, draft="layers", draft_layers=1, draft_k=3,
                  tree_width=2, lens=True, lens_precision="model")
    start, finished = events[0], events[-1]
    full = list(start.prompt_token_ids) + list(finished.token_ids)
    n = len(start.prompt_token_ids)
    lens_steps = {e.step: e for e in events if type(e).__name__ == "LayerStep"}
    assert len(lens_steps) == len(finished.token_ids)
    model = tiny_lm.model
    for step, lens_step in lens_steps.items():
        with torch.no_grad():
            hidden = model(torch.tensor([full[: n + step]]), output_hidden_states=True,
                           use_cache=False).hidden_states
            heads = [model.lm_head(h if i == len(hidden) - 2 else model.model.norm(h))
                     for i, h in enumerate(x[0, -1] for x in hidden[1:])]
        for layer, entropy in enumerate(lens_step.layer_entropy):
            logits = heads[layer].double()
            logp = logits.log_softmax(dim=-1)
            bits = float(-(logp.exp() * logp).sum() / math.log(2))
            assert entropy == pytest.approx(bits, abs=2e-3), (step, layer)


@pytest.mark.parametrize("drafter", ["prompt-lookup", "layers"])
def test_a_tree_run_stops_at_eos_and_at_a_stop_string_as_plain_greedy(tiny_lm_eos, drafter):
    """An EOS accepted inside a tree's path ends the run there; so does a stop string completed inside a round."""
    reasons = set()
    for prompt in ("Hello", "Hello there, hello there, hello", "One two one two one"):
        events = spec(tiny_lm_eos, prompt=prompt, max_new_tokens=40, draft_k=4, tree_width=2,
                      **TREE_DRAFTERS[drafter])
        ids = list(events[0].prompt_token_ids)
        expected = generate(tiny_lm_eos, ids, 40, eos_token_id=tiny_lm_eos.tokenizer.eos_token_id)
        assert list(events[-1].token_ids) == expected
        steps = [e for e in events if isinstance(e, TokenStep)]
        assert [s.token_id for s in steps] == expected
        assert sum(r.emitted for r in rounds_of(events)) == len(expected)
        reasons.add(events[-1].stop_reason)
    assert "eos" in reasons, "precondition: a run ends at EOS"
    # A stop string that completes mid-run, on the model that does not end early.
    tiny = build_tiny_lm(seed=0)
    prompt_ids = list(spec(tiny, prompt=REPEATING, max_new_tokens=1)[0].prompt_token_ids)
    ids = generate(tiny, prompt_ids, 30)
    stop = tiny.tokenizer.decode(ids[:13], skip_special_tokens=False)[-5:]
    cut = next(i for i in range(len(ids)) if stop in tiny.tokenizer.decode(ids[: i + 1], skip_special_tokens=False))
    assert 0 < cut < len(ids) - 1 and len(stop) >= 3
    events = spec(tiny, prompt=REPEATING, max_new_tokens=30, draft_k=4, tree_width=2, stop_strings=(stop,),
                  **TREE_DRAFTERS[drafter])
    assert events[-1].stop_reason == "stop_string" and list(events[-1].token_ids) == ids[: cut + 1]


def test_a_later_siblings_draw_is_judged_against_the_reduced_distribution():
    """Children 1 then 3 (fixed): the first is accepted with p(1); after its rejection the second with p′(3), p′ = p
    without token 1, renormalised: the thresholds each draw was compared with, computed here."""
    tree = trie([[1], [3]], budget=4)
    rows = torch.stack([P, P, P])
    generator = torch.Generator().manual_seed(3)
    seen_second = False
    for _ in range(200):
        verdict = verify_tree_sampled(tree, rows, generator)
        assert verdict.thresholds[0] == pytest.approx(float(P[1]))
        if len(verdict.thresholds) > 1:
            seen_second = True
            assert verdict.thresholds[1] == pytest.approx(float(P[3] / (1 - P[1])))
    assert seen_second


def test_sampled_tree_verification_draws_only_from_its_generator_and_reports_every_draw():
    """The same generator seed gives the same verdict whatever the global RNG did; every draw is reported with the
    node it judged and its threshold; the accepted count is the path's length."""
    tree = trie([[1, 0], [3], [4]], budget=8)
    rows = torch.stack([P, P_AFTER_1, P, P, P])
    verdicts = []
    for global_seed in (0, 1):
        torch.manual_seed(global_seed)
        verdicts.append([verify_tree_sampled(tree, rows, torch.Generator().manual_seed(s)) for s in range(40)])
    assert verdicts[0] == verdicts[1]
    for v in verdicts[0]:
        assert v.accepted == len(v.path) and len(v.draws) == len(v.draw_nodes) == len(v.thresholds) >= 1
        assert all(0.0 <= d < 1.0 for d in v.draws) and all(0.0 <= t <= 1.0 for t in v.thresholds)
        assert set(v.path) <= set(v.draw_nodes)


def test_sampled_tree_verification_rejects_what_the_target_cannot_emit_and_caps_thresholds():
    """A child the target's vocabulary lacks (id past its width) is never accepted; a child q gave no mass is
    rejected (threshold 0); where p > q the threshold is 1."""
    width = len(P)
    beyond = DraftTree([width + 1], [-1])  # deterministic: one-hot q on a token the target lacks
    generator = torch.Generator().manual_seed(4)
    for _ in range(50):
        v = verify_tree_sampled(beyond, torch.stack([P, P]), generator)
        assert v.path == () and v.thresholds == (0.0,) and v.token_id < width
    q = torch.zeros((1, width + 3))
    q[0, 2] = 1.0  # a sampled child whose q row says token 4 has no mass
    no_mass = DraftTree([4], [-1], q)
    for _ in range(20):
        v = verify_tree_sampled(no_mass, torch.stack([P, P]), generator)
        assert v.path == () and v.thresholds == (0.0,)
    q = torch.full((1, width), 0.01)
    q[0, 1] = 1 - 0.01 * (width - 1)
    low = DraftTree([2], [-1], q.double())  # q(2) = 0.01 < p(2) = 0.25
    v = verify_tree_sampled(low, torch.stack([P, P]), generator)
    assert v.thresholds == (1.0,) and v.path == (0,)


def test_sampled_tree_rounds_carry_each_draws_threshold(tiny_lm):
    events = spec(tiny_lm, prompt=REPEATING, max_new_tokens=20, draft="layers", draft_layers=1, draft_k=2,
                  tree_width=2, do_sample=True, seed=2)
    judged = [(r, i) for r in rounds_of(events) for i, d in enumerate(r.drafted) if d.draw is not None]
    assert judged
    for r, i in judged:
        d = r.drafted[i]
        assert d.accept_prob is not None and d.accepted == (d.draw < d.accept_prob)
        if d.rank == 0:  # a node's first child is judged against the target's own p
            assert d.accept_prob == pytest.approx(min(1.0, d.target_prob / d.draft_prob), abs=1e-6)


def test_the_resumed_draft_follows_the_accepted_tokens_not_the_argmax():
    from playground.engine.speculative.drafters import PromptLookupDrafter

    ids = [5, 10, 11, 12, 13, 14, 6, 7, 20, 10, 11, 15, 16, 8, 10]
    drafter = PromptLookupDrafter(1)
    tree = drafter.propose_tree(ids, 3, 2, 12)
    assert {tuple(tree.path_tokens(n)) for n in range(len(tree)) if not tree.children(n)} == {(11, 15, 16),
                                                                                               (11, 12, 13)}
    # Sampling accepted 11 then 12 (the second branch), though the target's argmax after 11 was 15.
    drafter.after_round(len(ids) + 2, [11, 15, 9], 2, path_tokens=[11, 12])
    assert drafter.resumed.rest == [13]


def test_budgets_small_trees_and_chain_shaped_rounds(tiny_lm):
    # A sampled model tree whose budget is below its width still drafts (the first draws of a group).
    events = spec(tiny_lm, prompt=REPEATING, max_new_tokens=12, draft="layers", draft_layers=1, draft_k=3,
                  tree_width=3, tree_nodes=2, do_sample=True)
    rounds = rounds_of(events)
    assert all(1 <= len(r.drafted) <= 2 for r in rounds[:-1])
    # The suffix drafter's chain (width 1) is as deep as draft tokens, whatever the node budget.
    tiny_lm.history.forget()
    spec(tiny_lm, prompt=REPEATING, max_new_tokens=20)
    events = spec(tiny_lm, prompt=REPEATING, max_new_tokens=20, draft="suffix", draft_k=4, tree_nodes=2)
    assert max(len(r.drafted) for r in rounds_of(events)) == 4
    # Every round of a tree run says it is one, chain-shaped or not.
    events = spec(tiny_lm, prompt=REPEATING, max_new_tokens=30, draft="prompt-lookup", tree_width=2)
    assert all(r.is_tree for r in rounds_of(events) if r.drafted)
