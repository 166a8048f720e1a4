"""Who proposes the tokens the target verifies: drafters behind one small interface (``propose`` a chain,
``propose_tree`` a tree; ``suffix.py`` holds the SuffixDecoding drafter).

- ``PromptLookupDrafter``: copies what followed an earlier occurrence of the text's last n-gram (no model): the
  latest one with k tokens after it.
- ``LayersDrafter``: the target's own first N layers, its final norm and LM head (LayerSkip's self-drafting);
  shares the target's weights, keeps its own KV cache (``playground.engine.variants`` makes every drafter model).
- ``ModelDrafter``: a separate small model with the target's tokenizer, its own KV cache; or the target's own
  quantized copy (``QuantizedDrafter``).
- ``JacobiDrafter``: the target refining a guess in parallel: each verification pass re-predicts every guessed
  position, and those predictions are the next guess (a Jacobi iteration towards the greedy fixed point).

Trees: prompt lookup's are several matches plus the draft the target turned down last round, resumed after its token
(``ResumedDraft``); a model drafter grows its tree depth by depth, one pass a depth, through a tree attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

import torch
from torch import nn
from transformers import DynamicCache

from playground.engine.processors import NamedTransform, run_pipeline
from playground.engine.speculative.rollback import keep_past, roll_back
from playground.engine.speculative.tree import DraftTree, chain, graft, trie
from playground.engine.speculative.tree_pass import tree_inputs
from playground.models.anatomy import anatomy_of


@dataclass
class Draft:
    tokens: list[int]
    probs: torch.Tensor | None  # [len(tokens), vocab] q rows of a model drafter (processed); None: deterministic


class Drafter:
    name = ""
    detail = ""
    deterministic = True  # q is one-hot on the drafted token

    def propose(self, ids: list[int], k: int) -> Draft:
        raise NotImplementedError

    def propose_tree(self, ids: list[int], depth: int, width: int, budget: int) -> DraftTree:
        """A tree of candidates, at most ``depth`` deep and ``budget`` nodes, ``width`` candidates per depth (a
        model-free tree adds the draft the target turned down last round); a drafter that drafts only chains
        proposes its chain."""
        draft = self.propose(ids, min(depth, budget))
        tree = chain(draft.tokens)
        tree.probs = draft.probs
        return tree

    def after_round(self, kept: int, target_choices: list[int], accepted: int,
                    path_tokens: list[int] | None = None) -> None:
        """``kept``: tokens now confirmed (context + accepted drafts, before the target's own token);
        ``target_choices``: the target's argmax at each verified position (of a tree: along the accepted path);
        ``path_tokens``: the accepted drafts (under sampling they need not be the argmax)."""


class PromptLookupDrafter(Drafter):
    name = "prompt-lookup"

    def __init__(self, max_ngram: int) -> None:
        self.max_ngram = max_ngram
        self.detail = f"longest n-gram {max_ngram}, latest match with a full continuation"
        self.resumed = ResumedDraft()

    def propose(self, ids: list[int], k: int) -> Draft:
        return Draft(lookup_continuation(ids, k, self.max_ngram), None)

    def propose_tree(self, ids: list[int], depth: int, width: int, budget: int) -> DraftTree:
        """The chain's draft, then the last round's rejected draft resumed after the target's own token
        (``ResumedDraft``), then the other matches (``width`` matches in all)."""
        branches = lookup_branches(ids, depth, self.max_ngram, width)
        tree = trie(branches[:1], budget)
        graft(tree, self.resumed.branch(depth), budget)
        for branch in branches[1:]:
            graft(tree, branch, budget)
        return self.resumed.proposed(tree)

    def after_round(self, kept: int, target_choices: list[int], accepted: int,
                    path_tokens: list[int] | None = None) -> None:
        self.resumed.verdict(path_tokens if path_tokens is not None else target_choices[:accepted])


class ResumedDraft:
    """A model-free drafter's memory of what the target turned down last round: the rejected child of the
    accepted path's last node and that child's first branch. Offered again next round, right after the target's
    own token, it catches an insertion: a model copying a text while adding a word or a comma puts its token
    before the drafted one and then goes on copying, where a lookup after the inserted token often finds no match,
    or the wrong one."""

    def __init__(self) -> None:
        self.last = DraftTree()  # the tree of the round in verification
        self.rest: list[int] = []

    def branch(self, depth: int) -> list[int]:
        return self.rest[:depth]

    def proposed(self, tree: DraftTree) -> DraftTree:
        self.last = tree
        return tree

    def verdict(self, path_tokens: list[int]) -> None:
        """``path_tokens``: the accepted drafts of the round, from the context down."""
        tree, self.last, self.rest = self.last, DraftTree(), []
        node = -1
        for token in path_tokens:
            found = next((c for c in tree.children(node) if tree.tokens[c] == token), None)
            if found is None:
                return
            node = found
        kids = tree.children(node)
        while kids:
            self.rest.append(tree.tokens[kids[0]])
            kids = tree.children(kids[0])


def lookup_branches(ids: list[int], k: int, max_ngram: int, width: int) -> list[list[int]]:
    """Up to ``width`` continuations of earlier occurrences of the text's last n-grams: the chain's draft
    (``lookup_continuation``) first, then the other occurrences of the longest n-gram that recurs (latest first),
    then of shorter n-grams. A continuation that is a prefix of one already taken adds nothing and is skipped."""
    first = lookup_continuation(ids, k, max_ngram)
    branches = [first] if first else []
    if not first:
        return branches
    for n in range(min(max_ngram, len(ids) - 1), 0, -1):
        suffix = ids[-n:]
        for start in range(len(ids) - n - 1, -1, -1):
            if len(branches) >= width:
                return branches
            if ids[start : start + n] == suffix:
                continuation = ids[start + n : start + n + k]
                if continuation and not any(b[: len(continuation)] == continuation for b in branches):
                    branches.append(continuation)
    return branches


def lookup_continuation(ids: list[int], k: int, max_ngram: int) -> list[int]:
    """The tokens that followed an earlier occurrence of the last n-gram of ``ids``, trying n = max_ngram down to
    1; [] when no n-gram recurs. Of the occurrences of that n-gram, the latest one followed by ``k`` tokens wins
    (recent text is the likeliest to repeat); when none is, the one followed by the most tokens (the latest of
    equals) — a match near the end has a clipped continuation, and a short draft wastes the verification pass."""
    if k <= 0:
        return []
    for n in range(min(max_ngram, len(ids) - 1), 0, -1):
        suffix = ids[-n:]
        best: list[int] = []
        # Latest first; the suffix itself (ending at the last token) has no continuation.
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start : start + n] == suffix:
                continuation = ids[start + n : start + n + k]
                if len(continuation) > len(best):
                    best = continuation
                    if len(best) == k:
                        break
        if best:
            return best
    return []


class ModelDrafter(Drafter):
    """Autoregressive drafting with a causal LM (a separate small model, or the target's first layers)."""

    deterministic = False

    def __init__(self, model: nn.Module, pipeline: tuple[NamedTransform, ...], sample: bool,
                 generator: torch.Generator, device: torch.device) -> None:
        self.model = model
        self.pipeline = pipeline
        self.sample = sample
        self.generator = generator
        self.device = device
        self.cache = DynamicCache(config=cast(Any, model).config)  # a transformers model's
        keep_past(self.cache)
        self._last_logits: torch.Tensor | None = None  # after the cache's last position, if still valid

    def propose(self, ids: list[int], k: int) -> Draft:
        tokens, rows = [], []
        context = torch.tensor([ids], device=self.device)  # [1, n]
        cached = self.cache.get_seq_length()
        for _ in range(k):
            feed = context[:, cached:]  # what the drafter has not read yet
            logits = self.model(input_ids=feed, cache=self.cache, use_cache=True).logits[:, -1, :].float()
            processed = run_pipeline(self.pipeline, context, logits)  # [1, vocab]
            probs = processed.softmax(dim=-1)
            if self.sample:
                token = int(torch.multinomial(probs, 1, generator=self.generator).item())
            else:
                token = int(processed.argmax(dim=-1).item())
            tokens.append(token)
            rows.append(probs[0])
            cached = context.shape[1]
            context = torch.cat([context, context.new_tensor([[token]])], dim=1)
        return Draft(tokens, torch.stack(rows) if rows else None)

    def after_round(self, kept: int, target_choices: list[int], accepted: int,
                    path_tokens: list[int] | None = None) -> None:
        roll_back(self.cache, kept)

    def _distribution(self, context: list[int], logits: torch.Tensor) -> torch.Tensor:
        """The drafter's processed probabilities [vocab] after ``context`` from its raw ``logits`` [vocab]."""
        row = logits[None].float()
        return run_pipeline(self.pipeline, torch.tensor([context], device=self.device), row).softmax(dim=-1)[0]

    def _children(self, q: torch.Tensor, width: int) -> list[int]:
        """Greedy: the ``width`` likeliest tokens (distinct); sampling: ``width`` independent draws from q (what
        SpecInfer's verification assumes; a token may come twice)."""
        if self.sample:
            return torch.multinomial(q, width, replacement=True, generator=self.generator).tolist()
        return torch.topk(q, width).indices.tolist()

    def propose_tree(self, ids: list[int], depth: int, width: int, budget: int) -> DraftTree:
        """Depth by depth, one drafter pass each: the ``width`` likeliest paths so far (by the product of q along
        them) get children. Greedy keeps the ``width`` likeliest children of a depth (and always the first choice
        after the first choice: the chain is a branch of the tree); sampling keeps every drawn child of an
        expanded node, as its rule needs. The drafter's cache is back at ``ids`` afterwards."""
        tree = DraftTree()
        if depth <= 0 or budget <= 0:
            return tree
        rows: list[torch.Tensor] = []  # each node's q: the distribution it was chosen from
        sliding = anatomy_of(self.model).has_sliding_layers
        cached = self.cache.get_seq_length()
        logits = self.model(input_ids=torch.tensor([ids[cached:]], device=self.device), cache=self.cache,
                            use_cache=True).logits[0, -1]
        # (node, its q, log of the path's probability); the chain's node first
        frontier: list[tuple[int, torch.Tensor, float]] = [(-1, self._distribution(ids, logits), 0.0)]
        read = 0
        for level in range(depth):
            groups = []  # (parent, tokens, q, parent's score)
            for node, q, score in frontier[:width]:
                groups.append((node, self._children(q, width), q, score))
            start = len(tree)
            if self.sample:  # the first draws of a group are independent draws too: a group may be cut
                for node, tokens, q, _score in groups:
                    for token in tokens[: budget - len(tree)]:
                        tree.add(token, node)
                        rows.append(q)
            else:
                scored = [(score + float(q[t].clamp(min=1e-30).log()), node, t, q)
                          for node, tokens, q, score in groups for t in tokens]
                chain_child = scored[0]
                best = [chain_child, *sorted(scored[1:], key=lambda c: -c[0])[: width - 1]]
                for _score, node, token, q in best[: budget - len(tree)]:
                    tree.add(token, node)
                    rows.append(q)
            new = list(range(start, len(tree)))
            if not new or level == depth - 1 or len(tree) >= budget:
                break
            if sliding:  # a sliding window cannot hold cached nodes: re-read the tree
                roll_back(self.cache, len(ids))
                read = 0
            mask, positions = tree_inputs(self.model, self.cache, 0, tree, self.device, read=read)
            out = self.model(input_ids=torch.tensor([tree.tokens[read:]], device=self.device), cache=self.cache,
                             use_cache=True, attention_mask=mask, position_ids=positions).logits[0, -len(new):]
            read = len(tree)
            frontier = []
            for j, node in enumerate(new):
                q = self._distribution(ids + tree.path_tokens(node), out[j])
                path_score = sum(float(rows[i][tree.tokens[i]].clamp(min=1e-30).log()) for i in tree.path_to(node))
                frontier.append((node, q, path_score))
            frontier = [frontier[0], *sorted(frontier[1:], key=lambda f: -f[2])]  # the chain's node stays first
        roll_back(self.cache, len(ids))
        tree.probs = torch.stack(rows) if rows else None
        return tree


class LayersDrafter(ModelDrafter):
    name = "layers"


class SmallModelDrafter(ModelDrafter):
    name = "model"


class QuantizedDrafter(ModelDrafter):
    name = "quantized"


class JacobiDrafter(Drafter):
    name = "jacobi"
    detail = "the target's own predictions for the guessed positions, refined each pass"

    def __init__(self) -> None:
        self.guess: list[int] = []

    def propose(self, ids: list[int], k: int) -> Draft:
        # First round: the last k tokens of the text as the initial guess (any guess converges).
        guess = self.guess or ids[-k:]
        guess = (guess + [guess[-1]] * k)[:k] if guess else []
        return Draft(guess, None)

    def after_round(self, kept: int, target_choices: list[int], accepted: int,
                    path_tokens: list[int] | None = None) -> None:
        # choices[accepted] is the target's own next token; the positions after it were predicted from the
        # guess: they are the next guess (one Jacobi update).
        self.guess = target_choices[accepted + 1 :]
