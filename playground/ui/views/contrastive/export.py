"""The contrastive view's data export: every recorded candidate of every step, one CSV row each."""

from __future__ import annotations

import csv
from pathlib import Path

from playground.state.contrastive import ContrastiveState

CSV_COLUMNS = ("step", "token_id", "token", "expert_rank", "expert_logprob", "amateur_logprob", "score",
               "plausible", "contrast_prob", "chosen", "expert_top")


def write_candidates_csv(state: ContrastiveState, path: Path) -> None:
    with path.open("w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(CSV_COLUMNS)
        for record in state.steps:
            s = record.contrast
            for c in s.candidates:
                writer.writerow([s.step, c.token_id, c.text, c.expert_rank, repr(c.expert_logprob),
                                 repr(c.amateur_logprob), repr(c.score), int(c.plausible), repr(c.prob),
                                 int(c.token_id == s.token_id), int(c.token_id == s.expert_token_id)])
