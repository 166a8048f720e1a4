"""Qt-free: folds side-by-side events (``PaneStarted``/``PaneToken``/``PaneFinished``) into what the panes show.

Panes are compared position by position with pane 0 (the reference): a token differs when pane 0 has another token
at the same step; a pane's first divergence is the first such step (or where one of the two ended early). Folding a
token costs one comparison (with the other panes' token at that step when they already have it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playground.events import Event, RunFinished
from playground.events.figures import first_divergence
from playground.events.panes import PaneFinished, PaneStarted, PaneToken
from playground.state.fold import STATUS, Fold

PANES = "panes"  # a part: the panes' texts, divergence and figures


@dataclass
class PaneRecord:
    label: str
    strategy: str = ""
    model_name: str = ""
    token_ids: list[int] = field(default_factory=list)
    texts: list[str] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    finished: PaneFinished | None = None

    @property
    def text(self) -> str:
        return self.finished.text if self.finished is not None else "".join(self.texts)


class PanesState(Fold):
    """The panes of one run. ``apply(event)`` folds an event in and says whether it was one of ours (the run's end
    is not: it ends the panes, ``ended``)."""

    parts = frozenset({PANES})

    def _clear(self) -> None:
        self.panes: list[PaneRecord] = []
        self.divergence: list[int | None] = []  # per pane: first step differing from pane 0 (None: not yet)

    @property
    def run_ended(self) -> bool:
        return self.ended

    def _pane(self, index: int) -> PaneRecord:
        while len(self.panes) <= index:  # a pane seen before its start (a truncated trace) still shows
            self.panes.append(PaneRecord(label=f"pane {len(self.panes) + 1}"))
            self.divergence.append(None)
        return self.panes[index]

    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, PaneStarted):
            pane = self._pane(event.pane)
            pane.label, pane.strategy, pane.model_name = event.label, event.strategy, event.model_name
        elif isinstance(event, PaneToken):
            pane = self._pane(event.pane)
            pane.token_ids.append(event.token_id)
            pane.texts.append(event.text)
            pane.probs.append(event.prob)
            self._compare_step(event.pane, len(pane.token_ids) - 1)
        elif isinstance(event, PaneFinished):
            pane = self._pane(event.pane)
            pane.finished = event
            if event.token_ids and not pane.token_ids:  # a strategy without token events (beam): its final text
                pane.token_ids = list(event.token_ids)
            self._settle_divergence()
        else:
            return None
        return {PANES, STATUS}

    def _finished(self, event: RunFinished) -> set[str]:
        return set()  # the run's end is not a pane's event (the panes' own ends came before it)

    def _compare_step(self, index: int, step: int) -> None:
        """A new token at ``step`` of pane ``index``: compare it with pane 0's (or pane 0's with every pane's)."""
        if not self.panes:
            return
        reference = self.panes[0].token_ids
        others = range(1, len(self.panes)) if index == 0 else (index,)
        for i in others:
            ids = self.panes[i].token_ids
            known = step < len(ids) and step < len(reference)
            if self.divergence[i] is None and known and ids[step] != reference[step]:
                self.divergence[i] = step

    def _settle_divergence(self) -> None:
        """Once panes have ended, one that stopped earlier than pane 0 (or later) diverges where the shorter ended."""
        if not self.panes or self.panes[0].finished is None:
            return
        reference = self.panes[0].token_ids
        for i, pane in enumerate(self.panes[1:], start=1):
            if pane.finished is None or self.divergence[i] is not None:
                continue
            first = first_divergence(pane.token_ids, reference)
            self.divergence[i] = None if first < 0 else first

    def differs(self, index: int, step: int) -> bool:
        """Whether pane ``index``'s token at ``step`` differs from pane 0's token there (False for pane 0)."""
        if index == 0 or not self.panes:
            return False
        reference = self.panes[0].token_ids
        ids = self.panes[index].token_ids
        return step < len(ids) and (step >= len(reference) or ids[step] != reference[step])
