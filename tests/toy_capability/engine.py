"""The toy strategy's runner: the playground's greedy decode, with a ``ToyStep`` after each token."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from playground.engine.sampling import run_sampling
from playground.events import TokenStep
from toy_capability import ToySettings, ToyStep


def run_toy(lm, settings, should_stop: Callable[[], bool] | None = None) -> Iterator:
    scale = settings.group(ToySettings).toy_scale
    inner = run_sampling(lm, settings, should_stop)  # not "sample": greedy

    def events() -> Iterator:
        for event in inner:
            yield event
            if isinstance(event, TokenStep):
                yield ToyStep(step=event.step, token_id=event.token_id, length=len(event.text) * scale)

    return events()
