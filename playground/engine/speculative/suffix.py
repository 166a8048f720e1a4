"""SuffixDecoding's drafter (Oliaro et al. 2024), model-free: the text's latest tokens are matched against the
prompt, the output so far and this session's earlier runs on the same model; the continuations that followed the
matches, weighted by how long each match is and counted where they agree, make a tree of the likeliest next
tokens.

The paper keeps a suffix tree over its corpus; a per-token index of positions, extended backwards from each hit,
finds the same matches and is rebuilt in no time for our corpus sizes (a session's runs, KEEP_TOKENS at most).
"""

from __future__ import annotations

import heapq
from collections import defaultdict

from playground.engine.speculative.drafters import Draft, Drafter, ResumedDraft
from playground.engine.speculative.tree import DraftTree, graft

MAX_PATTERN = 32  # the longest suffix of the text matched


class SuffixDrafter(Drafter):
    name = "suffix"

    def __init__(self, earlier: list[list[int]], max_pattern: int = MAX_PATTERN) -> None:
        """``earlier``: the token sequences of this session's earlier runs on the model (the run's history)."""
        self.max_pattern = max_pattern
        self.corpus = list(earlier)  # earlier runs, fixed for this run; the current text is added per round
        self.index: dict[int, list[tuple[int, int]]] = defaultdict(list)  # token -> (sequence, end) after it
        for s, sequence in enumerate(self.corpus):
            for end in range(1, len(sequence)):
                self.index[sequence[end - 1]].append((s, end))
        self.current = len(self.corpus)  # the current text's sequence number
        self.corpus.append([])
        self.indexed = 0
        self.resumed = ResumedDraft()
        runs = len(self.corpus) - 1
        self.detail = (f"suffix match over the prompt, the output and {runs} earlier run{'s' * (runs != 1)} "
                       "on this model")

    def _index_current(self, ids: list[int]) -> None:
        if len(ids) < self.indexed or ids[: self.indexed] != self.corpus[self.current][: self.indexed]:
            self.index = defaultdict(list, {t: [h for h in hits if h[0] != self.current]
                                            for t, hits in self.index.items()})
            self.indexed = 0
        self.corpus[self.current] = ids
        for end in range(max(1, self.indexed), len(ids)):
            self.index[ids[end - 1]].append((self.current, end))
        self.indexed = max(self.indexed, len(ids))

    def matches(self, ids: list[int]) -> list[tuple[int, int, int]]:
        """(sequence, end, match length) of every place the text's last tokens occurred before, followed by at
        least one token: the longest match, and those at least half as long."""
        if not ids:
            return []
        self._index_current(ids)
        found = []
        for s, end in self.index.get(ids[-1], ()):
            sequence = self.corpus[s]  # (the current text is indexed up to its last token: its end is no hit)
            length = 1
            while (length < self.max_pattern and end - length - 1 >= 0 and length < len(ids)
                   and sequence[end - length - 1] == ids[-length - 1]):
                length += 1
            found.append((s, end, length))
        if not found:
            return []
        longest = max(length for _s, _e, length in found)
        floor = max(1, (longest + 1) // 2)
        # Latest first: the current text's own matches, then earlier runs from the newest.
        kept = [f for f in found if f[2] >= floor]
        return sorted(kept, key=lambda f: (f[0] != self.current, -f[0], -f[1]))

    def propose(self, ids: list[int], k: int) -> Draft:
        return Draft(self.propose_tree(ids, k, 1, k).tokens, None)

    def propose_tree(self, ids: list[int], depth: int, width: int, budget: int) -> DraftTree:
        """The likeliest nodes, best first, at most ``width`` children per node and ``depth`` deep; a node's
        likelihood is the weight of the matches whose continuation passes through it over all matches'. A tree
        (``width`` > 1) also resumes the last round's rejected draft (``ResumedDraft``), within ``budget``."""
        resumed = self.resumed.branch(depth) if width > 1 else []
        tree = self._likeliest(ids, depth, width, budget - len(resumed))
        return self.resumed.proposed(graft(tree, resumed, budget))

    def after_round(self, kept: int, target_choices: list[int], accepted: int,
                    path_tokens: list[int] | None = None) -> None:
        self.resumed.verdict(path_tokens if path_tokens is not None else target_choices[:accepted])

    def _likeliest(self, ids: list[int], depth: int, width: int, budget: int) -> DraftTree:
        tree = DraftTree()
        found = self.matches(ids) if depth > 0 and budget > 0 else []
        if not found:
            return tree
        # The weighted trie of continuations: (parent key, token) -> weight; children in first-seen order.
        weight: dict[tuple, float] = defaultdict(float)
        kids: dict[tuple, list[tuple]] = defaultdict(list)
        for s, end, length in found:
            key: tuple = ()
            for token in self.corpus[s][end : end + depth]:
                child = (*key, token)
                if child not in weight:
                    kids[key].append(child)
                weight[child] += length
                key = child
        total = sum(length for _s, _e, length in found)
        order = 0
        heap: list[tuple[float, int, tuple, int]] = []  # (-likelihood, order, key, parent node)
        for child in kids[()]:
            heap.append((-weight[child] / total, order, child, -1))
            order += 1
        heapq.heapify(heap)
        taken: dict[int, int] = defaultdict(int)  # parent node -> children taken
        while heap and len(tree) < budget:
            _score, _order, key, parent = heapq.heappop(heap)
            if taken[parent] >= width:
                continue
            taken[parent] += 1
            node = tree.add(key[-1], parent)
            for child in kids[key]:
                heapq.heappush(heap, (-weight[child] / total, order, child, node))
                order += 1
        return tree
