"""Contrastive decoding's events: who the amateur is, and every step's expert, amateur and contrast scores.

A contrastive run also yields an ordinary ``token`` event per step (right after its ``contrast`` event, same
``step``), so the tokens view and the candidates chart work unchanged. There ``raw_*`` is the expert's own
distribution and ``processed_*`` / ``prob`` the normalised contrast distribution the token was chosen from
(softmax of the scores over the plausible set).

Every log-probability here is a natural log. Scores of tokens outside the plausible set are −∞ (``null`` in JSON).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar


@dataclass(frozen=True)
class ContrastiveStarted:
    """Right after ``start``: the amateur and the rule, described once for the view."""

    type: ClassVar[str] = "contrast_start"
    amateur: str  # "layer" | "dola" | "quantized" | "model"
    detail: str  # e.g. "layer 10 of 30 (final norm + LM head on its output)"
    amateur_layer: int  # layer amateur: 1-based layer of the expert; 0 otherwise
    layers: int  # decoder layers of the expert
    alpha: float  # plausibility: p_expert ≥ alpha × max p_expert
    amateur_temperature: float
    do_sample: bool  # drawn from the normalised scores (else: the highest score)
    expert_top: int  # each step records the expert's top ``expert_top`` tokens (and the contrast's best)
    dola_layers: tuple[int, ...] = ()  # DoLa: the candidate premature layers (0 = embeddings, j = layer j's output)
    dola_penalty: float = 1.0  # DoLa: the repetition penalty on the contrast scores (1 = none)
    # DoLa: "reference" (the authors' code as transformers 4.46 ran it: the LM head on the premature layer's
    # un-normalised state, ½[KL(M‖P) + KL(M‖Q)], the relative-top filter) or "formula" (the paper's text: the
    # logit lens, the true JSD); "" for the other amateurs and for runs saved before the variants (formula).
    dola_variant: str = ""


@dataclass(frozen=True)
class ContrastCandidate:
    """One recorded token of a step."""

    token_id: int
    text: str
    expert_logprob: float  # log p_expert (after the penalties, if any)
    amateur_logprob: float  # log p_amateur at the amateur temperature
    score: float  # expert_logprob − amateur_logprob inside the plausible set, −∞ outside
    plausible: bool  # expert_logprob ≥ the step's cut
    expert_rank: int  # 1 = the expert's most likely token
    prob: float  # probability under the normalised contrast distribution, after the sampling settings when
    # sampled: what the token was chosen from


@dataclass(frozen=True)
class ContrastStep:
    """One step: the expert's and the amateur's next-token distributions, the cut, the contrast and the choice.

    ``candidates`` hold the expert's top ``expert_top`` tokens, the best-scoring plausible tokens and the chosen
    one, in the expert's order: every token with expert_logprob above the lowest of the expert's top tokens is in.
    """

    type: ClassVar[str] = "contrast"
    step: int  # the step of the ``token`` event that follows
    candidates: tuple[ContrastCandidate, ...]
    cut_logprob: float  # log(alpha) + max log p_expert: the plausibility threshold in expert log-probability
    plausible_count: int  # tokens in the plausible set (all of the vocabulary, not only the recorded ones)
    token_id: int  # the chosen token
    text: str
    expert_token_id: int  # the expert's own top token (what greedy would have chosen here)
    expert_text: str
    changed: bool  # the contrast chose another token than the expert's top
    forced: bool  # forced by branching (the contrast's own choice is still recorded in ``contrast_token_id``)
    contrast_token_id: int  # the contrast's choice before any forcing (= token_id unless forced)
    amateur_ms: float  # time of the amateur's part of the step (its forward pass or LM-head product)
    contrast_ms: float  # time of the contrast maths (cut, scores, choice)
    premature_layer: int = -1  # DoLa: the layer contrasted with at this step (the largest JSD); -1 otherwise
    # DoLa: each of ``dola_layers``' divergence from the final layer in nats, in order (the variant's: the formula's
    # JSD, the reference's ½[KL(M‖P) + KL(M‖Q)])
    layer_jsd: tuple[float, ...] = ()
