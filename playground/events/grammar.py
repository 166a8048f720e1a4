"""What a constraint (``--json-schema``, ``--regex``, ``--grammar``, ``--choices``) did at one step: a value carried
by the step's event (``TokenStep.grammar``), not an event of its own. Saved runs from before it read None."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GrammarStep:
    """The constraint's mask at one step, against the raw distribution (softmax of the model's logits)."""

    allowed: int  # tokens the grammar allows at this step
    removed_mass: float  # raw probability of the tokens it forbids (0: the model kept to the grammar by itself)
    top_forbidden: bool  # the raw top token is forbidden: the grammar overrode the model's first choice
    # Tokens the grammar fixes from here without a choice (llguidance's fast-forward tokens, from this step's
    # state); empty when there is a choice.
    ff_tokens: tuple[int, ...] = ()
    # A fast-forward step: the grammar fixed this token (the only one it allowed) and the run fed it to the model in
    # one pass with the others it fixed (``playground.engine.fast_forward``); its probabilities are that pass's, at
    # its position. False for a step the model chose (and in runs saved before).
    fast_forward: bool = False
    # The step's raw top candidates (``TokenStep.candidates`` by raw rank, the chosen one aside) that the mask
    # forbids, for the tokens view's strike-through; None in runs saved before it was recorded.
    forbidden: tuple[int, ...] | None = None
    # The raw probability of the tokens the mask allows, summed on its own (``1 − removed_mass`` loses it where it is
    # tiny: a forced token the model gave 1e-9); the renormalisation costs ``−ln`` of it. None in older saved runs.
    allowed_mass: float | None = None

    @property
    def forced(self) -> bool:
        """Only one token was allowed."""
        return self.allowed == 1
