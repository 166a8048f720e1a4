"""The what-if's recorded input (``playground/state/what_if/recorded.py``: a run's packed raw candidates unpacked into
[S, C] arrays, the tail's numbers and the context counts) and its temperature stage
(``playground/state/what_if/stages/temperature.py``, dynamic temperature above all) held to references computed
here: the mutation run's survivors there fail one of these.

References: ``RawCandidates`` packed by hand (base64 of little-endian ids and of quantised log-probabilities that
are exact binary fractions, so every unpacked number is known exactly) for ``recorded.py``; for the stage, a small
whole vocabulary of logits per step in NumPy, its top tokens recorded exactly (``_recorded`` of the what-if's
other kill tests) and dynamic temperature computed here over it by the formula the engine's sampler follows
(llama.cpp's: ``T = low + (high − low)·(H / ln max(n, 2))^exponent``, ``low = max(0, t − range)``, ``high = t +
range``, H the entropy in nats of the n tokens in play; one token left alone, T = 0 keeps the top token only).
"""

from __future__ import annotations

import base64
import dataclasses
import math

import numpy as np
from test_mutation_kills_what_if import _lse, _recorded

from playground.config import RunSettings
from playground.events import TokenStep
from playground.events.run import RawCandidates, WholeVocabulary
from playground.state.what_if import RecordedRun, WhatIf, re_derive, unpack_raw_candidates

NEG_INF = -math.inf
LSE = 2.5  # every hand-packed step's log-sum-exp: logit = logprob + 2.5


def _raw(ids: list[int], q: list[int], tail_mass: float, vocab: int, moments: tuple[float, ...] = (),
         whole: WholeVocabulary | None = None, id_bytes: int = 2) -> RawCandidates:
    """A step's raw candidates packed by hand: ``ids`` by raw rank, their log-probabilities ``-q/1024`` nats."""
    return RawCandidates(ids=base64.b64encode(np.array(ids, dtype=f"<u{id_bytes}").tobytes()).decode("ascii"),
                         logprobs=base64.b64encode(np.array(q, dtype="<u2").tobytes()).decode("ascii"),
                         logsumexp=LSE, tail_mass=tail_mass, vocab_size=vocab, id_bytes=id_bytes,
                         tail_log_moments=moments, whole=whole)


def _step(index: int, token: int, logprob: float, raw: RawCandidates | None) -> TokenStep:
    return TokenStep(step=index, token_id=token, text="", prob=0.0, raw_prob=math.exp(logprob), logprob=logprob,
                     raw_rank=1, entropy=0.0, processed_entropy=0.0, candidates=(), shown_raw_mass=0.0, effects=(),
                     forced=False, step_ms=0.0, kv_cache_bytes=0, raw_top=raw)


def _mass(q: list[int]) -> float:
    """1 − the listed tokens' probability: the tail's raw mass."""
    return 1.0 - sum(math.exp(-v / 1024) for v in q)


# --- unpacking --------------------------------------------------------------------------------------------------


def test_unpacked_ids_are_integers_that_index_arrays():
    """The ids come back as int64 (they index the vocabulary; a float array cannot), 4-byte ids too, and the logits
    are ``-q/1024 + logsumexp`` exactly."""
    for id_bytes, ids in ((2, [7, 0, 65535]), (4, [70000, 3, 123456789])):
        got_ids, logits = unpack_raw_candidates(_raw(ids, [0, 1024, 3072], 0.1, 2**31, id_bytes=id_bytes))
        assert got_ids.dtype == np.int64 and got_ids.tolist() == ids
        assert np.arange(10)[got_ids % 10].tolist() == [i % 10 for i in ids]  # usable as an index
        assert logits.dtype == np.float64 and logits.tolist() == [2.5, 1.5, -0.5]


# --- RecordedRun.of: the [S, C] arrays ---------------------------------------------------------------------------


def test_rows_of_fewer_candidates_are_padded_with_minus_one_and_minus_infinity():
    """Step 0 records 3 candidates, step 1 one: the width is 3 + 1 (the chosen token's column); step 1's unused
    columns hold id -1 (the padding mark every reader tests) and logit -inf."""
    steps = [_step(0, 4, -1.0, _raw([4, 9, 2], [1024, 2048, 3072], _mass([1024, 2048, 3072]), 50)),
             _step(1, 6, -0.25, _raw([6], [256], _mass([256]), 50))]
    run = RecordedRun.of(steps, [1, 2])
    assert run.ids.dtype == np.int64
    assert run.ids.tolist() == [[4, 9, 2, -1], [6, -1, -1, -1]]
    assert run.x.tolist() == [[1.5, 0.5, -0.5, NEG_INF], [2.25, NEG_INF, NEG_INF, NEG_INF]]
    assert run.chosen.tolist() == [4, 6] and run.chosen_col.tolist() == [0, 0]


def test_a_step_without_candidates_does_not_end_the_later_steps():
    """An unrecorded step (no ``raw_top``) between two recorded ones: the step after it still gets its tail's
    numbers, its whole-vocabulary numbers and its moments (not the empty defaults)."""
    q = [1024, 2048]
    tail = _mass(q)
    whole = WholeVocabulary(entropy=0.75, logit_mean=-1.5, logit_std=2.25, finite=40)
    moments = (-1.25, -3.5, -4.75)
    recorded = _raw([3, 8], q, tail, 40, moments=moments, whole=whole)
    steps = [_step(0, 3, -1.0, recorded), _step(1, 5, -1.0, None), _step(2, 8, -2.0, recorded)]
    run = RecordedRun.of(steps, [1])
    assert run.recorded.tolist() == [True, False, True]
    assert run.ids[1].tolist() == [-1, -1, 5] and run.chosen_col[1] == 2  # shown alone in its own column
    for row in (0, 2):
        assert run.log_tail[row] == math.log(tail) + LSE
        assert run.tail_top[row] == 0.5  # the last recorded logit: -2 + 2.5
        assert run.tail_count[row] == 38
        assert run.whole[row].tolist() == [0.75, -1.5, 2.25, 40.0]
        assert np.isfinite(run.moments[row]).all()
    assert run.chosen_col[2] == 1
    assert np.isnan(run.whole[1]).all() and np.isnan(run.moments[1]).all() and run.log_tail[1] == NEG_INF


def test_the_tail_count_leaves_out_the_recorded_tokens_and_an_unrecorded_chosen_one():
    """A 30-token vocabulary with 3 recorded: 27 unrecorded when the chosen token is among the recorded ones, 26
    when it is not (it joins its step in a column of its own, logit = logprob + logsumexp, and its probability
    leaves the tail's mass)."""
    q = [1024, 2048, 3072]
    tail = _mass(q)
    inside = _step(0, 11, -1.0, _raw([10, 11, 12], q, tail, 30, moments=(-1.0, -3.0, -4.0)))
    outside = _step(1, 20, -5.0, _raw([10, 11, 12], q, tail, 30, moments=(-1.0, -3.0, -4.0)))
    run = RecordedRun.of([inside, outside], [1])
    assert run.tail_count.tolist() == [27.0, 26.0]
    assert run.chosen_col.tolist() == [1, 3]
    assert run.ids[1, 3] == 20 and run.x[1, 3] == -5.0 + LSE
    assert math.isclose(run.log_tail[1], math.log(tail - math.exp(-5.0)) + LSE, rel_tol=1e-15)
    assert run.log_tail[0] == math.log(tail) + LSE


def test_the_moments_are_the_recorded_log_moments_shifted_by_the_logsumexp():
    """log Σ exp(a·logit) over the tail = log Σ p^a + a·logsumexp: at a = 0 the log of the tail's count, at a = 1
    the log of its mass, at 0.5, 1.5 and 2 the recorded ones (exact binary fractions here)."""
    q = [1024, 2048]
    tail = _mass(q)
    run = RecordedRun.of([_step(0, 1, -1.0, _raw([1, 2], q, tail, 10, moments=(-1.25, -3.5, -4.75)))], [0])
    expected = [math.log(8), -1.25 + 0.5 * LSE, math.log(tail) + LSE, -3.5 + 1.5 * LSE, -4.75 + 2 * LSE]
    assert run.moments[0].tolist() == expected


def test_one_unrecorded_token_counts_as_one_in_the_moments():
    """A tail of a single token: its a = 0 log-moment is log 1 = 0 (not the log of a floor of 2)."""
    q = [1024, 2048]
    run = RecordedRun.of([_step(0, 1, -1.0, _raw([1, 2], q, _mass(q), 3, moments=(-1.0, -2.0, -3.0)))], [0])
    assert run.tail_count[0] == 1.0
    assert run.moments[0, 0] == 0.0


def test_no_moments_where_the_chosen_token_left_the_tail_or_the_run_recorded_none():
    """The recorded log-moments include an unrecorded chosen token's share, which left the tail: not used (NaN);
    an older saved run without them (empty) loads too, NaN, whether or not its chosen token was recorded."""
    q = [1024, 2048]
    tail = _mass(q)
    steps = [_step(0, 7, -4.0, _raw([1, 2], q, tail, 20, moments=(-1.0, -2.0, -3.0))),  # chosen outside
             _step(1, 1, -1.0, _raw([1, 2], q, tail, 20)),  # no moments recorded, chosen inside
             _step(2, 7, -4.0, _raw([1, 2], q, tail, 20))]  # neither
    run = RecordedRun.of(steps, [0])
    assert np.isnan(run.moments).all()
    assert np.isfinite(run.log_tail).all()


def test_a_step_whose_every_token_was_recorded_has_no_tail():
    """The whole 3-token vocabulary recorded, its tail's mass 0 (with its moments, log 0 = -inf, and without):
    no tail at all (log weight -inf, count 0, moments NaN), not a math error."""
    q = [512, 1024, 2048]
    steps = [_step(0, 0, -0.5, _raw([0, 1, 2], q, 0.0, 3, moments=(NEG_INF, NEG_INF, NEG_INF))),
             _step(1, 1, -1.0, _raw([0, 1, 2], q, 0.0, 3))]
    run = RecordedRun.of(steps, [0])
    assert run.log_tail.tolist() == [NEG_INF, NEG_INF]
    assert run.tail_count.tolist() == [0.0, 0.0]
    assert np.isnan(run.moments).all()
    what_if = re_derive(run, RunSettings(strategy="sample", temperature=0.5))
    assert what_if.tail_prob.tolist() == [0.0, 0.0] and what_if.exact.all()


def test_a_recorded_step_with_no_candidates_has_no_tail_top():
    """A step whose raw candidates list no token (every one in the tail): no largest tail logit is known (-inf
    rather than an index error); the chosen token stands in its own column."""
    step = _step(0, 4, -2.0, _raw([], [], 1.0, 12))
    run = RecordedRun.of([step], [0])
    assert run.tail_top.tolist() == [NEG_INF]
    assert run.ids.tolist() == [[4]] and run.x.tolist() == [[0.5]]
    assert run.tail_count.tolist() == [11.0]


def test_a_run_of_no_steps_is_empty_arrays_of_one_column():
    """No steps: [0, 1] arrays (no recorded candidates, the chosen token's column) and int64 tokens; re-deriving
    it gives empty int64 answers."""
    run = RecordedRun.of([], [3, 4])
    assert run.ids.shape == (0, 1) and run.x.shape == (0, 1)
    assert run.chosen.dtype == np.int64 and run.chosen.shape == (0,)
    what_if = re_derive(run, RunSettings(strategy="sample", temperature=0.7, top_k=5, presence_penalty=0.5))
    assert what_if.chosen.dtype == np.int64 and what_if.greedy.dtype == np.int64
    assert what_if.probs.shape == (0, 1)


# --- the context counts ------------------------------------------------------------------------------------------


def test_context_counts_by_hand_with_an_empty_prompt_and_token_zero():
    """No prompt (a run saved without its start): step 0 reads an empty context (0 distinct tokens, every count
    0); token 0 is counted like any other; the padding counts 0."""
    q = [1024, 2048]
    steps = [_step(0, 0, -1.0, _raw([0, 5], q, _mass(q), 9)),
             _step(1, 0, -1.0, _raw([0, 5], q, _mass(q), 9)),
             _step(2, 5, -2.0, _raw([5, 0], q, _mass(q), 9)),
             _step(3, 5, -1.0, _raw([5], [1024], _mass([1024]), 9))]
    run = RecordedRun.of(steps, [])
    counts, distinct = run.counts
    # contexts: [], [0], [0, 0], [0, 0, 5]
    assert counts.tolist() == [[0, 0, 0], [1, 0, 0], [0, 2, 0], [1, 0, 0]]
    assert distinct.tolist() == [0, 1, 1, 2]


# --- dynamic temperature -----------------------------------------------------------------------------------------


def _dynatemp(logits: np.ndarray, temperature: float, spread: float, exponent: float) -> np.ndarray:
    """Dynamic temperature over the tokens in play (finite) of each row, as llama.cpp: [S] temperatures."""
    out = []
    for row in logits:
        finite = row[np.isfinite(row)]
        p = np.exp(finite - _lse(finite))
        entropy = -float(np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)))
        low, high = max(0.0, temperature - spread), temperature + spread
        out.append(low + (high - low) * max(entropy / math.log(max(len(finite), 2)), 0.0) ** exponent)
    return np.array(out)


def _softmax(row: np.ndarray) -> np.ndarray:
    return np.exp(row - _lse(row))


def _settings(**values: object) -> RunSettings:
    return RunSettings(strategy="sample", **values)


def _check_recorded_probs(what_if: WhatIf, reference: np.ndarray, row: int) -> None:
    for j, token in enumerate(what_if.ids[row]):
        if token >= 0:
            assert math.isclose(what_if.probs[row, j], reference[token], rel_tol=1e-9, abs_tol=1e-12), (row, j)


def test_dynatemp_at_the_low_end_scales_the_tail_exactly():
    """A huge exponent takes every step to the range's low end, T = 0.75 − 0.25 = 0.5 exactly (a = 2, a recorded
    power: the tail's weight is known): the what-if is exact and is softmax(logits / 0.5) over the whole vocabulary,
    the unrecorded tokens' share too; the tail stays in play."""
    logits = np.random.default_rng(11).normal(0.0, 1.5, size=(3, 40))
    run = _recorded(logits, record=6)
    what_if = re_derive(run, _settings(temperature=0.75, dynatemp_range=0.25, dynatemp_exponent=5000.0))
    assert np.allclose(_dynatemp(logits, 0.75, 0.25, 5000.0), 0.5, rtol=0, atol=0)
    assert what_if.stages == ("dynatemp",)
    assert what_if.exact.all(), what_if.reasons
    for row in range(3):
        reference = _softmax(logits[row] / 0.5)
        _check_recorded_probs(what_if, reference, row)
        rest = np.setdiff1d(np.arange(40), run.ids[row])
        assert math.isclose(what_if.tail_prob[row], reference[rest].sum(), rel_tol=1e-9)
    assert what_if.kept[:, :6].all()


def test_dynatemp_then_top_n_sigma_reads_the_whole_vocabulary_at_the_step_s_temperature():
    """Dynamic temperature from the recorded whole-vocabulary entropy and count (T ≈ 0.35 to 0.4 here), then top-nσ
    with the whole vocabulary's spread at that temperature: exact, the kept set and probabilities the whole
    vocabulary's, computed here."""
    rng = np.random.default_rng(12)
    logits = rng.normal(0.0, 1.0, size=(3, 60))
    logits[:, :3] += 6.0
    settings = _settings(temperature=0.5, dynatemp_range=0.4, dynatemp_exponent=1.0, top_n_sigma=1.0)
    what_if = re_derive(_recorded(logits, record=12), settings)
    temps = _dynatemp(logits, 0.5, 0.4, 1.0)
    assert ((temps > 0.1) & (temps < 0.6)).all(), temps
    assert what_if.stages == ("dynatemp", "top_n_sigma")
    assert what_if.exact.all(), what_if.reasons
    for row in range(3):
        scaled = logits[row] / temps[row]
        keep = scaled >= scaled.max() - 1.0 * scaled.std()
        reference = np.where(keep, _softmax(np.where(keep, scaled, NEG_INF)), 0.0)
        _check_recorded_probs(what_if, reference, row)
        assert what_if.tail_prob[row] == 0.0
        assert sorted(what_if.ids[row][what_if.kept[row]].tolist()) == np.flatnonzero(keep).tolist()


def test_dynatemp_estimate_on_an_old_run_reads_each_step_s_own_candidates():
    """A run saved without the whole-vocabulary numbers: each step's temperature is estimated from its own recorded
    candidates (their entropy, their count: 8 per step, not all the steps' together), with exponent 2; top-nσ after
    it reads those candidates' spread, not the missing numbers. Both are estimates (not exact), computed here."""
    rng = np.random.default_rng(14)
    logits = rng.normal(0.0, 2.0, size=(3, 30))
    run = _recorded(logits, record=8)
    run = dataclasses.replace(run, whole=np.full_like(run.whole, np.nan))
    settings = _settings(temperature=1.0, dynatemp_range=0.8, dynatemp_exponent=2.0, top_n_sigma=1.5)
    what_if = re_derive(run, settings)
    recorded = np.where(run.ids >= 0, run.x, NEG_INF)
    temps = _dynatemp(recorded, 1.0, 0.8, 2.0)
    assert not what_if.exact.any()
    for row in range(3):
        scaled = recorded[row] / temps[row]
        finite = scaled[np.isfinite(scaled)]
        line = finite.max() - 1.5 * finite.std()
        keep = np.isfinite(scaled) & (scaled >= line)
        assert what_if.kept[row].tolist() == keep.tolist(), row
        kept = np.flatnonzero(keep)
        assert 2 <= kept.size < 8, "precondition: a cut, and two kept candidates to compare"
        # the kept candidates' ratios are the step's temperature's, whatever the tail's estimated share
        ratio = math.log(what_if.probs[row, kept[0]] / what_if.probs[row, kept[1]])
        assert math.isclose(ratio, (recorded[row, kept[0]] - recorded[row, kept[1]]) / temps[row], rel_tol=1e-9)


def test_dynatemp_after_top_k_of_two_uses_the_two_tokens_entropy_and_count():
    """top-k = 2 first leaves two tokens (the tail out): the temperature is their entropy over ln 2, and the two
    are scaled by it (two tokens are not one: not left alone); exact, the engine's chain computed here."""
    logits = np.random.default_rng(14).normal(0.0, 1.0, size=(2, 20))
    logits[0, 3], logits[1, 7] = 2.0, 1.2  # step 0 peaked, step 1 nearly flat over its top two
    settings = _settings(samplers="top_k;temperature", top_k=2, temperature=1.0, dynatemp_range=0.5,
                         dynatemp_exponent=1.0)
    what_if = re_derive(_recorded(logits, record=6), settings)
    assert what_if.exact.all(), what_if.reasons
    for row in range(2):
        top = np.argsort(-logits[row])[:2]
        two = np.full(20, NEG_INF)
        two[top] = logits[row, top]
        temp = _dynatemp(two[None], 1.0, 0.5, 1.0)[0]
        assert abs(temp - 1.0) > 0.05, "precondition: the temperature moves"
        _check_recorded_probs(what_if, _softmax(two / temp), row)


def test_dynatemp_leaves_a_single_recorded_candidate_alone_tail_and_all():
    """An old run recording one candidate per step, its tail in play: the estimate counts one token in play, and a
    single token is left alone (llama.cpp's rule) — no scaling of it nor of the tail's share: the probabilities
    stay the raw ones (not exact: the tail is in play)."""
    logits = np.random.default_rng(15).normal(0.0, 1.0, size=(2, 16))
    run = _recorded(logits, record=1)
    run = dataclasses.replace(run, whole=np.full_like(run.whole, np.nan))
    what_if = re_derive(run, _settings(temperature=1.0, dynatemp_range=0.5, dynatemp_exponent=1.0))
    assert not what_if.exact.any()
    for row in range(2):
        raw = _softmax(logits[row])
        top = int(np.argmax(logits[row]))
        assert math.isclose(what_if.probs[row, 0], raw[top], rel_tol=1e-12)
        assert math.isclose(what_if.tail_prob[row], 1.0 - raw[top], rel_tol=1e-12)


def test_dynatemp_of_zero_keeps_the_top_token_only_and_leaves_min_p_exact():
    """temperature 0.25 with a range of 0.5: the low end is 0, and a huge exponent takes the steps there: only the
    top token is kept (probability 1, the others and the tail cut by dynatemp), with no scaling of the logits, so
    that a min-p after it is exact too (no rounding doubt from a scaled logit)."""
    logits = np.random.default_rng(16).normal(0.0, 1.5, size=(3, 30))
    run = _recorded(logits, record=5)
    settings = _settings(temperature=0.25, dynatemp_range=0.5, dynatemp_exponent=5000.0, min_p=0.05)
    assert (_dynatemp(logits, 0.25, 0.5, 5000.0) == 0.0).all()
    what_if = re_derive(run, settings)
    assert what_if.stages == ("dynatemp", "min_p")
    assert what_if.exact.all(), what_if.reasons
    for row in range(3):
        assert what_if.probs[row].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        assert what_if.kept[row].tolist() == [True, False, False, False, False, False]
        assert what_if.cut_by[row, 1:5].tolist() == [0, 0, 0, 0]
        assert what_if.tail_prob[row] == 0.0
