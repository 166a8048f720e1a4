"""Qt-free session state: folds engine events into what the views show.

A session holds every run the user made (the original and its branches). Events always go to the *live* run
(the one being decoded); the views show the *selected* run, which is usually the live one but can be any earlier
run picked from the runs list. Views re-derive themselves from a run's recorded events, never by re-running.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from playground.config import RunSettings
from playground.config.catalog import STRATEGIES
from playground.events import (
    Event,
    PrefillDone,
    Rollback,
    RunFinished,
    RunStarted,
    StepEvent,
    TokenStep,
    UnitStep,
    is_step_event,
    is_unit_step,
    is_unit_step_type,
)
from playground.state.text import visible_token_text


def settings_summary(settings: RunSettings) -> str:
    """The settings that shaped a run, in one line (only what the strategy uses and what is switched on)."""
    s = settings
    strategy = STRATEGIES.get(s.strategy)
    parts = [s.strategy, f"max {s.max_new_tokens}"]
    if strategy is not None and "sampling" in strategy.sections:
        parts += [f"T={s.temperature:g}", f"seed {s.seed}"]
        parts += [text for on, text in ((s.top_k > 0, f"top-k {s.top_k}"), (s.top_p < 1, f"top-p {s.top_p:g}"),
                                        (s.min_p > 0, f"min-p {s.min_p:g}")) if on]
    for name in strategy.reads if strategy is not None else ():  # shared settings read outside its sections
        parts.append(f"{name.replace('_', '-')} {getattr(s, name)}")  # contrastive search's "top-k 4"
    for group in strategy.groups if strategy is not None else ():
        parts.append(s.group(group).summary())
    if s.repetition_penalty != 1:
        parts.append(f"repetition penalty {s.repetition_penalty:g}")
    if s.no_repeat_ngram_size:
        parts.append(f"no-repeat {s.no_repeat_ngram_size}-gram")
    if s.forced_token_ids:
        parts.append(f"{len(s.forced_token_ids)} forced tokens")
    parts.append("chat" if s.chat else "raw prompt")
    return " · ".join(parts)


@dataclass(frozen=True)
class Branch:
    """Where a run came from: an alternative token picked at a step of another run."""

    parent: int  # index of the parent run in the session
    step: int  # step of the parent run whose token was replaced
    token_id: int
    token_text: str


@dataclass
class Run:
    """One generation: its settings, the events it produced, and how it ended."""

    index: int
    settings: RunSettings
    branch: Branch | None = None
    events: list[Event] = field(default_factory=list)
    started: RunStarted | None = None
    prefill: PrefillDone | None = None
    steps: list[TokenStep] = field(default_factory=list)  # greedy/sampling tokens (what the tokens view shows)
    step_events: list[StepEvent] = field(default_factory=list)  # every per-step event, whatever the strategy
    # The per-step events that each produce the run's unit (a token, a beam step), not those that describe one
    # (a lens step): what counts and speeds are made of.
    unit_steps: list[UnitStep] = field(default_factory=list)
    step_kinds: set[type] = field(default_factory=set)  # the types among step_events (which views apply)
    finished: RunFinished | None = None
    # Phrase bans' rollbacks, in order; each took the steps from its position on out of ``steps`` (and the other
    # step lists): those hold the tokens that survived.
    rollbacks: list[Rollback] = field(default_factory=list)
    error: str | None = None
    source: str | None = None  # the saved trace it was opened from (None: decoded in this window)

    @classmethod
    def from_events(cls, events: list[Event], index: int = 0, source: str | None = None) -> Run:
        """A run rebuilt from its recorded events (a saved trace), with the settings its start event holds."""
        started = next(e for e in events if isinstance(e, RunStarted))
        settings, _unknown = RunSettings.from_plain_dict(started.settings)
        run = cls(index=index, settings=settings, source=source)
        for event in events:
            run.apply(event)
        return run

    def apply(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, RunStarted):
            self.started = event
        elif isinstance(event, PrefillDone):
            self.prefill = event
        elif isinstance(event, RunFinished):
            self.finished = event
        elif isinstance(event, Rollback):
            self.rollbacks.append(event)
            for kept in (self.steps, self.unit_steps, self.step_events):
                _drop_from(kept, event.position)
        elif is_step_event(event):
            self.step_events.append(event)
            self.step_kinds.add(type(event))
            if is_unit_step(event):
                self.unit_steps.append(event)
            if isinstance(event, TokenStep):
                self.steps.append(event)

    @property
    def running(self) -> bool:
        return self.finished is None and self.error is None

    @property
    def generated_ids(self) -> tuple[int, ...]:
        if self.finished is not None and (self.finished.token_ids or not self.steps):
            return self.finished.token_ids
        return tuple(step.token_id for step in self.steps)

    @property
    def text(self) -> str:
        if self.finished is not None:
            return self.finished.text
        return "".join(step.text for step in self.steps)

    @property
    def status(self) -> str:
        if self.error is not None:
            return "failed"
        if self.finished is None:
            return "running"
        return self.finished.stop_reason

    @property
    def step_unit(self) -> str:
        """What one step produces: "token", or "step" where a step grows several sequences (beam search)."""
        if self.unit_steps:
            return type(self.unit_steps[-1]).unit
        strategy = STRATEGIES.get(self.settings.strategy)
        units = [kind.unit for kind in (strategy.step_events if strategy else ()) if is_unit_step_type(kind)]
        return units[0] if units else "token"

    @property
    def kv_cache_bytes(self) -> int | None:
        """The KV cache's measured size after the latest step (or the prefill)."""
        latest: UnitStep | PrefillDone | None = self.unit_steps[-1] if self.unit_steps else self.prefill
        return latest.kv_cache_bytes if latest is not None else None

    def count_label(self) -> str:
        return f"{len(self.unit_steps)} {self.step_unit}s"

    def label(self) -> str:
        """One line for the runs list."""
        head = f"#{self.index + 1} {self.settings.strategy}"
        if self.branch is not None:
            head += (f" · branch of #{self.branch.parent + 1} at step {self.branch.step}"
                     f" → {visible_token_text(self.branch.token_text)}")
        if self.source is not None:
            head += f" · opened from {self.source}"
        return f"{head} · {self.count_label()} · {self.status}"

    def decode_ms_per_token(self) -> float | None:
        timed = [e.step_ms for e in self.unit_steps if not getattr(e, "forced", False)]
        return sum(timed) / len(timed) if timed else None

    def tokens_per_s(self) -> float | None:
        if self.finished is not None:
            return self.finished.tokens_per_s
        per_token = self.decode_ms_per_token()
        return 1000.0 / per_token if per_token else None


def _drop_from(steps: list, position: int) -> None:
    """Remove the step events of steps ``position`` on from the end of ``steps`` (a rollback undid them)."""
    cut = len(steps)
    while cut and steps[cut - 1].step >= position:
        cut -= 1
    del steps[cut:]


class Session:
    """All runs of a window, the live one and the selected one."""

    def __init__(self) -> None:
        self.runs: list[Run] = []
        self.live: Run | None = None  # receives events
        self.selected: Run | None = None  # shown by the views

    def start_run(self, settings: RunSettings, branch: Branch | None = None) -> Run:
        run = Run(index=len(self.runs), settings=settings, branch=branch)
        self.runs.append(run)
        self.live = run
        self.selected = run
        return run

    def add_saved_run(self, events: list[Event], source: str) -> Run:
        """A run read from a saved trace: shown like any other, decoded by nobody (never live)."""
        run = Run.from_events(events, index=len(self.runs), source=source)
        if run.finished is None:
            run.error = "the saved trace ends before the run did"
        self.runs.append(run)
        self.selected = run
        return run

    def apply(self, event: Event) -> Run | None:
        """Fold an event into the live run; returns that run (None if no run is live)."""
        run = self.live
        if run is None:
            return None
        run.apply(event)
        if isinstance(event, RunFinished):
            self.live = None
        return run

    def fail(self, message: str) -> Run | None:
        run = self.live
        if run is not None:
            run.error = message
            self.live = None
        return run

    def end_live(self) -> None:
        """The worker finished: a run that got no final event (killed mid-way) is marked stopped."""
        if self.live is not None and self.live.finished is None and self.live.error is None:
            self.live.error = "ended without a final event"
        self.live = None

    def select(self, index: int) -> Run:
        self.selected = self.runs[index]
        return self.selected

    def branch_settings(self, run_index: int, step: int, token_id: int) -> tuple[RunSettings, Branch]:
        """Settings that replay run ``run_index`` up to ``step`` and force ``token_id`` there.

        The branch keeps the parent's settings (prompt included, whatever the editor says now), forces the
        parent's first ``step`` generated tokens plus the alternative, and keeps at least the parent's budget.
        """
        parent = self.runs[run_index]
        ids = parent.generated_ids
        if not 0 <= step <= len(ids):
            raise ValueError(f"run #{run_index + 1} has no step {step}")
        forced = (*ids[:step], token_id)
        text = ""
        if step < len(parent.steps):
            text = next((c.text for c in parent.steps[step].candidates if c.token_id == token_id), "")
        settings = parent.settings.replace(
            forced_token_ids=forced,
            max_new_tokens=max(parent.settings.max_new_tokens, len(forced) + 1),
        )
        return settings, Branch(parent=run_index, step=step, token_id=token_id, token_text=text)
