"""Contrastive decoding: each step the expert and an amateur read the same text; among the tokens the expert finds
plausible (p ≥ α · its top p), the one the expert prefers most *over the amateur* is chosen (or drawn).

The prompt but its last token is prefilled; every step then runs one expert pass (with the layer amateur, the same
pass yields the amateur's logits) and, with a separate amateur, one amateur pass — so every step's time compares
with a greedy step's. Each step yields a ``ContrastStep`` and then an ordinary ``TokenStep`` whose ``raw_*`` figures
are the expert's and whose ``processed_*`` figures are the normalised contrast distribution.

A constraint masks the expert with the penalties (``engine.constraint.constrained_chain``): the plausible set is the
allowed tokens within α of the best allowed one, a forbidden token scores −∞, and the step's ``TokenStep.grammar`` says
what the mask removed from the expert's raw distribution. (Masking only the final scores could leave no token: the
expert's whole plausible head can be forbidden.)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import torch

from playground.config import ConfigError, ContrastiveSettings, RunSettings
from playground.config.samplers.grammar import GrammarSettings
from playground.engine.baseline import plain_greedy
from playground.engine.constraint import blocked, constrained_chain
from playground.engine.contrastive.amateurs import Amateur, LayerAmateur, ModelAmateur
from playground.engine.contrastive.dola import DolaAmateur, candidate_layers
from playground.engine.contrastive.record import choose, step_events
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.layers.lens import LayerStack
from playground.engine.processors import build_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_context import NO_CONTEXT, RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.engine.sampling import make_generator
from playground.engine.token_text import TokenTextCache
from playground.engine.variants import BuildStopped, QuantizedCopy, SmallModel, detail, variant
from playground.events import Event
from playground.events.contrastive import ContrastiveStarted
from playground.events.figures import agreement_figures
from playground.models.anatomy import layer_count
from playground.models.loaded import LoadedModel


def run_contrastive(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None
                    ) -> Iterator[Event]:
    """Contrastive decoding as a generator of events. Settings and prompt are checked and the amateur is made (a
    quantized copy built, reporting the context's ``progress``, a model loaded) before the generator is returned
    (``ConfigError``); Stop during that build returns a run that ends "stopped" at once."""
    settings.validate()
    contrastive = settings.group(ContrastiveSettings)
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    check_fits_context(lm, len(prompt_ids) + len(settings.forced_token_ids), settings)
    context = RunContext.of(context)
    record = RunRecorder(lm, settings, context, groups=(ContrastiveSettings,))
    if settings.group(GrammarSettings).active():
        constrained_chain(settings, sampling=False, tokenizer=lm.tokenizer, vocab_size=lm.model.config.vocab_size,
                          eos_ids=lm.eos_token_ids, part="penalties")  # a constraint it cannot build: refused here
        # The greedy baseline (--contrast-baseline) keeps to the constraint too (engine.baseline.plain_greedy).
    try:
        amateur = make_amateur(lm, contrastive, len(prompt_ids) + settings.max_new_tokens, context)
    except BuildStopped as stopped:
        return record.stopped_before_start(prompt_ids, prompt_text, (stopped.cut,))
    return _decode(lm, settings, contrastive, amateur, prompt_ids, prompt_text, record)


def make_amateur(lm: LoadedModel, settings: ContrastiveSettings, positions: int,
                 context: RunContext = NO_CONTEXT) -> Amateur:
    """The amateur the settings name; ``positions``: the longest text it will read (checked for a model amateur).
    A model amateur's model comes from the variants' cache (built there, reporting the context's ``progress``;
    ``BuildStopped`` when its Stop comes during the build)."""
    if settings.amateur == "layer":
        stack = LayerStack.of(lm.model)  # "model" precision: the amateur's logits exactly as the model computes
        layer = settings.layer_for(stack.count)
        if not 1 <= layer < stack.count:
            raise ConfigError(f"amateur_layer must be between 1 and {stack.count - 1} for this {stack.count}-layer "
                              f"model (got {layer}; the last layer is the expert itself)")
        return LayerAmateur(stack, layer)
    if settings.amateur == "dola":
        stack = LayerStack.of(lm.model)
        tied = bool(getattr(lm.model.config.get_text_config(), "tie_word_embeddings", False))
        return DolaAmateur(stack, candidate_layers(settings.dola_layers, stack.count, tied), settings.dola_variant)
    if settings.amateur == "quantized":
        made = variant(lm, QuantizedCopy.quick(settings.amateur_quant), context)
        return ModelAmateur("quantized", made.model, detail(made, "the expert"))
    try:
        made = variant(lm, SmallModel(settings.amateur_model), context)
    except ConfigError as error:  # its message speaks of a draft model
        raise ConfigError(f"amateur model: {error}") from None
    small = made.loaded
    assert small is not None
    if positions > small.context_length:
        raise ConfigError(f"the amateur {small.name} reads at most {small.context_length} tokens; this run needs "
                          f"{positions}: shorten the prompt or max_new_tokens")
    return ModelAmateur("model", made.model, detail(made, "the expert"))


def dola_of(amateur: Amateur) -> tuple[int, tuple[float, ...]]:
    """The step's premature layer and each candidate's JSD (DoLa), or (-1, ())."""
    return (amateur.chosen, amateur.jsd) if isinstance(amateur, DolaAmateur) else (-1, ())


def _decode(lm: LoadedModel, settings: RunSettings, contrastive: ContrastiveSettings, amateur: Amateur,
            prompt_ids: list[int], prompt_text: str, record: RunRecorder) -> Iterator[Event]:
    penalties, grammar = constrained_chain(settings, sampling=False, tokenizer=lm.tokenizer,
                                           vocab_size=lm.model.config.vocab_size, eos_ids=lm.eos_token_ids,
                                           part="penalties")
    # The sampler's transforms (temperature, top-k, top-p, min-p, ...) act on the scores, after the penalties.
    sampler = (build_pipeline(settings, sampling=True, tokenizer=lm.tokenizer, part="sampler")
               if contrastive.contrast_sample else ())
    generator = make_generator(lm.device, settings.seed)
    penalty = contrastive.dola_repetition_penalty if isinstance(amateur, DolaAmateur) else 1.0
    token_text = TokenTextCache(lm.tokenizer)
    forced = settings.forced_token_ids
    loop = DecodeLoop(lm, settings, record, prompt_ids, prompt_text)
    changed = plausible_total = 0
    amateur_ms = 0.0
    amateur_prefill_ms: float | None = 0.0

    def step(index: int, forced_id: int | None) -> Picked:
        nonlocal changed, plausible_total, amateur_ms
        ids = loop.ids.view
        with amateur.expert_pass():
            logits = lm.model(input_ids=loop.ids.last, cache=loop.cache, use_cache=True).logits[0, -1].float()
        amateur_logits = amateur.next_logits(ids, logits)
        start = time.perf_counter()
        choice = choose(logits, amateur_logits, ids, penalties, sampler, contrastive, generator, penalty,
                        amateur.contrast)
        contrast_ms = (time.perf_counter() - start) * 1000
        if grammar is not None and forced_id is None and blocked(choice.contrast.scores):
            return Picked([], lambda texts, ms: [], ends=("grammar_blocked", "no token is left: the constraint "
                                                          "allows none the contrast can score here"))
        token_id = forced_id if forced_id is not None else choice.token_id
        contrast_event, analysis = step_events(choice, token_id, index, forced_id is not None,
                                               settings.num_candidates, token_text, amateur.ms, contrast_ms,
                                               *dola_of(amateur))
        ends = None
        if grammar is not None:  # what the mask did, against the expert's raw distribution; then it follows
            analysis.grammar = grammar.step_record(choice.raw.softmax(dim=-1), int(choice.raw.argmax()))
            grammar.accept(token_id, float(choice.probs[0, token_id]))
            ends = grammar.finished()
        changed += contrast_event.changed
        plausible_total += contrast_event.plausible_count
        amateur_ms += amateur.ms

        def events(texts: list[str], step_ms: float) -> list[Event]:
            return [contrast_event, analysis.to_event(step=index, text=texts[0], forced=forced_id is not None,
                                                      step_ms=step_ms, kv_bytes=kv_cache_bytes(loop.cache),
                                                      token_text=token_text)]

        return Picked([token_id], events, ends=ends)

    yield loop.started()
    yield ContrastiveStarted(amateur=amateur.kind, detail=amateur.detail, amateur_layer=amateur.layer,
                             layers=layer_count(lm.model), alpha=contrastive.alpha,
                             amateur_temperature=contrastive.amateur_temperature,
                             do_sample=contrastive.contrast_sample, expert_top=settings.num_candidates,
                             dola_layers=amateur.candidates if isinstance(amateur, DolaAmateur) else (),
                             dola_penalty=penalty,
                             dola_variant=amateur.variant if isinstance(amateur, DolaAmateur) else "")
    with torch.inference_mode():
        # Every step reads its newest token itself (the first step the prompt's last), so each step costs one pass.
        if (yield from loop.prefill(defer=1)):
            amateur_prefill_ms = yield from amateur.prefill(loop.ids.view[:, :-1], record.context)
            if amateur_prefill_ms is None:  # Stop between two chunks of the amateur's reading of the prompt
                loop.stop_reason = "stopped"
            yield from loop.steps(step)

    if grammar is not None and loop.stop_reason == loop.budget_reason and grammar.incomplete():
        loop.stop_reason, loop.stop_note = "grammar_incomplete", grammar.incomplete()
    generated = loop.generated
    stop_reason = loop.stop_reason
    n = len(generated)
    figures = {"changed_steps": float(changed), "changed_fraction": changed / n if n else 0.0,
               "mean_plausible": plausible_total / n if n else 0.0, "amateur_ms": amateur_ms / n if n else 0.0}
    cut_short: tuple[str, ...] = ()
    if amateur_prefill_ms is None:
        cut_short = ("amateur_prefill",)
    else:
        figures["amateur_prefill_ms"] = amateur_prefill_ms
    greedy: list[int] | None = None
    if contrastive.contrast_baseline and generated:
        wanted = min(contrastive.contrast_baseline, n)
        greedy, speed = ([], 0.0) if stop_reason == "stopped" else \
            plain_greedy(lm, settings, prompt_ids, wanted, record.context)
        if len(greedy) < wanted:  # Stop came before or during the greedy baseline: its figures are left out
            stop_reason, cut_short, greedy = "stopped", ("baseline",), None
    loop.stop_reason, loop.cut_short = stop_reason, cut_short
    finished = loop.finished()
    if greedy is not None:
        figures["greedy_tokens_per_s"] = speed
        figures["step_cost"] = speed / finished.tokens_per_s if finished.tokens_per_s > 0 else 0.0
        if not forced:  # a branch's forced tokens are not greedy's: where they part says nothing
            figures["first_divergence"] = agreement_figures(generated, greedy)["first_divergence"]
    yield dataclasses.replace(finished, figures=figures)
