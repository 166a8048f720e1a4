"""What-if: a finished run's steps re-derived under other sampler settings (or another order), from the raw
candidates each step recorded (``TokenStep.raw_top``), without the model. Display only: what the chain would have
made of the same raw distributions, at the tokens the run actually chose.

Input: the run's steps, its prompt ids (for the penalties), the settings to try. Output: ``WhatIf``, NumPy arrays
over [steps, candidates], computed for all steps at once (a 1,000-step run in a few milliseconds; DRY and the
n-gram ban walk each step's context in Python).

Exactness. The raw distribution is known on the recorded candidates (the likeliest N tokens, the chosen one too)
and, for the rest (the tail), only as its total mass M, its size, and an upper bound on each of its logits (the
last recorded one). The chain is run on the recorded candidates with the tail kept as bounds on its summed weight
``Σ exp(logit)``: temperature maps them by the power-mean inequality, the penalties can only lower tail tokens (and
say so when a setting would raise one). A cut whose decision is the same at both bounds and that removes every tail
token (top-k within the recorded ones, min-p / epsilon / top-p / mirostat when the bound falls below the line) makes
the rest of the chain exact, as the engine's compact chain is. A step is not exact (``exact`` False, ``reasons``
says why) when the kept set reaches past the recorded candidates, when a cut's decision depends on how the tail's
mass is spread, when a sampler that reads the whole distribution (typical, eta, top-nσ, dynamic temperature) runs
while the tail is still in play and the chain no longer sees the raw distribution (each step records four numbers of
it, ``RawCandidates.whole``: the entropy, the logits' mean, spread and count; ``_Chain.raw`` says where a stage may
read them: nothing cut or moved before it, top-nσ's spread also after a temperature; tail-free sampling needs none:
the unrecorded tokens' second differences add up to at most the last two recorded probabilities), when XTC fires at
random (shown as if it fired), when guidance is on (the negative prompt's logits are not recorded), when mirostat's
mu (re-derived step by step from the chosen tokens) did not settle, or when the step recorded nothing.
Probabilities then are estimates, with the tail as one lump at its upper bound.

``tests/test_what_if_vs_engine.py`` holds every declared sampler (``SamplerSpec.what_if_examples``) to the engine
wherever this says exact.

The package: ``recorded`` reads the recorded candidates, ``bounds`` keeps the tail's bounds and the reasons,
``stages`` has one stage per sampler (a module per stem, as ``playground.config.samplers``; discovered),
``derive`` runs them.
"""

from playground.state.what_if.bounds import REASONS, WhatIf, _moment_bounds
from playground.state.what_if.derive import MIROSTAT_PASSES, re_derive
from playground.state.what_if.recorded import LOGPROB_STEP, MOMENT_POWERS, RecordedRun, unpack_raw_candidates

__all__ = ["LOGPROB_STEP", "MIROSTAT_PASSES", "MOMENT_POWERS", "REASONS", "RecordedRun", "WhatIf", "_moment_bounds",
           "re_derive", "unpack_raw_candidates"]
