"""Early-exit and layer-skip greedy decoding: each generated token goes through the layers one at a time
(``LayerLoop``), stopping at the first confident layer or passing layers by, and every token's lens is recorded.

The prompt is read with every layer (all but its last token, in the ordinary prefill); each step then feeds one
token through the loop. At the end the same prompt is decoded with every layer to report agreement and time saved.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch

from playground.config import ConfigError, LayerSettings, LensSettings, RunSettings
from playground.engine.baseline import plain_greedy
from playground.engine.decode import DecodeLoop, Picked
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.layers.lens import layers_started, lens_step
from playground.engine.layers.loop import KV_FILL, ExitRule, LayerLoop, skip_rule
from playground.engine.processors import NamedTransform, build_pipeline
from playground.engine.prompt import check_fits_context, encode_prompt
from playground.engine.run_context import NO_CONTEXT, RunContext, StopCheck
from playground.engine.run_events import RunRecorder
from playground.engine.step_analysis import analyse_step
from playground.engine.token_text import TokenTextCache
from playground.events import Event
from playground.events.figures import agreement_figures
from playground.models.loaded import LoadedModel


def run_early_exit(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None
                   ) -> Iterator[Event]:
    """Greedy decoding that stops each token at the first layer whose lens is confident enough."""
    return _prepare(lm, settings, context, "early-exit")


def run_layer_skip(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None
                   ) -> Iterator[Event]:
    """Greedy decoding that passes some layers by for each token (a fixed set, or after a small residual update)."""
    return _prepare(lm, settings, context, "layer-skip")


def _prepare(lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None, mode: str
             ) -> Iterator[Event]:
    settings.validate()
    layers = settings.group(LayerSettings)
    lens = settings.group(LensSettings)
    layer_loop = LayerLoop(lm.model, lens.lens_precision, lens.lens_kind)  # exit rules read the chosen lens
    count = layer_loop.stack.count
    if mode == "early-exit":
        if layers.min_exit_layer > count:
            raise ConfigError(f"min_exit_layer must be between 1 and {count} for this {count}-layer model "
                              f"(got {layers.min_exit_layer})")
        rules: dict[str, Any] = {
            "exit_rule": ExitRule(layers.exit_metric, layers.exit_threshold, layers.exit_from(count))}
    else:
        fixed = layers.skip_set()
        if fixed and fixed[-1] > count:
            raise ConfigError(f"skip_layers names layer {fixed[-1]}, but this model has {count} layers (1–{count})")
        if len(fixed) >= count:
            raise ConfigError("skip_layers skips every layer: leave at least one to run")
        if not fixed and layers.skip_threshold <= 0:
            raise ConfigError("layer-skip needs --skip-layers (e.g. 10-20) or a --skip-threshold above 0")
        rules = {"skip_rule": skip_rule(fixed, layers.skip_threshold, count)}
    prompt_ids, prompt_text = encode_prompt(lm, settings)
    check_fits_context(lm, len(prompt_ids) + len(settings.forced_token_ids), settings)
    record = RunRecorder(lm, settings, context, groups=(LensSettings, LayerSettings))
    # Built here, so a sampler these strategies refuse (guidance) fails before the first event.
    pipeline = build_pipeline(settings, sampling=False, tokenizer=lm.tokenizer)
    return _decode(lm, settings, mode, layer_loop, rules, prompt_ids, prompt_text, record, pipeline)


def _decode(lm: LoadedModel, settings: RunSettings, mode: str, layer_loop: LayerLoop, rules: dict,
            prompt_ids: list[int], prompt_text: str, record: RunRecorder,
            pipeline: tuple[NamedTransform, ...]) -> Iterator[Event]:
    lens, layers = settings.group(LensSettings), settings.group(LayerSettings)
    token_text = TokenTextCache(lm.tokenizer)
    count = layer_loop.stack.count
    loop = DecodeLoop(lm, settings, record, prompt_ids, prompt_text)
    computed = 0

    def step(index: int, forced: int | None) -> Picked:
        nonlocal computed
        token_pass = layer_loop.run(int(loop.ids.last), loop.cache, **rules)
        analysis = analyse_step(pipeline, loop.ids.view, token_pass.logits, settings.num_candidates)
        analysis.token_id = forced if forced is not None else int(analysis.processed_logits.argmax(dim=-1).item())
        layer_step = lens_step(layer_loop.stack, index, token_pass.outputs, token_pass.updates, lens.lens_top,
                               token_text, exit_layer=token_pass.exit_layer, skipped=token_pass.skipped,
                               forward_ms=token_pass.forward_ms, known=token_pass.lens_rows, full=lens.lens)
        computed += layer_step.layers_computed

        def events(texts: list[str], step_ms: float) -> list[Event]:
            return [layer_step, analysis.to_event(step=index, text=texts[0], forced=forced is not None,
                                                  step_ms=step_ms, kv_bytes=kv_cache_bytes(loop.cache),
                                                  token_text=token_text)]

        return Picked([analysis.token_id], events)

    yield loop.started()
    yield layers_started(mode, count, lens, layers, KV_FILL)
    with torch.inference_mode():
        if (yield from loop.prefill(defer=1)):  # the layer loop reads the prompt's last token
            yield from loop.steps(step)

    generated = loop.generated
    total = count * len(generated)
    figures = {"layers_total": float(total), "layers_computed": float(computed),
               "compute_saved": 1 - computed / total if total else 0.0}
    full = None
    if layers.compare_full and generated:
        full = None if loop.stop_reason == "stopped" else full_decode(lm, settings, prompt_ids, generated,
                                                                      record.context)
        if full is None:  # Stop came before or during the full model's decode: no agreement to report
            loop.stop_reason, loop.cut_short = "stopped", ("full_model",)
    finished = loop.finished()
    if full is not None:
        figures.update(agreement(generated, *full, finished.tokens_per_s))
    yield dataclasses.replace(finished, figures=figures)


def full_decode(lm: LoadedModel, settings: RunSettings, prompt_ids: list[int], generated: list[int],
                context: RunContext = NO_CONTEXT) -> tuple[list[int], float] | None:
    """The full model's greedy decode of as many tokens as ``generated`` and its speed; None when Stop cut it."""
    forced = list(settings.forced_token_ids[: len(generated)])  # a branch: the full model continues it too
    wanted = len(generated) - len(forced)
    rest, full_tokens_per_s = plain_greedy(lm, settings, prompt_ids + forced, wanted, context)
    return (forced + rest, full_tokens_per_s) if len(rest) == wanted else None


def agreement(generated: list[int], full: list[int], full_tokens_per_s: float, tokens_per_s: float
              ) -> dict[str, float]:
    """Against the full model's greedy decode of as many tokens: where the outputs first differ (−1: nowhere), the
    share of positions that agree, its speed and the time this run saved per token against it."""
    return {**agreement_figures(generated, full), "full_tokens_per_s": full_tokens_per_s,
            "time_saved": 1 - full_tokens_per_s / tokens_per_s if tokens_per_s > 0 else 0.0}
