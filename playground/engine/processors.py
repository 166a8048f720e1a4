"""A run's sampler chain: ``build_pipeline`` builds each declared sampler's engine object
(``playground.engine.samplers``) in the run's order; ``run_pipeline`` applies them; ``SamplerRun`` is what a
strategy that carries the stateful samplers (greedy and sample) hands them: the run's generator, the strategy's
per-step inputs (guidance's negative logits) and ``accept`` after each chosen token.

The transformers processors' functions live in their samplers' modules (``playground.engine.samplers.top_k``, ...;
importable from here).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from playground.config import RunSettings
from playground.config.errors import ConfigError
from playground.config.samplers import SPECS, active_samplers
from playground.engine.samplers import ENGINE_SAMPLERS, BuildContext, MirostatState, Sampler
from playground.engine.samplers.grammar import Grammar
from playground.engine.samplers.min_p import keep_min_p
from playground.engine.samplers.mirostat import Mirostat
from playground.engine.samplers.no_repeat_ngram import ban_repeated_ngrams
from playground.engine.samplers.repetition_penalty import apply_repetition_penalty
from playground.engine.samplers.temperature import apply_temperature
from playground.engine.samplers.top_k import keep_top_k
from playground.engine.samplers.top_p import FAST_TOP, FAST_VOCAB, keep_top_p

NamedTransform = Sampler  # a chain's stage: ``name`` and ``apply`` (the strategies' annotations use this name)

__all__ = ["FAST_TOP", "FAST_VOCAB", "NamedTransform", "SamplerRun", "apply_repetition_penalty", "apply_temperature",
           "ban_repeated_ngrams", "build_pipeline", "keep_min_p", "keep_top_k", "keep_top_p", "run_pipeline"]


@dataclass
class SamplerRun:
    """What a run's stateful samplers share with the strategy. Only a strategy that feeds it (greedy and sample)
    can use the samplers that need it (XTC, mirostat, guidance, Adaptive-P: ``SamplerSpec.needs_run``); the others
    are refused them by name (``build_pipeline`` without one)."""

    generator: torch.Generator  # XTC's draws come from the run's own seeded generator: runs are reproducible
    negative_logits: torch.Tensor | None = None  # guidance's hook: this step's logits after the negative prompt
    samplers: list[Sampler] = field(default_factory=list)  # the chain built with this run, in order
    ban_guard: Any = None  # phrase bans' rollbacks (``playground.engine.bans.BanGuard``), when the run has bans

    @classmethod
    def of(cls, settings: RunSettings, generator: torch.Generator, *, sampling: bool) -> SamplerRun:
        return cls(generator=generator)

    @property
    def mirostat(self) -> MirostatState | None:
        """Mirostat's state when the chain has it (its mu is recorded with each step)."""
        return next((s.state for s in self.samplers if isinstance(s, Mirostat)), None)

    @property
    def grammar(self) -> Grammar | None:
        """The constraint when the chain has one (its mask is recorded with each step; it may end the run)."""
        return next((s for s in self.samplers if isinstance(s, Grammar)), None)

    def accept(self, token_id: int, prob: float) -> None:
        """The run took ``token_id`` (probability ``prob`` under the processed distribution): each sampler's state
        follows it."""
        for sampler in self.samplers:
            sampler.accept(token_id, prob)


def _build(name: str, s: RunSettings, context: BuildContext, carried: tuple[str, ...] = ()) -> Sampler:
    spec = SPECS[name]
    if spec.needs_run and context.run is None and name not in carried:
        raise ConfigError(f"{name} is not available with the {s.strategy} strategy ({spec.needs_run}); use "
                          "greedy or sample, or switch it off")
    cls = ENGINE_SAMPLERS.get(name)
    if cls is None:
        raise ConfigError(f"{name} is declared but this engine has no sampler for it")
    return cls.build(s, context)


def build_pipeline(settings: RunSettings, *, sampling: bool, tokenizer: object = None, vocab_size: int | None = None,
                   run: SamplerRun | None = None, part: str = "all", eos_ids: tuple[int, ...] = (),
                   carried: tuple[str, ...] = ()) -> tuple[Sampler, ...]:
    """The samplers a run applies, in the settings' order (``samplers``; transformers' order by default).

    The penalties, DRY, logit bias and guidance apply to every strategy; the samplers that shape the distribution a
    token is drawn from (the declarations' ``sampling_only``: temperature, top-k/p, min-p, ...) only when
    ``sampling`` (as in ``generate``, where greedy and beam search ignore them); a selecting sampler (Adaptive-P)
    goes last. ``tokenizer``: to read words (logit bias, DRY's breakers); ``run``: the state the stateful samplers
    need (strategies without one are refused them); ``eos_ids``: the model's end tokens (a constraint's). ``part``:
    "penalties" or "sampler" for a strategy that applies the two apart (contrastive search), which refuses an order
    that mixes them. ``carried``: stateful samplers a strategy without a ``run`` carries itself (speculative
    decoding follows a constraint's matcher through its drafts).
    """
    s = settings
    active = active_samplers(s, sampling)
    if part != "all":
        first_sampler = next((k for k, name in enumerate(active) if SPECS[name].sampling_only), len(active))
        late = [name for name in active[first_sampler:] if not SPECS[name].sampling_only]
        if late:
            raise ConfigError(f"the {s.strategy} strategy applies the penalties before its sampler; the order puts "
                              f"{', '.join(late)} after {active[first_sampler]}")
        active = [name for name in active if SPECS[name].sampling_only == (part == "sampler")]
    context = BuildContext(tokenizer=tokenizer, vocab_size=vocab_size, run=run, strategy=s.strategy,
                           eos_ids=tuple(eos_ids))
    pipeline = tuple(_build(name, s, context, carried) for name in active)
    if run is not None:
        run.samplers.extend(pipeline)
    return pipeline


def run_pipeline(pipeline: tuple[Sampler, ...], ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    for step in pipeline:
        logits = step.apply(ids, logits)
    return logits
