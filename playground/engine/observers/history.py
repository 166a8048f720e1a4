"""The run's tokens (prompt + output) remembered when it ends, in the history the run's context holds (default:
the loaded model's own): what a later run's suffix drafter matches against."""

from __future__ import annotations

from typing import TYPE_CHECKING

from playground.engine.observe import Observer, register_observer
from playground.models.run_history import RunHistory

if TYPE_CHECKING:
    from playground.config import RunSettings
    from playground.engine.decode import DecodeLoop
    from playground.engine.run_context import RunContext
    from playground.models.loaded import LoadedModel


class HistoryObserver(Observer):
    def __init__(self, history: RunHistory) -> None:
        self.history = history

    def finished(self, loop: DecodeLoop) -> None:
        self.history.remember(loop.prompt_ids + loop.generated)


def _history(lm: LoadedModel, settings: RunSettings, context: RunContext) -> HistoryObserver:
    return HistoryObserver(context.history_of(lm))


register_observer("history", _history, order=1000)
