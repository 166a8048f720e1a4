"""One entry point for every decoding strategy: settings in, events out."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from playground.config import RunSettings
from playground.events import Event
from playground.models.loaded import LoadedModel

StopCheck = Callable[[], bool]


def run_strategy(lm: LoadedModel, settings: RunSettings, should_stop: StopCheck | None = None) -> Iterator[Event]:
    """Validate the settings and run the chosen strategy as a generator of events.

    ``should_stop`` is polled before each step; when it returns True the run ends with a ``RunFinished`` whose
    ``stop_reason`` is ``"stopped"``.
    """
    settings.validate()
    if settings.strategy == "beam":
        from playground.engine.beam import run_beam_search

        return run_beam_search(lm, settings, should_stop)
    from playground.engine.sampling import run_sampling

    return run_sampling(lm, settings, should_stop)
