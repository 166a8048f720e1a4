"""What every strategy does around its own steps: the start event, the timed (chunked) prefill, step timing,
and the final event.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator, Iterator
from typing import Any

import torch
from transformers import DynamicCache

from playground.config import RunSettings, SettingsGroup
from playground.engine.forward import prefill_in_chunks, sync_device
from playground.engine.kv_cache import kv_cache_bytes
from playground.engine.run_context import RunContext, StopCheck
from playground.events import BeamSequence, Event, PrefillDone, PrefillProgress, RunFinished, RunStarted, StopReason
from playground.models.loaded import LoadedModel


class RunRecorder:
    """Builds a run's shared events and keeps its clock (prefill and decode time, measured after a device sync)."""

    def __init__(self, lm: LoadedModel, settings: RunSettings, context: RunContext | StopCheck | None = None,
                 groups: tuple[type[SettingsGroup], ...] = ()) -> None:
        self.lm = lm
        self.settings = settings
        self.context = RunContext.of(context)  # the run's one context (a plain stop check is wrapped in one)
        self.groups = groups  # capability settings written into the start event even at their defaults
        self.prompt_tokens = 0
        self.prefill_ms = 0.0
        self.prefill_passes = 0  # model calls the prefill took
        self.decode_ms = 0.0
        self._step_start = 0.0

    def started(self, prompt_ids: list[int], prompt_text: str) -> RunStarted:
        self.prompt_tokens = len(prompt_ids)
        lm, s = self.lm, self.settings
        return RunStarted(
            strategy=s.strategy, prompt_text=prompt_text, prompt_token_ids=tuple(prompt_ids),
            forced_token_ids=tuple(s.forced_token_ids), model_name=lm.name, model_path=lm.path,
            device=str(lm.device), dtype=lm.dtype_name, settings=s.as_plain_dict(include=self.groups),
            base_model=lm.own_name, remote=False,
        )

    def prefill(self, ids: torch.Tensor, defer: int = 0, cache: Any = None
                ) -> Generator[Event, None, tuple[torch.Tensor | None, Any] | None]:
        """Read ``ids`` [1, n] but the last ``defer`` tokens into ``cache`` (default: a new DynamicCache), yielding
        progress for long prompts and ``PrefillDone``.

        Returns (last logits [1, vocab], cache) — logits None when nothing was read (everything deferred) — or
        None when Stop came between two chunks.
        """
        start = time.perf_counter()
        read = ids[:, : ids.shape[1] - defer]
        passes = 0
        if read.shape[1] == 0:
            logits, cache = None, cache if cache is not None else DynamicCache(config=self.lm.model.config)
        else:
            chunks = prefill_in_chunks(self.lm.model, read, cache=cache)
            while True:
                passes += 1
                try:
                    done = next(chunks)
                except StopIteration as end:
                    logits, cache = end.value
                    break
                if self.context.stopped():
                    self.prefill_ms = (time.perf_counter() - start) * 1000
                    return None
                yield PrefillProgress(done_tokens=done, total_tokens=ids.shape[1])
        sync_device(self.lm.device)
        self.prefill_ms = (time.perf_counter() - start) * 1000
        self.prefill_passes = passes
        yield PrefillDone(prompt_tokens=self.prompt_tokens, prefill_ms=self.prefill_ms,
                          kv_cache_bytes=kv_cache_bytes(cache), forward_passes=passes, deferred_tokens=defer)
        return logits, cache

    def step_started(self) -> None:
        self._step_start = time.perf_counter()

    def step_ended(self) -> float:
        """Milliseconds since ``step_started`` (after a device sync), added to the decode time."""
        sync_device(self.lm.device)
        ms = (time.perf_counter() - self._step_start) * 1000
        self.decode_ms += ms
        return ms

    def finished(self, token_ids: list[int] | tuple[int, ...], text: str, stop_reason: StopReason, steps: int,
                 sequences: tuple[BeamSequence, ...] = ()) -> RunFinished:
        """The final event; ``steps``: decode steps taken (tokens, or beam steps) for the speed figure."""
        lm = self.lm
        return RunFinished(
            token_ids=tuple(token_ids), text=text, stop_reason=stop_reason,
            tokens_per_s=steps / (self.decode_ms / 1000) if self.decode_ms > 0 else 0.0,
            prefill_ms=self.prefill_ms, decode_ms=self.decode_ms, prompt_tokens=self.prompt_tokens,
            model_name=lm.name, model_path=lm.path, device=str(lm.device), dtype=lm.dtype_name,
            sequences=sequences,
        )

    def stopped_before_start(self, prompt_ids: list[int], prompt_text: str, cut_short: tuple[str, ...]
                             ) -> Iterator[Event]:
        """A run that Stop ended before its first step, while something it needed was being made (a quantized
        copy, say): its start and its final event ("stopped", nothing decoded, ``cut_short`` naming what was cut)."""
        yield self.started(prompt_ids, prompt_text)
        yield dataclasses.replace(self.finished((), "", "stopped", steps=0), cut_short=tuple(cut_short))
