"""The what-if's bounds, driver and registries (``playground/state/what_if/{bounds,derive}.py``, ``stages/__init__.py``,
``stages/mirostat.py``) held to references computed here: the survivors of their mutation run (after
``tests/test_mutation_kills_what_if.py``) fail one of these, each test says which bug it catches.

References: recorded runs built by hand from a small whole vocabulary of logits per step (``_recorded``: the top
tokens recorded exactly, the tail's numbers computed from the rest), and the formulas written out here: the
softmax, the power-mean bounds, the chords of a convex sequence, mirostat's mu update, Adaptive-P's transform.

Two of the registries (``stage``, ``reason``) run when the stage modules are imported, before any test: the tests
here call them again at test time, on a registry of their own, so that a planted bug in them is seen.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_mutation_kills_what_if import _lse, _recorded

from playground.config import RunSettings
from playground.sampler_maths import ADAPTIVE_PEAK, ADAPTIVE_SHARPNESS, ADAPTIVE_WIDTH
from playground.state.what_if import RecordedRun, re_derive
from playground.state.what_if import bounds as bounds_module
from playground.state.what_if import derive as derive_module
from playground.state.what_if import stages as stages_module
from playground.state.what_if.bounds import _SPREAD, _TAIL_WEIGHT, REASONS, _Chain, _moment_bounds, _scale_tail
from playground.state.what_if.stages import STAGES, stage
from playground.state.what_if.stages.mirostat import mirostat_mu

NEG_INF = -math.inf


def _logits(steps: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 2.0, size=(steps, vocab))


def _softmax(values: np.ndarray) -> np.ndarray:
    return np.exp(values - _lse(values))


# --- the registries, called at test time ---------------------------------------------------------------------


def test_reason_adds_a_new_text_once_and_finds_an_old_one_where_it_is(monkeypatch):
    """A stage's own reason is appended and its index returned; asked again (or for a built-in one) the list does
    not grow and the first index comes back. Catches: appending only texts already there, appending None,
    looking up None, a str-only method (``rindex``) on the list."""
    codes = list(REASONS)
    monkeypatch.setattr(bounds_module, "REASONS", codes)
    n = len(codes)
    text = "a reason no stage gives"
    assert bounds_module.reason(text) == n
    assert codes[n] == text and len(codes) == n + 1
    assert bounds_module.reason(text) == n and len(codes) == n + 1
    assert bounds_module.reason(codes[_SPREAD]) == _SPREAD and len(codes) == n + 1


def test_the_stage_decorator_registers_the_function_with_its_defaults_and_what_it_is_given(monkeypatch):
    """``@stage(name)`` alone: the function itself, labelled by its name, no feedback, not a scaling stage (every
    stage but temperature ends the whole-vocabulary numbers); with a label, feedback and ``scales=True``, those.
    Catches: ``scales`` defaulting to True, the feedback or ``scales`` dropped or replaced by None."""
    registry: dict[str, stages_module.StageEntry] = {}
    monkeypatch.setattr(stages_module, "STAGES", registry)

    def fn(*_: object) -> None:
        return None

    def feedback(chosen_prob: np.ndarray, settings: object, steps: int) -> np.ndarray:
        return np.zeros(steps)

    assert stage("probe")(fn) is fn
    plain = registry["probe"]
    assert plain.fn is fn and plain.feedback is None and plain.scales is False
    assert plain.label(RunSettings()) == "probe"
    stage("probe_2", label=lambda s: "two", feedback=feedback, scales=True)(fn)
    given = registry["probe_2"]
    assert given.fn is fn and given.feedback is feedback and given.scales is True
    assert given.label(RunSettings()) == "two"


def test_only_temperature_scales_and_only_mirostat_follows_the_chosen_tokens():
    """The real registry, as the stage modules declare it."""
    assert [name for name, entry in STAGES.items() if entry.scales] == ["temperature"]
    assert [name for name, entry in STAGES.items() if entry.feedback is not None] == ["mirostat"]


def test_a_sampler_without_a_stage_is_refused_by_name(monkeypatch):
    """The KeyError names the sampler and where its stage belongs (not a bare KeyError)."""
    monkeypatch.delitem(STAGES, "top_k")
    run = _recorded(_logits(1, 8, seed=1), record=3)
    with pytest.raises(KeyError, match=r"the what-if has no stage for the sampler 'top_k' \(playground\.state"):
        re_derive(run, RunSettings(strategy="sample", samplers="top_k", top_k=2), sampling=True)


# --- mirostat's mu ---------------------------------------------------------------------------------------------


def test_mirostats_mu_starts_at_twice_tau_and_moves_by_eta_times_the_surprise_error():
    """tau 1.5, eta 0.25: the start is 2·tau = 3 at every step; then mu₀ = 3, after a token of p = ¼ (2 bits)
    mu₁ = 3 − ¼·(2 − 1.5) = 2.875, after a removed token (p = 0) it stays 2.875. Catches 2/tau for 2·tau."""
    s = RunSettings(mirostat=2, mirostat_tau=1.5, mirostat_eta=0.25)
    start = mirostat_mu(np.zeros(0), s, 3)
    assert start.tolist() == [3.0, 3.0, 3.0]
    following = mirostat_mu(np.array([0.25, 0.0, 0.5]), s, 3)
    assert following.tolist() == [3.0, 2.875, 2.875] and following.dtype == np.float64


# --- _Chain: the tail's size, the recorded log-sum-exp ---------------------------------------------------------


@pytest.mark.parametrize("a", [0.5, 2.0])
def test_a_tail_of_one_token_scales_by_the_power_mean_with_its_size_one(a):
    """Vocabulary 5, 4 recorded: the tail is one token of logit l, L = l, n = 1, ln n = 0, so the power-mean
    bounds are (sharper, a ≥ 1) [a·l, l + (a−1)·top] and (flatter) [l + (a−1)·top, a·l]: the truth a·l is a bound
    itself. Catches the tail's size counted as at least 2 (ln 2 off the spread bound)."""
    logits = _logits(2, 5, seed=2)
    run = _recorded(logits, record=4)
    assert run.tail_count.tolist() == [1.0, 1.0]
    c = _Chain(run)
    c.pristine[:] = False  # the plain bounds only
    _scale_tail(c, np.full(2, a))
    for row in range(2):
        ordered = np.sort(logits[row])[::-1]
        tail, top = ordered[4], ordered[3]
        spread, peak = a * tail, tail + (a - 1) * top
        lo, hi = (spread, peak) if a >= 1 else (peak, spread)
        assert math.isclose(c.lo[row], lo, rel_tol=1e-12, abs_tol=1e-12), row
        assert math.isclose(c.hi[row], hi, rel_tol=1e-12, abs_tol=1e-12), row


def test_the_recorded_log_sum_exp_of_logits_far_from_zero_does_not_overflow():
    """Logits of ±1000 (a raw logit of 10 at temperature 0.01): log Σ exp, computed from the largest, is
    1000 + log(1 + e⁻¹) and −1000 + log(1 + e⁻¹), not inf and −inf; a step with nothing in play is −inf.
    Catches the largest-logit shift lost (an initial of +inf, or the finite test dropped: shifted by 0)."""
    c = _Chain(_recorded(_logits(3, 6, seed=3), record=2))
    c.x = np.array([[1000.0, 999.0, NEG_INF], [-1000.0, -1001.0, NEG_INF], [NEG_INF, NEG_INF, NEG_INF]])
    with np.errstate(over="ignore", divide="ignore"):
        got = c.recorded_lse()
    assert math.isclose(got[0], 1000.0 + math.log1p(math.exp(-1.0)), rel_tol=1e-15)
    assert math.isclose(got[1], -1000.0 + math.log1p(math.exp(-1.0)), rel_tol=1e-15)
    assert got[2] == NEG_INF


# --- _moment_bounds at a recorded power, to the bit ---------------------------------------------------------------


def _chord(moments: list[float], i: int, a: float) -> float:
    """The chord over [MOMENT_POWERS[i], MOMENT_POWERS[i + 1]] (spacing ½) at ``a``, as floating point computes it."""
    slope = (moments[i + 1] - moments[i]) / 0.5
    return moments[i] + slope * (a - 0.5 * i)


def test_at_a_recorded_inner_power_the_chord_from_it_counts_on_both_sides():
    """a = ½ (temperature 2): a's own segments are [0, ½] and [½, 1]; the chord over the second starts at a, so it
    is the recorded moment m₁ to the bit, and it bounds from both sides (lower ≥ m₁ ≥ upper), while the chord over
    [0, ½] evaluated at its end rounds off m₁ by an ulp. Two convex sequences (slopes rising) whose chord from 0
    rounds above m₁ and below it. Catches [½, 1] not counted as a's own segment (upper from the chord from 0
    alone) and the chord from a dropped from the lower bound (the left-end test against 0 only)."""
    above = [3.0, 0.1, -2.0, -3.5, -4.5]  # slopes −5.8, −4.2, −3, −2
    below = [3.0, 0.3, -1.8, -3.3, -4.3]  # slopes −5.4, −4.2, −3, −2
    assert _chord(above, 0, 0.5) > 0.1 and _chord(below, 0, 0.5) < 0.3, "precondition: the chord rounds off"
    lower, upper = _moment_bounds(np.array([above, below]), np.array([0.5, 0.5]), np.zeros(2))
    for row, m1 in ((0, 0.1), (1, 0.3)):
        assert lower[row] >= m1 >= upper[row], (row, lower[row], upper[row])
        assert math.isclose(lower[row], m1, abs_tol=1e-15) and math.isclose(upper[row], m1, abs_tol=1e-15)


def test_at_the_last_recorded_power_both_bounds_are_its_segments_chord_and_never_cross():
    """a = 2, the last power, not past it: upper and lower are both the chord over [1.5, 2] at its end (the other
    chords' extensions lie below, the sequence is convex), so they meet exactly; here that chord rounds an ulp
    above m₄ = 0.3. Catches a = 2 taken as past the last power (upper m₄ + 0·top: below the lower bound)."""
    moments = [3.7, 2.7, 1.8, 1.0, 0.3]  # slopes −2, −1.8, −1.6, −1.4
    end = _chord(moments, 3, 2.0)
    assert end > 0.3, "precondition: the chord rounds above m₄"
    lower, upper = _moment_bounds(np.array([moments]), np.array([2.0]), np.array([-1.0]))
    assert lower[0] <= upper[0]
    assert lower[0] == end and upper[0] == end


# --- stages the bounds feed --------------------------------------------------------------------------------------


def test_temperature_then_a_per_step_ban_keeps_the_exact_tail_weight():
    """Temperature 2 (a = ½, a recorded power: the tail's weight exact from its moments) then the no-repeat n-gram
    ban (nothing repeats: it bans nothing but still lowers the tail by its count of unrecorded bans, 0): every
    step exact, every recorded candidate's probability and the tail's the softmax of logits / 2 over the whole
    vocabulary. Catches temperature leaving ``pristine`` a 0-d array that the ban's in-place update cannot hold."""
    logits = _logits(3, 16, seed=4)
    run = _recorded(logits, record=5, context=[100, 101, 102, 103], start=1)
    settings = RunSettings(strategy="sample", samplers="temperature;no_repeat_ngram", temperature=2.0,
                           no_repeat_ngram_size=2)
    what_if = re_derive(run, settings, sampling=True)
    assert what_if.stages == ("temperature", "no_repeat_ngram")
    assert what_if.exact.all(), what_if.reasons
    assert what_if.tail_prob is not None
    for row in range(3):
        p = _softmax(logits[row] / 2.0)
        recorded = [int(t) for t in run.ids[row] if t >= 0]
        for col, token in enumerate(recorded):
            assert math.isclose(what_if.probs[row, col], p[token], rel_tol=1e-12), (row, token)
        tail = np.delete(p, recorded).sum()
        assert math.isclose(what_if.tail_prob[row], tail, rel_tol=1e-9), row


def _adaptive(p: np.ndarray | float, adapted: float) -> np.ndarray:
    """llama.cpp's Adaptive-P transform, written out: PEAK − SHARPNESS·d²/(1 + d), d = |p − adapted| / WIDTH."""
    d = np.abs(np.asarray(p, dtype=np.float64) - adapted) / ADAPTIVE_WIDTH
    return ADAPTIVE_PEAK - ADAPTIVE_SHARPNESS * d * d / (1.0 + d)


def test_adaptive_p_bounds_the_tail_by_its_likeliest_tokens_probability_before_the_transform():
    """One step, 4 of 12 tokens recorded, Adaptive-P alone at target ½ (its first step's adapted target is the
    target): the recorded candidates' new logits are T(p) of their probabilities p over the whole vocabulary; the
    tail's likeliest token has probability at most p_top = e^top / Z (Z: the normaliser before the transform), each
    of the n tail tokens a new logit between T(0) and T(min(½, p_top)): the upper bound log n + T(p_top) sets the
    tail's share. Catches p_top's normaliser taken from the logits after the transform."""
    logits = _logits(1, 12, seed=5)
    run = _recorded(logits, record=4)
    settings = RunSettings.from_flat(strategy="sample", samplers="adaptive_p", adaptive_target=0.5,
                                     adaptive_decay=0.9)
    what_if = re_derive(run, settings, sampling=True)
    assert what_if.stages == ("adaptive_p",)
    order = np.argsort(-logits[0], kind="stable")
    recorded, rest = order[:4], order[4:]
    p = _softmax(logits[0])
    p_top = p[recorded[-1]]  # every tail logit is at most the last recorded one
    assert p_top < 0.5, "precondition: the tail's bound is below the target"
    new = _adaptive(p[recorded], 0.5)
    tail_hi = math.log(len(rest)) + float(_adaptive(p_top, 0.5))
    z = np.logaddexp(_lse(new), tail_hi)
    np.testing.assert_allclose(what_if.probs[0, :4], np.exp(new - z), rtol=1e-12)
    assert what_if.tail_prob is not None
    assert math.isclose(what_if.tail_prob[0], math.exp(tail_hi - z), rel_tol=1e-12)


# --- _finish -----------------------------------------------------------------------------------------------------


def _finished(logits: np.ndarray, record: int, lo: float, hi: float):
    run = _recorded(logits, record=record)
    progress = derive_module._Progress(_Chain(run), [], np.full(run.x.shape, -1, dtype=np.int16))
    progress.chain.lo, progress.chain.hi = np.array([lo]), np.array([hi])
    return derive_module._finish(progress, run)


def test_tail_bounds_at_most_1e_9_apart_count_as_agreeing():
    """The tail's bounds 10⁻⁹ apart exactly (0 and 1e-9) leave the step exact; 2·10⁻⁹ apart it says the tail's
    weight is not known. Catches the threshold taken as ≥."""
    logits = _logits(1, 8, seed=6)
    assert _finished(logits, 3, 0.0, 1e-9).exact[0]
    loose = _finished(logits, 3, 0.0, 2e-9)
    assert not loose.exact[0] and loose.reasons[0] == REASONS[_TAIL_WEIGHT]


def test_token_zero_is_a_candidate_like_any_other_and_the_run_s_tokens_come_back():
    """Token 0 the likeliest at every step and the run's choice, top-k 2: it is kept, not cut, greedy's pick, with
    its probability over the top two; ``chosen`` is the run's tokens. Catches token 0 taken for padding (ids > 0)
    and the run's tokens dropped from the result."""
    logits = _logits(3, 10, seed=7)
    logits[:, 0] = logits.max(axis=1) + 1.0
    run = _recorded(logits, record=4)
    what_if = re_derive(run, RunSettings(strategy="sample", samplers="top_k", top_k=2), sampling=True)
    assert what_if.exact.all(), what_if.reasons
    assert what_if.chosen.tolist() == [0, 0, 0]
    assert not what_if.chosen_cut.any()
    assert what_if.greedy.tolist() == [0, 0, 0]
    for row in range(3):
        top2 = np.argsort(-logits[row], kind="stable")[:2]
        assert top2[0] == 0
        assert [int(t) for t in what_if.ids[row][what_if.kept[row]]] == top2.tolist()
        assert math.isclose(what_if.chosen_prob[row], float(_softmax(logits[row, top2])[0]), rel_tol=1e-12)


def test_a_recorded_run_built_from_steps_has_a_column_for_each_step_even_with_nothing_recorded():
    """``RecordedRun.of`` always adds the chosen token's column: the driver never meets a run without columns
    (why its guards for that case are not separately tested)."""
    assert RecordedRun.of([], [1]).x.shape == (0, 1)
