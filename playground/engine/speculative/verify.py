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


@dataclass(frozen=True)
class Verdict:
    accepted: int  # length of the kept prefix of the draft
    token_id: int  # the target's token after it (correction or bonus)
    draws: tuple[float, ...]  # sampling: the uniform draw of each examined draft position


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
