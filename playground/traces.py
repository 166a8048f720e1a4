"""Saved runs: the JSON lines `trace` writes, read back without any model.

A damaged file opens as far as it can: a line that is not JSON, an event type this version does not know, or an
event missing fields is skipped and reported; a file that ends before its ``done`` event is a truncated run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from playground.errors import UserError
from playground.events import EventDecodeError, RunFinished, RunStarted, dumps_event, event_from_dict


class TraceError(UserError, ValueError):
    """A file that holds no run at all; the message says why."""


@dataclass
class SavedTrace:
    path: Path
    events: list = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # "line N: why", one per line that could not be read

    @property
    def truncated(self) -> bool:
        return not any(isinstance(e, RunFinished) for e in self.events)

    def problems(self) -> str:
        """What did not open, in one message (empty when everything did)."""
        parts = []
        if self.skipped:
            shown = "; ".join(self.skipped[:3]) + (f"; and {len(self.skipped) - 3} more" if len(self.skipped) > 3
                                                   else "")
            parts.append(f"skipped {len(self.skipped)} line{'s' if len(self.skipped) > 1 else ''} ({shown})")
        if self.truncated:
            parts.append("the trace ends before the run did (no 'done' event): it shows the run as far as it got")
        return ". ".join(parts)


def read_trace(path: str | Path) -> SavedTrace:
    """The events of a saved run. Raises ``TraceError`` when nothing in the file is a run's start."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as error:
        raise TraceError(f"cannot read {path}: {error.strerror or error}") from error
    trace = SavedTrace(path)
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            event = event_from_dict(json.loads(line, parse_constant=_refuse_constant))
        except json.JSONDecodeError as error:
            trace.skipped.append(f"line {number}: not JSON ({error.msg})")
            continue
        except (EventDecodeError, TypeError, ValueError) as error:
            trace.skipped.append(f"line {number}: {error}")
            continue
        if isinstance(event, RunStarted) and any(isinstance(e, RunStarted) for e in trace.events):
            trace.skipped.append(f"line {number}: a second run's start (a saved run holds one run)")
            break
        trace.events.append(event)
    if not trace.events or not isinstance(trace.events[0], RunStarted):
        if not trace.events:
            raise TraceError(f"{path} is not a saved run: it holds no readable event")
        raise TraceError(f"{path} is not a saved run: its first readable line is a '{trace.events[0].type}' "
                         "event, not a 'start' event")
    return trace


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not valid JSON")


def write_trace(events: Iterable, path: str | Path) -> Path:
    """Write events as JSON lines (what `trace` prints), atomically: a failed save leaves no half file."""
    path = Path(path)
    tmp = path.with_name(path.name + ".part")
    try:
        with tmp.open("w", encoding="utf-8") as out:
            for event in events:
                out.write(dumps_event(event) + "\n")
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
