"""The toy view's fold: Qt-free, work proportional to the new events only."""

from __future__ import annotations

from toy_capability import ToyStep


class ToyFold:
    def __init__(self) -> None:
        self.steps = 0
        self.total_length = 0

    def apply(self, events: list) -> None:
        for event in events:
            if isinstance(event, ToyStep):
                self.steps += 1
                self.total_length += event.length

    def text(self) -> str:
        return f"{self.steps} toy steps, total length {self.total_length}"
