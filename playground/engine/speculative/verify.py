"""The verification maths of draft-then-verify, on one round's distributions (pure functions).

Greedy: keep drafted tokens while each equals the target's argmax; the target's argmax at the first mismatch
(or after the last draft) is added. Sampling (Leviathan et al. 2023, Chen et al. 2023): keep drafted token x_i with
probability min(1, p_i(x_i) / q_i(x_i)); at the first rejection draw from normalise(max(0, p_i − q_i)); after a
fully accepted draft draw the bonus token from p_{k+1}. The emitted tokens are then distributed exactly as the
target's own samples.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from playground.engine.speculative.tree import DraftTree


@dataclass(frozen=True)
class Verdict:
    accepted: int  # length of the kept prefix of the draft
    token_id: int  # the target's token after it (correction or bonus)
    draws: tuple[float, ...]  # sampling: the uniform draw of each examined draft position (of a tree: node)
    path: tuple[int, ...] = ()  # a tree: the accepted nodes, from the context down
    draw_nodes: tuple[int, ...] = ()  # a tree: the node each of ``draws`` judged
    thresholds: tuple[float, ...] = ()  # a tree: min(1, p'(c) / q(c)) each of ``draws`` was compared with


def verify_greedy(draft: list[int], target_logits: torch.Tensor) -> Verdict:
    """``target_logits``: [len(draft) + 1, vocab] processed logits, row j predicting the token after draft[:j]."""
    choices = target_logits.argmax(dim=-1).tolist()  # [len(draft) + 1]
    accepted = 0
    while accepted < len(draft) and draft[accepted] == choices[accepted]:
        accepted += 1
    return Verdict(accepted, int(choices[accepted]), ())


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalise(max(0, p − q)): what the target wants that the drafter over-proposed. [vocab] → [vocab]."""
    residual = (p - q).clamp(min=0)
    total = residual.sum()
    # p == q exactly leaves nothing: then a rejection is impossible, but keep a valid distribution.
    return residual / total if total > 0 else p


def on_target_width(draft_probs: torch.Tensor, width: int) -> torch.Tensor:
    """q rows [n, vocab_draft] on the target's vocabulary [n, width]: a draft model whose LM head is narrower
    (fewer padding rows) gives the tokens it lacks probability 0; a wider one's extra rows are no tokens of the
    target (what it put there, the target rejects: p = 0)."""
    missing = width - draft_probs.shape[-1]
    if missing > 0:
        return torch.cat([draft_probs, draft_probs.new_zeros((*draft_probs.shape[:-1], missing))], dim=-1)
    return draft_probs[..., :width]


def verify_sampled(draft: list[int], draft_probs: torch.Tensor, target_probs: torch.Tensor,
                   generator: torch.Generator) -> Verdict:
    """``draft_probs``: [len(draft), vocab_draft] q rows (one-hot rows for a deterministic drafter);
    ``target_probs``: [len(draft) + 1, vocab] processed p rows. Draws with ``generator`` (on the rows' device)."""
    draws = []
    width = target_probs.shape[-1]
    fitted = on_target_width(draft_probs, width)
    for i, token in enumerate(draft):
        p, q = target_probs[i], fitted[i]
        draw = float(torch.rand((), generator=generator, device=p.device).item())
        draws.append(draw)
        q_token = float(draft_probs[i, token])
        p_token = float(p[token]) if token < width else 0.0
        if q_token <= 0 or draw >= min(1.0, p_token / q_token):
            residual = residual_distribution(p, q)
            token_id = int(torch.multinomial(residual, 1, generator=generator).item())
            return Verdict(i, token_id, tuple(draws))
    token_id = int(torch.multinomial(target_probs[len(draft)], 1, generator=generator).item())
    return Verdict(len(draft), token_id, tuple(draws))


def verify_tree_greedy(tree: DraftTree, choices: list[int]) -> Verdict:
    """``choices``: the target's argmax at each row of a tree pass, row 0 after the context and row 1 + i after
    node i. Walk down while some child of the current node is the target's choice there (siblings hold distinct
    tokens, so at most one is); the target's choice where the walk stops is its own token."""
    path: list[int] = []
    node, row = -1, 0
    while True:
        match = next((child for child in tree.children(node) if tree.tokens[child] == choices[row]), None)
        if match is None:
            return Verdict(len(path), int(choices[row]), (), tuple(path))
        path.append(match)
        node, row = match, match + 1


def verify_tree_sampled(tree: DraftTree, target_probs: torch.Tensor, generator: torch.Generator) -> Verdict:
    """SpecInfer's multi-step speculative sampling (Miao et al. 2024, Algorithm 2) over a tree pass's processed
    rows (``target_probs`` [len(tree) + 1, vocab], row 0 after the context, row 1 + i after node i). At a node,
    its children are tried in order: child c, drawn from q_c, is accepted with probability min(1, p'(c) / q_c(c));
    a rejection replaces p' by normalise(max(0, p' − q_c)); when every child is rejected the token is drawn from
    p'. A deterministic child (``tree.probs`` None) has q one-hot on it. The output is distributed exactly as the
    target's own samples."""
    width = target_probs.shape[-1]
    path: list[int] = []
    draws: list[float] = []
    draw_nodes: list[int] = []
    thresholds: list[float] = []
    node = -1
    while True:
        p = target_probs[node + 1]
        moved = False
        for child in tree.children(node):
            token = tree.tokens[child]
            if tree.probs is None:
                q = torch.zeros_like(p)
                if token < width:
                    q[token] = 1.0
                q_token = 1.0
            else:
                q = on_target_width(tree.probs[child : child + 1], width)[0]
                q_token = float(tree.probs[child, token])
            draw = float(torch.rand((), generator=generator, device=p.device).item())
            draws.append(draw)
            draw_nodes.append(child)
            p_token = float(p[token]) if token < width else 0.0
            threshold = min(1.0, p_token / q_token) if q_token > 0 else 0.0
            thresholds.append(threshold)
            if draw < threshold:
                path.append(child)
                node, moved = child, True
                break
            p = residual_distribution(p, q)
        if not moved:
            token_id = int(torch.multinomial(p, 1, generator=generator).item())
            return Verdict(len(path), token_id, tuple(draws), tuple(path), tuple(draw_nodes), tuple(thresholds))
