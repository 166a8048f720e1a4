"""Mirostat v2 (Basu et al.; llama.cpp's ``mirostat_v2``): mu, the surprise cut, carried across steps and moved
after each chosen token (``accept``) toward the target surprise tau.

ids: [batch, seq]; logits: [batch, vocab] (``-inf`` where an earlier sampler removed a token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from playground.engine.samplers.base import BuildContext, Sampler, engine_sampler
from playground.engine.samplers.cuts import NEG_INF, protect_top
from playground.sampler_maths import mirostat_next_mu


def truncate_by_surprise(ids: torch.Tensor, logits: torch.Tensor, mu: float) -> torch.Tensor:
    """Mirostat v2's cut: drop tokens whose surprise −log2 p exceeds ``mu`` (the top token always stays)."""
    surprise = -torch.log2(logits.softmax(dim=-1))
    return logits.masked_fill(protect_top(surprise > mu, logits, 1), NEG_INF)


@dataclass
class MirostatState:
    tau: float  # target surprise, bits
    eta: float  # learning rate
    mu: float  # the current cut: tokens more surprising than this are dropped

    @classmethod
    def start(cls, tau: float, eta: float) -> MirostatState:
        return cls(tau=tau, eta=eta, mu=2.0 * tau)

    def update(self, prob: float) -> None:
        """After a token of probability ``prob`` (under the distribution it was drawn from) was chosen: move mu by
        the error between its surprise and tau. A forced token the chain had removed (prob 0) teaches nothing."""
        self.mu = mirostat_next_mu(self.mu, prob, self.tau, self.eta)


@engine_sampler
class Mirostat(Sampler):
    declares = "mirostat"
    name = "mirostat"

    def __init__(self, tau: float, eta: float) -> None:
        self.state = MirostatState.start(tau, eta)

    @classmethod
    def build(cls, settings: Any, context: BuildContext) -> Sampler:
        return cls(settings.mirostat_tau, settings.mirostat_eta)

    def apply(self, ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        return truncate_by_surprise(ids, logits, self.state.mu)

    def accept(self, token_id: int, prob: float) -> None:
        self.state.update(prob)

    def reset(self) -> None:
        self.state.mu = 2.0 * self.state.tau

    def snapshot(self) -> float:
        return self.state.mu

    def restore(self, state: float) -> None:
        self.state = MirostatState(self.state.tau, self.state.eta, state)
