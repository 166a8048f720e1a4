"""Qt-free: folds speculative decoding's events into what the speculative view shows.

Three kinds of output mark: drafted tokens the target *accepted*, drafted tokens it *rejected* (kept in the text,
right after the accepted prefix of their round, where the target's correction follows them), and the *target's own*
token of each round (the correction after a rejection, or the bonus after a fully accepted draft). Tokens forced by
branching come in ordinary ``token`` events with no round; they are marks of their own.

Figures (live, from the rounds): acceptance overall and by draft position, mean accepted drafts per round, target
calls saved, and a what-if of the expected speed-up against k (Leviathan et al. 2023) from the measured acceptance
and the measured draft and verify times. The measured speed-up against plain decoding arrives with the run's final
event (``RunFinished.figures``).

Events come in the engine's order: a round, then the ``token`` events of the tokens it emitted. Folding one event
costs time proportional to that event (sums are kept, not recounted), so a view can refresh often.
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.events import Event, PrefillDone, RunFinished, RunStarted, TokenStep
from playground.events.speculative import SpeculativeRound, SpeculativeStarted
from playground.state.run_end import RunEnd

ACCEPTED = "accepted"  # a drafted token the target kept
REJECTED = "rejected"  # a drafted token the target threw away (it is not in the output)
TARGET = "target"  # the target's own token: a correction after a rejection, or the bonus after a full draft
FORCED = "forced"  # forced by branching (no drafting, no verdict)
KINDS = (ACCEPTED, REJECTED, TARGET, FORCED)

K_RANGE = range(0, 17)  # the what-if's k axis: 0 (plain decoding) to the settings' maximum


@dataclass
class Mark:
    """One token of the marked output, in reading order."""

    kind: str  # ACCEPTED | REJECTED | TARGET | FORCED
    text: str  # the emitted token's incremental text once its ``token`` event came; the drafted text before
    round: int | None  # the round it belongs to (None: forced, or the target's token after forced tokens)
    position: int | None  # drafted tokens: position in the draft (0 = first); the target's token: len(draft)
    step: int | None  # output position of an emitted token (None: rejected drafts, never emitted)
    settled: bool = False  # its text is final (rejected drafts at once; emitted tokens when their step comes)


def expected_tokens(alpha: float, k: int) -> float:
    """Expected tokens per round, E(k) = (1 − α^(k+1)) / (1 − α), when each draft is accepted with probability α
    independently (Leviathan et al. 2023, eq. 1); k + 1 when α = 1."""
    if abs(1.0 - alpha) < 1e-12:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def what_if_speedup(alpha: float, k: int, draft_ms: float, verify_ms_0: float, verify_ms_per_draft: float,
                    plain_ms: float) -> float:
    """Expected speed-up over plain decoding with ``k`` drafts per round: E(k) tokens per round for
    k·c_draft + c_verify(k) ms per round, against ``plain_ms`` per token; c_verify(k) = ``verify_ms_0`` +
    k·``verify_ms_per_draft``."""
    cost = k * draft_ms + verify_ms_0 + k * verify_ms_per_draft
    if cost <= 0 or plain_ms <= 0:
        return 0.0
    return expected_tokens(alpha, k) * plain_ms / cost


@dataclass(frozen=True)
class WhatIf:
    """The inputs of the what-if curve and the curve itself."""

    alpha: float
    draft_ms: float  # c_draft: per drafted token
    verify_ms_0: float  # c_verify(0)
    verify_ms_per_draft: float  # c_verify's slope
    plain_ms: float  # per token of plain decoding
    plain_measured: bool  # plain_ms is the measured baseline (else: c_verify(0), an estimate)
    ks: tuple[int, ...]
    speedups: tuple[float, ...]


class SpeculativeState(RunEnd):
    """The rounds of one speculative run. ``apply(event)`` folds an event in; ``reset()`` empties it."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.drafter = ""
        self.detail = ""
        self.draft_k = 0
        self.do_sample = False
        self.rounds: list[SpeculativeRound] = []
        self.marks: list[Mark] = []
        self.round_marks: list[tuple[int, int]] = []  # (first, end) indices into marks of each round
        self.settled = 0  # marks[:settled] are final (what a view may draw)
        self.emitted = 0  # token events (every emitted token)
        self.drafted = 0
        self.accepted = 0
        self.examined = 0  # drafts the verification reached: up to and including the first rejection
        self.drafted_at: list[int] = []  # per draft position: rounds that drafted a token there
        self.reached_at: list[int] = []  # ... whose verification reached it (every earlier draft accepted)
        self.accepted_at: list[int] = []  # ... that kept it
        self.draft_ms = 0.0
        self.verify_ms = 0.0
        self.prefill_passes = 0  # target passes over the prompt before the first round (0 for a short prompt)
        self.prompt_passes = 0  # ... and in plain decoding, where the prompt's last pass gives the first token
        self.forced_rounds = 0  # target passes that verified forced tokens (branching)
        self._fit = [0.0] * 5  # n, Σx, Σy, Σx², Σxy of (drafted, verify_ms) per round
        self._pending: dict[int, int] = {}  # step -> index of its mark, until its token event comes
        self._last_forced = False
        self.figures: dict[str, float] = {}
        self.tokens_per_s: float | None = None
        self.stop_reason: str | None = None
        self.ended_status: str | None = None

    # --- folding events -------------------------------------------------------------------------------------
    def apply(self, event: Event) -> bool:
        """Fold one event in; True when the state changed."""
        if isinstance(event, RunStarted):
            self.reset()
        elif isinstance(event, SpeculativeStarted):
            self.drafter, self.detail = event.drafter, event.detail
            self.draft_k, self.do_sample = event.draft_k, event.do_sample
        elif isinstance(event, PrefillDone):
            self.prefill_passes = event.forward_passes
            self.prompt_passes = event.forward_passes + int(event.deferred_tokens > 0)
        elif isinstance(event, SpeculativeRound):
            self._add_round(event)
        elif isinstance(event, TokenStep):
            self._add_token(event)
        elif isinstance(event, RunFinished):
            self.figures = dict(event.figures)
            self.tokens_per_s = event.tokens_per_s
            self.stop_reason = event.stop_reason
            self._settle_all()
        else:
            return False
        return True

    def _add_round(self, r: SpeculativeRound) -> None:
        index = len(self.rounds)  # = r.round (forced stretches are not rounds)
        self.rounds.append(r)
        n = len(r.drafted)
        first = len(self.marks)
        for i, d in enumerate(r.drafted[: r.accepted]):
            self._pending[r.first_step + i] = len(self.marks)
            self.marks.append(Mark(ACCEPTED, d.text, index, i, r.first_step + i))
        for i, d in enumerate(r.drafted[r.accepted :], start=r.accepted):
            self.marks.append(Mark(REJECTED, d.text, index, i, None, settled=True))
        if r.target_kind != "none":
            step = r.first_step + r.accepted
            self._pending[step] = len(self.marks)
            self.marks.append(Mark(TARGET, r.target_text, index, r.accepted, step))
        self.round_marks.append((first, len(self.marks)))
        self.drafted += n
        self.accepted += r.accepted
        self.examined += min(n, r.accepted + 1)
        while len(self.drafted_at) < n:
            self.drafted_at.append(0)
            self.reached_at.append(0)
            self.accepted_at.append(0)
        for i in range(n):
            self.drafted_at[i] += 1
            if i <= r.accepted:
                self.reached_at[i] += 1
            if i < r.accepted:
                self.accepted_at[i] += 1
        self.draft_ms += r.draft_ms
        self.verify_ms += r.verify_ms
        if not r.prompt_read:  # a pass that also read the prompt is not what verifying a draft costs
            fit = self._fit
            fit[0] += 1
            fit[1] += n
            fit[2] += r.verify_ms
            fit[3] += n * n
            fit[4] += n * r.verify_ms
        self._last_forced = False
        self._advance_settled()

    def _add_token(self, step: TokenStep) -> None:
        self.emitted += 1
        index = self._pending.pop(step.step, None)
        if index is None:  # not from a round: forced by branching, or the target's token right after them
            if step.forced and not self._last_forced:
                self.forced_rounds += 1
            self._last_forced = step.forced
            index = len(self.marks)
            self.marks.append(Mark(FORCED if step.forced else TARGET, step.text, None, None, step.step))
        self.marks[index].text = step.text
        self.marks[index].settled = True
        self._advance_settled()

    def _advance_settled(self) -> None:
        while self.settled < len(self.marks) and self.marks[self.settled].settled:
            self.settled += 1

    def _settle_all(self) -> None:
        """The run ended: every mark is final (accepted drafts after an EOS never got a token event)."""
        for mark in self.marks[self.settled :]:
            mark.settled = True
        self._pending.clear()
        self.settled = len(self.marks)

    def end(self, status: str) -> None:
        """A run that ended without RunFinished (failed, stopped): draw what there is; a no-op after one."""
        if self.stop_reason is None:
            super().end(status)
            self._settle_all()

    # --- reading ----------------------------------------------------------------------------------------------

    @property
    def rejected(self) -> int:
        return self.drafted - self.accepted

    @property
    def acceptance_rate(self) -> float | None:
        """Accepted ÷ drafted (the engine's ``acceptance_rate``); None before any draft."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def alpha(self) -> float | None:
        """Per-draft acceptance α: accepted ÷ drafts the verification reached (the estimate of α in E(k): drafts
        after a rejection were never judged)."""
        return self.accepted / self.examined if self.examined else None

    def position_rates(self) -> list[float | None]:
        """Per draft position: accepted ÷ reached (None where no verification reached it)."""
        return [a / r if r else None for a, r in zip(self.accepted_at, self.reached_at, strict=True)]

    @property
    def mean_accepted(self) -> float | None:
        """Accepted drafts per round (the engine's ``mean_accepted``)."""
        return self.accepted / len(self.rounds) if self.rounds else None

    @property
    def target_calls(self) -> int:
        """Target forward passes: the prompt's before the first round (none for a short prompt, read with the
        first draft), one per round, one per forced stretch (the final figure once it came)."""
        if "target_calls" in self.figures:
            return int(self.figures["target_calls"])
        return self.prefill_passes + len(self.rounds) + self.forced_rounds

    @property
    def plain_calls(self) -> int:
        """Target passes plain decoding makes for as many tokens: the prompt's (its last gives the first token),
        then one per token."""
        return self.prompt_passes + max(self.emitted - 1, 0)

    @property
    def calls_saved(self) -> int:
        return self.plain_calls - self.target_calls

    @property
    def baseline_tokens_per_s(self) -> float | None:
        return self.figures.get("baseline_tokens_per_s")

    @property
    def speedup(self) -> float | None:
        return self.figures.get("speedup")

    def round_counts(self, index: int) -> tuple[int, int, int]:
        """(accepted, rejected, target's own) tokens of round ``index``."""
        r = self.rounds[index]
        return r.accepted, len(r.drafted) - r.accepted, int(r.target_kind != "none")

    def verify_fit(self) -> tuple[float, float] | None:
        """c_verify(k) ≈ a + b·k, least squares over the rounds (k = tokens drafted that round; b ≥ 0, constant
        when every round drafted as many)."""
        n, sx, sy, sxx, sxy = self._fit
        if n == 0:
            return None
        denominator = n * sxx - sx * sx
        slope = max(0.0, (n * sxy - sx * sy) / denominator) if denominator > 1e-9 else 0.0
        intercept = (sy - slope * sx) / n
        if intercept <= 0:  # a fit that says a pass costs nothing: fall back to the mean
            slope, intercept = 0.0, sy / n
        return intercept, slope

    def what_if(self) -> WhatIf | None:
        """The expected speed-up against k from the measured α and costs (None before any round with a draft)."""
        alpha, fit = self.alpha, self.verify_fit()
        if alpha is None or fit is None or not self.drafted:
            return None
        c_draft = self.draft_ms / self.drafted
        baseline = self.baseline_tokens_per_s
        plain_measured = bool(baseline and baseline > 0)
        plain_ms = 1000.0 / baseline if plain_measured else fit[0]
        ks = tuple(K_RANGE)
        speedups = tuple(what_if_speedup(alpha, k, c_draft, fit[0], fit[1], plain_ms) for k in ks)
        return WhatIf(alpha, c_draft, fit[0], fit[1], plain_ms, plain_measured, ks, speedups)

    def most_interesting_round(self) -> int | None:
        """The round worth showing first: one with accepted drafts and a rejection (most accepted), else one with
        a rejection (most drafted), else the longest accepted draft, else the last."""
        if not self.rounds:
            return None

        def score(index: int) -> tuple[int, int, int]:
            r = self.rounds[index]
            rejected = r.accepted < len(r.drafted)
            return (2 if rejected and r.accepted else 1 if rejected else 0, r.accepted, len(r.drafted))

        return max(range(len(self.rounds)), key=score)
