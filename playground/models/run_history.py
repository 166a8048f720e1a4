"""The token sequences (prompt + output) of a session's earlier runs on one loaded model: what the suffix drafter
learns from. Held by the ``LoadedModel`` the caller hands to each run (``LoadedModel.history``), in memory only,
for as long as that model is loaded: no process-wide state."""

from __future__ import annotations

from dataclasses import dataclass, field

KEEP_RUNS = 32  # the latest runs kept
KEEP_TOKENS = 16_384  # ... and at most this many tokens of them


@dataclass
class RunHistory:
    runs: list[list[int]] = field(default_factory=list)  # oldest first

    def remember(self, ids: list[int]) -> None:
        self.runs.append(list(ids))
        while len(self.runs) > KEEP_RUNS or (len(self.runs) > 1 and sum(map(len, self.runs)) > KEEP_TOKENS):
            self.runs.pop(0)

    def earlier_runs(self) -> list[list[int]]:
        """The runs remembered, oldest first (a new list; the caller owns it, not the sequences)."""
        return list(self.runs)

    def forget(self) -> None:
        self.runs.clear()
