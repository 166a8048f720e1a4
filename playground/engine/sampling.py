"""Greedy decoding and sampling, one token per step over the model's KV cache, every intermediate recorded.

Prefill runs the whole prompt once and fills the cache; each later step feeds only the newest token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from playground.config import LayerSettings, LensSettings, RunSettings
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.layers.lens import LensRecorder, layers_started
from playground.engine.processors import NamedTransform, build_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_events import RunRecorder
from playground.engine.step_analysis import StepAnalysis, analyse_step
from playground.engine.token_text import TokenTextCache
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
    token_text = TokenTextCache(lm.tokenizer)
    loop = DecodeLoop(lm, settings, record, prompt_ids, prompt_text)

    def step(index: int, forced: int | None) -> Picked:
        if lens is not None:
            logits = lens.forward(loop.ids.last, loop.cache).float()
        elif index > 0:
            logits = lm.model(input_ids=loop.ids.last, cache=loop.cache, use_cache=True).logits[:, -1, :].float()
        else:
            logits = loop.logits  # the prefill's
        analysis = _choose(pipeline, loop.ids.view, logits, settings, sampling, generator, forced)
        layer_step = lens.step_event(index) if lens is not None else None

        def events(texts: list[str], step_ms: float) -> list[Event]:
            token = analysis.to_event(step=index, text=texts[0], forced=forced is not None, step_ms=step_ms,
                                      kv_bytes=kv_cache_bytes(loop.cache), token_text=token_text)
            return [layer_step, token] if layer_step is not None else [token]

        return Picked([analysis.token_id], events)

    yield loop.started()
    if lens is not None:
        yield layers_started("lens", lens.stack.count, settings.group(LensSettings), LayerSettings(), kv_fill="")
    with torch.inference_mode():
        # With the lens the first step reads the prompt's last token itself, so every step's layers are recorded.
        if (yield from loop.prefill(defer=1 if lens is not None else 0)):
            yield from loop.steps(step)
    yield loop.finished()


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

