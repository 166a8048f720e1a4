"""The logit lens as an observer: every kept token's layers, from hooks on the decoder layers around the step's
model pass (``loop.watching()``), at the batch row and position its step says it was predicted (``Picked.seen``).

A strategy that records the layers itself (early exit, layer skipping: its catalog entry's ``records_itself``
names "lens") gets no lens observer."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from playground.config import LayerSettings, LensSettings, RunSettings
from playground.config.catalog import get_strategy
from playground.engine.layers.lens import LayerOutputs, LayerStack, layers_started
from playground.engine.observe import Observer, register_observer
from playground.engine.token_text import TokenTextCache
from playground.events.layers import LayerStep

if TYPE_CHECKING:
    from playground.engine.decode import DecodeLoop, Picked
    from playground.engine.run_context import RunContext
    from playground.models.loaded import LoadedModel


class LensObserver(Observer):
    defer = 1  # the first step reads the prompt's last token itself, so every step's layers are recorded

    def __init__(self, lm: LoadedModel, lens: LensSettings) -> None:
        self.lens = lens
        self.stack = LayerStack.of(lm.model, lens.lens_precision, lens.lens_kind)
        self.token_text = TokenTextCache(lm.tokenizer)
        self.captured = LayerOutputs(self.stack)
        self.forward_ms = 0.0
        self.steps: list[LayerStep] = []

    def started(self, loop: DecodeLoop) -> list[Any]:
        return [layers_started("lens", self.stack.count, self.lens, LayerSettings(), kv_fill="")]

    @contextmanager
    def _watching(self) -> Iterator[None]:
        start = time.perf_counter()
        with self.captured:
            yield
        self.forward_ms = (time.perf_counter() - start) * 1000

    def watch(self, loop: DecodeLoop) -> Any:
        return self._watching()

    def after_step(self, loop: DecodeLoop, picked: Picked) -> None:
        self.steps = []
        if picked.logits is None or self.captured.outputs[-1] is None:
            return
        self.steps = [self.captured.step_event_at(batch, position, picked.first + j, self.lens.lens_top,
                                                  self.token_text, picked.logits[j], self.forward_ms)
                      for j, (batch, position) in enumerate(picked.seen)]
        self.captured.inputs = [None] * self.stack.count  # the pass's tensors are not held past the step
        self.captured.outputs = [None] * self.stack.count

    def step_events(self, loop: DecodeLoop, picked: Picked, units: int) -> Sequence[Sequence[Any]] | None:
        return [[step] for step in self.steps[:units]] if self.steps else None


def _lens(lm: LoadedModel, settings: RunSettings, context: RunContext) -> LensObserver | None:
    lens = settings.group(LensSettings)
    if not lens.lens or "lens" in get_strategy(settings.strategy).records_itself:
        return None
    return LensObserver(lm, lens)


register_observer("lens", _lens, order=10)
