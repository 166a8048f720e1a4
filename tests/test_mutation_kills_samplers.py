"""The samplers' engine objects where mutation testing found no test looking (issue 28, point 4): each test here
fails on a mutant that survived `make mutate` (named in /work/notes/mutation_table.md), against references written
here: rows of a batch as each row alone, dynamic temperature's formula in plain Python, locally typical sampling in
NumPy over the whole vocabulary (the engine's fast path ranks only the likeliest 1024), the exact boundaries the
papers' and transformers' rules give (``p < epsilon`` keeps ``p == epsilon``), Adaptive-P's moving average by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from playground.engine.samplers import (
    ENGINE_SAMPLERS,
    apply_dynamic_temperature,
    dynamic_temperature,
    exclude_top_choices,
    keep_above_epsilon,
    keep_above_eta,
    keep_top_n_sigma,
    keep_typical,
    truncate_by_surprise,
)
from playground.engine.samplers.adaptive_p import AdaptiveP
from playground.engine.samplers.min_p import keep_min_p
from playground.engine.samplers.tfs import keep_tail_free
from playground.engine.samplers.top_a import keep_top_a
from playground.engine.samplers.top_k import keep_top_k
from playground.engine.samplers.top_p import keep_top_p
from playground.engine.samplers.typical_p import TYPICAL_FAST_VOCAB, _typical_among_top
from playground.engine.samplers.xtc import Xtc

NEG_INF = float("-inf")


def _rows() -> torch.Tensor:
    """Three rows unlike each other: spread out, a third of it removed, peaked (each sampler cuts them differently)."""
    g = torch.Generator().manual_seed(7)
    rows = torch.randn(3, 48, generator=g)
    rows[0] *= 0.5
    rows[1] *= 2.0
    rows[1, ::3] = NEG_INF
    rows[2] *= 4.0
    return rows


ROW_WISE = [
    ("top_k", lambda x: keep_top_k(None, x, 5)),
    ("top_p", lambda x: keep_top_p(None, x, 0.6)),
    ("min_p", lambda x: keep_min_p(None, x, 0.1)),
    ("epsilon", lambda x: keep_above_epsilon(None, x, 0.03)),
    ("eta", lambda x: keep_above_eta(None, x, 0.05)),
    ("top_a", lambda x: keep_top_a(None, x, 0.3)),
    ("top_n_sigma", lambda x: keep_top_n_sigma(None, x, 1.0)),
    ("typical", lambda x: keep_typical(None, x, 0.5)),
    ("tfs", lambda x: keep_tail_free(None, x, 0.7)),
    ("xtc", lambda x: exclude_top_choices(None, x, 0.05)),
    ("mirostat", lambda x: truncate_by_surprise(None, x, 4.0)),
    ("dynatemp", lambda x: apply_dynamic_temperature(None, x, 1.0, 0.5, 1.0)),
]


@pytest.mark.parametrize("fn", [f for _, f in ROW_WISE], ids=[n for n, _ in ROW_WISE])
def test_each_row_of_a_batch_is_cut_as_it_would_be_alone(fn):
    rows = _rows()
    together = fn(rows)
    for r in range(rows.shape[0]):
        alone = fn(rows[r:r + 1])[0]
        assert torch.equal(torch.isfinite(together[r]), torch.isfinite(alone)), r
        assert torch.allclose(together[r][torch.isfinite(alone)], alone[torch.isfinite(alone)]), r
    # and the rows are really cut differently (a batch of equal rows would hide a reduction over the batch)
    kept = [int(torch.isfinite(together[r]).sum()) for r in range(rows.shape[0])]
    assert len(set(kept)) > 1 or not torch.allclose(together[0], together[2])


# ---- dynamic temperature -------------------------------------------------------------------------------------------

def _dynatemp_reference(row: list[float], temperature: float, spread: float, exponent: float) -> float:
    finite = [v for v in row if v != NEG_INF]
    top = max(finite)
    z = sum(math.exp(v - top) for v in finite)
    probs = [math.exp(v - top) / z for v in finite]
    entropy = -sum(p * math.log(p) for p in probs if p > 0)
    low, high = max(0.0, temperature - spread), temperature + spread
    return low + (high - low) * (entropy / math.log(max(len(finite), 2))) ** exponent


def test_dynamic_temperature_is_llama_cpps_formula_per_row_with_or_without_the_count():
    rows = torch.tensor([[2.0, 1.0, 0.0, -1.0, NEG_INF, NEG_INF],
                         [0.5, 0.2, NEG_INF, NEG_INF, NEG_INF, NEG_INF],  # two tokens: ln 2, not ln 3
                         [3.0, 3.0, 1.0, 0.0, -2.0, 0.5]], dtype=torch.float64)
    for temperature, spread, exponent in [(1.0, 0.5, 1.0), (0.8, 0.6, 2.0)]:
        expected = [_dynatemp_reference(r, temperature, spread, exponent) for r in rows.tolist()]
        got = dynamic_temperature(rows, temperature, spread, exponent)  # counts the finite logits itself
        assert got.shape == (3, 1)
        assert got[:, 0].tolist() == pytest.approx(expected, rel=1e-12)
        out = apply_dynamic_temperature(None, rows, temperature, spread, exponent)
        for r, t in enumerate(expected):
            finite = torch.isfinite(rows[r])
            assert torch.equal(torch.isfinite(out[r]), finite)
            assert out[r][finite].tolist() == pytest.approx((rows[r][finite] / t).tolist(), rel=1e-12)


def test_a_temperature_of_zero_keeps_only_the_top_token_and_a_row_with_one_token_is_left_alone():
    # llama.cpp's rules: a zero temperature is greedy; a single token left is not divided by anything.
    rows = torch.tensor([[1.0, 3.0, 2.0, NEG_INF],
                         [0.0, -1.0, NEG_INF, NEG_INF],
                         [NEG_INF, 4.0, NEG_INF, NEG_INF]])
    out = apply_dynamic_temperature(None, rows, 0.0, 0.0, 1.0)
    assert out[0].tolist() == [NEG_INF, 3.0, NEG_INF, NEG_INF]
    assert out[1].tolist() == [0.0, NEG_INF, NEG_INF, NEG_INF]
    assert out[2].tolist() == [NEG_INF, 4.0, NEG_INF, NEG_INF]
    # a zero-entropy row (the top token takes all the mass in float) beside rows of temperature in (0, 1]
    mixed = torch.tensor([[0.0, -200.0, -200.0], [1.0, 0.5, 0.0], [2.0, 0.0, -1.0]])
    out = apply_dynamic_temperature(None, mixed, 0.5, 0.5, 1.0)
    assert out[0].tolist() == [0.0, NEG_INF, NEG_INF]
    for r in (1, 2):
        t = _dynatemp_reference(mixed[r].tolist(), 0.5, 0.5, 1.0)
        assert 0.0 < t <= 1.0
        assert out[r].tolist() == pytest.approx((mixed[r] / t).tolist(), rel=1e-5)


# ---- the boundaries: "below" is strict ------------------------------------------------------------------------------

def test_epsilon_and_eta_keep_a_token_exactly_at_the_cutoff():
    # Four equal logits: each p is exactly 0.25 (and e^-H exactly 0.25), so the cutoffs equal p: p < cutoff is false.
    flat = torch.zeros(1, 4)
    assert torch.isfinite(keep_above_epsilon(None, flat, 0.25)).all()  # transformers: probabilities < epsilon
    assert torch.isfinite(keep_above_eta(None, flat, 1.0)).all()  # eta = min(1, √1 · 0.25) = 0.25 = p
    assert int(torch.isfinite(keep_above_epsilon(None, flat, 0.26)).sum()) == 1  # just above: only the top stays


def test_tail_free_removes_a_token_only_when_the_sum_before_it_exceeds_z():
    # probabilities 1/2, 1/4, 1/8, 1/8: |second differences| 1/8, 1/8 -> normalised 1/2, 1/2 (exact in float).
    logits = torch.log(torch.tensor([[4.0, 2.0, 1.0, 1.0]]))
    assert torch.isfinite(keep_tail_free(None, logits, 0.5))[0].tolist() == [True, True, False, False]
    assert torch.isfinite(keep_tail_free(None, logits, 0.49))[0].tolist() == [True, False, False, False]


# ---- locally typical sampling on a large vocabulary ----------------------------------------------------------------

def _typical_reference(row: np.ndarray, mass: float, min_keep: int = 1) -> np.ndarray:
    """Meister et al.'s rule over the whole vocabulary (ties with the cut's token kept), float64."""
    finite = np.isfinite(row)
    top = row[finite].max()
    logp = np.full(row.shape, -np.inf)
    logp[finite] = row[finite] - top - np.log(np.exp(row[finite] - top).sum())
    p = np.exp(logp)
    entropy = -(p[finite] * logp[finite]).sum()
    distance = np.where(finite, np.abs(-logp - entropy), np.inf)
    order = np.argsort(distance, kind="stable")
    cumulative = np.cumsum(p[order])
    last = min(int((cumulative < mass).sum()), row.shape[0] - 1)
    keep = distance <= distance[order[last]]
    keep[order[:min_keep]] = True
    return keep


def _large_rows() -> list[np.ndarray]:
    vocab = 2 * TYPICAL_FAST_VOCAB
    rng = np.random.default_rng(3)
    rows = [rng.standard_normal(vocab) * scale for scale in (0.5, 1.0, 2.0, 4.0)]
    # 1024 likelier tokens (the fast path's whole top) and a tail that holds most of the mass and lies nearer the
    # entropy: the cut reaches past the top, so the fast path must hand over to the full sort.
    tiered = np.zeros(vocab)
    tiered[rng.permutation(vocab)[:1024]] = 1.0
    rows.append(tiered)
    return rows


@pytest.mark.parametrize("mass", [0.05, 0.2, 0.5, 0.9, 0.99])
def test_typical_on_a_large_vocabulary_equals_the_whole_vocabulary_rule(mass):
    for i, row in enumerate(_large_rows()):
        got = torch.isfinite(keep_typical(None, torch.tensor(row[None, :]), mass))[0].numpy()
        assert np.array_equal(got, _typical_reference(row, mass)), (i, mass)


def test_typical_min_keep_on_a_large_vocabulary_keeps_the_nearest_to_the_entropy():
    for i, row in enumerate(_large_rows()):
        for min_keep in (40, 1500):
            got = torch.isfinite(keep_typical(None, torch.tensor(row[None, :]), 0.01, min_keep=min_keep))[0].numpy()
            assert np.array_equal(got, _typical_reference(row, 0.01, min_keep)), (i, min_keep)


def test_typical_fast_path_decides_a_peaked_step_without_the_full_sort():
    # The point of the fast path (~10 ms a step saved on 49k tokens): a peaked step is decided among the top 1024.
    row = torch.tensor(_large_rows()[3][None, :])  # scale 4: peaked
    logprobs = row.log_softmax(dim=-1)
    probs = logprobs.exp()
    entropy = torch.special.entr(probs).sum(dim=-1, keepdim=True)
    distance = (-logprobs - entropy).abs()
    for mass in (0.2, 0.5, 0.9):
        kept = _typical_among_top(logprobs, probs, entropy, distance, mass, 1)
        assert kept is not None, mass
        assert np.array_equal(kept[0].numpy(), _typical_reference(row[0].numpy(), mass)), mass


# ---- Adaptive-P's state --------------------------------------------------------------------------------------------

def test_adaptive_p_learns_once_per_apply_and_never_from_a_token_it_did_not_see():
    target, decay = 0.4, 0.5
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = torch.softmax(logits[0].double(), dim=-1).tolist()
    start = (target / (1 - decay), 1 / (1 - decay))

    sampler = AdaptiveP(target, decay)
    sampler.accept(1, 0.3)  # before any apply: nothing to learn from
    assert sampler.snapshot() == pytest.approx(start)
    sampler.apply(None, logits)
    sampler.accept(-1, 0.0)  # no token (a forced token outside the vocabulary): nothing learned
    assert sampler.snapshot() == pytest.approx(start)
    sampler.accept(1, 0.3)  # learns the token's probability *before* the transform, p[1]
    once = (p[1] + decay * start[0], 1 + decay * start[1])
    assert sampler.snapshot() == pytest.approx(once, rel=1e-6)
    sampler.accept(2, 0.3)  # a second accept after one apply learns nothing more
    assert sampler.snapshot() == pytest.approx(once, rel=1e-6)

    for back_to_start in (sampler.reset, lambda: sampler.restore(start)):
        sampler.apply(None, logits)
        back_to_start()  # forgets the apply's probabilities too
        sampler.accept(0, 0.3)
        assert sampler.snapshot() == pytest.approx(start)


# ---- XTC's state and the objects' names ----------------------------------------------------------------------------

def test_xtc_reset_replays_its_draws_from_the_start():
    generator = torch.Generator().manual_seed(11)
    sampler = Xtc(probability=0.5, threshold=0.1, generator=generator)
    logits = torch.tensor([[2.0, 1.9, 1.8, -3.0]])
    first = [bool(torch.isinf(sampler.apply(None, logits)).any()) for _ in range(24)]
    assert 0 < sum(first) < 24  # it cut on some steps and not on others
    sampler.reset()
    assert [bool(torch.isinf(sampler.apply(None, logits)).any()) for _ in range(24)] == first
    # the draws are the generator's own: the same seed's uniform draws below the probability
    expected = (torch.rand(24, generator=torch.Generator().manual_seed(11)) < 0.5).tolist()
    assert first == expected


def test_an_engine_object_names_its_class_and_stage():
    assert repr(ENGINE_SAMPLERS["xtc"](0.5, 0.1, torch.Generator())) == "Xtc('xtc')"
    assert repr(AdaptiveP(0.3, 0.5)) == "AdaptiveP('adaptive_p')"


# ---- more boundaries, min_keep, and top-p on a large vocabulary ----------------------------------------------------

def test_xtc_cuts_when_exactly_two_tokens_reach_the_threshold():
    logits = torch.log(torch.tensor([[0.45, 0.35, 0.2]]))
    # two tokens at least 0.3 likely: all of them but the least likely one go (llama.cpp: ``cur_p`` from the last)
    assert torch.isfinite(exclude_top_choices(None, logits, 0.3))[0].tolist() == [False, True, True]
    assert torch.isfinite(exclude_top_choices(None, logits, 0.4))[0].tolist() == [True, True, True]  # one: no cut


def test_mirostat_and_min_p_keep_a_token_exactly_at_their_cutoff():
    logits = torch.log(torch.tensor([[2.0, 1.0, 1.0]]))  # p = 1/2, 1/4, 1/4: surprises 1, 2, 2 bits (exact)
    assert torch.isfinite(truncate_by_surprise(None, logits, 2.0)).all()  # surprise > mu removes; 2 > 2 is false
    assert torch.isfinite(truncate_by_surprise(None, logits, 1.5))[0].tolist() == [True, False, False]
    assert torch.isfinite(keep_min_p(None, logits, 0.5)).all()  # 1/4 == 0.5 · 1/2: kept (transformers: p < cut)
    assert torch.isfinite(keep_min_p(None, logits, 0.6))[0].tolist() == [True, False, False]


def test_min_keep_keeps_that_many_of_the_likeliest_tokens():
    logits = torch.tensor([[5.0, 1.0, 0.5, 0.0, -1.0]])
    assert torch.isfinite(keep_min_p(None, logits, 0.9, min_keep=3))[0].tolist() == [True, True, True, False, False]
    assert torch.isfinite(keep_above_epsilon(None, logits, 0.5, min_keep=3))[0].tolist() == [True, True, True, False,
                                                                                           False]


def test_typical_with_all_of_the_mass_keeps_every_token():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]])
    assert torch.isfinite(keep_typical(None, logits, 1.0)).all()


def test_typical_on_a_batch_of_large_rows_cuts_each_as_alone():
    rows = _large_rows()
    batch = torch.tensor(np.stack([rows[1], rows[3]]))
    got = torch.isfinite(keep_typical(None, batch, 0.5)).numpy()
    assert np.array_equal(got[0], _typical_reference(rows[1], 0.5))
    assert np.array_equal(got[1], _typical_reference(rows[3], 0.5))


def _top_p_reference(row: np.ndarray, top_p: float, min_keep: int = 1) -> np.ndarray:
    """transformers' nucleus over the whole vocabulary: sorted ascending, drop while the cumulative mass is at most
    1 − top_p, keep the last ``min_keep``."""
    p = np.exp(row - row.max())
    p /= p.sum()
    order = np.argsort(row, kind="stable")
    cumulative = np.cumsum(p[order])
    remove_sorted = cumulative <= 1 - top_p
    remove_sorted[len(row) - min_keep:] = False
    keep = np.ones(len(row), dtype=bool)
    keep[order[remove_sorted]] = False
    return keep


@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 0.97])
def test_top_p_on_a_large_vocabulary_equals_the_whole_vocabulary_rule(top_p):
    # Above 1024 tokens top-p first decides among the likeliest 256 (and falls back when the nucleus may reach past).
    rng = np.random.default_rng(5)
    for scale in (0.3, 1.0, 3.0, 6.0):
        row = rng.standard_normal(4096) * scale
        got = torch.isfinite(keep_top_p(None, torch.tensor(row[None, :]), top_p))[0].numpy()
        assert np.array_equal(got, _top_p_reference(row, top_p)), (scale, top_p)
    rows = np.stack([rng.standard_normal(4096) * 6.0, rng.standard_normal(4096) * 0.3])
    got = torch.isfinite(keep_top_p(None, torch.tensor(rows), 0.5)).numpy()
    for r in range(2):
        assert np.array_equal(got[r], _top_p_reference(rows[r], 0.5)), r


def test_logit_bias_takes_every_id_of_the_vocabulary_and_names_the_first_outside():
    from playground.config.errors import ConfigError
    from playground.engine.samplers.logit_bias import resolve_logit_bias

    assert resolve_logit_bias(("0=+1.5", "9=-inf"), None, 10) == (((0,), 1.5), ((9,), NEG_INF))
    with pytest.raises(ConfigError, match=r"^logit bias 10: token 10 is outside the vocabulary \(0-9\)$"):
        resolve_logit_bias(("10=+1",), None, 10)
    with pytest.raises(ConfigError, match=r"this strategy cannot read words"):
        resolve_logit_bias((" hello=+1",), None, 10)


def test_top_p_fast_path_decides_peaked_rows_among_the_top_and_removes_at_exactly_one_minus_p():
    from playground.engine.samplers.top_p import _top_p_among_top

    rng = np.random.default_rng(8)
    rows = np.stack([rng.standard_normal(4096) * 6.0, rng.standard_normal(4096) * 5.0])
    for top_p in (0.3, 0.8):
        kept = _top_p_among_top(torch.tensor(rows), top_p, 1)
        assert kept is not None, top_p  # peaked rows: decided among the likeliest 256, no full sort
        for r in range(2):
            assert np.array_equal(torch.isfinite(kept[r]).numpy(), _top_p_reference(rows[r], top_p)), (r, top_p)
    # p = 1/2, 1/4, 1/4 and top_p 0.75: the first quarter in ascending order has cumulative mass exactly 1 − top_p,
    # which transformers removes (cumulative <= 1 − top_p)
    kept = torch.isfinite(keep_top_p(None, torch.log(torch.tensor([[2.0, 1.0, 1.0]])), 0.75))[0]
    assert bool(kept[0]) and int(kept.sum()) == 2


def test_a_token_bias_and_a_word_ending_in_that_token_add_up():
    from playground.engine.samplers.logit_bias import apply_sequence_bias

    logits = torch.zeros(2, 8)
    ids = torch.tensor([[1, 3], [1, 4]])  # the first row ends with the word's prefix (3), the second does not
    out = apply_sequence_bias(ids, logits, (((5,), 1.0), ((3, 5), 2.0), ((6,), -1.0)))
    assert out[0].tolist() == [0, 0, 0, 0, 0, 3.0, -1.0, 0]
    assert out[1].tolist() == [0, 0, 0, 0, 0, 1.0, -1.0, 0]
    out = apply_sequence_bias(ids, logits, (((3, 5), 2.0), ((5,), 1.0)))  # the word first: still a sum
    assert out[0, 5] == 3.0 and out[1, 5] == 1.0


def test_logit_bias_checks_ids_against_the_vocabulary_it_is_given_or_the_tokenizers():
    from playground.config import RunSettings
    from playground.config.errors import ConfigError
    from playground.engine.samplers import BuildContext

    build = ENGINE_SAMPLERS["logit_bias"].build
    with pytest.raises(ConfigError, match=r"token 10 is outside the vocabulary \(0-9\)"):
        build(RunSettings(logit_bias=("10=+1",)), BuildContext(vocab_size=10))

    class Tokenizer:
        def __len__(self) -> int:
            return 12

    with pytest.raises(ConfigError, match=r"token 12 is outside the vocabulary \(0-11\)"):
        build(RunSettings(logit_bias=("12=+1",)), BuildContext(tokenizer=Tokenizer()))
    # neither (a remote strategy): any id a server could have is taken
    sampler = build(RunSettings(logit_bias=("100000=+1",)), BuildContext())
    assert sampler.name == "logit_bias"


def test_typical_with_all_of_the_mass_keeps_every_token_when_the_float_sum_falls_short_of_one():
    logits = torch.randn(1, 700, generator=torch.Generator().manual_seed(2))  # its sorted float32 sum: 1 - 6e-8
    assert torch.isfinite(keep_typical(None, logits, 1.0)).all()


def test_typical_fast_path_on_a_batch_of_peaked_rows_cuts_each_as_alone():
    rows = _large_rows()
    batch = torch.tensor(np.stack([rows[3], rows[3][::-1].copy() * 0.9]))
    for mass in (0.05, 0.2):
        got = torch.isfinite(keep_typical(None, batch, mass)).numpy()
        for r in range(2):
            assert np.array_equal(got[r], _typical_reference(batch[r].numpy(), mass)), (r, mass)


def test_xtc_counts_the_tokens_above_the_threshold_per_row():
    logits = torch.log(torch.tensor([[0.45, 0.35, 0.2], [0.6, 0.25, 0.15]]))  # two above 0.3, then one
    assert torch.isfinite(exclude_top_choices(None, logits, 0.3)).tolist() == [[False, True, True], [True, True, True]]


def test_dry_built_from_the_settings_reads_its_breakers_through_the_tokenizer():
    from playground.config import RunSettings
    from playground.config.errors import ConfigError
    from playground.engine.samplers import BuildContext

    class Tokenizer:  # ten tokens; 9 is a newline
        def __len__(self) -> int:
            return 10

        def batch_decode(self, ids):
            return ["\n" if i == 9 else chr(ord("a") + i) for (i,) in ids]

    settings = RunSettings(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=1, dry_sequence_breakers=(r"\n",))
    sampler = ENGINE_SAMPLERS["dry"].build(settings, BuildContext(tokenizer=Tokenizer()))
    ids = torch.tensor([[9, 1, 2, 5, 9, 1, 2]])  # "… 1 2" was followed by 5; the match stops at the newline: 2 long
    out = sampler.apply(ids, torch.zeros(1, 10))
    assert out[0].tolist() == [0.0] * 5 + [-(1.0 * 2.0 ** (2 - 1))] + [0.0] * 4
    with pytest.raises(ConfigError, match=r"^DRY's sequence breakers are words, which the sample strategy cannot"):
        ENGINE_SAMPLERS["dry"].build(settings.replace(strategy="sample"), BuildContext())


# ---- round 4: top-p's safety margin, the compact set's dtype, guidance's and logit bias's messages --------------

def test_top_p_on_a_large_vocabulary_keeps_the_tail_token_that_reaches_past_one_minus_p():
    """2048 tokens: the likeliest 256 hold 0.89995, the 1792 others 0.10005, just above 1 − top_p = 0.1. Over the
    whole vocabulary the largest of those (2e-4) then has cumulative mass 0.10005 > 0.1 and stays; the fast path
    among the likeliest 256 would drop it, so a tail within the safety margin of 1 − p (or above) goes to the full
    sort."""
    p = np.empty(2048)
    p[:256] = np.linspace(1.2, 0.8, 256) * (0.89995 / 256) / np.linspace(1.2, 0.8, 256).mean()
    p[256] = 2e-4
    p[257:] = (0.10005 - 2e-4) / 1791
    row = np.log(p)
    assert p[:256].min() > p[256] > p[257], "precondition: the 256 likeliest are the first"
    got = torch.isfinite(keep_top_p(None, torch.tensor(row[None, :]), 0.9))[0].numpy()
    assert np.array_equal(got, _top_p_reference(row, 0.9))
    assert got[:257].all() and not got[257:].any()


def test_the_compact_set_spread_over_the_vocabulary_keeps_the_values_dtype():
    from playground.engine.samplers.chain import CompactLogits, Kept

    values = torch.tensor([[0.25, -1.5]], dtype=torch.float64)
    full = CompactLogits(Kept.of(torch.tensor([1, 3]), 5), values).full()
    assert full.dtype == torch.float64
    assert full.tolist() == [[NEG_INF, 0.25, NEG_INF, -1.5, NEG_INF]]


def test_guidance_run_by_a_strategy_without_the_negative_prompts_pass_says_so():
    from types import SimpleNamespace

    from playground.engine.samplers.guidance import Guidance

    guidance = Guidance(1.5, SimpleNamespace(negative_logits=None))
    with pytest.raises(AssertionError, match=r"^the strategy runs the negative prompt before the pipeline$"):
        guidance.apply(torch.zeros(1, 2, dtype=torch.long), torch.zeros(1, 4))


def _bos_tokenizer():
    """A word-level tokenizer whose post-processor puts a BOS token before every text it encodes with special
    tokens (as Llama's and Gemma's do); the tiny models' BPE tokenizer adds none."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.WordLevel({"<s>": 0, "hello": 1, "world": 2, "[UNK]": 3}, unk_token="[UNK]"))
    core.pre_tokenizer = pre_tokenizers.Whitespace()
    core.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=core, bos_token="<s>", unk_token="[UNK]")


def test_logit_bias_on_a_word_biases_its_own_tokens_not_the_tokenizers_bos():
    from playground.engine.samplers.logit_bias import resolve_logit_bias

    tokenizer = _bos_tokenizer()
    assert tokenizer.encode("hello world") == [0, 1, 2], "precondition: encoding adds a BOS by default"
    assert resolve_logit_bias(("hello=+2", "hello world=-1"), tokenizer, 4) == (((1,), 2.0), ((1, 2), -1.0))


def test_logit_bias_on_a_word_of_no_tokens_says_so():
    from playground.config.errors import ConfigError
    from playground.engine.samplers.logit_bias import resolve_logit_bias

    class Tokenizer:  # every word encodes to nothing (a tokenizer that drops what it cannot read)
        def encode(self, text, add_special_tokens=True):
            return []

    with pytest.raises(ConfigError, match=r"^logit bias 'hello': the word is no token at all$"):
        resolve_logit_bias(("hello=+1",), Tokenizer(), 10)
