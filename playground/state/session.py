"""Qt-free session state: folds engine events into what the views show.

A session holds every run the user made (the original and its branches). Events always go to the *live* run
(the one being decoded); the views show the *selected* run, which is usually the live one but can be any earlier
run picked from the runs list. Views re-derive themselves from a run's recorded events, never by re-running.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from playground.config import RunSettings
from playground.events import (
    BeamStep,
    Candidate,
    Event,
    PrefillDone,
    RunFinished,
    RunStarted,
    TokenStep,
)

# Log-prob colour scale: everything at or below this is drawn in the darkest shade (p <= ~0.1 %).
LOGPROB_FLOOR = math.log(1e-3)

REST_OF_VOCAB = "(rest of vocabulary)"


# Characters that change how the *following* text is laid out (bidi overrides, zero-width marks) or draw nothing:
# shown as a visible escape so a token cannot reverse or hide its neighbours.
_FORMAT_CHARS = {*range(0x200B, 0x2010), *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xFEFF}


def _escape_char(ch: str) -> str:
    code = ord(ch)
    if code < 0x20:
        return chr(0x2400 + code)  # Unicode's "control pictures": ␀ ␁ … ␟
    if code == 0x7F:
        return "␡"
    if code in _FORMAT_CHARS:
        return f"⟨U+{code:04X}⟩"
    return ch


def flowing_token_text(text: str) -> str:
    """Token text for the output document: line breaks shown as ↵ and kept, other invisibles escaped."""
    text = text.replace("\r\n", "\n").replace("\u2028", "\n").replace("\u2029", "\n")
    return "".join("↵\n" if ch == "\n" else "\t" if ch == "\t" else _escape_char(ch) for ch in text)


def visible_token_text(text: str) -> str:
    """Token text on one line with invisible characters made visible, for axis labels and lists."""
    if text == "":
        return "∅"
    marks = {" ": "␣", "\n": "↵", "\t": "⇥", "\r": "␍", "\u2028": "↵", "\u2029": "↵"}
    return "".join(marks.get(ch) or _escape_char(ch) for ch in text)


def shade_fraction(prob: float) -> float:
    """Position of a probability on the clamped log-prob colour scale: 0 = certain (p=1), 1 = p <= 0.1 %."""
    if prob <= 0.0:
        return 1.0
    logprob = math.log(min(prob, 1.0))
    return min(1.0, max(0.0, logprob / LOGPROB_FLOOR))


def chosen_text(step: TokenStep) -> str:
    """The chosen token's own text (its output delta can be empty when it ends mid-character)."""
    if step.text:
        return step.text
    return next((c.text for c in step.candidates if c.token_id == step.token_id), "")


def settings_summary(settings: RunSettings) -> str:
    """The settings that shaped a run, in one line (only what the strategy uses and what is switched on)."""
    s = settings
    parts = [s.strategy, f"max {s.max_new_tokens}"]
    if s.strategy == "sample":
        parts += [f"T={s.temperature:g}", f"seed {s.seed}"]
        parts += [text for on, text in ((s.top_k > 0, f"top-k {s.top_k}"), (s.top_p < 1, f"top-p {s.top_p:g}"),
                                        (s.min_p > 0, f"min-p {s.min_p:g}")) if on]
    if s.strategy == "beam":
        parts += [f"{s.num_beams} beams", f"length penalty {s.length_penalty:g}"]
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
    steps: list[TokenStep] = field(default_factory=list)
    beam_steps: list[BeamStep] = field(default_factory=list)
    finished: RunFinished | None = None
    error: str | None = None

    def apply(self, event: Event) -> None:
        self.events.append(event)
        if isinstance(event, RunStarted):
            self.started = event
        elif isinstance(event, PrefillDone):
            self.prefill = event
        elif isinstance(event, TokenStep):
            self.steps.append(event)
        elif isinstance(event, BeamStep):
            self.beam_steps.append(event)
        elif isinstance(event, RunFinished):
            self.finished = event

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

    def count_label(self) -> str:
        """How far the run got: tokens for greedy/sampling, steps for beam search (each step grows every beam)."""
        if self.settings.strategy == "beam":
            return f"{len(self.beam_steps)} steps"
        return f"{len(self.steps)} tokens"

    def label(self) -> str:
        """One line for the runs list."""
        head = f"#{self.index + 1} {self.settings.strategy}"
        if self.branch is not None:
            head += (f" · branch of #{self.branch.parent + 1} at step {self.branch.step}"
                     f" → {visible_token_text(self.branch.token_text)}")
        return f"{head} · {self.count_label()} · {self.status}"

    def decode_ms_per_token(self) -> float | None:
        timed = [s.step_ms for s in self.steps if not s.forced] or [s.step_ms for s in self.beam_steps]
        return sum(timed) / len(timed) if timed else None

    def tokens_per_s(self) -> float | None:
        if self.finished is not None:
            return self.finished.tokens_per_s
        per_token = self.decode_ms_per_token()
        return 1000.0 / per_token if per_token else None


@dataclass(frozen=True)
class ChartRow:
    """One row of the candidates bar chart."""

    label: str
    token_id: int | None  # None for the rest-of-vocabulary row
    raw_prob: float
    processed_prob: float
    chosen: bool
    cut_by: str | None


def _rest(shown: float) -> float:
    """What ``shown`` leaves of a distribution; float32 round-off below 1e-6 is no probability at all."""
    rest = 1.0 - shown
    return rest if rest > 1e-6 else 0.0


def chart_rows(step: TokenStep, limit: int | None = None) -> list[ChartRow]:
    """The step's candidates by raw probability (chosen one always included), then the rest of the vocabulary.

    The rest row's raw share is what the shown candidates leave uncovered; its processed share is what the
    sampler pipeline left to tokens not shown.
    """
    candidates: list[Candidate] = sorted(step.candidates, key=lambda c: c.raw_rank)
    if limit is not None and len(candidates) > limit:
        kept = candidates[:limit]
        if all(c.token_id != step.token_id for c in kept):
            kept[-1] = next(c for c in candidates if c.token_id == step.token_id)
        candidates = kept
    rows = [
        ChartRow(visible_token_text(c.text), c.token_id, c.raw_prob, c.processed_prob,
                 c.token_id == step.token_id, c.cut_by)
        for c in candidates
    ]
    raw_rest = _rest(sum(c.raw_prob for c in candidates))
    processed_rest = _rest(sum(c.processed_prob for c in candidates))
    rows.append(ChartRow(REST_OF_VOCAB, None, raw_rest, processed_rest, False, None))
    return rows


def cut_summary(rows: list[ChartRow] | TokenStep) -> dict[str, int]:
    """How many of the shown rows (or all of a step's recorded candidates) each processor removed."""
    items = rows.candidates if isinstance(rows, TokenStep) else rows
    counts: dict[str, int] = {}
    for item in items:
        if item.cut_by:
            counts[item.cut_by] = counts.get(item.cut_by, 0) + 1
    return counts


def most_interesting_step(steps: list[TokenStep]) -> int | None:
    """The step worth showing first (screenshots): the least certain non-forced one, ignoring a final EOS."""
    if not steps:
        return None
    pool = [s for s in steps[:-1] if not s.forced] or [s for s in steps if not s.forced] or steps
    return max(pool, key=lambda s: s.entropy).step


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
