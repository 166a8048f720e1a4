"""The speculative view's data export: every drafted token and target token of a run, one CSV row each."""

from __future__ import annotations

import csv
from pathlib import Path

from playground.state.speculative import ACCEPTED, GRAMMAR, REJECTED, TARGET, SpeculativeState

CSV_COLUMNS = ("round", "position", "token_id", "token", "kind", "draft_q", "target_p", "draw", "accepted", "parent",
               "depth", "rank")


def write_rounds_csv(state: SpeculativeState, path: Path) -> None:
    with path.open("w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for r in state.rounds:
            parents = r.parents or range(-1, len(r.drafted) - 1)
            for i, (d, parent, depth) in enumerate(zip(r.drafted, parents, r.depths(), strict=True)):
                kind = ACCEPTED if d.accepted else GRAMMAR if d.grammar_rejected else REJECTED
                writer.writerow([r.round, i, d.token_id, d.text, kind,
                                 repr(d.draft_prob), repr(d.target_prob),
                                 "" if d.draw is None else repr(d.draw), int(d.accepted), parent, depth, d.rank])
            if r.target_kind != "none":
                writer.writerow([r.round, len(r.drafted), r.target_token_id, r.target_text,
                                 f"{TARGET} ({r.target_kind})", "", repr(r.target_prob), "", "",
                                 r.accepted - 1, r.accepted, ""])
