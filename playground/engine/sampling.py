"""Greedy decoding and sampling, one token per step over the model's KV cache, every intermediate recorded.

Prefill runs the whole prompt once and fills the cache; each later step feeds only the newest token, or with it the
tokens a constraint fixes from there (``playground.engine.fast_forward``: one pass for all of them). With guidance
on, a second context (the negative prompt, then every generated token) runs beside it with its own cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any

import torch

from playground.config import ConfigError, RunSettings
from playground.engine.bans import BanGuard, blocked_note, check_croppable
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.fast_forward import FastForward
from playground.engine.forward import prefill
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.processors import NamedTransform, SamplerRun, build_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_context import Chooser, RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.engine.samplers.ban import Ban
from playground.engine.step_analysis import StepAnalysis, analyse_step
from playground.engine.token_text import TokenTextCache
from playground.events import Event
from playground.models.loaded import LoadedModel


def sample_next_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from ``probs`` ([1, vocab], rows sum to 1) with an explicit generator."""
    return int(torch.multinomial(probs, num_samples=1, generator=generator).item())


make_generator = RunContext.generator


def run_sampling(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None,
                 chooser: Chooser | None = None) -> Iterator[Event]:
    """Greedy (``strategy="greedy"``) or sampling (``strategy="sample"``) as a stream of events; the context's
    ``chooser`` (or ``chooser``): the user picks each token (step mode).

    Settings are checked before the first event (``ConfigError``); the events come from the returned generator.
    """
    context = RunContext.of(context)  # the run's context, or one around a plain stop check
    if chooser is not None:
        context = dataclasses.replace(context, chooser=chooser)
    settings.validate()
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    check_fits_context(lm, len(prompt_ids), settings)
    sampling = settings.strategy == "sample"
    run = SamplerRun.of(settings, context.generator(lm.device, settings.seed), sampling=sampling)
    # Built here, so a setting the vocabulary refuses (a logit bias on no token) fails before the first event.
    pipeline = build_pipeline(settings, sampling=sampling, tokenizer=lm.tokenizer,
                              vocab_size=lm.model.config.vocab_size, run=run, eos_ids=lm.eos_token_ids)
    negative = _negative_context(lm, settings, prompt_ids) if any(t.name == "guidance" for t in pipeline) else None
    # The loop (and its observers: the lens refuses a tuned kind never trained) is made before the first event.
    loop = DecodeLoop(lm, settings, RunRecorder(lm, settings, context), prompt_ids, prompt_text)
    ban = next((s for s in run.samplers if isinstance(s, Ban)), None)
    if ban is not None:  # phrase bans: the loop rolls the run back where a banned phrase began
        if negative is not None:
            raise ConfigError("phrase bans (--ban, --ban-regex) do not roll guidance's negative context back: use "
                              "one or the other")
        check_croppable(lm)
        loop.guard = run.ban_guard = BanGuard(ban, run.samplers, TokenTextCache(lm.tokenizer), run.generator)
    return _decode(lm, settings, loop, pipeline, run, negative)


class NegativeContext:
    """Classifier-free guidance's second context, as transformers' ``UnbatchedClassifierFreeGuidanceLogitsProcessor``
    runs it: the negative prompt read once, then each generated token, in its own KV cache."""

    def __init__(self, lm: LoadedModel, ids: list[int]) -> None:
        self.lm = lm
        self.unread: torch.Tensor | None = torch.tensor([ids], device=lm.device)  # [1, n], read by the first step
        self.cache: Any = None  # a DynamicCache once the negative context is read

    def next_logits(self, last: torch.Tensor) -> torch.Tensor:
        """The next-token logits [1, vocab] after the negative context and ``last`` ([1, 1], the newest token)."""
        if self.unread is not None:
            logits, self.cache = prefill(self.lm.model, self.unread)
            self.unread = None
            return logits.float()
        return self.lm.model(input_ids=last, cache=self.cache, use_cache=True).logits[:, -1, :].float()


def _negative_context(lm: LoadedModel, settings: RunSettings, prompt_ids: list[int]) -> NegativeContext:
    if not settings.negative_prompt.strip():
        return NegativeContext(lm, prompt_ids[-1:])  # transformers' unconditional context: the last token alone
    ids, _ = encode_prompt(lm, settings.replace(prompt=settings.negative_prompt))
    if len(ids) + settings.max_new_tokens > lm.context_length:
        raise ConfigError(f"the negative prompt is {len(ids)} tokens: with {settings.max_new_tokens} new tokens it "
                          f"does not fit {lm.name}'s {lm.context_length}; shorten it")
    return NegativeContext(lm, ids)


def _decode(lm: LoadedModel, settings: RunSettings, loop: DecodeLoop, pipeline: tuple[NamedTransform, ...],
            run: SamplerRun, negative: NegativeContext | None) -> Iterator[Event]:
    sampling = settings.strategy == "sample"
    token_text = TokenTextCache(lm.tokenizer)
    chooser = loop.context.chooser

    passes = FastForward(lm, loop, run.grammar)  # a constraint's fixed tokens go through the model in one pass

    def step(index: int, forced: int | None) -> Picked:
        fixed = None  # the token the constraint fixed here, when the pass fed it (a fast-forward step)
        if index > 0 or loop.deferred:  # else the prefill's logits (it read the whole prompt)
            logits, fixed = passes.next_logits()
        else:
            assert loop.logits is not None  # the prefill read the whole prompt
            logits = loop.logits
        if negative is not None:
            run.negative_logits = negative.next_logits(loop.ids.last)
        ask = None
        if chooser is not None and forced is None:
            def ask(a: StepAnalysis) -> int | None:
                return chooser(a.to_event(step=index, text=token_text(a.token_id), forced=False, step_ms=0.0,
                                          kv_bytes=0, token_text=token_text))
        analysis = _choose(pipeline, loop.ids.view, logits, settings, sampling, run, forced, ask)
        if analysis is None:  # the user ended the run instead of choosing
            return Picked([], lambda texts, ms: [], stopped=True)
        if "blocked" in analysis.extra:  # the constraint left no token to take: the run ends here, with why
            return Picked([], lambda texts, ms: [], ends=("grammar_blocked", analysis.extra["blocked"]))
        if "ban_blocked" in analysis.extra:  # the bans' rollbacks forbade every token left here
            return Picked([], lambda texts, ms: [], ends=("ban_blocked", analysis.extra["ban_blocked"]))
        chose_other = analysis.extra.get("chosen_by_user", False)
        if fixed is not None and analysis.token_id == fixed and analysis.grammar is not None:
            analysis.grammar = dataclasses.replace(analysis.grammar, fast_forward=True)

        def events(texts: list[str], step_ms: float) -> list[Event]:
            return [analysis.to_event(step=index, text=texts[0], forced=forced is not None or chose_other,
                                      step_ms=step_ms, kv_bytes=kv_cache_bytes(loop.cache), token_text=token_text)]

        ends = run.grammar.finished() if run.grammar is not None else None
        return Picked([analysis.token_id], events, logits=logits, ends=ends)

    yield loop.started()
    with torch.inference_mode():
        if (yield from loop.prefill()):
            yield from loop.steps(step)
    if run.grammar is not None and loop.stop_reason == loop.budget_reason and run.grammar.incomplete():
        loop.stop_reason, loop.stop_note = "grammar_incomplete", run.grammar.incomplete()
    yield loop.finished(figures=loop.guard.figures() if loop.guard is not None else None)


def _choose(
    pipeline: tuple[NamedTransform, ...], ids: torch.Tensor, logits: torch.Tensor, settings: RunSettings,
    sampling: bool, run: SamplerRun, forced_id: int | None,
    ask: Callable[[StepAnalysis], int | None] | None = None,
) -> StepAnalysis | None:
    """Run the processors, pick the token (forced, argmax or a draw) and record what each processor did; ``ask``
    (step mode) is shown the strategy's pick and returns the token taken, or None to stop (then None)."""
    mu = run.mirostat.mu if run.mirostat is not None else None  # the cut this step's mirostat applies
    analysis = analyse_step(pipeline, ids, logits, settings.num_candidates, record=settings.record_candidates)
    guard = run.ban_guard
    if guard is not None and forced_id is None and guard.ban.forbidden.get(guard.ban.position) and not bool(
            torch.isfinite(analysis.processed_logits).any()):
        analysis.extra["ban_blocked"] = blocked_note(guard.ban, guard.ban.position)
        return analysis
    grammar = run.grammar
    if grammar is not None:
        top = analysis.top_ids[0] if analysis.top_ids else int(logits.argmax(dim=-1).item())
        analysis.grammar = grammar.step_record(analysis.raw_probs(), top, shown=analysis.top_ids)
        if forced_id is None and not bool(torch.isfinite(analysis.processed_logits).any()):
            analysis.extra["blocked"] = (
                f"no token is left: the constraint allows {analysis.grammar.allowed} here and the other samplers "
                "removed them all" if analysis.grammar.allowed else "the constraint allows no token here")
            return analysis
    if forced_id is not None:
        token_id = forced_id
    elif sampling:
        token_id = analysis.draw(run.generator)
    else:
        token_id = int(analysis.processed_logits.argmax(dim=-1).item())
    analysis.token_id = token_id
    if ask is not None:
        taken = ask(analysis)
        if taken is None:
            return None
        analysis.extra["chosen_by_user"] = taken != token_id
        analysis.token_id = token_id = taken
    analysis.mirostat_mu = mu
    if run.samplers:  # each sampler's state follows the token taken (mirostat's mu, Adaptive-P's average)
        run.accept(token_id, float(analysis.processed_probs[0, token_id].item()))
    return analysis
