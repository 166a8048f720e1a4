"""The Qt-free folds of the speculative, quantization and side-by-side views (``playground.state``), fed real runs
of a tiny model and hand-built events, against figures the test computes itself from the per-step events (sums,
counts and a least-squares fit with NumPy) — never from the folds' or the engine's own figures. Fast: the mutation
run (``make mutate``) uses these for the folds."""

from __future__ import annotations

import numpy as np
import pytest

from playground.config import RunSettings
from playground.config.words import settings_from_pane
from playground.events import RunFinished, TokenStep
from playground.events.panes import PaneFinished, PaneStarted, PaneToken
from playground.events.quant import LayerError, QuantReady, QuantStep, QuantSummary, QuantTable
from playground.events.speculative import SpeculativeRound
from playground.state.panes import PanesState
from playground.state.quant import QuantState
from playground.state.speculative import ACCEPTED, FORCED, REJECTED, TARGET, SpeculativeState

PROMPT = "one two three one two three one two three"
SPECULATIVE_RUNS = {
    "prompt-lookup": "speculative --draft prompt-lookup --draft-k 4 --prompt-lookup-ngram 1 --baseline-tokens 8",
    "first-layer": "speculative --draft layers --draft-layers 1 --draft-k 3 --baseline-tokens 0",
}


def run_events(lm, spec: str, max_new_tokens: int = 40, **changes) -> list:
    from playground.engine.strategies import run_strategy

    settings = settings_from_pane(RunSettings(prompt=PROMPT, chat=False, max_new_tokens=max_new_tokens, **changes),
                                  spec)
    return list(run_strategy(lm, settings))


@pytest.fixture(scope="module", params=list(SPECULATIVE_RUNS))
def speculative_run(request, tiny_lm):
    events = run_events(tiny_lm, SPECULATIVE_RUNS[request.param])
    state = SpeculativeState()
    for event in events:
        state.apply(event)
    return events, state


def _rounds(events) -> list[SpeculativeRound]:
    return [e for e in events if isinstance(e, SpeculativeRound)]


def test_speculative_counts_equal_the_rounds(speculative_run):
    events, state = speculative_run
    rounds = _rounds(events)
    assert rounds and state.rounds == rounds
    drafted = sum(len(r.drafted) for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    judged = sum(min(len(r.drafted), r.accepted + 1) for r in rounds)  # up to and including the first rejection
    assert (state.drafted, state.accepted, state.rejected) == (drafted, accepted, drafted - accepted)
    assert state.acceptance_rate == pytest.approx(accepted / drafted)
    assert state.alpha == pytest.approx(accepted / judged)
    assert state.mean_accepted == pytest.approx(accepted / len(rounds))
    assert state.emitted == sum(isinstance(e, TokenStep) for e in events)
    for i, r in enumerate(rounds):
        assert state.round_counts(i) == (r.accepted, len(r.drafted) - r.accepted, int(r.target_kind != "none"))
    # By draft position: the rounds whose verification reached it, and of those the ones that kept it.
    width = max(len(r.drafted) for r in rounds)
    for position in range(width):
        reached = [r for r in rounds if len(r.drafted) > position and r.accepted >= position]
        kept = [r for r in reached if r.accepted > position]
        rate = state.position_rates()[position]
        assert rate == (pytest.approx(len(kept) / len(reached)) if reached else None)
        assert state.reached_at[position] == len(reached)
        assert state.drafted_at[position] == sum(len(r.drafted) > position for r in rounds)
    assert state.draft_ms == pytest.approx(sum(r.draft_ms for r in rounds))
    assert state.verify_ms == pytest.approx(sum(r.verify_ms for r in rounds))


def test_speculative_marks_read_as_the_rounds_in_order(speculative_run):
    """Each round's accepted drafts, then its rejected ones, then the target's token; emitted marks carry their
    token event's text and step, and every mark is settled once the run finished."""
    events, state = speculative_run
    expected = []
    for r in _rounds(events):
        expected += [(ACCEPTED, r.round, i, r.first_step + i) for i in range(r.accepted)]
        expected += [(REJECTED, r.round, i, None) for i in range(r.accepted, len(r.drafted))]
        if r.target_kind != "none":
            expected.append((TARGET, r.round, r.accepted, r.first_step + r.accepted))
    assert [(m.kind, m.round, m.position, m.step) for m in state.marks] == expected
    texts = {e.step: e.text for e in events if isinstance(e, TokenStep)}
    assert [m.text for m in state.marks if m.step is not None] == [texts[m.step] for m in state.marks
                                                                   if m.step is not None]
    assert state.settled == len(state.marks) and all(m.settled for m in state.marks)
    first = 0
    for index, (start, end) in enumerate(state.round_marks):
        assert start == first and {m.round for m in state.marks[start:end]} == {index}
        first = end


def test_speculative_figures_of_calls_and_the_what_if(speculative_run):
    events, state = speculative_run
    rounds = _rounds(events)
    finished = events[-1]
    assert isinstance(finished, RunFinished)
    assert state.stop_reason == finished.stop_reason and state.tokens_per_s == finished.tokens_per_s
    # c_verify(k) = a + b·k, least squares over the rounds that read no prompt
    fitted = [r for r in rounds if not r.prompt_read]
    k = np.array([len(r.drafted) for r in fitted], dtype=float)
    ms = np.array([r.verify_ms for r in fitted])
    if np.ptp(k) > 0:
        slope, intercept = np.polyfit(k, ms, 1)
        if slope < 0:
            slope, intercept = 0.0, ms.mean()
    else:
        slope, intercept = 0.0, ms.mean()
    if intercept <= 0:
        slope, intercept = 0.0, ms.mean()
    assert state.verify_fit() == pytest.approx((intercept, slope), rel=1e-6, abs=1e-9)
    what_if = state.what_if()
    alpha = sum(r.accepted for r in rounds) / sum(min(len(r.drafted), r.accepted + 1) for r in rounds)
    c_draft = sum(r.draft_ms for r in rounds) / sum(len(r.drafted) for r in rounds)
    baseline = finished.figures.get("baseline_tokens_per_s")
    plain = 1000.0 / baseline if baseline else intercept
    assert what_if.plain_measured == bool(baseline) and what_if.plain_ms == pytest.approx(plain)
    assert what_if.ks == tuple(range(17))
    for kk, speedup in zip(what_if.ks, what_if.speedups, strict=True):
        tokens = kk + 1 if alpha == 1 else sum(alpha ** j for j in range(kk + 1))  # E(k), summed
        assert speedup == pytest.approx(tokens * plain / (kk * c_draft + intercept + kk * slope), rel=1e-6)
    # The round shown first: accepted drafts and a rejection (most accepted), else a rejection, else the longest.
    def score(r):
        rejected = r.accepted < len(r.drafted)
        return (2 if rejected and r.accepted else 1 if rejected else 0, r.accepted, len(r.drafted))
    best = max(score(r) for r in rounds)
    assert score(rounds[state.most_interesting_round()]) == best
    assert state.most_interesting_round() == next(i for i, r in enumerate(rounds) if score(r) == best)


def test_speculative_target_calls_before_and_after_the_final_figures(speculative_run):
    events, state = speculative_run
    live = SpeculativeState()
    for event in events[:-1]:
        live.apply(event)
    from playground.events import PrefillDone

    prefill = next((e for e in events if isinstance(e, PrefillDone)), None)
    passes = prefill.forward_passes if prefill is not None else 0
    deferred = int(prefill.deferred_tokens > 0) if prefill is not None else 0
    forced = 0  # no forced tokens in these runs
    assert live.target_calls == passes + len(_rounds(events)) + forced
    tokens = sum(isinstance(e, TokenStep) for e in events)
    assert live.plain_calls == passes + deferred + tokens - 1
    assert live.calls_saved == live.plain_calls - live.target_calls
    assert state.target_calls == int(events[-1].figures["target_calls"])


def test_speculative_forced_tokens_are_their_own_marks(tiny_lm):
    events = run_events(tiny_lm, SPECULATIVE_RUNS["prompt-lookup"], max_new_tokens=12, forced_token_ids=(5, 6))
    state = SpeculativeState()
    for event in events:
        state.apply(event)
    tokens = [e for e in events if isinstance(e, TokenStep)]
    assert [m.kind for m in state.marks[:2]] == [FORCED, FORCED]
    assert [m.step for m in state.marks[:2]] == [0, 1] and state.forced_rounds == 1
    assert [m.text for m in state.marks[:2]] == [tokens[0].text, tokens[1].text]


def test_speculative_end_without_a_final_event_settles_the_marks(speculative_run):
    events, _ = speculative_run
    cut = [e for e in events if not isinstance(e, (RunFinished, TokenStep))]  # rounds whose tokens never came
    state = SpeculativeState()
    for event in cut:
        state.apply(event)
    assert state.settled < len(state.marks)
    state.end("stopped")
    assert state.ended and state.settled == len(state.marks) and state.stop_reason is None
    assert state.ended_status == "stopped"


# --- the side-by-side panes ----------------------------------------------------------------------------------

def _pane_finished(pane: int, ids: tuple[int, ...]) -> PaneFinished:
    return PaneFinished(pane=pane, token_ids=ids, text="", stop_reason="max_new_tokens", tokens_per_s=1.0,
                        decode_ms=1.0, figures={})


@pytest.fixture(scope="module")
def run_end(tiny_lm) -> RunFinished:
    return run_events(tiny_lm, "greedy", max_new_tokens=2)[-1]


def test_panes_mark_each_difference_from_the_reference_pane(run_end):
    state = PanesState()
    reference, other, shorter = [1, 2, 3, 4], [1, 2, 9, 4], [1, 2]
    state.apply(PaneStarted(pane=0, label="ref", summary="", strategy="greedy", model_name="m"))
    for step in range(4):  # pane 1 runs ahead of pane 0 at each step: the comparison waits for the reference
        for pane, ids in ((1, other), (0, reference)):
            state.apply(PaneToken(pane=pane, step=step, token_id=ids[step], text=f"<{ids[step]}>", prob=0.5,
                                  step_ms=1.0))
    for step, token in enumerate(shorter):
        state.apply(PaneToken(pane=2, step=step, token_id=token, text="", prob=0.5, step_ms=1.0))
    assert [p.label for p in state.panes] == ["ref", "pane 2", "pane 3"]  # unnamed panes still show
    assert state.panes[0].text == "<1><2><3><4>" and state.panes[1].token_ids == other
    assert state.divergence == [None, 2, None]
    assert [state.differs(1, s) for s in range(4)] == [False, False, True, False]
    assert not any(state.differs(0, s) for s in range(4))
    assert [state.differs(2, s) for s in range(3)] == [False, False, False]  # no token at 2: nothing differs
    assert not state.ended and state.apply(run_end) is False and state.ended  # the run's end: not a pane's event
    state.reset()
    assert state.panes == [] and state.divergence == [] and not state.ended


def test_panes_settle_where_a_pane_ended_early_and_take_a_beam_panes_final_ids():
    state = PanesState()
    for step, token in enumerate([1, 2, 3]):
        state.apply(PaneToken(pane=0, step=step, token_id=token, text="", prob=1.0, step_ms=1.0))
    state.apply(PaneToken(pane=1, step=0, token_id=1, text="", prob=1.0, step_ms=1.0))
    state.apply(_pane_finished(1, (1,)))
    assert state.divergence[1] is None  # the reference is still running
    state.apply(_pane_finished(0, (1, 2, 3)))
    assert state.divergence == [None, 1]  # the shorter pane diverges where it ended
    state.apply(_pane_finished(2, (1, 2, 3)))  # a beam pane: no token events, its ids at the end
    assert state.panes[2].token_ids == [1, 2, 3] and state.divergence[2] is None
    state.apply(_pane_finished(3, ()))  # a pane that ended before its first token diverges at once
    assert state.divergence[3] == 0
    assert state.differs(1, 0) is False and state.differs(2, 2) is False
    state.end("stopped")
    assert state.ended


# --- the quantization lab --------------------------------------------------------------------------------------

def _step(step: int, kl: float, agrees: bool) -> QuantStep:
    return QuantStep(step=step, token_id=step, text="", kl=kl, reference_prob=0.5, quantized_prob=0.4,
                     quantized_top_id=0, quantized_top_text="", top1_agrees=agrees)


def test_quant_fold_steps_agreement_and_layer_errors():
    state = QuantState()
    kls, agrees = [0.1, 0.0, 0.25, 0.05], [True, False, True, False]
    for i, (kl, ok) in enumerate(zip(kls, agrees, strict=True)):
        assert state.apply(_step(i, kl, ok))
    assert state.kl.tolist() == kls and state.disagreements == [1, 3]
    assert state.running_agreement() == pytest.approx(2 / 4)
    assert state.apply(PaneToken(pane=0, step=0, token_id=1, text="", prob=1.0, step_ms=1.0)) is False  # not ours
    # GPT-2's two c_proj kinds stay apart; a layer without a kind is NaN there; names without a layer are left out
    errors = (LayerError("lm_head", 1.0), LayerError("layers.0.attn.c_proj", 0.1),
              LayerError("layers.0.mlp.c_proj", 0.2), LayerError("layers.1.attn.c_proj", 0.3),
              LayerError("layers.1.q_proj", 0.4), LayerError("layers.1.mlp.down_proj", 0.5),
              LayerError("layers.2", 9.0))
    ready = QuantReady(method="rtn-int4", group_size=32, stored="", reference_dtype="float32",
                       reference_weight_bytes=4, weight_bytes=1, seconds=0.0, cached=False, note="",
                       layer_errors=errors)
    state.apply(ready)
    kinds, series = state.layer_errors_by_layer()
    assert kinds == ["attn.c_proj", "mlp.c_proj", "q_proj", "down_proj"]  # a unique last part names its kind
    np.testing.assert_array_equal(series["down_proj"], [np.nan, 0.5])
    np.testing.assert_array_equal(series["attn.c_proj"], [0.1, 0.3])
    np.testing.assert_array_equal(series["mlp.c_proj"], [0.2, np.nan])
    np.testing.assert_array_equal(series["q_proj"], [np.nan, 0.4])
    summary = QuantSummary(kl_mean=0.1, kl_median=0.07, kl_p99=0.25, kl_max=0.25, top1_agreement=0.5, tokens=4,
                           first_divergence=2, reference_tokens_per_s=1.0, quantized_tokens_per_s=2.0)
    table = QuantTable(model_name="m", rows=())
    assert state.apply(summary) and state.apply(table)
    assert (state.ready, state.summary, state.table) == (ready, summary, table)
    state.reset()
    assert state.steps == [] and state.running_agreement() is None and state.layer_errors_by_layer() == ([], {})
    assert state.ready is None and state.summary is None and state.table is None
