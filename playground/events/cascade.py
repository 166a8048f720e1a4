"""Cascade inference's events: the two models, who produced every token, and (per response) the verdict.

A cascade run also yields an ordinary ``token`` event for every output token (from the distribution of the model
that chose it), so the tokens view and the candidates chart work unchanged. Per token, each ``cascade_step`` comes
right before its ``token`` event. Per response, the cheap model's whole response comes first as ``cascade_step``
events with ``draft`` set (no ``token`` events: it is not the output yet), then one ``cascade_response`` verdict,
then the output's ``token`` events: the cheap response's when it was kept, else the full model's own response (a
``cascade_step`` and a ``token`` event per token). The run's figures come with ``done`` (``RunFinished.figures``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

CHEAP = "cheap"  # the token is the cheap model's choice
FULL = "full"  # the full model decided the token
FORCED = "forced"  # forced by branching (neither model chose it)


@dataclass(frozen=True)
class CascadeStarted:
    """Right after ``start``: the two models and the rule, described once for the view."""

    type: ClassVar[str] = "cascade_start"
    unit: str  # "token" | "response": what one escalation decision covers
    threshold: float  # escalate when the cheap model's probability (per response: the mean) is below this
    cheap: str  # "quantized" | "layers" | "model"
    cheap_detail: str  # e.g. "SmolLM2 with int4 weights and LM head (group 32)"
    full_detail: str  # e.g. "SmolLM2-135M-Instruct, 30 layers, float32"
    cheap_macs: int  # weight multiply-adds per position read (every linear layer once, the LM head included)
    full_macs: int
    do_sample: bool  # each model draws its token (else takes its top token)
    compare: bool  # the full model alone decodes as many tokens after the run


@dataclass(frozen=True)
class CascadeStep:
    """One position: the cheap model's choice and confidence, and who produced the token."""

    type: ClassVar[str] = "cascade_step"
    step: int  # output position (per-response drafts: position in the cheap model's response)
    token_id: int  # the token this step produced (the output's; for a draft, the cheap model's)
    text: str  # its incremental text
    producer: str  # CHEAP | FULL | FORCED
    escalated: bool  # the full model decided this token (the cheap model was unsure, or per response: rewrote it)
    cheap_token_id: int | None  # the cheap model's choice here (None: it did not run for this prefix)
    cheap_text: str
    cheap_prob: float | None  # its probability of that choice after the sampler pipeline: the confidence
    full_prob: float | None  # the full model's probability of the token it chose (None: it did not decide)
    full_read: int  # positions the full model read in this step's pass (its catch-up); 0: it did not run
    cheap_ms: float  # the cheap model's pass and choice (0 when its pass was the prefill)
    full_ms: float  # the full model's pass and choice (0 when it did not run)
    draft: bool = False  # per response: a token of the cheap model's response, judged at its end


@dataclass(frozen=True)
class CascadeResponse:
    """Per response: the verdict on the cheap model's whole response."""

    type: ClassVar[str] = "cascade_response"
    tokens: int  # tokens of the cheap response the verdict read (forced tokens are not counted)
    drafted: int  # tokens of the cheap response, forced ones included
    mean_prob: float  # the mean of their ``cheap_prob`` (the confidence compared with the threshold; 1 when none)
    min_prob: float
    threshold: float
    escalated: bool  # mean_prob < threshold: thrown away, the full model writes the response
    draft_ms: float  # what the cheap response cost (its steps, the prefill excluded)
