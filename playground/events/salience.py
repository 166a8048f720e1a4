"""Prompt salience of one step: how much each context token mattered to the token chosen there.

Computed on demand for a chosen step (``playground.engine.attribution.salience``), after the run, and kept with
the run (a saved trace reopens with them). One ``SalienceMap`` per method, then one ``SalienceAgreement`` for the
step: the methods' rank correlations, so the view can say where they disagree and by how much.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

SALIENCE_METHODS = ("occlusion", "grad_x_input", "integrated_gradients")
METHOD_TITLES = {"occlusion": "occlusion", "grad_x_input": "gradient × input",
                 "integrated_gradients": "integrated gradients"}
DISAGREE_BELOW = 0.5  # Spearman ρ under this between two methods: the view says they disagree


@dataclass(frozen=True)
class SalienceMap:
    """One method's scores for step ``step``'s token, one per context token (prompt, then the output before it).

    Units: change in log p(chosen token) in nats, positive = the token raised the chosen token. Occlusion: log p
    with the context as it was minus log p with that one token replaced by the baseline token. Gradient × input:
    the gradient of log p with respect to the token's input embedding, dotted with that embedding. Integrated
    gradients: (embedding − baseline embedding) · the path integral of that gradient from the baseline embedding
    (every token replaced) to the real one; the scores add up to log p(context) − log p(baseline) ("completeness",
    reported in ``figures``).
    """

    type: ClassVar[str] = "salience"
    step: int  # the explained step (0 = the first generated token)
    method: str  # one of SALIENCE_METHODS
    target_id: int
    target_text: str
    target_logprob: float  # log p(chosen token) given the whole context, nats
    token_ids: tuple[int, ...]  # the context: prompt ids then the output's first ``step`` ids
    tokens: tuple[str, ...]  # each context token's display text
    prompt_tokens: int  # how many of ``token_ids`` are the prompt
    scores: tuple[float, ...]
    baseline: str  # what stands in for a token: "token 0 '<pad>'"
    detail: str  # how it was computed, in words (steps and rule for integrated gradients)
    seconds: float
    figures: dict[str, float]  # integrated gradients: "sum", "expected_sum", "completeness_gap"


@dataclass(frozen=True)
class SalienceAgreement:
    """How far the step's methods agree: Spearman's rank correlation of each pair's scores over the context."""

    type: ClassVar[str] = "salience_agreement"
    step: int
    pairs: tuple[tuple[str, str], ...]  # (method, method)
    rho: tuple[float, ...]  # one per pair, in -1..1 (nan where a method's scores are all equal)
    top_tokens: tuple[int, ...]  # per method in SALIENCE order of the step's maps: the most salient position
