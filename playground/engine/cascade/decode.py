"""Cascade inference: the cheap model answers first, the full model takes over where the cheap one is unsure.

Per token: every step the cheap model proposes a token; when its probability for it (after the sampler pipeline)
is below the threshold, the full model decides that token instead. Each model reads every emitted token, lazily:
the cheap model reads the previous token at every step (whoever chose it), so its cache never holds a token that was
not emitted and nothing is ever rolled back; the full model reads only when it is asked, all the positions it
missed in one pass (the prompt, at its first escalation, in chunks for a long prompt). A run whose cheap model is
always sure never runs the full model at all, its prompt included.

Per response: the cheap model writes the whole response (until EOS, a stop string or the budget); when the mean
of its token probabilities is below the threshold, the response is thrown away and the full model writes its own
from the prompt. The mean, not the minimum: one unsure token in a long, confident answer is common and usually
harmless, and the mean reads on the same scale as the per-token threshold.

Greedy (each model takes its top token) or sampled with the run's seed (each draws from its processed
distribution: the cheap model draws first, the full model draws again when it decides). The comparison at the end
decodes as many tokens with the full model alone (same prompt, settings and seed).

A constraint masks both models' distributions alike (one text, one matcher): the cheap model's probability, and so
the escalation, is under the mask; a per-response draft that is thrown away resets the matcher to the prompt's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator
from typing import Any, cast

import torch

from playground.config import CascadeSettings, RunSettings
from playground.engine.cascade.models import CheapModel, ModelSide, make_cheap_model, weight_macs
from playground.engine.constraint import blocked, constrained_chain
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.forward import sync_device
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.processors import NamedTransform
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_context import NO_CONTEXT, RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.engine.sampling import make_generator, sample_next_token
from playground.engine.step_analysis import StepAnalysis, analyse_step
from playground.engine.token_text import TokenTextCache
from playground.engine.variants import BuildStopped
from playground.events import Event, StopReason, TokenStep
from playground.events.cascade import CHEAP, FORCED, FULL, CascadeResponse, CascadeStarted, CascadeStep
from playground.events.figures import agreement_figures
from playground.models.anatomy import layer_count
from playground.models.loaded import LoadedModel


def run_cascade(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None
                ) -> Iterator[Event]:
    """Cascade inference as a generator of events. Settings, prompt and the cheap model are checked (and the cheap
    model built, reporting the context's ``progress``, or loaded) before the generator is returned
    (``ConfigError``); Stop during that build returns a run that ends "stopped" at once."""
    settings.validate()
    cascade = settings.group(CascadeSettings)
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    check_fits_context(lm, len(prompt_ids) + len(settings.forced_token_ids), settings)
    context = RunContext.of(context)
    try:
        cheap = make_cheap_model(lm, cascade, context)
    except BuildStopped as stopped:
        record = RunRecorder(lm, settings, context, groups=(CascadeSettings,))
        return record.stopped_before_start(prompt_ids, prompt_text, (stopped.cut,))
    # The recorder's prefill reads the prompt with the cheap model: the full model reads it when first asked.
    record = RunRecorder(dataclasses.replace(lm, model=cheap.model), settings, context, groups=(CascadeSettings,))
    return _Cascade(lm, settings, cascade, cheap, record, prompt_ids).run(prompt_text)


def escalates(cheap_prob: float, threshold: float) -> bool:
    """The rule: the full model decides when the cheap model's probability is below the threshold (1: always)."""
    return cheap_prob < threshold or threshold >= 1.0


def choose(analysis: StepAnalysis, sample: bool, generator: torch.Generator) -> int:
    if sample:
        return sample_next_token(analysis.processed_probs, generator)
    return int(analysis.processed_logits.argmax(dim=-1).item())


def _ms_since(start: float, device: torch.device) -> float:
    sync_device(device)
    return (time.perf_counter() - start) * 1000


class _Cascade:
    def __init__(self, lm: LoadedModel, settings: RunSettings, cascade: CascadeSettings, cheap: CheapModel,
                 record: RunRecorder, prompt_ids: list[int]) -> None:
        self.lm, self.settings, self.cascade, self.cheap, self.record = lm, settings, cascade, cheap, record
        self.prompt_ids = prompt_ids
        self.sample = cascade.cascade_sample
        # A constraint masks both models' distributions alike (the text so far is one): whichever model picks, its
        # token is one the constraint allows (the cheap model's probability, and so the escalation, is the masked
        # one). It follows the emitted tokens; a per-response draft thrown away takes its tokens back.
        self.pipeline: tuple[NamedTransform, ...]
        self.pipeline, self.grammar = constrained_chain(settings, sampling=self.sample, tokenizer=lm.tokenizer,
                                                        vocab_size=lm.model.config.vocab_size,
                                                        eos_ids=lm.eos_token_ids)
        self.generator = make_generator(lm.device, settings.seed)
        self.token_text = TokenTextCache(lm.tokenizer)
        self.eos_ids = set(lm.eos_token_ids)
        self.max_steps = min(settings.max_new_tokens, lm.context_length - len(prompt_ids))
        self.budget_reason: StopReason = "max_new_tokens" if self.max_steps == settings.max_new_tokens \
            else "context_full"
        self.stop_reason: StopReason = self.budget_reason  # until the run ends otherwise
        self.stop_note = ""  # why, in words, where the reason needs them (a constraint's)
        self.ms = {CHEAP: 0.0, FULL: 0.0}  # every pass of each model, a thrown-away response's included

    def run(self, prompt_text: str) -> Iterator[Event]:
        lm, cascade = self.lm, self.cascade
        yield self.record.started(self.prompt_ids, prompt_text)
        layers = layer_count(lm.model)
        yield CascadeStarted(
            unit=cascade.cascade_unit, threshold=cascade.cascade_threshold, cheap=self.cheap.kind,
            cheap_detail=self.cheap.detail, full_detail=f"{lm.name}, {layers} layers, {lm.dtype_name}",
            cheap_macs=weight_macs(self.cheap.model), full_macs=weight_macs(lm.model), do_sample=self.sample,
            compare=cascade.cascade_compare)
        output: list[CascadeStep] = []
        with torch.inference_mode():
            prefilled = yield from self.record.prefill(torch.tensor([self.prompt_ids], device=lm.device))
            if prefilled is None:
                self.stop_reason, cheap, full = "stopped", None, None
            else:
                logits, cache = prefilled
                assert logits is not None  # nothing deferred
                cheap = ModelSide(self.cheap.model, lm.device, cache, logits.float())
                full = ModelSide(lm.model, lm.device)
                if cascade.cascade_unit == "token":
                    for step, token in self._steps(cheap, full, cascade.cascade_threshold):
                        output.append(step)
                        yield step
                        yield token
                else:
                    yield from self._per_response(cheap, full, output)
        generated = [s.token_id for s in output]
        alone = self._full_model_alone(output, cheap, full)
        cut_short = ("full_model",) if alone is None and self.cascade.cascade_compare and output else ()
        if cut_short:
            self.stop_reason = "stopped"
        finished = self.record.finished(generated, lm.tokenizer.decode(generated, skip_special_tokens=True),
                                        self.stop_reason, steps=len(generated))
        figures = self._figures(output, cheap, full, finished.prefill_ms + finished.decode_ms, alone)
        yield dataclasses.replace(finished, figures=figures, cut_short=cut_short,
                                  stop_note="" if cut_short else self.stop_note)

    def _full_model_alone(self, output: list[CascadeStep], cheap: ModelSide | None, full: ModelSide | None
                          ) -> tuple[list[int], float] | None:
        """The comparison's decode by the full model alone, when asked; None when not asked, or Stop cut it."""
        if not (self.cascade.cascade_compare and output and cheap is not None and full is not None) \
                or self.stop_reason == "stopped":
            return None
        return full_model_alone(self.lm, self.settings, self.prompt_ids, len(output), self.sample,
                                self.record.context)

    def _per_response(self, cheap: ModelSide, full: ModelSide, output: list[CascadeStep]) -> Iterator[Event]:
        """The cheap model's whole response, the verdict on it, then the output: that response or the full
        model's own."""
        drafted: list[tuple[CascadeStep, TokenStep]] = []
        for step, token in self._steps(cheap, None, 0.0, draft=True):
            drafted.append((step, token))
            yield step
        judged = [s.cheap_prob for s, _ in drafted if s.producer != FORCED and s.cheap_prob is not None]
        if self.stop_reason == "stopped":  # no verdict on a response Stop cut short: what was written stands
            kept = drafted
        else:
            mean = sum(judged) / len(judged) if judged else 1.0
            escalated = escalates(mean, self.cascade.cascade_threshold) and bool(judged)
            yield CascadeResponse(tokens=len(judged), drafted=len(drafted), mean_prob=mean,
                                  min_prob=min(judged, default=1.0), threshold=self.cascade.cascade_threshold,
                                  escalated=escalated, draft_ms=sum(t.step_ms for _, t in drafted))
            kept = [] if escalated else drafted
            if escalated:
                self.stop_reason = self.budget_reason  # the full model's response starts afresh
                if self.grammar is not None:
                    self.grammar.reset()  # from the prompt again: the draft's tokens are not the text
                for step, token in self._steps(None, full, 1.0):
                    output.append(step)
                    yield step
                    yield token
        for step, token in kept:
            output.append(dataclasses.replace(step, draft=False))
            yield token

    def _steps(self, cheap: ModelSide | None, full: ModelSide | None, threshold: float,
               draft: bool = False) -> Iterator[tuple[CascadeStep, TokenStep]]:
        """Decode from the prompt on the one decode loop: per step, the cheap model proposes (when there is one)
        and the full model decides when the cheap one is unsure (or always, when there is no cheap model). Sets
        ``stop_reason``."""
        lm, settings, record = self.lm, self.settings, self.record
        loop = DecodeLoop(lm, settings, record, self.prompt_ids, "")

        def step(index: int, forced_id: int | None) -> Picked:
            forced = forced_id is not None
            ids = self.prompt_ids + loop.generated
            view = loop.ids.view  # [1, prompt + step]
            analysis = None
            cheap_token = cheap_prob = full_prob = None
            cheap_ms = full_ms = 0.0
            full_read = 0
            if cheap is not None:
                start = time.perf_counter()
                cheap_logits = cheap.next_logits(ids)  # no context: the cheap side's read is never stopped
                assert cheap_logits is not None  # never stopped
                analysis = analyse_step(self.pipeline, view, cheap_logits, settings.num_candidates)
                # At a forced step the cheap model's top token is recorded, with no draw (as greedy's forced steps).
                cheap_token = choose(analysis, self.sample and not forced, self.generator)
                cheap_prob = float(analysis.processed_probs[0, cheap_token])
                cheap_ms = _ms_since(start, lm.device)
            escalated = not forced and (cheap is None or escalates(cast(float, cheap_prob), threshold))
            if full is not None and (escalated or analysis is None):
                start, before = time.perf_counter(), full.read
                logits = full.next_logits(ids, record.context)
                if logits is None:  # Stop between the chunks of a long prompt
                    return Picked([], lambda texts, ms: [], stopped=True)
                full_read = len(ids) - before
                analysis = analyse_step(self.pipeline, view, logits, settings.num_candidates)
                token = forced_id if forced else choose(analysis, self.sample, self.generator)
                full_prob = float(analysis.processed_probs[0, token])
                full_ms = _ms_since(start, lm.device)
            else:
                token = forced_id if forced else cheap_token
            assert analysis is not None and token is not None  # the cheap model's step or the full model's
            grammar = self.grammar
            if grammar is not None and not forced and blocked(analysis.processed_logits):
                return Picked([], lambda texts, ms: [], ends=("grammar_blocked", "no token is left: the constraint "
                                                              "and the other samplers removed every one here"))
            ends = None
            if grammar is not None:  # what the mask did to the deciding model's raw distribution; then it follows
                analysis.grammar = grammar.step_record(analysis.raw_probs(), int(analysis.raw_logits.argmax()))
                grammar.accept(token, float(analysis.processed_probs[0, token]))
                ends = grammar.finished()
            analysis.token_id = token
            self.ms[CHEAP] += cheap_ms
            self.ms[FULL] += full_ms
            producer = FORCED if forced else FULL if escalated else CHEAP

            def events(texts: list[str], step_ms: float) -> list[Any]:  # (CascadeStep, TokenStep) pairs: see _steps
                kv_bytes = sum(kv_cache_bytes(side.cache) for side in (cheap, full) if side is not None)
                pair = (CascadeStep(
                    step=index, token_id=token, text=texts[0], producer=producer, escalated=escalated,
                    cheap_token_id=cheap_token, cheap_text=self.token_text(cheap_token) if cheap_token is not None
                    else "", cheap_prob=cheap_prob, full_prob=full_prob if escalated else None, full_read=full_read,
                    cheap_ms=cheap_ms, full_ms=full_ms, draft=draft),
                    analysis.to_event(step=index, text=texts[0], forced=forced, step_ms=step_ms, kv_bytes=kv_bytes,
                                      token_text=self.token_text))
                return [pair]  # the cascade step and its token: the per-response mode holds tokens back

            return Picked([token], events, ends=ends)

        yield from loop.steps(step)
        self.stop_reason, self.stop_note = loop.stop_reason, loop.stop_note
        if self.grammar is not None and self.stop_reason == loop.budget_reason and self.grammar.incomplete():
            self.stop_reason, self.stop_note = "grammar_incomplete", self.grammar.incomplete()

    def _figures(self, output: list[CascadeStep], cheap: ModelSide | None, full: ModelSide | None,
                 run_ms: float, alone_run: tuple[list[int], float] | None) -> dict[str, float]:
        n = len(output)
        if not n or cheap is None or full is None:
            return {}
        by = {who: sum(s.producer == who for s in output) for who in (CHEAP, FULL, FORCED)}
        stretches = sum(s.producer == FULL and (i == 0 or output[i - 1].producer != FULL) for i, s in enumerate(output))
        cheap_macs, full_macs = weight_macs(self.cheap.model), weight_macs(self.lm.model)
        alone_positions = len(self.prompt_ids) + n - 1  # the full model alone reads the prompt and all but the last
        spent = cheap_macs * cheap.read + full_macs * full.read
        figures = {
            "cheap_tokens": float(by[CHEAP]), "full_tokens": float(by[FULL]), "forced_tokens": float(by[FORCED]),
            "full_share": by[FULL] / n, "escalations": float(stretches),
            "cheap_passes": float(cheap.passes + self.record.prefill_passes), "full_passes": float(full.passes),
            "cheap_positions": float(cheap.read), "full_positions": float(full.read),
            "compute_saved": 1 - spent / (full_macs * alone_positions),
            "cheap_ms": self.ms[CHEAP], "full_ms": self.ms[FULL],
        }
        if alone_run is not None:
            alone, alone_ms = alone_run
            figures.update({
                **agreement_figures([s.token_id for s in output], alone),
                "tokens_per_s_with_prompt": n / (run_ms / 1000) if run_ms > 0 else 0.0,
                "full_alone_tokens_per_s": n / (alone_ms / 1000) if alone_ms > 0 else 0.0,
                "time_saved": 1 - run_ms / alone_ms if alone_ms > 0 else 0.0,
            })
        return figures


def full_model_alone(lm: LoadedModel, settings: RunSettings, prompt_ids: list[int], tokens: int, sample: bool,
                     context: RunContext = NO_CONTEXT) -> tuple[list[int], float] | None:
    """``tokens`` tokens of the full model alone after ``prompt_ids`` (forced tokens first; greedy, or sampled
    with the run's seed), each step timed as a cascade step is (forward pass, analysis, choice; not the event);
    returns them and the milliseconds it took, the prompt's pass included (as a cascade run's time includes its
    prompt). The context's Stop is polled before each step (and between a long prompt's chunks): None when it
    stopped the decode."""
    pipeline, grammar = constrained_chain(settings, sampling=sample, tokenizer=lm.tokenizer,
                                          vocab_size=lm.model.config.vocab_size, eos_ids=lm.eos_token_ids)
    generator = make_generator(lm.device, settings.seed)
    forced = settings.forced_token_ids
    ids = list(prompt_ids)
    side = ModelSide(lm.model, lm.device)
    chosen: list[int] = []
    with torch.inference_mode():
        sync_device(lm.device)
        start = time.perf_counter()
        for step in range(tokens):
            if context.stopped():
                return None
            read = torch.tensor([ids], device=lm.device)
            logits = side.next_logits(ids, context)
            if logits is None:  # Stop between the chunks of a long prompt
                return None
            analysis = analyse_step(pipeline, read, logits, settings.num_candidates)
            token = forced[step] if step < len(forced) else choose(analysis, sample, generator)
            chosen.append(token)
            ids.append(token)
            if grammar is not None:
                grammar.accept(token, 1.0)
                if grammar.finished() is not None:
                    break  # the constraint is complete (or cannot follow): the cascade's output ends here too
        ms = _ms_since(start, lm.device)
    return chosen, ms
