"""The attention recording as an observer: ``AttentionStarted`` after the start, then each step's new attention
row in every layer and head (``AttentionRow``) just before the step's token, from the attention tap active
during the run's passes (``kv.attention_tap``: the run opens it with its cache, which H2O's scores share)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from playground.config import KVSettings, RunSettings
from playground.config.catalog import get_strategy
from playground.engine.kv.attention_record import attention_row
from playground.engine.kv.attention_tap import active_tap
from playground.engine.observe import Observer, register_observer
from playground.engine.token_text import TokenTextCache
from playground.events.attention import AttentionStarted
from playground.events.kv import KVStep
from playground.models.anatomy import kv_layout

if TYPE_CHECKING:
    from playground.engine.decode import DecodeLoop, Picked
    from playground.engine.run_context import RunContext
    from playground.models.loaded import LoadedModel


class AttentionObserver(Observer):
    def __init__(self, lm: LoadedModel, kv: KVSettings) -> None:
        self.lm, self.top = lm, kv.attention_top
        layout = kv_layout(lm.model.config)
        self.layers, self.kv_heads = layout.count, layout.kv_heads

    def started(self, loop: DecodeLoop) -> list[Any]:
        text = TokenTextCache(self.lm.tokenizer)
        return [AttentionStarted(layers=self.layers, heads=self.lm.model.config.num_attention_heads,
                                 kv_heads=self.kv_heads, top=self.top,
                                 prompt_tokens=tuple(text(i) for i in loop.prompt_ids))]

    def step_events(self, loop: DecodeLoop, picked: Picked, units: int) -> Sequence[Sequence[Any]] | None:
        tap = active_tap()
        seen = tap.take() if tap is not None and tap.record else None
        if not seen:
            return None
        held = len(loop.prompt_ids) + loop.taken - 1  # the pass's last query is the newest position read
        return [[attention_row(picked.first, seen, loop.cache, held, self.top, self.kv_heads)]]


def _attention(lm: LoadedModel, settings: RunSettings, context: RunContext) -> AttentionObserver | None:
    strategy = get_strategy(settings.strategy)
    # The rows come with a strategy that measures its cache each step (it opens the tap with its cache).
    if KVSettings not in strategy.groups or KVStep not in strategy.step_events:
        return None
    kv = settings.group(KVSettings)
    return AttentionObserver(lm, kv) if kv.record_attention else None


register_observer("attention", _attention, order=30)
