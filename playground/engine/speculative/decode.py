"""Draft-then-verify decoding: each round a drafter proposes k tokens, the target scores them all in one forward
pass, the longest acceptable prefix is kept, the target adds one token of its own, and both KV caches are rolled
back past the rejected drafts.

Every emitted token also gets an ordinary ``TokenStep`` (raw and processed distributions from the target's logits
at that position), so greedy speculative decoding is observably the target's greedy decoding — only faster or
slower.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from contextlib import nullcontext

import torch

from playground.config import LayerSettings, LensSettings, RunSettings, SpeculativeSettings
from playground.engine.baseline import plain_greedy
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.forward import deferred_tail, keep_last_logits
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.layers.lens import LayerOutputs, LensRecorder, layers_started
from playground.engine.processors import NamedTransform, build_pipeline, run_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_events import RunRecorder
from playground.engine.sampling import make_generator
from playground.engine.speculative.drafters import (
    Draft,
    Drafter,
    JacobiDrafter,
    LayersDrafter,
    PromptLookupDrafter,
    QuantizedDrafter,
    SmallModelDrafter,
    keep_past,
    roll_back,
)
from playground.engine.speculative.verify import Verdict, verify_greedy, verify_sampled
from playground.engine.step_analysis import analyse_step
from playground.engine.token_text import TokenTextCache
from playground.engine.variants import BuildStopped, FirstLayers, Progress, QuantizedCopy, SmallModel, detail, variant
from playground.events import Event
from playground.events.speculative import DraftToken, SpeculativeRound, SpeculativeStarted
from playground.models.loaded import LoadedModel

StopCheck = Callable[[], bool]


def run_speculative(lm: LoadedModel, settings: RunSettings, should_stop: StopCheck | None = None,
                    progress: Progress | None = None) -> Iterator[Event]:
    """Speculative decoding as a generator of events. Settings, prompt and drafter are checked (and a draft model
    loaded, a quantized drafter built, reporting ``progress``) before the generator is returned (``ConfigError``);
    Stop during that build returns a run that ends "stopped" at once."""
    settings.validate()
    spec = settings.group(SpeculativeSettings)
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    check_fits_context(lm, len(prompt_ids) + len(settings.forced_token_ids), settings)
    generator = make_generator(lm.device, settings.seed)
    pipeline = build_pipeline(settings, sampling=spec.do_sample, tokenizer=lm.tokenizer)
    record = RunRecorder(lm, settings, should_stop, groups=(SpeculativeSettings,))
    try:
        drafter = make_drafter(lm, spec, pipeline, generator, progress, should_stop)
    except BuildStopped as stopped:
        return record.stopped_before_start(prompt_ids, prompt_text, (stopped.cut,))
    lens_settings = settings.group(LensSettings)
    lens = LensRecorder(lm.model, lens_settings, TokenTextCache(lm.tokenizer)) if lens_settings.lens else None
    return _decode(lm, settings, spec, drafter, pipeline, generator, prompt_ids, prompt_text, record, lens)


def make_drafter(lm: LoadedModel, spec: SpeculativeSettings, pipeline: tuple[NamedTransform, ...],
                 generator: torch.Generator, progress: Progress | None = None,
                 should_stop: StopCheck | None = None) -> Drafter:
    """The drafter the settings name; a model drafter's model comes from the variants' cache (built there, with
    ``progress``; ``BuildStopped`` when ``should_stop`` says so during the build)."""
    if spec.draft == "prompt-lookup":
        return PromptLookupDrafter(spec.prompt_lookup_ngram)
    if spec.draft == "jacobi":
        return JacobiDrafter()
    kinds = {"layers": (LayersDrafter, FirstLayers(spec.draft_layers)),
             "model": (SmallModelDrafter, SmallModel(spec.draft_model)),
             "quantized": (QuantizedDrafter, QuantizedCopy.quick(spec.draft_quant))}
    kind, request = kinds[spec.draft]
    made = variant(lm, request, progress, should_stop)
    drafter = kind(made.model, pipeline, spec.do_sample, generator, lm.device)
    drafter.detail = detail(made, "the target")
    return drafter


def _decode(lm: LoadedModel, settings: RunSettings, spec: SpeculativeSettings, drafter: Drafter,
            pipeline: tuple[NamedTransform, ...], generator: torch.Generator, prompt_ids: list[int],
            prompt_text: str, record: RunRecorder, lens: LensRecorder | None) -> Iterator[Event]:
    token_text = TokenTextCache(lm.tokenizer)
    loop = DecodeLoop(lm, settings, record, prompt_ids, prompt_text)
    forced = list(settings.forced_token_ids)
    k = spec.draft_k  # tokens to draft next round
    rounds = drafted_total = accepted_total = target_calls = 0
    draft_ms_total = verify_ms_total = 0.0

    def step(_index: int, _forced: int | None) -> Picked:
        """One round: draft (or take the forced tokens), verify in one target pass, roll the caches back."""
        nonlocal k, rounds, drafted_total, accepted_total, target_calls, draft_ms_total, verify_ms_total
        generated, cache = loop.generated, loop.cache
        ids = prompt_ids + generated  # prompt + emitted tokens
        room = loop.max_steps - len(generated)
        forcing = len(generated) < len(forced)
        start = time.perf_counter()
        if forcing:  # branching: the forced tokens are a draft that is accepted whatever the target says
            draft = Draft(forced[len(generated) : len(generated) + room], None)
        else:
            draft = drafter.propose(ids, min(k, room - 1)) if room > 1 else Draft([], None)
            draft.tokens = draft.tokens[: max(0, room - 1)]
        draft_ms = (time.perf_counter() - start) * 1000
        start = time.perf_counter()
        context = torch.tensor([ids + draft.tokens], device=lm.device)  # [1, len(ids) + n]
        prompt_read = max(0, len(prompt_ids) - cache.get_seq_length())
        captured = LayerOutputs(lens.stack, len(draft.tokens) + 1) if lens is not None else nullcontext()
        with captured:  # the lens: every layer's output at the verified positions
            raw, processed = _score(lm, cache, ids, draft.tokens, context, pipeline)  # [n + 1, vocab]
        target_calls += 1
        verdict, target_probs = _verify(draft, processed, spec.do_sample, generator, forcing)
        # The target's token after the kept prefix comes in the round only when there is room for it.
        emitted = draft.tokens[: verdict.accepted]
        with_target = len(emitted) < room
        if with_target:
            emitted = [*emitted, verdict.token_id]
        kept = len(ids) + verdict.accepted  # positions the target cache keeps (the target's token is not read)
        roll_back(cache, kept)
        drafter.after_round(kept, processed.argmax(dim=-1).tolist(), verdict.accepted)
        verify_ms = (time.perf_counter() - start) * 1000
        first_step, read = len(generated), len(ids)
        kv_bytes = kv_cache_bytes(cache)
        # Recording the round's tokens is part of its time, as a plain step's is: each token j follows
        # ids + draft[:j] (every emitted token but the last is an accepted draft).
        analyses = []
        for j, token in enumerate(emitted):
            analysis = analyse_step(pipeline, context[:, : read + j], raw[j : j + 1], settings.num_candidates)
            analysis.token_id = token
            analyses.append(analysis)
        lens_steps = [captured.step_event(j, first_step + j, lens.top, token_text, raw[j])
                      for j in range(len(emitted))] if lens is not None else []
        if not forcing:
            if spec.adaptive_k and draft.tokens:
                k = next_draft_length(k, verdict.accepted, len(draft.tokens))
            rounds += 1
            drafted_total += len(draft.tokens)
            accepted_total += verdict.accepted
            draft_ms_total += draft_ms
            verify_ms_total += verify_ms
        round_index = rounds - 1

        def events(texts: list[str], round_ms: float) -> list[Event]:
            n = len(texts)  # the loop cut the round at an end (EOS, a stop string)
            steps = [analyses[j].to_event(step=first_step + j, text=texts[j], forced=forcing and j < len(draft.tokens),
                                          step_ms=round_ms / n, kv_bytes=kv_bytes, token_text=token_text)
                     for j in range(n)]
            out: list[Event] = []
            if not forcing:
                cut = n < len(emitted)  # the run ended inside the round
                out.append(_round_event(round_index, first_step, n, draft, verdict, target_probs, lm, token_text,
                                        "none" if cut or not with_target else
                                        ("bonus" if verdict.accepted == len(draft.tokens) else "correction"),
                                        draft_ms, verify_ms, kv_bytes, prompt_read))
            for j, token_step in enumerate(steps):
                if lens_steps:
                    out.append(lens_steps[j])
                out.append(token_step)
            return out

        return Picked(emitted, events)

    yield loop.started()
    yield SpeculativeStarted(drafter=drafter.name, detail=drafter.detail, draft_k=spec.draft_k,
                             do_sample=spec.do_sample, baseline_tokens=spec.baseline_tokens)
    if lens is not None:
        yield layers_started("lens", lens.stack.count, settings.group(LensSettings), LayerSettings(), kv_fill="")
    with torch.inference_mode():
        # The prompt's tail (all of a short prompt) is read by the first verification pass together with the first
        # draft: one target pass fewer than a separate prefill, as in transformers' assisted generation.
        if (yield from loop.prefill(defer=deferred_tail(len(prompt_ids)))):
            target_calls += record.prefill_passes
            yield from loop.steps(step)
    generated, stop_reason = loop.generated, loop.stop_reason

    figures = {
        "rounds": float(rounds), "drafted": float(drafted_total), "accepted": float(accepted_total),
        "acceptance_rate": accepted_total / drafted_total if drafted_total else 0.0,
        "mean_accepted": accepted_total / rounds if rounds else 0.0,
        "target_calls": float(target_calls), "draft_ms": draft_ms_total, "verify_ms": verify_ms_total,
    }
    cut_short: tuple[str, ...] = ()
    if spec.baseline_tokens and generated:
        wanted = min(spec.baseline_tokens, len(generated))
        baseline_ids, baseline = ([], 0.0) if stop_reason == "stopped" else \
            plain_greedy(lm, settings, prompt_ids, wanted, record.should_stop)
        if len(baseline_ids) < wanted:  # Stop came before or during the baseline: no speed-up to report
            stop_reason, cut_short = "stopped", ("baseline",)
        else:
            figures["baseline_tokens_per_s"] = baseline
    loop.stop_reason, loop.cut_short = stop_reason, cut_short
    finished = loop.finished()
    if "baseline_tokens_per_s" in figures:
        baseline = figures["baseline_tokens_per_s"]
        figures["speedup"] = finished.tokens_per_s / baseline if baseline > 0 else 0.0
    yield dataclasses.replace(finished, figures=figures)


def next_draft_length(k: int, accepted: int, drafted: int) -> int:
    """transformers' "heuristic" schedule: a fully accepted draft earns two more tokens, a rejection costs one."""
    return min(16, k + 2) if accepted == drafted else max(1, k - 1)


def _score(lm: LoadedModel, cache: object, ids: list[int], draft: list[int], context: torch.Tensor,
           pipeline: tuple[NamedTransform, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's raw and processed logits [len(draft) + 1, vocab] for every drafted position and the one after,
    in one forward pass over what the cache has not read (the last emitted token; the prompt's tail in the first
    round) + the draft. Row j predicts the token after ids + draft[:j] (= context[:, :len(ids) + j])."""
    keep_past(cache)  # the pass may be rolled back, also across a sliding window
    feed = ids[cache.get_seq_length():] + draft
    rows = len(draft) + 1
    out = lm.model(input_ids=torch.tensor([feed], device=lm.device), cache=cache, use_cache=True,
                   **keep_last_logits(lm.model, rows))
    raw = out.logits[0, -rows:].float()
    if not pipeline:
        return raw, raw
    processed = torch.cat([run_pipeline(pipeline, context[:, : len(ids) + j], raw[j : j + 1]) for j in range(rows)])
    return raw, processed


def _verify(draft: Draft, processed: torch.Tensor, sample: bool, generator: torch.Generator,
            forcing: bool) -> tuple[Verdict, torch.Tensor]:
    probs = processed.softmax(dim=-1)
    if forcing:
        choice = int(torch.multinomial(probs[-1], 1, generator=generator).item()) if sample else \
            int(processed[-1].argmax().item())
        return Verdict(len(draft.tokens), choice, ()), probs
    if not sample:
        return verify_greedy(draft.tokens, processed), probs
    q = draft.probs
    if q is None:  # a deterministic drafter: q is one-hot on each drafted token
        q = torch.zeros((len(draft.tokens), probs.shape[-1]), device=probs.device)
        if draft.tokens:
            q[torch.arange(len(draft.tokens)), torch.tensor(draft.tokens, device=probs.device)] = 1.0
    return verify_sampled(draft.tokens, q, probs, generator), probs


def _round_event(index: int, first_step: int, emitted: int, draft: Draft, verdict: Verdict, target_probs: torch.Tensor,
                 lm: LoadedModel, token_text: TokenTextCache, kind: str, draft_ms: float, verify_ms: float,
                 kv_bytes: int, prompt_read: int) -> SpeculativeRound:
    drafted = []
    for i, token in enumerate(draft.tokens):
        q = float(draft.probs[i, token]) if draft.probs is not None else 1.0
        drafted.append(DraftToken(
            # A wider draft head may propose a row the target lacks: the target gives it probability 0 (rejected).
            token_id=token, text=token_text(token), draft_prob=q,
            target_prob=float(target_probs[i, token]) if token < target_probs.shape[-1] else 0.0,
            accepted=i < verdict.accepted, draw=verdict.draws[i] if i < len(verdict.draws) else None))
    target_prob = float(target_probs[verdict.accepted, verdict.token_id])
    return SpeculativeRound(
        round=index, first_step=first_step, emitted=emitted, drafted=tuple(drafted), accepted=verdict.accepted,
        target_token_id=verdict.token_id, target_text=token_text(verdict.token_id), target_kind=kind,
        target_prob=target_prob, draft_ms=draft_ms, verify_ms=verify_ms, kv_cache_bytes=kv_bytes,
        prompt_read=prompt_read)
