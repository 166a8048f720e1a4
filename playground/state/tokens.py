"""What the tokens view shows of greedy/sampling steps: the probability shading, the chart rows, the step worth
showing first."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from playground.events import Candidate, TokenStep
from playground.state.text import visible_token_text

# Log-prob colour scale: everything at or below this is drawn in the darkest shade (p <= ~0.1 %).
LOGPROB_FLOOR = math.log(1e-3)

REST_OF_VOCAB = "(rest of vocabulary)"


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


def chart_candidates(step: TokenStep, limit: int | None = None) -> list[Candidate]:
    """The candidates ``chart_rows`` shows, by raw probability (the chosen one always among them)."""
    candidates: list[Candidate] = sorted(step.candidates, key=lambda c: c.raw_rank)
    if limit is not None and len(candidates) > limit:
        kept = candidates[:limit]
        if all(c.token_id != step.token_id for c in kept):
            kept[-1] = next(c for c in candidates if c.token_id == step.token_id)
        candidates = kept
    return candidates


def rest_shares(candidates: list[Candidate]) -> tuple[float, float]:
    """What ``candidates`` leave of the raw and of the processed distribution (the chart's rest row)."""
    return _rest(sum(c.raw_prob for c in candidates)), _rest(sum(c.processed_prob for c in candidates))


def chart_rows(step: TokenStep, limit: int | None = None) -> list[ChartRow]:
    """The step's candidates by raw probability (chosen one always included), then the rest of the vocabulary.

    The rest row's raw share is what the shown candidates leave uncovered; its processed share is what the
    sampler pipeline left to tokens not shown.
    """
    candidates = chart_candidates(step, limit)
    rows = [
        ChartRow(visible_token_text(c.text), c.token_id, c.raw_prob, c.processed_prob,
                 c.token_id == step.token_id, c.cut_by)
        for c in candidates
    ]
    raw_rest, processed_rest = rest_shares(candidates)
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
    """The step worth showing first (screenshots): under a constraint, the step where it removed the most raw
    probability while the model still had a choice among allowed tokens (where it overrode the model); else the
    least certain non-forced one, ignoring a final EOS."""
    if not steps:
        return None
    pool = [s for s in steps[:-1] if not s.forced] or [s for s in steps if not s.forced] or steps
    overridden = [s for s in pool if s.grammar is not None and s.grammar.top_forbidden and s.grammar.allowed > 1]
    if overridden:
        return max(overridden, key=lambda s: s.grammar.removed_mass if s.grammar else 0.0).step
    return max(pool, key=lambda s: s.entropy).step


_BYTE_TOKEN = re.compile(r"(?:<0x[0-9A-Fa-f]{2}>)+")


def token_bytes(step: TokenStep) -> bytes:
    """The bytes the chosen token stands for: its ``<0xE9>`` pieces when it is part of a character, else the UTF-8
    of its text."""
    own = next((c.text for c in step.candidates if c.token_id == step.token_id), step.text)
    if _BYTE_TOKEN.fullmatch(own):
        return bytes(int(own[i + 3 : i + 5], 16) for i in range(0, len(own), 6))
    return own.encode("utf-8")


def _char_spans(data: bytes) -> list[tuple[int, int]]:
    """Byte spans of the UTF-8 characters in ``data`` (a stray byte is a span of its own)."""
    spans, i = [], 0
    while i < len(data):
        lead = data[i]
        size = 1 if lead < 0x80 else 2 if lead >> 5 == 0b110 else 3 if lead >> 4 == 0b1110 else \
            4 if lead >> 3 == 0b11110 else 1
        spans.append((i, min(i + size, len(data))))
        i += size
    return spans


def split_characters(steps: list[TokenStep]) -> dict[int, str]:
    """For every token of a run that carries part of a character, what part: ``{step: "byte 1 of 3 of 长"}``."""
    return {index: piece[0] for index in range(len(steps)) if (piece := character_piece(steps, index))}


def _describe_group(group: list[tuple[int, bytes]]) -> dict[int, str]:
    data = b"".join(b for _, b in group)
    spans = _char_spans(data)
    notes: dict[int, str] = {}
    start = 0
    for index, piece in group:
        end = start + len(piece)
        parts = []
        for a, b in spans:
            lo, hi = max(a, start), min(b, end)
            if lo >= hi or (lo == a and hi == b):
                continue  # not in this token, or whole in it
            char = data[a:b].decode("utf-8", errors="replace")
            which = f"byte {lo - a + 1}" if hi - lo == 1 else f"bytes {lo - a + 1}–{hi - a}"
            parts.append(f"{which} of {b - a} of {char}")
        if parts:
            notes[index] = "; ".join(parts)
        start = end
    return notes


def character_piece(steps: list[TokenStep], index: int) -> tuple[str, str] | None:
    """(note, characters) when step ``index`` holds part of a split character — ``("byte 1 of 3 of 长", "长")`` —
    looking only at the tokens of its character (work proportional to the group, not the run)."""
    start = index
    while start > 0 and not steps[start - 1].text:
        start -= 1
    end = index
    while end < len(steps) - 1 and not steps[end].text:
        end += 1
    notes = _describe_group([(i, token_bytes(steps[i])) for i in range(start, end + 1)])
    note = notes.get(index)
    if note is None:
        return None
    chars = "".join(part.rsplit(" of ", 1)[1] for part in note.split("; "))
    return note, chars
