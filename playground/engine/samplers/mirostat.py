"""Mirostat v2's state (Basu et al.; llama.cpp's ``mirostat_v2``): mu, the surprise cut, carried across steps."""

from __future__ import annotations

import math
from dataclasses import dataclass


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
        if prob > 0.0:
            self.mu -= self.eta * (-math.log2(prob) - self.tau)
