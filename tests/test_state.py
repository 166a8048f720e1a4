"""The Qt-free session state, fed by the real engine on a tiny model (and by hand-built events for edge cases)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from playground.config import RunSettings
from playground.engine.strategies import run_strategy
from playground.events import Candidate, RunFinished, TokenStep
from playground.state import (
    REST_OF_VOCAB,
    ChartRow,
    Session,
    chart_rows,
    chosen_text,
    cut_summary,
    flowing_token_text,
    most_interesting_step,
    settings_summary,
    shade_fraction,
    visible_token_text,
)


def _run(session: Session, lm, settings: RunSettings, branch=None):
    run = session.start_run(settings, branch)
    for event in run_strategy(lm, settings):
        session.apply(event)
    return run


def _step(step: int = 0, token_id: int = 1, text: str = "a", candidates=(), forced: bool = False,
          entropy: float = 1.0) -> TokenStep:
    candidates = candidates or (Candidate(token_id, text, 0.5, 0.7, 1),)
    return TokenStep(step=step, token_id=token_id, text=text, prob=0.7, raw_prob=0.5, logprob=math.log(0.5),
                     raw_rank=1, entropy=entropy, processed_entropy=0.5, candidates=tuple(candidates),
                     shown_raw_mass=sum(c.raw_prob for c in candidates), effects=(), forced=forced, step_ms=1.0,
                     kv_cache_bytes=100)


def test_session_folds_a_real_run(tiny_lm):
    session = Session()
    run = _run(session, tiny_lm, RunSettings(strategy="greedy", max_new_tokens=6))
    assert run.started is not None and run.prefill is not None
    assert isinstance(run.finished, RunFinished)
    assert [s.step for s in run.steps] == list(range(len(run.steps)))
    assert run.generated_ids == run.finished.token_ids == tuple(s.token_id for s in run.steps)
    assert run.text == run.finished.text
    assert not run.running and session.live is None and session.selected is run
    assert run.status == run.finished.stop_reason
    assert run.label().startswith("#1 greedy") and run.status in run.label()
    assert run.tokens_per_s() == run.finished.tokens_per_s
    assert run.decode_ms_per_token() > 0


def test_branch_forces_the_prefix_and_keeps_the_parent(tiny_lm):
    session = Session()
    parent = _run(session, tiny_lm, RunSettings(strategy="greedy", max_new_tokens=6))
    step = parent.steps[2]
    alt = next(c for c in step.candidates if c.token_id != step.token_id)
    settings, branch = session.branch_settings(parent.index, 2, alt.token_id)
    assert settings.forced_token_ids == (*parent.generated_ids[:2], alt.token_id)
    assert settings.prompt == parent.settings.prompt and settings.max_new_tokens == 6
    assert branch.parent == 0 and branch.step == 2 and branch.token_text == alt.text

    child = _run(session, tiny_lm, settings, branch)
    assert child.generated_ids[:3] == settings.forced_token_ids
    assert [s.forced for s in child.steps[:3]] == [True, True, True]
    assert len(session.runs) == 2 and session.runs[0] is parent  # the original stays reachable
    assert "branch of #1 at step 2" in child.label()
    assert session.select(0) is parent and session.selected is parent


def test_branch_at_the_last_step_still_has_room():
    session = Session()
    run = session.start_run(RunSettings(max_new_tokens=2))
    for i in range(2):
        session.apply(_step(i, token_id=10 + i))
    settings, _ = session.branch_settings(0, 2, 99)  # past the end: append to the full output
    assert settings.forced_token_ids == (10, 11, 99) and settings.max_new_tokens == 4
    with pytest.raises(ValueError):
        session.branch_settings(0, 5, 99)
    assert run.running


def test_failures_and_unfinished_runs():
    session = Session()
    run = session.start_run(RunSettings())
    assert session.fail("boom") is run and run.error == "boom" and run.status == "failed"
    assert session.apply(_step()) is None  # nothing is live any more
    other = session.start_run(RunSettings())
    session.end_live()
    assert other.error and not other.running


def test_chart_rows_cover_the_whole_distribution():
    chosen = Candidate(7, " far", 0.01, 0.0, 40, cut_by="top_k")
    top = [Candidate(i, f"t{i}", 0.2 - i * 0.02, 0.25 - i * 0.02 if i < 3 else 0.0, i + 1,
                     cut_by=None if i < 3 else "top_p") for i in range(6)]
    step = _step(token_id=7, text=" far", candidates=(*top, chosen))
    rows = chart_rows(step, limit=4)
    assert [r.token_id for r in rows[:-1]] == [0, 1, 2, 7]  # the chosen one replaces the last shown
    assert rows[-1].label == REST_OF_VOCAB and rows[-1].token_id is None
    assert math.isclose(sum(r.raw_prob for r in rows), 1.0)
    assert math.isclose(sum(r.processed_prob for r in rows), 1.0)
    assert rows[3].chosen and rows[3].cut_by == "top_k" and rows[3].label == "␣far"
    assert cut_summary(step) == {"top_p": 3, "top_k": 1}


def test_the_rest_row_is_what_the_shown_candidates_leave_and_nothing_below_round_off():
    # Shown candidates covering all but 4e-7 of each distribution: round-off, so the rest row is exactly 0.
    whole = (Candidate(1, "a", 0.6, 0.7, 1), Candidate(2, "b", 0.4 - 4e-7, 0.3 - 4e-7, 2))
    assert chart_rows(_step(token_id=1, candidates=whole))[-1] == ChartRow(REST_OF_VOCAB, None, 0.0, 0.0, False,
                                                                            None)
    # Two shown of three, limit 2 (as many as there are: nothing replaced); the rest is 1 - their sum, exactly.
    part = (Candidate(1, "a", 0.5, 0.6, 1), Candidate(2, "b", 0.25, 0.125, 2))
    rows = chart_rows(_step(token_id=2, candidates=part), limit=2)
    assert [r.token_id for r in rows] == [1, 2, None]
    assert rows[-1] == ChartRow(REST_OF_VOCAB, None, 1 - 0.75, 1 - 0.725, False, None)


def test_chart_rows_from_a_sampled_step_match_the_event(tiny_lm):
    session = Session()
    run = _run(session, tiny_lm, RunSettings(strategy="sample", max_new_tokens=3, top_k=3, seed=1))
    step = run.steps[0]
    rows = chart_rows(step)
    assert len(rows) == len(step.candidates) + 1
    assert sum(1 for r in rows if r.chosen) == 1
    assert {r.token_id for r in rows if r.cut_by == "top_k"} == {c.token_id for c in step.candidates
                                                                 if c.cut_by == "top_k"}
    assert math.isclose(rows[-1].raw_prob, 1 - sum(c.raw_prob for c in step.candidates), abs_tol=1e-9)


def test_small_helpers():
    assert visible_token_text(" a\n\tb") == "␣a↵⇥b" and visible_token_text("") == "∅"
    # Control and bidi characters must not act on the text around them.
    assert visible_token_text("a\u202eb\x05\x7f\r") == "a⟨U+202E⟩b⟨U+0005⟩⟨U+007F⟩⟨CR⟩"
    assert flowing_token_text("x\r\ny\u2029z\u200b") == "x↵\ny↵\nz⟨U+200B⟩"
    assert shade_fraction(1.0) == 0.0 and shade_fraction(0.0) == 1.0 and shade_fraction(1e-9) == 1.0
    assert 0 < shade_fraction(0.1) < shade_fraction(0.01) < 1
    steps = [_step(0, entropy=1), _step(1, entropy=3), _step(2, entropy=9)]
    assert most_interesting_step(steps) == 1  # the final (EOS-like) step is not picked
    assert most_interesting_step([]) is None
    held = _step(text="", candidates=(Candidate(1, "<0xE4>", 0.5, 0.5, 1),))
    assert chosen_text(held) == "<0xE4>"


def test_state_does_not_import_qt():
    code = "import sys, playground.state; assert 'PySide6' not in sys.modules and 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_settings_summary_names_what_shaped_the_run():
    text = settings_summary(RunSettings(strategy="sample", temperature=0.7, top_k=5, forced_token_ids=(1, 2)))
    assert text.startswith("sample") and "T=0.7" in text and "top-k 5" in text and "2 forced" in text
    assert "top-p" not in text and "beams" not in text
    assert "4 beams" in settings_summary(RunSettings(strategy="beam"))


@pytest.mark.parametrize("strategy", ["greedy", "early-exit"])
def test_a_lens_step_is_not_counted_as_a_token(tiny_lm, strategy):
    from playground.state import Run

    settings = RunSettings.from_flat(strategy=strategy, lens=True, max_new_tokens=5, prompt="Hello")
    run = Run(index=0, settings=settings)
    for event in run_strategy(tiny_lm, settings):
        run.apply(event)
        # Between a lens step and its token, the run still counts tokens, and its KV figure is the last token's.
        assert run.step_unit == "token"
        if run.steps:
            assert run.kv_cache_bytes == run.steps[-1].kv_cache_bytes
    assert len(run.step_events) == 10 and run.count_label() == "5 tokens"
