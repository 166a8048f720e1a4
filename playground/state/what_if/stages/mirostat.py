"""Mirostat v2's cut at each step's mu (``derive`` iterates mu to its fixed point from the chosen tokens)."""

from __future__ import annotations

import numpy as np

from playground.config import RunSettings
from playground.sampler_maths import mirostat_next_mu
from playground.state.what_if.bounds import _below_probability, _Chain
from playground.state.what_if.recorded import LOGPROB_STEP
from playground.state.what_if.stages import stage


def mirostat_mu(chosen_prob: np.ndarray, s: RunSettings, steps: int) -> np.ndarray:
    """mu at each step [S]: 2·tau, moved after each step by eta·(surprise − tau) of the chosen token (a token the
    chain removed, probability 0, teaches nothing), as the engine's ``MirostatState.update``; without chosen
    probabilities (the start), 2·tau everywhere."""
    if len(chosen_prob) == 0:
        return np.full(steps, 2.0 * s.mirostat_tau)
    mu, out = 2.0 * s.mirostat_tau, []
    for prob in chosen_prob.tolist():
        out.append(mu)
        mu = mirostat_next_mu(mu, prob, s.mirostat_tau, s.mirostat_eta)
    return np.array(out, dtype=np.float64)


@stage("mirostat", feedback=mirostat_mu)
def _mirostat(c: _Chain, s: RunSettings, *_: object) -> None:
    """Mirostat v2's cut: surprise −log2 p above mu removed (the likeliest kept), mu per step from ``re_derive``."""
    assert c.mu is not None
    err = c.err
    # mu itself carries the rounding of every earlier chosen probability: the cut's border is that much wider.
    c.err = err + s.mirostat_eta * 2 * (0.5 / LOGPROB_STEP) * np.arange(c.x.shape[0])
    _below_probability(c, 2.0 ** -c.mu, protect_top=True)
    c.err = err
