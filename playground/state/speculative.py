"""Qt-free: folds speculative decoding's events into what the speculative view shows.

Under a constraint, a drafted token the grammar forbade is marked *rejected by the grammar* instead (it never
reached the target's pass), and the acceptance is split by where each token was drafted: at a forced step (the
grammar allowed one token), inside a constrained span (it allowed fewer than half the vocabulary) or outside one.

Three kinds of output mark: drafted tokens the target *accepted*, drafted tokens it *rejected* (kept in the text,
right after the accepted prefix of their round, where the target's correction follows them), and the *target's own*
token of each round (the correction after a rejection, or the bonus after a fully accepted draft). Tokens forced by
branching come in ordinary ``token`` events with no round; they are marks of their own. A tree round (each round
drafts a tree of candidates) marks as rejected only the children of the accepted path's last node (of the context
when nothing was accepted), in the drafter's rank order: the alternatives the target turned down where the path
stopped, not every branch the tree held.

Figures (live, from the rounds): acceptance overall and by draft position (by depth, for trees), mean accepted drafts
per round, target calls saved, and a what-if of the expected speed-up against k (Leviathan et al. 2023) from the
measured acceptance and the measured draft and verify times; for tree runs also a what-if grid over the tree's depth
and width (``tree_what_if``). The measured speed-up against plain decoding arrives with the run's final event
(``RunFinished.figures``).

Events come in the engine's order: a round, then the ``token`` events of the tokens it emitted. Folding one event
costs time proportional to that event (sums are kept, not recounted), so a view can refresh often.
"""

from __future__ import annotations

from dataclasses import dataclass

from playground.events import Event, PrefillDone, RunFinished, TokenStep
from playground.events.speculative import SpeculativeRound, SpeculativeStarted
from playground.state.fold import STATUS, Fold

ACCEPTED = "accepted"  # a drafted token the target kept
REJECTED = "rejected"  # a drafted token the target threw away (it is not in the output)
TARGET = "target"  # the target's own token: a correction after a rejection, or the bonus after a full draft
FORCED = "forced"  # forced by branching (no drafting, no verdict)
GRAMMAR = "grammar_rejected"  # a drafted token the constraint forbade: rejected before verification
KINDS = (ACCEPTED, REJECTED, TARGET, FORCED, GRAMMAR)
SPANS = ("forced", "inside", "outside")  # where a token was drafted under a constraint (``DraftToken.span``)

ROUNDS = "rounds"  # a part: the rounds (timeline, round chart, acceptance by position, what-if)
MARKS = "marks"  # a part: the output's marks (the text)

K_RANGE = range(0, 17)  # the what-if's k axis: 0 (plain decoding) to the settings' maximum


@dataclass
class Mark:
    """One token of the marked output, in reading order."""

    kind: str  # ACCEPTED | REJECTED | TARGET | FORCED
    text: str  # the emitted token's incremental text once its ``token`` event came; the drafted text before
    round: int | None  # the round it belongs to (None: forced, or the target's token after forced tokens)
    position: int | None  # drafted tokens: index into the round's ``drafted`` (a chain's: its position, 0 = first;
    # a tree's path node i is at depth i); the target's token: the round's accepted count
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


@dataclass(frozen=True)
class TreeWhatIf:
    """Tree runs: what the rounds would have given with the tree cut to its first ``depth`` levels and its first
    ``width`` children per node (by the drafter's rank). Grids are indexed ``[depth − 1][width − 1]``; the last
    cell is the tree as drafted (this run)."""

    depths: tuple[int, ...]  # 1 … the most levels a round drafted
    widths: tuple[int, ...]  # 1 … the highest rank drafted + 1
    tokens: tuple[tuple[float, ...], ...]  # mean tokens per round: accepted path within the cut, + the target's own
    nodes: tuple[tuple[float, ...], ...]  # mean nodes per round the cut tree would have drafted
    speedups: tuple[tuple[float, ...], ...]  # estimated speed-up over plain decoding
    exact: bool  # greedy verification: the tokens grid is exact (the target's choice at each node is fixed)
    draft_ms: float  # per drafted node
    verify_ms_0: float  # c_verify(0)
    verify_ms_per_node: float  # c_verify's slope per node
    plain_ms: float
    plain_measured: bool
    rounds: int


def rejected_nodes(r: SpeculativeRound) -> list[int]:
    """Indices into ``r.drafted`` of the drafts marked rejected: a chain's drafts after its accepted prefix; a
    tree's children of the accepted path's last node (of the context when none was accepted), in rank order."""
    if not r.is_tree:
        return list(range(r.accepted, len(r.drafted)))
    last = r.accepted - 1
    children = [i for i, parent in enumerate(r.parents) if parent == last and i >= r.accepted]
    return sorted(children, key=lambda i: r.drafted[i].rank)


class SpeculativeState(Fold):
    """The rounds of one speculative run. ``apply(event)`` folds an event in; ``reset()`` empties it."""

    parts = frozenset({ROUNDS, MARKS})
    start_event = SpeculativeStarted

    def _clear(self) -> None:
        self.drafter = ""
        self.detail = ""
        self.draft_k = 0
        self.do_sample = False
        self.tree_width = 1  # candidates per depth (1: chains)
        self.tree_nodes = 0  # a tree's node budget (0: chains)
        self.rounds: list[SpeculativeRound] = []
        self.marks: list[Mark] = []
        self.round_marks: list[tuple[int, int]] = []  # (first, end) indices into marks of each round
        self.settled = 0  # marks[:settled] are final (what a view may draw)
        self.emitted = 0  # token events (every emitted token)
        self.drafted = 0
        self.accepted = 0
        self.examined = 0  # draft positions (tree depths) the verification reached: up to the first rejection
        self.drafted_at: list[int] = []  # per draft position (a tree's depth): rounds that drafted a token there
        self.reached_at: list[int] = []  # ... whose verification reached it (every earlier draft accepted)
        self.accepted_at: list[int] = []  # ... that kept it
        # Tree runs: sums over the rounds of the tree what-if's cells, [depth − 1][width − 1] (each round's counts
        # stop growing past its own depth and width, so a grid grows by repeating its last row or column).
        self._tree_tokens: list[list[int]] = [[0]]
        self._tree_nodes: list[list[int]] = [[0]]
        self.draft_ms = 0.0
        self.verify_ms = 0.0
        self.prefill_passes = 0  # target passes over the prompt before the first round (0 for a short prompt)
        self.prompt_passes = 0  # ... and in plain decoding, where the prompt's last pass gives the first token
        self.forced_rounds = 0  # target passes that verified forced tokens (branching)
        self._fit = [0.0] * 5  # n, Σx, Σy, Σx², Σxy of (drafted, verify_ms) per round
        self._pending: dict[int, int] = {}  # step -> index of its mark, until its token event comes
        self._last_forced = False
        self.constraint = ""  # the run's constraint kind ("" none)
        # under a constraint: per span, [drafted, accepted, rejected by the grammar]
        self.spans: dict[str, list[int]] = {span: [0, 0, 0] for span in SPANS}

    # --- folding events -------------------------------------------------------------------------------------
    def _fold(self, event: Event) -> set[str] | None:
        if isinstance(event, SpeculativeStarted):
            self.drafter, self.detail = event.drafter, event.detail
            self.draft_k, self.do_sample = event.draft_k, event.do_sample
            self.tree_width, self.tree_nodes = event.tree_width, event.tree_nodes
            self.constraint = event.constraint
        elif isinstance(event, PrefillDone):
            self.prefill_passes = event.forward_passes
            self.prompt_passes = event.forward_passes + int(event.deferred_tokens > 0)
            return {STATUS}
        elif isinstance(event, SpeculativeRound):
            self._add_round(event)
            return {ROUNDS, MARKS, STATUS}
        elif isinstance(event, TokenStep):
            self._add_token(event)
            return {MARKS, STATUS}
        return None

    def _finished(self, event: RunFinished) -> set[str]:
        self._settle_all()
        return set(self.parts)

    def _add_round(self, r: SpeculativeRound) -> None:
        index = len(self.rounds)  # = r.round (forced stretches are not rounds)
        self.rounds.append(r)
        n = len(r.drafted)
        first = len(self.marks)
        for i, d in enumerate(r.drafted[: r.accepted]):
            self._pending[r.first_step + i] = len(self.marks)
            self.marks.append(Mark(ACCEPTED, d.text, index, i, r.first_step + i))
        for i in rejected_nodes(r):
            kind = GRAMMAR if r.drafted[i].grammar_rejected else REJECTED
            self.marks.append(Mark(kind, r.drafted[i].text, index, i, None, settled=True))
        for i, d in enumerate(r.drafted):
            if d.span in self.spans:
                counts = self.spans[d.span]
                counts[0] += 1
                counts[1] += i < r.accepted
                counts[2] += d.grammar_rejected
        if r.target_kind != "none":
            step = r.first_step + r.accepted
            self._pending[step] = len(self.marks)
            self.marks.append(Mark(TARGET, r.target_text, index, r.accepted, step))
        self.round_marks.append((first, len(self.marks)))
        self.drafted += n
        self.accepted += r.accepted
        levels = max(r.depths(), default=-1) + 1  # a chain's: n
        self.examined += min(levels, r.accepted + 1)
        while len(self.drafted_at) < levels:
            self.drafted_at.append(0)
            self.reached_at.append(0)
            self.accepted_at.append(0)
        for i in range(levels):
            self.drafted_at[i] += 1
            if i <= r.accepted:
                self.reached_at[i] += 1
            if i < r.accepted:
                self.accepted_at[i] += 1
        if self.tree_width > 1:
            self._add_tree_cells(r, levels)
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

    def _add_tree_cells(self, r: SpeculativeRound, levels: int) -> None:
        """Add round ``r``'s tokens and nodes under every cut of the grid, growing the grid to the round's size.
        A cut to ``depth`` levels and ``width`` children keeps a node when it lies above that depth and its rank and
        every ancestor's are below that width; the accepted path keeps its longest prefix of kept nodes."""
        tokens, nodes = self._tree_tokens, self._tree_nodes
        width = max((d.rank + 1 for d in r.drafted), default=1)
        for grid in (tokens, nodes):
            for row in grid:  # wider: repeat the last column (no earlier round had a node there)
                row.extend([row[-1]] * (width - len(row)))
            while len(grid) < levels:  # deeper: repeat the last row
                grid.append(list(grid[-1]))
        rows, columns = len(tokens), len(tokens[0])
        parents = r.parents or range(-1, len(r.drafted) - 1)
        depths = r.depths()
        widest: list[int] = []  # per node: the highest rank on the way from the context to it
        counts = [[0] * columns for _ in range(rows)]  # nodes per (depth, widest)
        for i, (d, parent) in enumerate(zip(r.drafted, parents, strict=True)):
            widest.append(max(d.rank, widest[parent]) if parent >= 0 else d.rank)
            counts[depths[i]][widest[i]] += 1
        for w in range(1, columns + 1):
            path = next((i for i in range(r.accepted) if widest[i] >= w), r.accepted)  # widest grows along it
            kept = 0
            for depth in range(1, rows + 1):
                kept += sum(counts[depth - 1][:w])
                tokens[depth - 1][w - 1] += min(path, depth) + int(r.target_kind != "none")
                nodes[depth - 1][w - 1] += kept

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

    def _ended_without_finish(self) -> None:
        """A run that ended without RunFinished (failed, stopped): draw what there is."""
        self._settle_all()

    # --- reading ----------------------------------------------------------------------------------------------

    @property
    def is_tree(self) -> bool:
        """The run drafted trees (its rounds may still be chains where the drafter found one branch)."""
        return self.tree_width > 1

    @property
    def tree_shape(self) -> str:
        """The tree's shape in words ("tree 3 wide ≤ 16 nodes"); empty for chains."""
        return f"tree {self.tree_width} wide ≤ {self.tree_nodes} nodes" if self.is_tree else ""

    @property
    def rejected(self) -> int:
        return self.drafted - self.accepted

    @property
    def grammar_rejected(self) -> int:
        """Drafted tokens the constraint forbade (rejected before verification)."""
        return sum(counts[2] for counts in self.spans.values())

    def span_counts(self, span: str) -> tuple[int, int, int]:
        """(drafted, accepted, rejected by the grammar) at ``span``: "forced", "inside", "outside", or "free" (the
        steps that were not forced, inside or outside)."""
        if span == "free":
            inside, outside = self.spans["inside"], self.spans["outside"]
            return inside[0] + outside[0], inside[1] + outside[1], inside[2] + outside[2]
        drafted, accepted, rejected = self.spans[span]
        return drafted, accepted, rejected

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
        plain_ms = 1000.0 / baseline if baseline and baseline > 0 else fit[0]  # (plain_measured)
        ks = tuple(K_RANGE)
        speedups = tuple(what_if_speedup(alpha, k, c_draft, fit[0], fit[1], plain_ms) for k in ks)
        return WhatIf(alpha, c_draft, fit[0], fit[1], plain_ms, plain_measured, ks, speedups)

    def tree_what_if(self) -> TreeWhatIf | None:
        """Tree runs: the depth × width grid of mean tokens per round and estimated speed-up, had the trees been
        cut (None for chains, and before a round with a draft). Tokens per round are exact for greedy verification
        (the target's choice at every node is fixed, so a cut tree's accepted path is the drafted path's longest
        prefix inside the cut); for sampled runs an estimate. The speed-up: those tokens for the cut tree's nodes ×
        c_draft + c_verify(nodes) ms per round, against plain decoding's ms per token (as ``what_if``)."""
        fit = self.verify_fit()
        if not self.is_tree or fit is None or not self.drafted:
            return None
        c_draft = self.draft_ms / self.drafted
        baseline = self.baseline_tokens_per_s
        plain_measured = bool(baseline and baseline > 0)
        plain_ms = 1000.0 / baseline if baseline and baseline > 0 else fit[0]  # (plain_measured)
        n = len(self.rounds)
        tokens = tuple(tuple(t / n for t in row) for row in self._tree_tokens)
        nodes = tuple(tuple(k / n for k in row) for row in self._tree_nodes)

        def speedup(t: float, k: float) -> float:
            cost = k * c_draft + fit[0] + k * fit[1]
            return t * plain_ms / cost if cost > 0 and plain_ms > 0 else 0.0

        speedups = tuple(tuple(speedup(t, k) for t, k in zip(trow, krow, strict=True))
                         for trow, krow in zip(tokens, nodes, strict=True))
        return TreeWhatIf(tuple(range(1, len(tokens) + 1)), tuple(range(1, len(tokens[0]) + 1)), tokens, nodes,
                          speedups, not self.do_sample, c_draft, fit[0], fit[1], plain_ms, plain_measured, n)

    def most_interesting_round(self) -> int | None:
        """The round worth showing first: one with accepted drafts and a rejection (most accepted), else one with
        a rejection (most drafted), else the longest accepted draft, else the last."""
        if not self.rounds:
            return None

        def score(index: int) -> tuple[int, int, int]:
            r = self.rounds[index]
            rejected = bool(rejected_nodes(r))  # a chain's: a draft after the accepted ones
            return (2 if rejected and r.accepted else 1 if rejected else 0, r.accepted, len(r.drafted))

        return max(range(len(self.rounds)), key=score)
