"""A draft tree: candidate continuations that share their prefixes, verified by the target in one pass.

Nodes are stored parents-before-children; node i's ``parent`` is another node's index, or -1 when it follows the
context directly. A chain is the tree whose node i has parent i - 1. Siblings keep the drafter's ranking (the
first child is its first choice), and siblings never repeat a token unless they were sampled (SpecInfer's
multi-candidate rule draws children independently, so a token may come twice).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    # The distribution each node was drawn from (processed drafter probabilities, [n, vocab]); None: every node
    # was chosen deterministically (q is one-hot on it).
    probs: torch.Tensor | None = None

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, token: int, parent: int) -> int:
        self.tokens.append(token)
        self.parents.append(parent)
        return len(self.tokens) - 1

    def depths(self) -> list[int]:
        out: list[int] = []
        for parent in self.parents:
            out.append(0 if parent < 0 else out[parent] + 1)
        return out

    def children(self, node: int) -> list[int]:
        """The children of ``node`` (-1: of the context) in the drafter's order."""
        return [i for i, parent in enumerate(self.parents) if parent == node]

    def ranks(self) -> list[int]:
        """Each node's place among its siblings (0: the drafter's first choice)."""
        seen: dict[int, int] = {}
        out = []
        for parent in self.parents:
            out.append(seen.get(parent, 0))
            seen[parent] = out[-1] + 1
        return out

    def path_to(self, node: int) -> list[int]:
        """The nodes from the context down to ``node`` (inclusive); [] for -1."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def path_tokens(self, node: int) -> list[int]:
        return [self.tokens[i] for i in self.path_to(node)]

    def is_chain(self) -> bool:
        return all(parent == i - 1 for i, parent in enumerate(self.parents))

    def first_branch(self) -> list[int]:
        """The drafter's first choice at every depth: the chain this tree extends."""
        out, node = [], -1
        while (kids := self.children(node)):
            node = kids[0]
            out.append(self.tokens[node])
        return out


def chain(tokens: Sequence[int]) -> DraftTree:
    return DraftTree(list(tokens), list(range(-1, len(tokens) - 1)))


def trie(branches: Iterable[Sequence[int]], budget: int) -> DraftTree:
    """The prefix tree of ``branches`` in their order (an earlier branch's nodes rank first among siblings), with
    at most ``budget`` nodes: a branch is cut where the budget runs out."""
    tree = DraftTree()
    index: dict[tuple[int, int], int] = {}  # (parent, token) -> node
    for branch in branches:
        parent = -1
        for token in branch:
            node = index.get((parent, token))
            if node is None:
                if len(tree) >= budget:
                    break
                node = index[(parent, token)] = tree.add(token, parent)
            parent = node
    return tree


def graft(tree: DraftTree, branch: Sequence[int], budget: int) -> DraftTree:
    """Add ``branch`` (from the context down) to ``tree`` where it is not there yet, within ``budget`` nodes."""
    parent = -1
    for token in branch:
        node = next((c for c in tree.children(parent) if tree.tokens[c] == token), None)
        if node is None:
            if len(tree) >= budget:
                break
            node = tree.add(token, parent)
        parent = node
    return tree


def ancestors_mask(tree: DraftTree) -> torch.Tensor:
    """[n, n] bool: entry (i, j) is True when node j is node i or one of its ancestors (what node i may attend to
    among the tree's nodes)."""
    n = len(tree)
    mask = torch.zeros((n, n), dtype=torch.bool)
    for i, parent in enumerate(tree.parents):
        mask[i, i] = True
        if parent >= 0:
            mask[i] |= mask[parent]
    return mask
