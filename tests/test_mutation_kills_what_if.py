"""The what-if's bounding arithmetic and its driver (``playground/state/what_if/{bounds,derive,recorded}.py``) held to
references computed here, each test named after what it pins down: the mutation run's survivors there (issue 28,
point 4; the list in the notes' mutation table) fail one of these.

References: a small whole vocabulary of logits per step in NumPy, its top tokens "recorded" by hand (no packing, so
no rounding) for the bounds' helpers; for ``re_derive``, steps packed as the engine packs them and mirostat v2 run
step by step here over the whole vocabulary.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from playground.config import RunSettings
from playground.engine.step_analysis import pack_raw_candidates
from playground.events import TokenStep
from playground.state.what_if import REASONS, RecordedRun, re_derive
from playground.state.what_if import derive as derive_module
from playground.state.what_if.bounds import (
    _MIROSTAT,
    _PAST,
    _ROUNDING,
    _SPREAD,
    _below_probability,
    _Chain,
    _counts,
    _entropy,
    _moment_bounds,
    _per_step_bans,
    _scale_tail,
)
from playground.state.what_if.recorded import MOMENT_POWERS

NEG_INF = -math.inf
ERR = 0.5 / 1024  # a recorded logit's rounding, as the chain starts with it


def _lse(values: np.ndarray) -> float:
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0 or not np.isfinite(values).any():
        return NEG_INF
    m = values[np.isfinite(values)].max()
    return float(m + math.log(np.exp(values - m).sum()))


def _recorded(logits: np.ndarray, record: int, context: list[int] | None = None, start: int = 1) -> RecordedRun:
    """A RecordedRun built by hand from whole-vocabulary logits [S, V]: the top ``record`` tokens of each step
    recorded exactly (one padding column after them), the rest as the tail's numbers computed here."""
    steps, vocab = logits.shape
    order = np.argsort(-logits, axis=1, kind="stable")
    ids = np.full((steps, record + 1), -1, dtype=np.int64)
    x = np.full((steps, record + 1), NEG_INF)
    log_tail, tail_top = np.zeros(steps), np.zeros(steps)
    moments = np.zeros((steps, len(MOMENT_POWERS)))
    whole = np.zeros((steps, 4))
    for row in range(steps):
        top, rest = order[row, :record], order[row, record:]
        ids[row, :record], x[row, :record] = top, logits[row, top]
        tail = logits[row, rest]
        log_tail[row], tail_top[row] = _lse(tail), logits[row, top[-1]]
        moments[row] = [_lse(a * tail) for a in MOMENT_POWERS]
        p = np.exp(logits[row] - _lse(logits[row]))
        whole[row] = (-(p * np.log(p)).sum(), logits[row].mean(), logits[row].std(), vocab)
    context = context if context is not None else [0] * (start + steps)
    return RecordedRun(steps=(), ids=ids, x=x, log_tail=log_tail, tail_top=tail_top,
                       tail_count=np.full(steps, float(vocab - record)), moments=moments, whole=whole,
                       chosen=ids[:, 0].copy(), chosen_col=np.zeros(steps, dtype=np.int64),
                       recorded=np.ones(steps, dtype=bool), context=np.array(context, dtype=np.int64), start=start)


def _logits(steps: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0.0, 2.0, size=(steps, vocab))


# --- _entropy ---------------------------------------------------------------------------------------------------


def test_entropy_is_the_recorded_candidates_in_play_alone_per_step():
    """[S, 1] nats of the softmax over the finite candidates only (the tail, alive, is left out), here with 3 steps
    of 6 columns and a different number of candidates in play in each."""
    c = _Chain(_recorded(_logits(3, 12, seed=1), record=5))
    c.x[0, 3:] = NEG_INF  # step 0: 3 in play; step 1: all 5 (and the padding); step 2: 1
    c.x[2, 1:] = NEG_INF
    assert c.alive.all(), "precondition: the tail is in play and still left out"
    got = _entropy(c)
    assert got.shape == (3, 1)
    for row in range(3):
        finite = c.x[row][np.isfinite(c.x[row])]
        p = np.exp(finite - _lse(finite))
        assert math.isclose(got[row, 0], float(-(p * np.log(p)).sum()), rel_tol=1e-12, abs_tol=1e-12), row
    assert got[2, 0] == 0.0 and got[1, 0] > got[0, 0] > 0.0


def test_entropy_of_a_step_with_nothing_in_play_is_zero_without_a_floating_point_error():
    """A step whose candidates were all removed: 0 nats, and the -inf - -inf inside stays quiet even where the
    caller makes an invalid operation an error."""
    c = _Chain(_recorded(_logits(2, 10, seed=2), record=4))
    c.x[1, :] = NEG_INF
    with np.errstate(divide="ignore", invalid="raise"):
        got = _entropy(c)
    finite = c.x[0][np.isfinite(c.x[0])]
    p = np.exp(finite - _lse(finite))
    assert got.shape == (2, 1)
    assert math.isclose(got[0, 0], float(-(p * np.log(p)).sum()), rel_tol=1e-12)
    assert got[1, 0] == 0.0


# --- _scale_tail and _moment_bounds -----------------------------------------------------------------------------


def _tail_truth(logits: np.ndarray, record: int, a: float) -> list[float]:
    order = np.argsort(-logits, axis=1, kind="stable")
    return [_lse(a * logits[row, order[row, record:]]) for row in range(logits.shape[0])]


@pytest.mark.parametrize("a", [0.6, 1.0, 1.8])
def test_scaling_the_tail_without_moments_gives_the_power_mean_bounds(a):
    """Every logit times ``a``: with no recorded moments, log Σ exp(a·l) over n tail tokens of weight L = log Σ
    exp(l), each at most ``top``, lies in [(1−a)·ln n + a·L, L + (a−1)·top] for a ≥ 1 and in
    [L + (a−1)·top, (1−a)·ln n + a·L] below 1 (the power-mean inequality, written out here); the truth, from
    the whole vocabulary, lies within; the rounding scales with the logits."""
    logits, record = _logits(3, 40, seed=3), 6
    run = _recorded(logits, record)
    c = _Chain(run)
    c.pristine[:] = False  # as after a penalty: the plain bounds only
    n, big_l, top = run.tail_count, run.log_tail, run.tail_top
    _scale_tail(c, np.full(3, a))
    spread, peak = (1 - a) * np.log(n) + a * big_l, big_l + (a - 1) * top
    lo, hi = (spread, peak) if a >= 1 else (peak, spread)
    np.testing.assert_allclose(c.lo, lo, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(c.hi, hi, rtol=1e-12, atol=1e-12)
    truth = np.array(_tail_truth(logits, record, a))
    assert (c.lo <= truth + 1e-9).all() and (truth <= c.hi + 1e-9).all()
    np.testing.assert_allclose(c.top, top * a)
    np.testing.assert_allclose(c.err, np.full(3, ERR * a))


@pytest.mark.parametrize("a", [0.5, 1.5, 2.0])
def test_scaling_the_tail_at_a_recorded_power_gives_its_weight_exactly(a):
    """At a power whose log-moment was recorded the bounds meet at the truth computed from the whole vocabulary
    (the lower bound too, not only the upper)."""
    logits, record = _logits(3, 40, seed=4), 6
    c = _Chain(_recorded(logits, record))
    assert c.pristine.all()
    _scale_tail(c, np.full(3, a))
    truth = np.array(_tail_truth(logits, record, a))
    np.testing.assert_allclose(c.lo, truth, atol=1e-9)
    np.testing.assert_allclose(c.hi, truth, atol=1e-9)
    assert not c.pristine.any()


def test_a_second_scaling_composes_the_plain_bounds():
    """Two temperatures in a row: the second from the first's bounds by the power-mean inequality (the moments no
    longer describe the scaled tail); the truth lies within."""
    logits, record = _logits(2, 30, seed=5), 5
    run = _recorded(logits, record)
    c = _Chain(run)
    _scale_tail(c, np.full(2, 1.5))
    lo1, hi1, top1 = c.lo.copy(), c.hi.copy(), c.top.copy()
    _scale_tail(c, np.full(2, 0.5))
    n = run.tail_count
    np.testing.assert_allclose(c.lo, lo1 + (0.5 - 1) * top1, rtol=1e-12)
    np.testing.assert_allclose(c.hi, (1 - 0.5) * np.log(n) + 0.5 * hi1, rtol=1e-12)
    truth = np.array(_tail_truth(logits, record, 0.75))
    assert (c.lo <= truth + 1e-9).all() and (truth <= c.hi + 1e-9).all()


@pytest.mark.parametrize("a", [0.5, 1.0, 1.7])
def test_scaling_a_step_with_no_tail_keeps_it_at_minus_infinity(a):
    """A step whose every token was recorded: its tail's weight stays -inf at both bounds (never NaN), beside a
    step with a tail."""
    logits = _logits(2, 8, seed=6)
    run = _recorded(logits, record=5)
    c = _Chain(run)
    c.lo[1] = c.hi[1] = c.top[1] = NEG_INF
    c.count[1] = 1.0
    c.pristine[:] = False
    with np.errstate(invalid="ignore"):
        _scale_tail(c, np.full(2, a))
    assert c.lo[1] == NEG_INF and c.hi[1] == NEG_INF
    assert np.isfinite(c.lo[0]) and np.isfinite(c.hi[0])


@pytest.mark.parametrize("a", [2.5, 3.0])
def test_past_the_last_recorded_power_a_flat_tail_meets_its_upper_bound(a):
    """For a > 2 the upper bound is the a = 2 moment with every tail logit at most ``top``: a tail whose tokens all
    sit at ``top`` (n of them) reaches it, log n + a·top, computed here."""
    top, n = -3.0, 50
    tail = np.full(n, top)
    moments = np.array([[_lse(p * tail) for p in MOMENT_POWERS]])
    lower, upper = _moment_bounds(moments, np.array([a]), np.array([top]))
    assert math.isclose(upper[0], math.log(n) + a * top, abs_tol=1e-9)
    assert lower[0] <= upper[0] + 1e-9


# --- _below_probability -----------------------------------------------------------------------------------------


def _two_equal(tail_lo: float, tail_hi: float, top: float) -> _Chain:
    """One step, two recorded candidates of logit 0 (probability ½ each among themselves), a tail of weight in
    [exp(tail_lo), exp(tail_hi)], each tail logit at most ``top``."""
    c = _Chain(_recorded(_logits(1, 6, seed=7), record=2))
    c.x = np.array([[0.0, 0.0, NEG_INF]])
    c.lo, c.hi, c.top = np.array([tail_lo]), np.array([tail_hi]), np.array([top])
    return c


def test_a_candidate_exactly_at_the_line_is_kept():
    """p == line keeps the token (the engine removes p < line only): two candidates of ½ each, no tail, line ½."""
    c = _two_equal(NEG_INF, NEG_INF, NEG_INF)
    c.alive[:] = False
    _below_probability(c, np.array([0.5]), protect_top=True)
    assert np.isfinite(c.x[0, :2]).all()


def test_a_cut_decided_differently_at_the_two_bounds_is_flagged_as_depending_on_the_spread():
    """Tail weight between 0 and 1 beside two candidates of weight 1 each, line ½: at the smallest normaliser the
    second candidate sits exactly on the line (kept), at the largest it is below (removed): the cut depends on the
    tail's spread."""
    c = _two_equal(NEG_INF, 0.0, -5.0)
    _below_probability(c, np.array([0.5]), protect_top=True)
    assert c.reason[0] == _SPREAD
    assert REASONS[_SPREAD] == "the cut depends on how the probability outside the recorded candidates is spread"


def test_a_tail_token_that_may_sit_exactly_on_the_line_stays_in_play():
    """One candidate of weight 1, a tail of weight at least 0 whose likeliest token has weight ½: at the smallest
    normaliser that token's probability is exactly the line ½, so the tail is not cut and the kept set may reach
    past the recorded candidates."""
    c = _Chain(_recorded(_logits(1, 6, seed=8), record=1))
    c.x = np.array([[0.0, NEG_INF]])
    c.lo, c.hi, c.top = np.array([NEG_INF]), np.array([math.log(0.5)]), np.array([math.log(0.5)])
    _below_probability(c, np.array([0.5]), protect_top=True)
    assert c.alive[0]
    assert c.reason[0] == _PAST


# --- _Chain.near, lower_tail, compact ---------------------------------------------------------------------------


def test_near_flags_a_gap_within_two_and_a_half_roundings_and_only_where_asked():
    c = _Chain(_recorded(_logits(4, 8, seed=9), record=3))
    gap = np.full(c.x.shape, 1.0)
    gap[0, 0] = 2.5 * ERR  # exactly on the border: flagged
    gap[1, 0] = 3.0 * ERR  # past it: not
    gap[2, 0] = ERR  # within, but step 2 is not asked about
    gap[3, 0] = -2.0 * ERR  # within, below
    c.near(gap, np.array([True, True, False, True]))
    assert c.reason.tolist() == [_ROUNDING, 0, 0, _ROUNDING]


def test_lowering_tail_tokens_drops_the_lower_bound_by_their_largest_possible_weight():
    """``touched`` tail tokens lowered by unknown amounts: the lower bound becomes log(exp(lo) − touched·exp(top))
    (at least log 0), the upper stays; only the touched steps lose their pristine moments."""
    c = _Chain(_recorded(_logits(5, 30, seed=10), record=4))
    c.lo = np.array([-800.0, 1.0, 1.0, 1.0, 1.0])  # step 0's weight underflows exp(): it must stay as it is
    c.top = np.array([-1.0, -1.0, -1.0, 1.5, -1.0])  # step 3: e^1.5 > e^1, nothing left
    c.hi = np.full(5, 2.0)
    c.pristine = np.array([True, True, True, True, False])
    touched = np.array([0.0, 1.0, 2.0, 1.0, 0.0])
    with np.errstate(divide="ignore"):  # as re_derive runs it: log 0 is meant
        c.lower_tail(touched)
    expected = [-800.0, math.log(math.e - math.exp(-1)), math.log(math.e - 2 * math.exp(-1)), NEG_INF, 1.0]
    for got, want in zip(c.lo.tolist(), expected, strict=True):
        assert got == want or math.isclose(got, want, rel_tol=1e-12)
    assert (c.hi == 2.0).all()
    assert c.pristine.tolist() == [True, False, False, False, False]


def _chain_in_play(pattern: list[list[bool]]) -> _Chain:
    pattern_array = np.array(pattern)
    steps, width = pattern_array.shape
    c = _Chain(_recorded(_logits(steps, width + 4, seed=11), record=width - 1))
    c.x = np.where(pattern_array, c.x, NEG_INF)
    return c


@pytest.mark.parametrize(("pattern", "width"), [
    ([[True, False, True, False, False, False]] * 2, 2),  # 2 of 6 in every step: compacted
    ([[True, True, False, False, False, False], [False, False, True, False, False, False]], 2),  # per step, not summed
    ([[True, True, True, False, False, False]], 3),  # exactly half: compacted
    ([[True, True, True, False, False, False, False, False]], 3),  # 3 of 8
    ([[False, True, False, False, False, False]], 1),  # one
    ([[True, True, True, True, False, False]], 6),  # more than half: left as it is
    ([[False] * 6], 6),  # nothing in play: left as it is
])
def test_compact_keeps_the_columns_in_play_in_rank_order_once_at_most_half_remain(pattern, width):
    c = _chain_in_play(pattern)
    x0, ids0 = c.x.copy(), c.ids.copy()
    c.compact()
    assert c.x.shape == (len(pattern), width)
    rows = np.arange(len(pattern))[:, None]
    np.testing.assert_array_equal(c.x, x0[rows, c.cols])
    np.testing.assert_array_equal(c.ids, ids0[rows, c.cols])
    if width < len(pattern[0]):
        for row, in_play in enumerate(pattern):
            kept = [j for j, on in enumerate(in_play) if on]
            assert c.cols[row, :len(kept)].tolist() == kept  # in rank order, the padding after them


def test_compact_keeps_rank_order_over_a_wide_row():
    """64 columns, a scattered half in play: the compacted columns are the ones in play, in their rank order."""
    rng = np.random.default_rng(12)
    pattern = [[bool(v) for v in rng.permutation([1] * 20 + [0] * 44)] for _ in range(3)]
    c = _chain_in_play(pattern)
    c.compact()
    for row, in_play in enumerate(pattern):
        assert c.cols[row].tolist() == [j for j, on in enumerate(in_play) if on]


def test_compact_of_a_run_with_no_steps_is_a_no_op():
    run = _recorded(np.zeros((0, 6)), record=3)
    c = _Chain(run)
    c.compact()
    assert c.x.shape == (0, 4)


# --- the penalties' counts, per-step bans -----------------------------------------------------------------------


def test_the_context_counts_of_the_candidates_and_the_distinct_tokens_outside_them():
    """Counted here by hand over each step's context (prompt + the tokens before it): token 0 counts as any other,
    the padding counts nothing."""
    logits = np.full((3, 8), -5.0)
    for row, tops in enumerate([(0, 3, 5), (3, 0, 7), (2, 6, 1)]):
        logits[row, list(tops)] = [3.0, 2.0, 1.0]
    context = [0, 3, 3, 4, 0, 9, 3]  # prompt of 4, then the three steps' tokens
    run = _recorded(logits, record=3, context=context, start=4)
    counts, distinct = run.counts
    assert counts.dtype.kind == "i"
    for row in range(3):
        before = context[:4 + row]
        for col in range(4):
            token = int(run.ids[row, col])
            assert counts[row, col] == (before.count(token) if token >= 0 else 0), (row, col)
        assert distinct[row] == len(set(before))
    c = _Chain(run)
    got, outside = _counts(c)
    np.testing.assert_array_equal(got, counts)
    for row in range(3):
        before = context[:4 + row]
        recorded = {int(t) for t in run.ids[row] if t >= 0}
        assert outside[row] == len(set(before) - recorded), row


def test_per_step_bans_on_unrecorded_tokens_lower_the_tail_by_each_of_them():
    """Step 0 lowers two unrecorded tokens and one recorded; step 1 one unrecorded: the recorded one drops by its
    amount, the tail's lower bound by the weight of as many tokens at ``top``."""
    logits = _logits(2, 30, seed=13)
    run = _recorded(logits, record=4)
    c = _Chain(run)
    lo0, top0 = c.lo.copy(), c.top.copy()
    outside = [int(t) for t in np.argsort(-logits[0])[-2:]]
    recorded = int(run.ids[0, 1])
    _per_step_bans(c, [{outside[0]: 1.0, outside[1]: 2.0, recorded: 0.5},
                       {int(np.argsort(-logits[1])[-1]): 1.0}], subtract=True)
    assert math.isclose(c.x[0, 1], run.x[0, 1] - 0.5)
    for row, touched in ((0, 2), (1, 1)):
        left = math.exp(lo0[row]) - touched * math.exp(top0[row])
        assert math.isclose(c.lo[row], math.log(left) if left > 0 else NEG_INF, rel_tol=1e-12), row
    assert not c.pristine.any()


# --- re_derive: the arguments it passes on, mirostat's passes, the reasons --------------------------------------


VOCAB, RECORD, STEPS = 40, 12, 10
WORD = 0  # the token the word "w" encodes to
TOP_K, TAU, ETA, EDGE = 6, 1.2, 0.5, 6


def _packed_steps(seed: int) -> tuple[list[TokenStep], np.ndarray]:
    """Steps packed as the engine packs them, each step's top token a different one (so DRY finds no repeat), the
    chosen token the top one; the whole-vocabulary logits kept as the reference."""
    rng = np.random.default_rng(seed)
    full = rng.normal(0.0, 1.5, size=(STEPS, VOCAB))
    for row in range(STEPS):
        full[row, 3 * row + 1] += 8.0
    full[:, WORD] = -20.0  # the biased word's token: never near the top
    # Step EDGE: its second token sits exactly on mirostat's line at mu = 2·tau, the first pass's mu everywhere (and
    # far from the line at the step's own mu): a pass must not inherit what an earlier one flagged.
    six = np.log([0.5, 2.0 ** -(2 * TAU), 0.08, 0.07, 0.06, 1.0 - 0.5 - 2.0 ** -(2 * TAU) - 0.21])
    full[EDGE] = six.min() - 3.0 - rng.random(VOCAB)
    full[EDGE, [3 * EDGE + 1, 2, 5, 8, 11, 14]] = six
    full[EDGE, WORD] = -20.0
    steps = []
    for row in range(STEPS):
        logits = torch.tensor(full[row])
        logprobs = logits.log_softmax(-1)
        top = torch.topk(logits, RECORD).indices
        chosen = int(top[0])
        steps.append(TokenStep(step=row, token_id=chosen, text="", prob=0.0, raw_prob=float(logprobs[chosen].exp()),
                               logprob=float(logprobs[chosen]), raw_rank=1, entropy=0.0, processed_entropy=0.0,
                               candidates=(), shown_raw_mass=0.0, effects=(), forced=False, step_ms=0.0,
                               kv_cache_bytes=0, raw_top=pack_raw_candidates(top, logprobs, logits)))
    return steps, full


def _mirostat_reference(full: np.ndarray, k: int, tau: float, eta: float) -> tuple[list[float], list[np.ndarray]]:
    """Mirostat v2 after top-k, step by step over the whole vocabulary: mu starts at 2·tau; tokens more surprising
    than mu (−log2 p > mu) go, the likeliest stays; mu moves by eta·(surprise − tau) of the chosen (top) token."""
    mu, mus, probs = 2.0 * tau, [], []
    for row in range(full.shape[0]):
        keep = np.argsort(-full[row])[:k]
        p = np.zeros(full.shape[1])
        p[keep] = np.exp(full[row, keep] - _lse(full[row, keep]))
        top = int(np.argmax(p))
        cut = (p > 0) & (-np.log2(np.where(p > 0, p, 1.0)) > mu)
        cut[top] = False
        q = np.where(cut, 0.0, p)
        q /= q.sum()
        mus.append(mu)
        probs.append(q)
        mu -= eta * (-math.log2(q[top]) - tau)
    return mus, probs


# Word bias (resolved by ``encode``) and DRY with breakers (``breaker_ids``), before or after mirostat: on their
# own they change nothing here (the word's token is far below the top, the contexts never repeat), but without
# ``encode`` / ``breaker_ids`` every step would be marked not exact.
ORDERS = ["logit_bias;dry;top_k;mirostat", "top_k;mirostat;logit_bias;dry", "logit_bias;dry;top_k"]


def _settings(order: str) -> RunSettings:
    return RunSettings(strategy="sample", samplers=order, top_k=TOP_K, temperature=1.0, logit_bias=("w=-inf",),
                       dry_multiplier=0.8, dry_allowed_length=2, dry_sequence_breakers=("\n",),
                       mirostat=2 if "mirostat" in order else 0, mirostat_tau=TAU, mirostat_eta=ETA)


def _derive(order: str, seed: int = 21):
    steps, full = _packed_steps(seed)
    prompt = [VOCAB + 5, VOCAB + 6]  # tokens no step ranks
    what_if = re_derive(RecordedRun.of(steps, prompt), _settings(order), sampling=True,
                        encode=lambda word: [WORD] if word == "w" else [], breaker_ids=frozenset({VOCAB + 9}))
    return what_if, full


@pytest.mark.parametrize("order", ORDERS)
def test_re_derive_passes_the_word_encoder_and_the_breakers_on_and_equals_the_chain_computed_here(order):
    what_if, full = _derive(order)
    assert what_if.exact.all(), what_if.reasons
    assert what_if.reasons == ("",) * STEPS
    if "mirostat" in order:
        mus, probs = _mirostat_reference(full, TOP_K, TAU, ETA)
        assert what_if.mirostat_mu is not None
        np.testing.assert_allclose(what_if.mirostat_mu, mus, atol=5e-3)
        assert len({round(m, 3) for m in mus}) > 3, "precondition: mu moves from step to step"
        assert abs(mus[EDGE] - 2 * TAU) > 0.1, "precondition: step EDGE's own mu is not the first pass's"
    else:
        probs = []
        for row in range(STEPS):
            keep = np.argsort(-full[row])[:TOP_K]
            p = np.zeros(VOCAB)
            p[keep] = np.exp(full[row, keep] - _lse(full[row, keep]))
            probs.append(p)
    for row in range(STEPS):
        for col, token in enumerate(what_if.ids[row]):
            if token >= 0:
                assert math.isclose(what_if.probs[row, col], probs[row][token], rel_tol=2e-3, abs_tol=1e-6)
    # cut_by: int16, -1 for a kept candidate
    assert what_if.cut_by.dtype == np.int16
    assert (what_if.cut_by[what_if.kept] == -1).all()
    assert (what_if.cut_by[(what_if.ids >= 0) & ~what_if.kept] >= 0).all()


def test_mirostats_passes_run_out_leaving_the_later_steps_marked_as_mirostats_estimates(monkeypatch):
    """With a single pass allowed (the loop's else: one more chain with the state the pass computed), the first
    steps' mu are the sequential ones computed here and exact; the steps whose mu had not settled are not exact,
    and say mirostat's reason."""
    monkeypatch.setattr(derive_module, "MIROSTAT_PASSES", 1)
    for order in ORDERS[:2]:
        what_if, full = _derive(order)
        mus, _ = _mirostat_reference(full, TOP_K, TAU, ETA)
        assert what_if.exact[:2].all(), what_if.reasons
        assert not what_if.exact.all(), "precondition: one pass does not settle every step"
        assert what_if.mirostat_mu is not None
        for row in range(STEPS):
            if what_if.exact[row]:
                assert math.isclose(what_if.mirostat_mu[row], mus[row], abs_tol=5e-3), row
                assert what_if.reasons[row] == ""
            else:
                assert what_if.reasons[row] == REASONS[_MIROSTAT], (row, what_if.reasons[row])


def test_the_sampling_flag_given_is_the_one_used():
    """A greedy-strategy run re-derived with ``sampling=True``: top-k (sampling-only) applies; with ``False`` it
    does not (the strategy alone would not apply it)."""
    steps, full = _packed_steps(22)
    run = RecordedRun.of(steps, [VOCAB + 5])
    settings = RunSettings(strategy="greedy", top_k=3)
    on = re_derive(run, settings, sampling=True)
    off = re_derive(run, settings, sampling=False)
    assert (on.kept.sum(axis=1) == 3).all()
    assert (off.kept.sum(axis=1) == (off.ids >= 0).sum(axis=1)).all()
    for row in range(STEPS):
        keep = np.argsort(-full[row])[:3]
        expected = np.exp(full[row, keep] - _lse(full[row, keep]))
        column = {int(t): j for j, t in enumerate(on.ids[row])}
        got = [on.probs[row, column[int(t)]] for t in keep]
        np.testing.assert_allclose(got, expected, rtol=2e-3)


def test_a_run_with_no_steps_re_derives_to_nothing_with_mirostat_on():
    what_if = re_derive(RecordedRun.of([], [VOCAB + 5]), _settings(ORDERS[0]), sampling=True,
                        encode=lambda word: [WORD], breaker_ids=frozenset())
    assert what_if.probs.shape[0] == 0 and what_if.exact.shape == (0,) and what_if.reasons == ()
    assert what_if.mirostat_mu is not None and what_if.mirostat_mu.shape == (0,)


# --- mirostat's passes: when they stop ----------------------------------------------------------------------------

def _flat_steps(seed: int, count: int, unrecorded: tuple[int, ...] = ()) -> tuple[list[TokenStep], np.ndarray]:
    """Steps packed as the engine packs them but flat (the top token only 1 above the others): mirostat's cut, and
    so the chosen token's final probability, depends on each step's mu, so mu takes a pass per step to settle.
    The steps in ``unrecorded`` keep no raw candidates (not exact in the what-if)."""
    rng = np.random.default_rng(seed)
    full = rng.normal(0.0, 1.0, size=(count, VOCAB))
    for row in range(count):
        full[row, 3 * row + 1] += 1.0
    steps = []
    for row in range(count):
        logits = torch.tensor(full[row])
        logprobs = logits.log_softmax(-1)
        top = torch.topk(logits, RECORD).indices
        chosen = int(top[0])
        steps.append(TokenStep(step=row, token_id=chosen, text="", prob=0.0, raw_prob=float(logprobs[chosen].exp()),
                               logprob=float(logprobs[chosen]), raw_rank=1, entropy=0.0, processed_entropy=0.0,
                               candidates=(), shown_raw_mass=0.0, effects=(), forced=False, step_ms=0.0,
                               kv_cache_bytes=0,
                               raw_top=None if row in unrecorded else pack_raw_candidates(top, logprobs, logits)))
    return steps, full


def _counted_re_derive(monkeypatch, steps: list[TokenStep]):
    """re_derive with top-k then mirostat, and the number of chain passes it ran (``_chain_once`` calls)."""
    calls = []
    chain_once = derive_module._chain_once

    def counting(*args, **kwargs):
        calls.append(1)
        return chain_once(*args, **kwargs)

    monkeypatch.setattr(derive_module, "_chain_once", counting)
    what_if = re_derive(RecordedRun.of(steps, [VOCAB + 5]), _settings("top_k;mirostat"), sampling=True)
    return what_if, len(calls)


def test_mirostats_passes_stop_as_soon_as_no_mu_moves(monkeypatch):
    """Five exact steps: mu settles one step per pass, so the fifth pass sees nothing move and the what-if stops
    there (not after all of MIROSTAT_PASSES and one more), with every mu the sequential one computed here."""
    steps, full = _flat_steps(3, 5)
    what_if, passes = _counted_re_derive(monkeypatch, steps)
    mus, _ = _mirostat_reference(full, TOP_K, TAU, ETA)
    assert what_if.exact.all(), what_if.reasons
    assert what_if.mirostat_mu is not None
    np.testing.assert_allclose(what_if.mirostat_mu, mus, atol=5e-3)
    assert len({round(m, 2) for m in mus}) == 5, "precondition: every step's mu is another"
    assert passes <= 5 < derive_module.MIROSTAT_PASSES + 1


def test_past_the_first_inexact_step_mirostats_passes_stop_once_its_own_mu_has_settled(monkeypatch):
    """Step 2 recorded nothing (not exact), steps 0 and 1 are exact: step 2's own mu still follows from exact
    probabilities, so it is the sequential one; once it has settled only later (estimated anyway) states move, and
    the passes stop (3 here, not MIROSTAT_PASSES): the later steps stay marked as estimates."""
    steps, full = _flat_steps(3, 10, unrecorded=(2,))
    what_if, passes = _counted_re_derive(monkeypatch, steps)
    mus, _ = _mirostat_reference(full, TOP_K, TAU, ETA)
    assert what_if.exact[:2].all() and not what_if.exact[2:].any(), what_if.reasons
    assert what_if.mirostat_mu is not None
    np.testing.assert_allclose(what_if.mirostat_mu[:3], mus[:3], atol=5e-3)
    assert abs(mus[2] - mus[1]) > 0.1 and abs(mus[2] - 2 * TAU) > 0.1, "precondition: step 2's mu moved twice"
    assert passes <= 4
