"""Logit transforms as pure functions ``(ids, logits) -> logits`` that never modify their input.

``ids``: [batch, seq] token ids so far (prompt + generated), ``logits``: [batch, vocab]. The four here follow the
transformers logits processor of the same name (checked against it in tests); the others live in
``playground.engine.samplers``. ``build_pipeline`` binds each one's settings, in the run's order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from playground.config import RunSettings
from playground.config.errors import ConfigError
from playground.config.samplers import SAMPLING_ONLY, parse_sampler_order, sampler_is_on
from playground.engine.samplers import (
    MirostatState,
    apply_dry,
    apply_dynamic_temperature,
    apply_presence_frequency_penalties,
    apply_sequence_bias,
    breaker_token_ids,
    combine_guidance,
    exclude_top_choices,
    keep_above_epsilon,
    keep_above_eta,
    keep_top_n_sigma,
    keep_typical,
    resolve_logit_bias,
    truncate_by_surprise,
)

LogitTransform = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def apply_repetition_penalty(ids: torch.Tensor, logits: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL's penalty: a token already in ``ids`` has its logit divided by ``penalty`` (multiplied if negative)."""
    seen = torch.gather(logits, 1, ids)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return logits.scatter(1, ids, seen)


def ban_repeated_ngrams(ids: torch.Tensor, logits: torch.Tensor, ngram_size: int) -> torch.Tensor:
    """Forbid any token that would complete an n-gram already present in ``ids``."""
    seq_len = ids.shape[1]
    if seq_len < ngram_size:
        return logits
    # windows: [batch, n_windows, n]; a window whose first n-1 tokens equal the current suffix bans its last token
    windows = ids.unfold(1, ngram_size, 1)
    suffix = ids[:, seq_len - ngram_size + 1 :]
    matches = (windows[..., :-1] == suffix.unsqueeze(1)).all(dim=-1)  # [batch, n_windows]
    rows, at = matches.nonzero(as_tuple=True)  # the matching windows: a few, against the whole vocabulary
    out = logits.clone()
    out[rows, windows[rows, at, -1]] = float("-inf")
    return out


def apply_temperature(ids: torch.Tensor, logits: torch.Tensor, temperature: float) -> torch.Tensor:
    return logits / temperature


def keep_top_k(ids: torch.Tensor, logits: torch.Tensor, top_k: int, min_keep: int = 1) -> torch.Tensor:
    """Keep the ``top_k`` highest logits (ties with the k-th are kept too)."""
    k = min(max(top_k, min_keep), logits.shape[-1])
    kth = torch.topk(logits, k).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


def keep_top_p(ids: torch.Tensor, logits: torch.Tensor, top_p: float, min_keep: int = 1) -> torch.Tensor:
    """Nucleus: keep the smallest set of most likely tokens whose probability reaches ``top_p``."""
    if logits.shape[-1] > FAST_VOCAB:
        fast = _top_p_among_top(logits, top_p, min_keep)
        if fast is not None:
            return fast
    sorted_logits, order = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cumulative <= (1 - top_p)
    remove_sorted[..., -min_keep:] = False
    remove = remove_sorted.scatter(1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))


# Above this vocabulary, top-p first looks among the 256 likeliest tokens (llama.cpp's adaptive sort): sorting the
# whole vocabulary costs ~8 ms on 49k tokens, a tenth of a decode step.
FAST_VOCAB, FAST_TOP = 1024, 256


def _top_p_among_top(logits: torch.Tensor, top_p: float, min_keep: int) -> torch.Tensor | None:
    """Top-p decided among the likeliest ``FAST_TOP`` tokens, or None when the nucleus may reach past them."""
    probs = logits.softmax(dim=-1)
    top_probs, top_ids = probs.topk(FAST_TOP, dim=-1)  # descending
    tail = probs.sum(dim=-1, keepdim=True) - top_probs.sum(dim=-1, keepdim=True)  # the mass outside them
    if bool((tail >= (1 - top_p) * 0.999).any()) or min_keep > FAST_TOP:
        return None  # some token outside might be kept: the full sort decides
    cumulative = tail + top_probs.flip(-1).cumsum(dim=-1)  # ascending, as the full sort adds them up
    keep_sorted = (cumulative > (1 - top_p)).flip(-1)
    keep_sorted[..., :min_keep] = True
    keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, top_ids, keep_sorted)
    return logits.masked_fill(~keep, float("-inf"))


def keep_min_p(ids: torch.Tensor, logits: torch.Tensor, min_p: float, min_keep: int = 1) -> torch.Tensor:
    """Keep tokens whose probability is at least ``min_p`` times the top token's probability."""
    probs = logits.softmax(dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    keep = torch.topk(probs, min(min_keep, probs.shape[-1]), dim=-1).indices
    remove = remove.scatter(-1, keep, False)
    return logits.masked_fill(remove, float("-inf"))


@dataclass(frozen=True)
class NamedTransform:
    name: str
    apply: LogitTransform


@dataclass
class SamplerRun:
    """What a run's stateful samplers carry from step to step. Only a strategy that feeds it (greedy and sample)
    can use XTC, mirostat and guidance; the others are refused them by name (``build_pipeline`` without one)."""

    generator: torch.Generator  # XTC's draws come from the run's own seeded generator: runs are reproducible
    mirostat: MirostatState | None = None
    negative_logits: torch.Tensor | None = None  # guidance: this step's logits after the negative prompt [1, vocab]

    @classmethod
    def of(cls, settings: RunSettings, generator: torch.Generator, *, sampling: bool) -> SamplerRun:
        on = sampling and settings.mirostat == 2  # a sampling-only sampler: greedy carries no mu
        mirostat = MirostatState.start(settings.mirostat_tau, settings.mirostat_eta) if on else None
        return cls(generator=generator, mirostat=mirostat)

    def chose(self, prob: float) -> None:
        """The token was chosen with probability ``prob`` under the processed distribution."""
        if self.mirostat is not None:
            self.mirostat.update(prob)


# Why a stateful sampler needs a strategy that carries it, for the refusal.
_NEEDS_RUN = {"xtc": "its draw comes from the run's generator", "mirostat": "its mu follows the chosen tokens",
              "guidance": "it needs a second forward pass of the negative prompt"}


def _transform(name: str, s: RunSettings, tokenizer: Any, vocab_size: int | None,
               run: SamplerRun | None) -> NamedTransform:
    if name in _NEEDS_RUN and run is None:
        raise ConfigError(f"{name} is not available with the {s.strategy} strategy ({_NEEDS_RUN[name]}); use "
                          "greedy or sample, or switch it off")
    if name == "guidance":
        assert run is not None

        def guide(i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            assert run.negative_logits is not None, "the strategy runs the negative prompt before the pipeline"
            return combine_guidance(x, run.negative_logits, s.guidance_scale)

        return NamedTransform("guidance", guide)
    if name == "logit_bias":
        size = vocab_size if vocab_size is not None else (len(tokenizer) if tokenizer is not None else 2**31)
        biases = resolve_logit_bias(s.logit_bias, tokenizer, size)
        return NamedTransform("logit_bias", lambda i, x: apply_sequence_bias(i, x, biases))
    if name == "repetition_penalty":
        return NamedTransform(name, lambda i, x: apply_repetition_penalty(i, x, s.repetition_penalty))
    if name == "no_repeat_ngram":
        return NamedTransform(name, lambda i, x: ban_repeated_ngrams(i, x, s.no_repeat_ngram_size))
    if name == "penalties":
        return NamedTransform(name, lambda i, x: apply_presence_frequency_penalties(
            i, x, s.presence_penalty, s.frequency_penalty))
    if name == "dry":
        if tokenizer is None and s.dry_sequence_breakers:
            raise ConfigError(f"DRY's sequence breakers are words, which the {s.strategy} strategy cannot read here")
        breakers = breaker_token_ids(s.dry_sequence_breakers, tokenizer) if s.dry_sequence_breakers else frozenset()
        return NamedTransform(name, lambda i, x: apply_dry(i, x, s.dry_multiplier, s.dry_base,
                                                           s.dry_allowed_length, breakers))
    if name == "temperature":
        if s.dynatemp_range > 0:
            return NamedTransform("dynatemp", lambda i, x: apply_dynamic_temperature(
                i, x, s.temperature, s.dynatemp_range, s.dynatemp_exponent))
        return NamedTransform(name, lambda i, x: apply_temperature(i, x, s.temperature))
    if name == "xtc":
        assert run is not None
        generator = run.generator

        def xtc(i: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            # llama.cpp draws once per step and cuts when the draw is within the probability.
            draw = float(torch.rand((), generator=generator, device=generator.device).item())
            return exclude_top_choices(i, x, s.xtc_threshold) if draw < s.xtc_probability else x

        return NamedTransform(name, xtc)
    if name == "mirostat":
        assert run is not None and run.mirostat is not None
        state = run.mirostat
        return NamedTransform(name, lambda i, x: truncate_by_surprise(i, x, state.mu))
    simple: dict[str, LogitTransform] = {
        "top_k": lambda i, x: keep_top_k(i, x, s.top_k),
        "top_p": lambda i, x: keep_top_p(i, x, s.top_p),
        "min_p": lambda i, x: keep_min_p(i, x, s.min_p),
        "typical_p": lambda i, x: keep_typical(i, x, s.typical_p),
        "epsilon_cutoff": lambda i, x: keep_above_epsilon(i, x, s.epsilon_cutoff),
        "eta_cutoff": lambda i, x: keep_above_eta(i, x, s.eta_cutoff),
        "top_n_sigma": lambda i, x: keep_top_n_sigma(i, x, s.top_n_sigma),
    }
    return NamedTransform(name, simple[name])


def build_pipeline(settings: RunSettings, *, sampling: bool, tokenizer: Any = None, vocab_size: int | None = None,
                   run: SamplerRun | None = None, part: str = "all") -> tuple[NamedTransform, ...]:
    """The processors a run applies, in the settings' order (``samplers``; transformers' order by default).

    The penalties, DRY, logit bias and guidance apply to every strategy; the samplers that shape the distribution a
    token is drawn from (temperature, top-k/p, min-p, typical, epsilon, eta, top-nσ, XTC, mirostat) only when
    ``sampling`` (as in ``generate``, where greedy and beam search ignore them). ``tokenizer``: to read words (logit
    bias, DRY's breakers); ``run``: the state XTC, mirostat and guidance need (strategies without one are refused
    them). ``part``: "penalties" or "sampler" for a strategy that applies the two apart (contrastive search),
    which refuses an order that mixes them.
    """
    s = settings
    active = [name for name in parse_sampler_order(s.samplers)
              if sampler_is_on(s, name) and (sampling or name not in SAMPLING_ONLY)]
    if part != "all":
        first_sampler = next((k for k, name in enumerate(active) if name in SAMPLING_ONLY), len(active))
        late = [name for name in active[first_sampler:] if name not in SAMPLING_ONLY]
        if late:
            raise ConfigError(f"the {s.strategy} strategy applies the penalties before its sampler; the order puts "
                              f"{', '.join(late)} after {active[first_sampler]}")
        active = [name for name in active if (name in SAMPLING_ONLY) == (part == "sampler")]
    return tuple(_transform(name, s, tokenizer, vocab_size, run) for name in active)


def run_pipeline(pipeline: tuple[NamedTransform, ...], ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    for step in pipeline:
        logits = step.apply(ids, logits)
    return logits
