"""The ``patching`` strategy: both prompts read once, then every map's rows (``patching.Patcher``), one event a
row, Stop polled between rows."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterator

import torch

from playground.config import ConfigError, RunSettings
from playground.config.patching import PatchingSettings
from playground.engine.attribution.patching import Patcher, logit_diff, patch_map_rows
from playground.engine.attribution.salience import context_texts
from playground.engine.prompt import encode_prompt
from playground.engine.run_context import RunContext
from playground.engine.run_events import RunRecorder
from playground.events import Event, PrefillDone
from playground.events.patching import PatchingRow, PatchingStarted
from playground.models.loaded import LoadedModel


def _token(lm: LoadedModel, text: str, what: str) -> int:
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    if not ids:
        raise ConfigError(f"--patch-{what} {text!r} encodes to no token")
    return int(ids[0])


def answer_and_foil(lm: LoadedModel, group: PatchingSettings, clean: torch.Tensor, corrupted: torch.Tensor
                    ) -> tuple[int, int]:
    answer = _token(lm, group.patch_answer, "answer") if group.patch_answer else int(clean.argmax())
    if group.patch_foil:
        foil = _token(lm, group.patch_foil, "foil")
    else:
        top2 = corrupted.topk(2).indices.tolist()
        foil = top2[1] if top2[0] == answer else top2[0]
    if foil == answer:
        raise ConfigError("--patch-answer and --patch-foil are the same token: the logit difference is 0")
    return answer, foil


def run_patching(lm: LoadedModel, settings: RunSettings, context: RunContext | None = None) -> Iterator[Event]:
    context = RunContext.of(context)
    group = settings.group(PatchingSettings)
    maps = group.maps()
    if not group.corrupted.strip():
        raise ConfigError("activation patching needs a corrupted prompt (--corrupted): the prompt with a few words "
                          "changed, e.g. 'The capital of Italy is' against 'The capital of France is'")
    clean_ids, clean_text = encode_prompt(lm, settings)
    corrupted_ids, _ = encode_prompt(lm, dataclasses.replace(settings, prompt=group.corrupted))
    if len(clean_ids) != len(corrupted_ids):
        raise ConfigError(f"the clean and corrupted prompts must be the same number of tokens (clean "
                          f"{len(clean_ids)}, corrupted {len(corrupted_ids)}): change words for words of as many "
                          "tokens")
    differ = tuple(i for i, (a, b) in enumerate(zip(clean_ids, corrupted_ids, strict=True)) if a != b)
    if not differ:
        raise ConfigError("the corrupted prompt is the clean one: change a few words in it")
    patcher = Patcher(lm)
    start = time.perf_counter()
    clean, corrupted = patcher.record(clean_ids), patcher.record(corrupted_ids)
    read_ms = (time.perf_counter() - start) * 1000
    answer, foil = answer_and_foil(lm, group, clean.logits, corrupted.logits)
    clean_diff = float(logit_diff(clean.logits, answer, foil))
    corrupted_diff = float(logit_diff(corrupted.logits, answer, foil))
    if abs(clean_diff - corrupted_diff) < 1e-6:
        raise ConfigError("the two prompts give the same logit difference: nothing to recover (choose another "
                          "--patch-answer / --patch-foil)")
    return _rows(lm, settings, context, patcher, clean_ids, corrupted_ids, clean_text, maps, differ,
                 clean, corrupted, answer, foil, clean_diff, corrupted_diff, read_ms)


def _rows(lm, settings, context, patcher, clean_ids, corrupted_ids, clean_text, maps, differ, clean, corrupted,
          answer, foil, clean_diff, corrupted_diff, read_ms) -> Iterator[Event]:
    recorder = RunRecorder(lm, settings, context, groups=(PatchingSettings,))
    yield recorder.started(list(clean_ids), clean_text)
    texts = context_texts(lm, [answer])[0], context_texts(lm, [foil])[0]
    yield PatchingStarted(clean_tokens=context_texts(lm, clean_ids), corrupted_tokens=context_texts(lm, corrupted_ids),
                          clean_ids=tuple(clean_ids), corrupted_ids=tuple(corrupted_ids), layers=patcher.layers,
                          maps=maps, answer_id=answer, answer_text=texts[0], foil_id=foil, foil_text=texts[1],
                          clean_diff=clean_diff, corrupted_diff=corrupted_diff, differ=differ)
    recorder.prefill_ms = read_ms  # both prompts read once, their activations kept (no KV cache)
    yield PrefillDone(prompt_tokens=len(clean_ids), prefill_ms=read_ms, kv_cache_bytes=0, forward_passes=2,
                      deferred_tokens=0)
    row_index = 0
    figures: dict[str, float] = {}
    total = len(maps) * patcher.layers
    for kind in maps:
        start = time.perf_counter()
        for layer, share, seconds in patch_map_rows(patcher, kind, clean, corrupted, answer, foil):
            recorder.step_started()
            recorder.step_ended()
            yield PatchingRow(step=row_index, map=kind, layer=layer, recovered=tuple(share), seconds=seconds)
            row_index += 1
            context.report(f"Patching the {kind} map: block {layer + 1} of {patcher.layers}", row_index / total)
            if context.stopped():
                finished = recorder.finished((), "", "stopped", steps=0)
                yield dataclasses.replace(finished, figures=figures, stop_note=f"stopped in the {kind} map")
                return
        figures[f"{kind}_s"] = time.perf_counter() - start
    finished = recorder.finished((), "", "max_new_tokens", steps=0)
    yield dataclasses.replace(finished, figures=figures, stop_note="every block patched at every position")
