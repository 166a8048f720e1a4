"""Each sampler against its reference: transformers' processors where they exist (equal on random logits), the
papers' and llama.cpp's definitions otherwise (hand-built logits with the exact kept sets and values), and sampled
frequencies against the processed distribution (chi-square, fixed seeds, small vocabulary)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    EpsilonLogitsWarper,
    EtaLogitsWarper,
    SequenceBiasLogitsProcessor,
    TypicalLogitsWarper,
    UnbatchedClassifierFreeGuidanceLogitsProcessor,
)

from playground.config import RunSettings
from playground.engine.processors import SamplerRun, build_pipeline, run_pipeline
from playground.engine.samplers import (
    MirostatState,
    apply_dry,
    apply_dynamic_temperature,
    apply_presence_frequency_penalties,
    apply_sequence_bias,
    combine_guidance,
    exclude_top_choices,
    keep_above_epsilon,
    keep_above_eta,
    keep_top_n_sigma,
    keep_typical,
    truncate_by_surprise,
)
from playground.engine.sampling import sample_next_token

VOCAB = 64
NEG_INF = float("-inf")


def random_case(seed: int, batch: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, VOCAB, generator=generator) * 3
    ids = torch.randint(0, 8, (batch, 20), generator=generator)
    return ids, logits


REFERENCES = [
    ("typical_p=0.9", lambda i, x: keep_typical(i, x, 0.9), TypicalLogitsWarper(mass=0.9)),
    ("typical_p=0.3", lambda i, x: keep_typical(i, x, 0.3), TypicalLogitsWarper(mass=0.3)),
    ("typical_p=0.5,min_keep=3", lambda i, x: keep_typical(i, x, 0.5, min_keep=3),
     TypicalLogitsWarper(mass=0.5, min_tokens_to_keep=3)),
    ("epsilon=0.01", lambda i, x: keep_above_epsilon(i, x, 0.01), EpsilonLogitsWarper(0.01)),
    ("epsilon=0.2", lambda i, x: keep_above_epsilon(i, x, 0.2), EpsilonLogitsWarper(0.2)),
    ("epsilon=0.9,min_keep=2", lambda i, x: keep_above_epsilon(i, x, 0.9, min_keep=2),
     EpsilonLogitsWarper(0.9, min_tokens_to_keep=2)),
    ("eta=0.01", lambda i, x: keep_above_eta(i, x, 0.01), EtaLogitsWarper(0.01)),
    ("eta=0.1", lambda i, x: keep_above_eta(i, x, 0.1), EtaLogitsWarper(0.1)),
    ("sequence_bias", lambda i, x: apply_sequence_bias(i, x, (((3,), -2.0), ((5, 6), 4.0), ((1, 2, 7), NEG_INF))),
     SequenceBiasLogitsProcessor([[[3], -2.0], [[5, 6], 4.0], [[1, 2, 7], NEG_INF]])),
]


@pytest.mark.parametrize(("ours", "reference"), [r[1:] for r in REFERENCES], ids=[r[0] for r in REFERENCES])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_sampler_equals_transformers_processor(ours, reference, seed):
    ids, logits = random_case(seed)
    ids[0, -2:] = torch.tensor([1, 2])  # so the 3-token sequence bias matches a row
    ids[1, -1] = 5  # and the 2-token one another
    before = logits.clone()
    expected = reference(ids, logits.clone())
    got = ours(ids, logits)
    assert torch.equal(logits, before), "the sampler modified its input"
    assert torch.equal(torch.isinf(got), torch.isinf(expected))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("top_k", [150, 900, 0])
def test_top_p_and_typical_on_a_real_sized_vocabulary_equal_transformers(top_k):
    """Past 1024 (4096) tokens top-p (typical) first decide among the likeliest ones; the result is the same."""
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    from playground.engine.processors import keep_top_p

    generator = torch.Generator().manual_seed(top_k)
    logits = torch.randn(1, 8192, generator=generator) * 4
    logits[0, :5] += 12  # a peaked head, as a model's
    if top_k:
        logits = TopKLogitsWarper(top_k)(None, logits)
    for p in (0.5, 0.9, 0.99):
        assert torch.equal(keep_top_p(None, logits, p), TopPLogitsWarper(p)(None, logits.clone()))
        ours, theirs = torch.isfinite(keep_typical(None, logits, p)), torch.isfinite(TypicalLogitsWarper(p)(None,
                                                                                                      logits.clone()))
        # transformers re-normalises the logits in the ranked order: at a mass boundary within float rounding
        # (p = 0.99 on the flat one here) one token may fall on either side.
        assert int((ours ^ theirs).sum()) <= (1 if p == 0.99 else 0), (p, int(ours.sum()), int(theirs.sum()))


def test_guidance_equals_transformers_unbatched_cfg_on_random_logits():
    ids, logits = random_case(3, batch=1)
    negative = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(9)) * 2

    class Negative:  # the reference's model: its "forward" returns the negative prompt's logits
        def __call__(self, input_ids, **kwargs):
            return {"logits": negative[:, None, :], "cache": None}

    class Output(dict):
        __getattr__ = dict.__getitem__

    reference = UnbatchedClassifierFreeGuidanceLogitsProcessor(1.8, lambda *a, **k: Output(Negative()(*a, **k)))
    expected = reference(ids, logits.clone())
    torch.testing.assert_close(combine_guidance(logits, negative, 1.8), expected, rtol=0, atol=1e-6)


# ---- hand-built logits: exact kept sets and values ---------------------------------------------------------------

def test_presence_and_frequency_penalties_are_openais_formula():
    ids = torch.tensor([[2, 2, 2, 4, 0]])  # token 2 three times, 4 and 0 once; 1 and 3 never
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]])
    got = apply_presence_frequency_penalties(ids, logits, presence=0.5, frequency=0.25)
    assert got.tolist() == [[1.0 - 0.25 - 0.5, 2.0, 3.0 - 0.75 - 0.5, 4.0, 5.0 - 0.25 - 0.5]]


def test_dry_penalises_exactly_the_token_that_extends_a_repeat():
    # "a b c d ... a b c" -> "d" would extend a 3-token repeat; allowed length 2: penalty 0.8 * 1.75^(3 - 2).
    a, b, c, d, x, y = 10, 11, 12, 13, 14, 15
    ids = torch.tensor([[a, b, c, d, x, y, a, b, c]])
    got = apply_dry(ids, torch.zeros(1, 20), multiplier=0.8, base=1.75, allowed_length=2, breakers=frozenset())
    expected = torch.zeros(1, 20)
    expected[0, d] = -0.8 * 1.75
    assert torch.equal(got, expected)
    # A repeat of 2 (allowed 3) is not penalised; nor is one that crosses a breaker (b), nor a breaker itself (d).
    assert torch.equal(apply_dry(ids, torch.zeros(1, 20), 0.8, 1.75, 4, frozenset()), torch.zeros(1, 20))
    crossed = apply_dry(ids, torch.zeros(1, 20), 0.8, 1.75, 2, frozenset({b}))
    assert torch.equal(crossed, torch.zeros(1, 20))  # c's match stops at b: length 1 < 2
    assert torch.equal(apply_dry(ids, torch.zeros(1, 20), 0.8, 1.75, 2, frozenset({d})), torch.zeros(1, 20))


def test_dry_takes_the_longest_repeat_for_a_token_and_matches_text_generation_webuis_example():
    # "a b c a b c a b": the text ends with "a b c a b", which also starts at the second "a b" position's left,
    # so c extends a repeat of 5 (a b c a b), not only of 2: the longest one counts.
    a, b, c = 1, 2, 3
    ids = torch.tensor([[a, b, c, a, b, c, a, b]])
    got = apply_dry(ids, torch.zeros(1, 8), multiplier=1.0, base=2.0, allowed_length=2, breakers=frozenset())
    expected = torch.zeros(1, 8)
    expected[0, c] = -(2.0 ** (5 - 2))
    assert torch.equal(got, expected)


def test_top_n_sigma_keeps_logits_within_n_standard_deviations_of_the_top():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, NEG_INF]])  # finite: mean 2, population σ √2
    sigma = math.sqrt(2.0)
    got = keep_top_n_sigma(None, logits, 1.0)  # keep >= 4 − 1.41: 4 and 3
    assert torch.isfinite(got).tolist() == [[True, True, False, False, False, False]]
    assert got[0, :2].tolist() == [4.0, 3.0]
    got = keep_top_n_sigma(None, logits, 2.5 / sigma)  # keep >= 1.5: 4, 3, 2
    assert torch.isfinite(got).tolist() == [[True, True, True, False, False, False]]
    # σ is the population's (llama.cpp): with n = 1.35 the floor is 4 − 1.91 = 2.09; the sample σ (√2.5) would
    # put it at 1.87 and keep 2 as well.
    got = keep_top_n_sigma(None, logits, 1.35)
    assert torch.isfinite(got).tolist() == [[True, True, False, False, False, False]]


def test_xtc_removes_the_top_choices_but_the_least_likely_of_them():
    probs = torch.tensor([[0.4, 0.3, 0.15, 0.1, 0.05]])
    logits = probs.log()
    got = exclude_top_choices(None, logits, 0.15)  # 0.4, 0.3, 0.15 are >= 0.15: only 0.15 stays of them
    assert torch.isfinite(got).tolist() == [[False, False, True, True, True]]
    torch.testing.assert_close(got[0, 2:], logits[0, 2:], rtol=0, atol=0)
    # One token above the threshold: nothing is removed.
    assert torch.equal(exclude_top_choices(None, logits, 0.35), logits)


def test_mirostat_cuts_by_surprise_and_moves_mu_toward_tau():
    probs = torch.tensor([[0.5, 0.25, 0.125, 0.125]])  # surprises 1, 2, 3, 3 bits
    got = truncate_by_surprise(None, probs.log(), mu=2.5)
    assert torch.isfinite(got).tolist() == [[True, True, False, False]]
    assert torch.isfinite(truncate_by_surprise(None, probs.log(), mu=0.1)).tolist() == [[True, False, False, False]]
    state = MirostatState.start(tau=3.0, eta=0.1)
    assert state.mu == 6.0
    state.update(0.25)  # surprise 2: mu -= 0.1 * (2 - 3)
    assert state.mu == pytest.approx(6.1)
    state.update(0.0)  # a forced token the chain had removed teaches nothing
    assert state.mu == pytest.approx(6.1)


def test_dynamic_temperature_follows_the_normalised_entropy():
    logits = torch.tensor([[2.0, 1.0, 0.0, NEG_INF]])  # three tokens in play
    probs = logits[0, :3].softmax(dim=-1)
    normalised = float(-(probs * probs.log()).sum()) / math.log(3)
    temp = max(0.0, 0.8 - 0.5) + (0.8 + 0.5 - max(0.0, 0.8 - 0.5)) * normalised ** 2.0
    got = apply_dynamic_temperature(None, logits, 0.8, 0.5, 2.0)
    torch.testing.assert_close(got[0, :3], logits[0, :3] / temp)
    assert got[0, 3] == NEG_INF
    # A uniform distribution gets the top of the range; one token left is left alone.
    flat = torch.zeros(1, 4)
    torch.testing.assert_close(apply_dynamic_temperature(None, flat + 1.0, 1.0, 0.5, 1.0), (flat + 1.0) / 1.5)
    one = torch.tensor([[3.0, NEG_INF]])
    assert torch.equal(apply_dynamic_temperature(None, one, 1.0, 0.5, 1.0), one)


def test_logit_bias_words_and_ids_resolve_through_the_tokenizer(tiny_lm):
    tokenizer = tiny_lm.tokenizer
    word = tokenizer.encode(" hello", add_special_tokens=False)
    settings = RunSettings(logit_bias=(" hello=-inf", "7=+2.5"))
    (bias,) = build_pipeline(settings, sampling=False, tokenizer=tokenizer, vocab_size=tiny_lm.model.config.vocab_size)
    logits = torch.zeros(1, tiny_lm.model.config.vocab_size)
    ids = torch.tensor([word[:-1] or [0]])
    out = bias.apply(ids, logits)
    assert out[0, 7] == 2.5 and out[0, word[-1]] == NEG_INF
    assert int(torch.isinf(out).sum()) == 1


# ---- the chain: order, greedy, refusals --------------------------------------------------------------------------

def test_the_users_order_is_the_order_applied():
    settings = RunSettings(strategy="sample", samplers="top_k;temperature;min_p", top_k=3, temperature=0.5,
                           min_p=0.3)
    pipeline = build_pipeline(settings, sampling=True)
    assert [t.name for t in pipeline] == ["top_k", "temperature", "min_p"]
    ids, logits = random_case(4, batch=1)
    from playground.engine.processors import apply_temperature, keep_min_p, keep_top_k
    expected = keep_min_p(ids, apply_temperature(ids, keep_top_k(ids, logits, 3), 0.5), 0.3)
    assert torch.equal(run_pipeline(pipeline, ids, logits), expected)
    # The other order gives another distribution (min-p before temperature keeps a different set).
    swapped = build_pipeline(settings.replace(samplers="min_p;temperature;top_k"), sampling=True)
    assert [t.name for t in swapped] == ["min_p", "temperature", "top_k"]


def test_greedy_keeps_the_penalties_and_drops_the_sampling_only_samplers():
    settings = RunSettings(presence_penalty=0.5, dry_multiplier=0.8, logit_bias=("3=-inf",), typical_p=0.5,
                           epsilon_cutoff=0.01, eta_cutoff=0.01, top_n_sigma=1.0, xtc_probability=0.5, mirostat=2,
                           dynatemp_range=0.5)
    greedy = [t.name for t in build_pipeline(settings, sampling=False, tokenizer=_Breakers(), run=None)]
    assert greedy == ["logit_bias", "penalties", "dry"]
    run = SamplerRun.of(settings, torch.Generator().manual_seed(0), sampling=True)
    sampled = [t.name for t in build_pipeline(settings, sampling=True, tokenizer=_Breakers(), run=run)]
    assert sampled == ["logit_bias", "penalties", "dry", "dynatemp", "typical_p", "epsilon_cutoff", "eta_cutoff",
                       "top_n_sigma", "xtc", "mirostat"]


class _Breakers:
    """A four-token vocabulary for DRY's breakers."""

    def __len__(self):
        return 4

    def batch_decode(self, ids):
        return ["a", "\n", "b:", "c"]


@pytest.mark.parametrize(("values", "name"), [
    ({"xtc_probability": 0.5}, "xtc"), ({"mirostat": 2}, "mirostat"), ({"guidance_scale": 2.0}, "guidance")])
def test_a_strategy_that_cannot_carry_a_stateful_sampler_refuses_it_by_name(tiny_lm, values, name):
    from playground.config import ConfigError
    from playground.engine.strategies import run_strategy

    settings = RunSettings.from_flat(strategy="speculative", do_sample=True, prompt="Hello", max_new_tokens=4,
                                     **values)
    with pytest.raises(ConfigError, match=f"^{name} is not available with the speculative strategy"):
        list(run_strategy(tiny_lm, settings))


def test_dry_breakers_are_every_token_whose_text_holds_one():
    from playground.engine.samplers import breaker_token_ids

    assert breaker_token_ids(("\\n", ":"), _Breakers()) == frozenset({1, 2})


# ---- sampled frequencies against the processed distribution ------------------------------------------------------

def chi_square(counts: list[int], expected: list[float]) -> float:
    return sum((c - e) ** 2 / e for c, e in zip(counts, expected, strict=True) if e > 0)


# The 0.999 quantile of the chi-square distribution with k degrees of freedom (k = 1..7).
CHI2_999 = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32}


def test_xtc_fires_with_its_probability_and_sampling_draws_from_the_processed_distribution():
    """With XTC at probability 0.4 the token is drawn from the mixture 0.4 · (XTC's cut) + 0.6 · (uncut),
    computed here by hand; 6000 seeded draws through the chain agree with it."""
    probs = [0.35, 0.25, 0.2, 0.1, 0.06, 0.04]
    logits = torch.tensor([probs]).log()
    settings = RunSettings(strategy="sample", xtc_probability=0.4, xtc_threshold=0.2)
    run = SamplerRun.of(settings, torch.Generator().manual_seed(7), sampling=True)
    pipeline = build_pipeline(settings, sampling=True, run=run)
    counts = [0] * 6
    draws = 6000
    for _ in range(draws):
        processed = run_pipeline(pipeline, torch.zeros(1, 1, dtype=torch.long), logits).softmax(dim=-1)
        counts[sample_next_token(processed, run.generator)] += 1
    cut_mass = sum(probs[2:])  # 0.35 and 0.25 are removed, 0.2 (the least of the three above 0.2) stays
    mixture = [0.6 * p + (0.4 * p / cut_mass if i >= 2 else 0.0) for i, p in enumerate(probs)]
    statistic = chi_square(counts, [m * draws for m in mixture])
    assert statistic < CHI2_999[5], (counts, statistic)
    # Planted-bug guard: always firing (or never) is far outside.
    always = [p / cut_mass if i >= 2 else 0.0 for i, p in enumerate(probs)]
    assert chi_square(counts, [max(a, 1e-9) * draws for a in always]) > 100


@pytest.mark.parametrize(("values", "expected"), [
    ({"typical_p": 0.5}, None), ({"top_n_sigma": 1.0}, None), ({"epsilon_cutoff": 0.08}, None),
    ({"dynatemp_range": 0.6, "temperature": 0.9}, None)])
def test_sampled_frequencies_follow_the_processed_distribution(values, expected):
    """Draws through the run's chain against the distribution its definition gives (computed independently)."""
    probs = torch.tensor([0.3, 0.22, 0.18, 0.12, 0.1, 0.05, 0.03])
    logits = probs.log()[None]
    name = next(iter(values))
    if name == "typical_p":  # entropy H; keep the tokens closest to H in surprise until mass > 0.5
        entropy = float(-(probs * probs.log()).sum())
        order = sorted(range(7), key=lambda i: abs(-math.log(probs[i]) - entropy))
        kept, mass = [], 0.0
        for i in order:
            kept.append(i)
            mass += float(probs[i])
            if mass >= 0.5:
                break
        target = [float(probs[i]) if i in kept else 0.0 for i in range(7)]
    elif name == "top_n_sigma":
        values_ = probs.log()
        floor = float(values_.max() - values_.std(unbiased=False))
        target = [float(p) if float(v) >= floor else 0.0 for p, v in zip(probs, values_, strict=True)]
    elif name == "epsilon_cutoff":
        target = [float(p) if p >= 0.08 else 0.0 for p in probs]
    else:  # dynamic temperature in [0.3, 1.5] by the normalised entropy
        entropy = float(-(probs * probs.log()).sum()) / math.log(7)
        temp = 0.3 + 1.2 * entropy
        target = (probs.log() / temp).softmax(dim=-1).tolist()
    total = sum(target)
    target = [t / total for t in target]
    settings = RunSettings(strategy="sample", **values)
    run = SamplerRun.of(settings, torch.Generator().manual_seed(3), sampling=True)
    processed = run_pipeline(build_pipeline(settings, sampling=True, run=run), torch.zeros(1, 1, dtype=torch.long),
                             logits).softmax(dim=-1)
    draws = 5000
    counts = torch.bincount(torch.multinomial(processed[0], draws, replacement=True, generator=run.generator),
                            minlength=7).tolist()
    kept = [t for t in target if t > 0]
    statistic = chi_square(counts, [t * draws for t in target])
    assert all(c == 0 for c, t in zip(counts, target, strict=True) if t == 0), (counts, target)
    assert statistic < CHI2_999[max(len(kept) - 1, 1)], (counts, target, statistic)


@pytest.mark.parametrize("strategy", [dict(strategy="beam", num_beams=2), dict(strategy="early-exit"),
                                      dict(strategy="layer-skip", skip_layers="1")])
def test_beam_and_the_layer_strategies_refuse_a_sampler_before_their_first_event(tiny_lm, strategy):
    """Their pipeline is built when the run is asked for, as greedy's is: the refusal comes from the call itself,
    not from the stream after RunStarted."""
    from playground.config import ConfigError
    from playground.engine.strategies import run_strategy

    settings = RunSettings.from_flat(prompt="Hello", max_new_tokens=3, guidance_scale=2.0, **strategy)
    with pytest.raises(ConfigError, match=f"^guidance is not available with the {strategy['strategy']} strategy"):
        run_strategy(tiny_lm, settings)  # not iterated: no event has been made
    assert list(run_strategy(tiny_lm, settings.replace(guidance_scale=1.0)))  # precondition: it runs without it
