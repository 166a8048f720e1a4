"""The KV cache's measurements as an observer, for a strategy that holds its cache as the KV settings say
(``--paged``, ``--kv-dtype``) without measuring it itself (beam search; the ``kv-cache`` strategy's entry says
it records "kv" itself): ``KVStarted`` after the start, a ``KVStep`` before each step's own event, measured
outside the step's time."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from playground.config import KVSettings, RunSettings
from playground.config.catalog import get_strategy
from playground.engine.observe import Observer, register_observer
from playground.events.kv import KVStarted

if TYPE_CHECKING:
    from playground.engine.decode import DecodeLoop, Picked
    from playground.engine.run_context import RunContext
    from playground.models.loaded import LoadedModel


class KVObserver(Observer):
    def __init__(self, lm: LoadedModel, kv: KVSettings) -> None:
        self.lm, self.kv = lm, kv
        self.start: KVStarted | None = None

    def started(self, loop: DecodeLoop) -> list[Any]:
        from playground.engine.kv.decode import kv_started

        start = kv_started(self.lm, self.kv, len(loop.prompt_ids) + loop.max_steps)
        self.start = dataclasses.replace(start, sequences=loop.rows)
        return [self.start]

    def step_events(self, loop: DecodeLoop, picked: Picked, units: int) -> Sequence[Sequence[Any]] | None:
        from playground.engine.kv.decode import kv_step

        if self.start is None:
            return None
        held = len(loop.prompt_ids) + loop.taken - 1  # positions the cache holds: the newest token is not read yet
        return [[kv_step(self.lm, loop.cache, picked.first + j, held - (units - 1 - j), self.start)]
                for j in range(units)]


def _kv(lm: LoadedModel, settings: RunSettings, context: RunContext) -> KVObserver | None:
    strategy = get_strategy(settings.strategy)
    if KVSettings not in strategy.groups or "kv" in strategy.records_itself:
        return None
    kv = settings.group(KVSettings)
    return KVObserver(lm, kv) if kv.paged or kv.kv_dtype != "model" else None


register_observer("kv", _kv, order=20)
