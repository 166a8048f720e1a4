"""The events every run has: start, prefill, one token per step (greedy, sampling), done.

Every strategy yields these. They carry no tensors and no Qt types, so the same stream feeds the GUI, the
`trace` command (JSON lines), tests and benchmarks. Each event class has a ``type`` tag used in JSON.

Which distribution a number comes from is always in its name:
- ``raw_*``: softmax of the model's logits, before any processor;
- ``processed_*`` / ``prob``: after the sampler pipeline (penalties, temperature, top-k, top-p, min-p), i.e. the
  distribution the token was actually drawn from (for greedy: the one whose argmax was taken).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

from playground.events.grammar import GrammarStep

# Why a run ended. The engine's strategies: "eos" (the model's end token), "stop_string" (the text reached a stop
# string), "max_new_tokens" (the budget), "context_full" (the model's context), "stopped" (the user's Stop). A server
# adds the OpenAI API's other finish reasons: "content_filter", "tool_calls", "function_call". "unknown": a reason
# this version does not know (a server's own finish reason, or a saved run from a newer version: read as "unknown").
# A constraint (``--json-schema``, ...) adds "grammar" (it is complete: nothing more can follow), "grammar_incomplete"
# (the budget ended before it was) and "grammar_blocked" (no token could follow it: ``RunFinished.stop_note`` says why).
# Phrase bans (``--ban``) add "ban_blocked" (their rollbacks forbade every token left at a step) and "ban_limit" (the
# run reached its most rollbacks). Steering (``--steer``) adds "non_finite" (the steered model's logits were not finite:
# the strength is too large; ``stop_note`` says where).
StopReason = Literal["eos", "stop_string", "max_new_tokens", "context_full", "stopped", "content_filter",
                     "tool_calls", "function_call", "grammar", "grammar_incomplete", "grammar_blocked",
                     "ban_blocked", "ban_limit", "non_finite", "unknown"]
STOP_REASONS: tuple[StopReason, ...] = get_args(StopReason)


@dataclass(frozen=True)
class Candidate:
    """One of the top candidates of a step."""

    token_id: int
    text: str
    raw_prob: float  # softmax of the raw logits
    processed_prob: float  # after the sampler pipeline; 0.0 when a processor cut it
    raw_rank: int  # 1 = most likely under the raw distribution
    cut_by: str | None = None  # name of the first processor that removed it, if any


@dataclass(frozen=True)
class ProcessorEffect:
    """What one logit processor did to the candidates shown for a step."""

    name: str  # e.g. "repetition_penalty", "top_k"
    removed: tuple[int, ...]  # token ids among the shown candidates it set to -inf
    reweighted: tuple[int, ...]  # token ids among the shown candidates whose logit it changed otherwise


@dataclass(frozen=True)
class TokenNumbers:
    """Which distribution a run's per-token probabilities come from, as its start events say (their
    ``token_numbers``): what a view's captions, legends and shading choices follow, whatever the model source."""

    # None: two per token, the raw model's and the processed one (a run decoded here); else the one distribution a
    # server sent: "raw", "post-sampler", "raw (assumed)", "unknown"
    distribution: str | None = None
    note: str = ""  # where the numbers come from, one sentence for a tooltip


@dataclass(frozen=True)
class RawCandidates:
    """A step's likeliest raw tokens, kept so that other sampler settings can be tried on a finished run (the
    what-if, ``playground.state.what_if``), packed small: ~2 KB a step for 256 tokens of a vocabulary under 65,536.

    ``ids``: base64 of the token ids, little-endian unsigned integers of ``id_bytes`` bytes each, by raw rank;
    ``logprobs``: base64 of little-endian uint16 ``q``, the raw log-probability being ``-q / 1024`` nats (a
    probability within 0.05 %; 65535 means ``-64`` or less); ``logsumexp``: the raw logits' log-sum-exp, so that
    ``logit = logprob + logsumexp`` (the repetition penalty reads the logits' signs); ``tail_mass``: the raw
    probability of every token not listed; ``vocab_size``: how many tokens there are in all; ``tail_log_moments``:
    ``log Σ p^a`` over the tokens not listed for ``a`` in ``TAIL_POWERS`` (what temperature makes of their share is
    bounded by these, the log-moments being convex in ``a``; empty in older saved runs); ``whole``: a few numbers of
    the whole raw distribution (None in older saved runs)."""

    ids: str
    logprobs: str
    logsumexp: float
    tail_mass: float
    vocab_size: int
    id_bytes: int = 2
    tail_log_moments: tuple[float, ...] = ()
    whole: WholeVocabulary | None = None


@dataclass(frozen=True)
class WholeVocabulary:
    """A step's whole raw distribution in four numbers, recorded with its candidates: the samplers that read every
    token (eta and typical-p: the entropy; top-nσ: the logits' spread; dynamic temperature: the entropy and the
    count) are then exact in the what-if where they see the raw distribution (first in the chain).

    ``entropy``: −Σ p ln p in nats; ``logit_mean`` and ``logit_std``: the mean and population standard deviation of
    the finite raw logits; ``finite``: how many raw logits are finite."""

    entropy: float
    logit_mean: float
    logit_std: float
    finite: int


TAIL_POWERS = (0.5, 1.5, 2.0)  # RawCandidates.tail_log_moments' powers


@dataclass(frozen=True)
class RunStarted:
    """First event of every run: what is being decoded, with what."""

    type: ClassVar[str] = "start"
    strategy: str
    prompt_text: str  # the text fed to the model (after the chat template, if on)
    prompt_token_ids: tuple[int, ...]
    forced_token_ids: tuple[int, ...]  # generated tokens forced at the start (branching)
    model_name: str
    model_path: str
    device: str
    dtype: str
    settings: dict[str, Any]  # the run's settings as plain values
    # The model the weights were made from: model_name itself, or for a quantized copy the model it copies
    # (saved runs from before this field read "").
    base_model: str = ""
    # The run was streamed from a server (``playground.remote``): it holds no logits, layers or cache of the model.
    # Saved runs from before this field read it from their device ("remote: llama.cpp"; ``codec.LEGACY_FIELDS``).
    remote: bool = False

    @property
    def token_numbers(self) -> TokenNumbers:
        """A run decoded here records both distributions; a server's run says otherwise in its next start event
        (``RemoteStarted.token_numbers``)."""
        return TokenNumbers()


@dataclass(frozen=True)
class PrefillProgress:
    """A long prompt is read in chunks (so Stop is honoured between them): how far the prefill got."""

    type: ClassVar[str] = "prefill_progress"
    done_tokens: int
    total_tokens: int


@dataclass(frozen=True)
class PrefillDone:
    """The prompt went through the model once and filled the KV cache."""

    type: ClassVar[str] = "prefill"
    prompt_tokens: int
    prefill_ms: float
    kv_cache_bytes: int  # measured size of the cache after prefill
    forward_passes: int = 1  # model calls the prefill took (one per chunk of a long prompt)
    # Prompt tokens left for the first step to read with its own input (speculative decoding reads the prompt's
    # tail together with its first draft, in one pass, as transformers' assisted generation does).
    deferred_tokens: int = 0


@dataclass(frozen=True)
class TokenStep:
    """One decoding step of greedy or sampling."""

    type: ClassVar[str] = "token"
    unit: ClassVar[str] = "token"  # what one step produces, for counts and speeds ("tokens/s")
    step: int  # 0 = first generated token
    token_id: int
    text: str  # incremental text this token adds to the output
    prob: float  # probability of the chosen token after the sampler pipeline
    raw_prob: float  # probability of the chosen token under the raw model distribution
    logprob: float  # natural log of raw_prob
    raw_rank: int  # rank of the chosen token under the raw distribution, 1 = top
    entropy: float  # entropy of the raw distribution, in bits
    processed_entropy: float  # entropy after the sampler pipeline, in bits
    candidates: tuple[Candidate, ...]  # top candidates by raw probability (plus the chosen one if outside)
    shown_raw_mass: float  # raw probability the shown candidates cover
    effects: tuple[ProcessorEffect, ...]
    forced: bool  # the token was forced (branching), not chosen by the strategy
    step_ms: float  # model forward + processing for this step
    kv_cache_bytes: int  # measured size of the KV cache after this step
    # Mirostat v2's surprise cut mu (bits) that this step applied; None without mirostat (and in older saved runs).
    mirostat_mu: float | None = None
    # The likeliest raw tokens of this step (``--record-candidates``), for the what-if; None when not recorded (and in
    # older saved runs).
    raw_top: RawCandidates | None = None
    # What a constraint's mask did at this step; None without one (and in older saved runs).
    grammar: GrammarStep | None = None
    varentropy: float | None = None  # variance of the raw distribution's surprisal, bits²; None: older saved runs

    # What the numbers are, for views that must not guess from the event's class (a server's steps override
    # these as fields): whether the step has probabilities at all, and whether ``prob`` is a second distribution
    # (after the sampler pipeline) beside ``raw_prob`` or the one number a server sent for the token.
    @property
    def has_probs(self) -> bool:
        return True

    @property
    def two_distributions(self) -> bool:
        return True


@dataclass(frozen=True)
class BeamSequence:
    """A sequence a strategy returned (beam search returns several, best first)."""

    token_ids: tuple[int, ...]  # generated tokens only
    text: str
    score: float  # length-normalised, as transformers' sequences_scores
    sum_logprobs: float


@dataclass(frozen=True)
class RunFinished:
    """Last event of every run that was not stopped by an error."""

    type: ClassVar[str] = "done"
    token_ids: tuple[int, ...]  # generated tokens only
    text: str
    stop_reason: StopReason
    tokens_per_s: float
    prefill_ms: float
    decode_ms: float
    prompt_tokens: int
    model_name: str
    model_path: str
    device: str
    dtype: str
    sequences: tuple[BeamSequence, ...] = ()  # beam search: returned sequences, best first
    # Figures a strategy measured over the whole run, by name (speculative decoding: "acceptance_rate",
    # "mean_accepted", "target_calls", ...); empty for strategies that have none.
    figures: dict[str, float] = field(default_factory=dict)
    # End-of-run measurements the settings asked for that Stop skipped or cut short (their figures are left out):
    # "baseline" (plain greedy's speed), "full_model" (the full model's own decode, compared), "no_cache" (the
    # KV lab's decode without a cache), "batch_sweep" (its batch sizes; the sizes measured before Stop are kept),
    # "log_likelihood" (side by side), "salience" (--salience's maps); and what a run needed before its first
    # step: "quantized_copy" (Stop came while it was built: nothing was decoded or kept), "small_model" (Stop
    # came while a separate small model was loaded: the drafter's, the amateur's or the cheap model's),
    # "amateur_prefill" (the contrastive amateur's prompt read).
    # Empty when nothing was cut.
    cut_short: tuple[str, ...] = ()
    # Why the run ended, in words, where the reason needs them (a constraint's: what it could not do); "" otherwise.
    stop_note: str = ""
