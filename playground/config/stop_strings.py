"""Stop strings (``RunSettings.stop_strings``): end a run once the generated text contains one of them.

Every decode loop, local or on a server, watches its output with the same rule.
"""

from __future__ import annotations

from typing import Literal


class StopStringWatch:
    def __init__(self, stop_strings: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stop_strings if s)
        self._keep = max((len(s) for s in self._stops), default=0)
        self._tail = ""

    def hit(self, new_text: str) -> bool:
        """Feed the newest text; True once any stop string has appeared (possibly across token boundaries)."""
        if not self._stops:
            return False
        self._tail = (self._tail + new_text)[-(self._keep + len(new_text)) :]
        return any(s in self._tail for s in self._stops)


def end_reason(token_id: int, text: str, eos_ids: tuple[int, ...] | set[int], watch: StopStringWatch
               ) -> Literal["eos", "stop_string"] | None:
    """Why a run ends after this token: ``"eos"``, ``"stop_string"`` (``text``: what the token added), or None."""
    if token_id in eos_ids:
        return "eos"
    if watch.hit(text):
        return "stop_string"
    return None
