"""Greedy decoding and sampling, one token per step over the model's KV cache, every intermediate recorded.

Prefill runs the whole prompt once and fills the cache; each later step feeds only the newest token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from playground.config import LayerSettings, LensSettings, RunSettings
from playground.config.stop_strings import StopStringWatch, end_reason
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.layers.lens import LensRecorder, layers_started
from playground.engine.processors import NamedTransform, build_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_events import RunRecorder
from playground.engine.step_analysis import StepAnalysis, analyse_step
from playground.engine.token_text import IncrementalDecoder, TokenTextCache
from playground.events import Event
from playground.models.loaded import LoadedModel


def sample_next_token(probs: torch.Tensor, generator: torch.Generator) -> int:
    """Draw one token id from ``probs`` ([1, vocab], rows sum to 1) with an explicit generator."""
    return int(torch.multinomial(probs, num_samples=1, generator=generator).item())


def make_generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def run_sampling(
    lm: LoadedModel, settings: RunSettings, should_stop: Callable[[], bool] | None = None
) -> Iterator[Event]:
    """Greedy (``strategy="greedy"``) or sampling (``strategy="sample"``) as a stream of events.

    Settings are checked before the first event (``ConfigError``); the events come from the returned generator.
    """
    settings.validate()
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    check_fits_context(lm, len(prompt_ids), settings)
    lens = _lens_recorder(lm, settings)
    return _decode(lm, settings, prompt_ids, prompt_text, RunRecorder(lm, settings, should_stop), lens)


def _decode(lm: LoadedModel, settings: RunSettings, prompt_ids: list[int], prompt_text: str,
            record: RunRecorder, lens: LensRecorder | None) -> Iterator[Event]:
    sampling = settings.strategy == "sample"
    pipeline = build_pipeline(settings, sampling=sampling)
    generator = make_generator(lm.device, settings.seed)
    eos_ids = set(lm.eos_token_ids)
    token_text = TokenTextCache(lm.tokenizer)
    decoder = IncrementalDecoder(lm.tokenizer, prompt_ids)
    stop_watch = StopStringWatch(settings.stop_strings)
    max_steps = min(settings.max_new_tokens, lm.context_length - len(prompt_ids))

    yield record.started(prompt_ids, prompt_text)
    if lens is not None:
        yield layers_started("lens", lens.stack.count, settings.group(LensSettings), LayerSettings(), kv_fill="")
    generated: list[int] = []
    stop_reason = "max_new_tokens" if max_steps == settings.max_new_tokens else "context_full"
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids], device=lm.device)  # [1, prompt_len], grows by one a step
        # With the lens the first step reads the prompt's last token itself, so every step's layers are recorded.
        prefilled = yield from record.prefill(ids, defer=1 if lens is not None else 0)
        if prefilled is None:
            max_steps, stop_reason = 0, "stopped"
        else:
            logits, cache = prefilled
            logits = logits.float()  # [1, vocab]

        for step in range(max_steps):
            if record.should_stop():
                stop_reason = "stopped"
                break
            record.step_started()
            if lens is not None:
                logits = lens.forward(ids[:, -1:], cache).float()
            elif step > 0:
                logits = lm.model(input_ids=ids[:, -1:], cache=cache, use_cache=True).logits[:, -1, :].float()
            forced = step < len(settings.forced_token_ids)
            analysis = _choose(pipeline, ids, logits, settings, sampling, generator,
                               settings.forced_token_ids[step] if forced else None)
            token_id = analysis.token_id
            ids = torch.cat([ids, ids.new_tensor([[token_id]])], dim=1)
            layer_step = lens.step_event(step) if lens is not None else None
            step_ms = record.step_ended()

            text = decoder.push(token_id)
            generated.append(token_id)
            if layer_step is not None:
                yield layer_step
            yield analysis.to_event(step=step, text=text, forced=forced, step_ms=step_ms,
                                    kv_bytes=kv_cache_bytes(cache), token_text=token_text)
            ended = end_reason(token_id, text, eos_ids, stop_watch)
            if ended is not None:
                stop_reason = ended
                break

    yield record.finished(generated, lm.tokenizer.decode(generated, skip_special_tokens=True), stop_reason,
                          steps=len(generated))


def _lens_recorder(lm: LoadedModel, settings: RunSettings) -> LensRecorder | None:
    lens = settings.group(LensSettings)
    return LensRecorder(lm.model, lens, TokenTextCache(lm.tokenizer)) if lens.lens else None


def _choose(
    pipeline: tuple[NamedTransform, ...], ids: torch.Tensor, logits: torch.Tensor, settings: RunSettings,
    sampling: bool, generator: torch.Generator, forced_id: int | None,
) -> StepAnalysis:
    """Run the processors, pick the token (forced, argmax or a draw) and record what each processor did."""
    analysis = analyse_step(pipeline, ids, logits, settings.num_candidates)
    if forced_id is not None:
        token_id = forced_id
    elif sampling:
        token_id = sample_next_token(analysis.processed_probs, generator)
    else:
        token_id = int(analysis.processed_logits.argmax(dim=-1).item())
    analysis.token_id = token_id
    return analysis

