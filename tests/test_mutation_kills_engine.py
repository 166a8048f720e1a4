"""Engine modules where mutation testing (issue 28, point 4; round 4's run, notes/mutation_table_round4.md) found no
test looking: DoLa's contrast and its amateur (``engine/contrastive/dola.py``), the n-gram ban, the grammar
constraint, banned strings and the run context. Each test names what it pins down and fails on the survivors listed
with it in the table; the references are written here (log-softmaxes in float64, sets by hand)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from playground.config import ConfigError
from playground.engine.contrastive.dola import DolaAmateur, reference_contrast, relative_top_filter
from playground.engine.layers.lens import LayerStack

NEG_INF = -math.inf


# ---- DoLa ----------------------------------------------------------------------------------------------------------

def test_the_reference_contrast_divides_the_premature_logits_by_the_amateur_temperature_and_cuts_at_alpha():
    """The reference variant at α = 0.25 and amateur temperature 2: kept = {log p_N ≥ max log p_N + log α}, the
    score there log p_N − log softmax(premature / T), −∞ elsewhere; the cut is recorded."""
    g = torch.Generator().manual_seed(1)
    expert, premature = torch.randn(40, generator=g) * 2, torch.randn(40, generator=g) * 2
    alpha, temperature = 0.25, 2.0
    contrast = reference_contrast(expert, premature, alpha, temperature)
    expert_lp = expert.double().log_softmax(-1)
    amateur_lp = (premature.double() / temperature).log_softmax(-1)
    cut = float(expert_lp.max()) + math.log(alpha)
    keep = expert_lp >= cut
    assert 2 <= int(keep.sum()) < int((expert_lp >= float(expert_lp.max()) + math.log(0.1)).sum()), \
        "precondition: α = 0.25 keeps more than one token and fewer than 4.46's default 0.1"
    assert torch.equal(contrast.plausible, keep)
    torch.testing.assert_close(contrast.scores[keep].double(), (expert_lp - amateur_lp)[keep], atol=1e-5, rtol=0)
    assert bool((contrast.scores[~keep] == NEG_INF).all())
    assert math.isclose(contrast.cut_logprob, cut, abs_tol=1e-5)
    torch.testing.assert_close(contrast.amateur_logprobs.double(), amateur_lp, atol=1e-5, rtol=0)


def test_the_relative_top_filter_keeps_every_token_at_zero_and_defaults_to_a_tenth():
    """α = 0 (the setting's minimum) filters nothing and its threshold is −∞ (no log 0); without ``relative_top``
    the filter is 4.46's default 0.1."""
    g = torch.Generator().manual_seed(2)
    scores, baseline = torch.randn(2, 30, generator=g), torch.randn(2, 30, generator=g)
    final, base, threshold = relative_top_filter(scores.clone(), baseline.clone(), 0.0)
    assert torch.isfinite(final).all()
    torch.testing.assert_close(base, baseline.log_softmax(-1))
    assert bool((threshold == NEG_INF).all())
    tenth = relative_top_filter(scores.clone(), baseline.clone(), 0.1)
    assert all(1 < int(torch.isfinite(row).sum()) < 30 for row in tenth[0]), "precondition: 0.1 cuts some, not all"
    for default, given in zip(relative_top_filter(scores.clone(), baseline.clone()), tenth, strict=True):
        assert torch.equal(default, given)


def test_a_dola_amateur_is_the_reference_variant_by_default_describes_its_variant_and_refuses_another(tiny_lm):
    """The detail is the contrastive view's and the run's description of what ran."""
    stack = LayerStack.of(tiny_lm.model)
    amateur = DolaAmateur(stack, (0, 1))
    assert amateur.variant == "reference"
    assert amateur.detail == (
        "DoLa, reference variant (the authors' code, as transformers 4.46 ran it): per token, the layer of {0, 1} "
        f"(of {stack.count}) whose LM head on its un-normalised output differs most from the last layer by "
        "½[KL(M‖P) + KL(M‖Q)], then the relative-top filter")
    assert DolaAmateur(stack, (0, 1), "formula").detail == (
        f"DoLa, formula variant (the paper's text): per token, the layer of {{0, 1}} (of {stack.count}) whose logit "
        "lens (final norm + LM head) differs most from the last layer (Jensen-Shannon divergence ½[KL(P‖M) + "
        "KL(Q‖M)])")
    with pytest.raises(ConfigError, match=r"^dola_variant must be reference or formula \(got 'paper'\)$"):
        DolaAmateur(stack, (0, 1), "paper")


def test_a_dola_amateur_asked_without_the_experts_logits_or_pass_says_what_is_missing(tiny_lm):
    amateur = DolaAmateur(LayerStack.of(tiny_lm.model), (0, 1))
    ids = torch.tensor([[1, 2]])
    with pytest.raises(AssertionError, match=r"^DoLa compares with the expert's own logits$"):
        amateur.next_logits(ids, None)
    with pytest.raises(AssertionError, match=r"^the expert's pass did not reach layers \[0, 1\]$"):
        amateur.next_logits(ids, torch.zeros(amateur.stack.count))


def test_the_layer_taps_keep_the_newest_position_of_layers_called_by_keyword_that_return_tuples():
    """transformers 4.x's decoder layers (4.46 included) take ``hidden_states`` by keyword from some callers and
    return a tuple (hidden, attention, cache); 5.x's take it by position and return the tensor (the tiny models).
    Layer 0 is the first layer's input, layer j the output of layer j, each at the newest of three positions."""
    from types import SimpleNamespace

    from torch import nn

    class Layer(nn.Module):
        def forward(self, hidden_states=None):
            return hidden_states * 2 + 1, None

    layers = nn.ModuleList([Layer(), Layer()])
    amateur = DolaAmateur(SimpleNamespace(layers=layers, count=3), (0, 1, 2))
    x = torch.arange(12.0).reshape(1, 3, 4)
    with amateur.expert_pass():
        h = x
        for layer in layers:
            h = layer(hidden_states=h)[0]
    assert sorted(amateur.hidden) == [0, 1, 2]
    assert torch.equal(amateur.hidden[0], x[0, -1:])
    assert torch.equal(amateur.hidden[1], x[0, -1:] * 2 + 1)
    assert torch.equal(amateur.hidden[2], (x[0, -1:] * 2 + 1) * 2 + 1)
    assert not layers[0]._forward_pre_hooks and not layers[1]._forward_hooks  # the taps are gone after the pass


def test_dolas_repetition_penalty_divides_positive_scores_and_multiplies_negative_ones():
    from playground.engine.contrastive.dola import penalise_repeats

    scores = torch.tensor([2.0, -1.0, 4.0, 3.0])
    out = penalise_repeats(scores, torch.tensor([[0, 1, 1]]), 2.0)
    assert out.tolist() == [1.0, -2.0, 4.0, 3.0]
    assert scores.tolist() == [2.0, -1.0, 4.0, 3.0]  # a new tensor
    assert penalise_repeats(scores, torch.tensor([[0]]), 1.0) is scores


def test_dola_layer_lists_that_are_no_numbers_or_past_the_model_are_refused_by_name():
    from playground.engine.contrastive.dola import candidate_layers

    with pytest.raises(ConfigError, match=r"^dola_layers must be low, high or layer numbers such as 2,6,10 "
                                          r"\(got '2,x'\)$"):
        candidate_layers("2,x", 12, False)
    with pytest.raises(ConfigError, match=r"^dola_layers '0,2': each layer must be between 0 \(the embeddings\) "
                                          r"and 1 for this 2-layer model \(the last layer is the expert itself\)$"):
        candidate_layers("0,2", 2, False)


# ---- the n-gram ban ------------------------------------------------------------------------------------------------

def _transformers_ban(ids: torch.Tensor, logits: torch.Tensor, n: int) -> torch.Tensor:
    from transformers import NoRepeatNGramLogitsProcessor

    return NoRepeatNGramLogitsProcessor(n)(ids, logits.clone())


def _counting(sampler):
    """The sampler with its index's whole-text reading (``NgramBans.banned``) counted."""
    calls: list[int] = []
    banned = sampler.bans.banned

    def counted(rows):
        calls.append(len(rows))
        return banned(rows)

    sampler.bans.banned = counted
    return calls


def test_the_ngram_ban_continues_its_index_for_beams_that_extend_the_last_calls_texts():
    """Beams, each a text of the last call plus one token (two continuing the first, the second dropped), then a
    single text: every call bans exactly what transformers' processor does, and only the first reads the texts
    whole; the others match the texts to the last call's on the tensors and read their new tokens alone."""
    import random

    from playground.engine.samplers.no_repeat_ngram import NoRepeatNgram

    sampler = NoRepeatNgram(2)
    calls = _counting(sampler)
    rng = random.Random(0)
    rows = [[rng.randrange(6) for _ in range(8)] for _ in range(3)]
    for _ in range(4):
        ids, logits = torch.tensor(rows), torch.zeros(3, 6)
        assert torch.equal(sampler.apply(ids, logits), _transformers_ban(ids, logits, 2))
        rows = [rows[parent] + [rng.randrange(6)] for parent in (0, 0, 2)]
    assert calls == [3]
    # one text (a greedy or sampled run): the same, matched on the tensors without fingerprints
    sampler = NoRepeatNgram(2)
    calls = _counting(sampler)
    row = rows[0]
    for _ in range(3):
        ids, logits = torch.tensor([row]), torch.zeros(1, 6)
        assert torch.equal(sampler.apply(ids, logits), _transformers_ban(ids, logits, 2))
        row = [*row, rng.randrange(6)]
    assert calls == [1]


def test_the_ngram_ban_matches_beams_past_its_first_1024_fingerprint_weights():
    """Texts longer than the 1024 weights made first (a beam search past 1024 tokens): the weights grow with them."""
    from playground.engine.samplers.no_repeat_ngram import NoRepeatNgram

    g = torch.Generator().manual_seed(4)
    full = torch.randint(0, 40, (2, 1101), generator=g)
    sampler = NoRepeatNgram(3)
    calls = _counting(sampler)
    for width in (10, 11, 1100, 1101):
        ids, logits = full[:, :width], torch.zeros(2, 40)
        assert torch.equal(sampler.apply(ids, logits), _transformers_ban(ids, logits, 3)), width
    assert calls == [2]


def test_masking_banned_tokens_works_on_logits_of_any_layout():
    """A dense but non-contiguous batch (a transposed one) is masked as its contiguous copy would be."""
    from playground.engine.samplers.no_repeat_ngram import mask_banned

    logits = torch.arange(12.0).reshape(6, 2).t()  # [2, 6], strides (1, 2)
    assert not logits.is_contiguous()
    expected = logits.contiguous().clone()
    expected[0, 3] = expected[1, 1] = expected[1, 4] = NEG_INF
    assert torch.equal(mask_banned(logits, [{3}, {1, 4}]), expected)
    one = logits.contiguous().clone()
    one[1, 5] = NEG_INF
    assert torch.equal(mask_banned(logits, [set(), {5}]), one)


# ---- the grammar constraint ----------------------------------------------------------------------------------------
# A real llguidance matcher on the tiny models' real 320-token tokenizer, the Grammar built by its own build path
# (the engine's). Token ids come from the tokenizer; ``<|endoftext|>`` (id 0 here, as in SmolLM2) and ``<|im_end|>``
# are the model's end tokens, so the end token at id 0 also pins the lower bound of the vocabulary check.

INTEGER = json.dumps({"type": "integer"})  # accepts after one digit and can go on: accepting, never stopped
ONLY_AB = json.dumps({"enum": ["ab"]})  # stopped after '"ab"': nothing more can follow


def _grammar(tokenizer, eos_ids: tuple[int, ...], **group):
    from playground.config import RunSettings
    from playground.config.samplers.grammar import GrammarSettings
    from playground.engine.samplers.base import BuildContext
    from playground.engine.samplers.grammar import Grammar

    settings = RunSettings.from_flat(strategy="sample").with_group(GrammarSettings(**group))
    grammar = Grammar.build(settings, BuildContext(tokenizer=tokenizer, vocab_size=len(tokenizer), eos_ids=eos_ids,
                                                   strategy="sample"))
    assert isinstance(grammar, Grammar)
    return grammar


def _ends(tokenizer) -> tuple[int, int]:
    return tokenizer.convert_tokens_to_ids("<|endoftext|>"), tokenizer.convert_tokens_to_ids("<|im_end|>")


def _token(tokenizer, text: str) -> int:
    (token,) = tokenizer.encode(text)
    return token


def test_the_grammar_mask_is_padded_or_cut_to_logits_wider_or_narrower_than_the_vocabulary(tiny_lm):
    """A model whose logits have padding rows past its vocabulary (320 tokens, 322 logits): the rows past it are
    forbidden, in the mask applied and in the step's record; narrower logits take the mask's first columns. The
    allowed set is read from the tokenizer: the tokens whose text starts one of the choices."""
    tok = tiny_lm.tokenizer
    vocab = len(tok)
    choices = ("Paris", "water")
    grammar = _grammar(tok, _ends(tok), choices=(",".join(choices),))
    expected = torch.tensor([any(c.startswith(tok.decode([t])) for c in choices) and tok.decode([t]) != ""
                             for t in range(vocab)])
    assert 2 <= int(expected.sum()) < vocab
    wide = torch.isfinite(grammar.apply(None, torch.zeros(1, vocab + 2)))[0]
    assert torch.equal(wide, torch.cat([expected, torch.tensor([False, False])]))
    width = int(expected.nonzero()[0]) + 1  # the cut ends on the first allowed token
    assert torch.equal(torch.isfinite(grammar.apply(None, torch.zeros(1, width)))[0], expected[:width])
    probs = torch.softmax(torch.randn(1, vocab + 2, generator=torch.Generator().manual_seed(0)), -1)
    probs[0, vocab + 1] += 1.0  # the raw top token is a padding row
    probs /= probs.sum()
    padded = torch.cat([expected, torch.tensor([False, False])])
    removed = float(probs[0, ~padded].double().sum())
    record = grammar.step_record(probs, vocab + 1)
    assert record.allowed == int(expected.sum()) and record.top_forbidden
    assert math.isclose(record.removed_mass, removed, rel_tol=1e-5)
    allowed_top = int(expected.nonzero()[-1])
    record = grammar.step_record(probs.reshape(-1), allowed_top)  # a [vocab] distribution: the same
    assert record.allowed == int(expected.sum()) and not record.top_forbidden and record.ff_tokens == ()
    assert math.isclose(record.removed_mass, removed, rel_tol=1e-5)
    one_choice = _grammar(tok, _ends(tok), choices=("Paris",))  # fixes the next tokens: the choice's own
    assert one_choice.step_record(probs, allowed_top).ff_tokens == tuple(tok.encode("Paris"))


def test_a_grammars_twin_and_reset_keep_or_clear_why_it_broke(tiny_lm):
    tok = tiny_lm.tokenizer
    letter, other = _token(tok, "a"), _token(tok, "b")
    grammar = _grammar(tok, _ends(tok), json_schema=INTEGER)
    grammar.accept(letter, 0.5)  # not an integer's
    reason = f"token {letter} is not one the json schema allows here"
    twin = grammar.clone()
    assert twin.finished() == ("grammar_blocked", f"the constraint cannot follow: {reason}")
    grammar.accept(other, 0.5)  # a later (also forbidden) token leaves the first reason as it was
    assert grammar.broken == reason
    grammar.reset()
    grammar.accept(-1, 0.0)  # no token (nothing to follow)
    assert grammar.finished() is None and grammar.incomplete() == "the budget ended before the json schema was complete"
    done = _grammar(tok, _ends(tok), json_schema=ONLY_AB)
    for token in tok.encode('"ab"'):
        done.accept(token, 1.0)
    assert done.broken == "" and done.clone().finished() == ("grammar", "the json schema is complete: nothing more "
                                                                        "can follow")


def test_a_grammar_follows_the_tokens_it_allows_and_breaks_on_the_others_or_an_early_end(tiny_lm):
    """A digit is followed (the integer then accepts), and an end token where it accepts (id 0) leaves it whole; an
    end token before the grammar accepts, and a token past the vocabulary, break it; after a complete grammar the
    end token is nothing to consume, another token breaks it."""
    tok = tiny_lm.tokenizer
    endoftext, im_end = _ends(tok)
    assert endoftext == 0
    digit = _token(tok, "1")
    grammar = _grammar(tok, (endoftext, im_end), json_schema=INTEGER)
    assert grammar.incomplete() != ""
    grammar.accept(digit, 0.5)
    assert grammar.broken == "" and grammar.incomplete() == "" and grammar.finished() is None
    grammar.accept(endoftext, 0.5)
    assert grammar.broken == "" and grammar.finished() is None
    grammar = _grammar(tok, (endoftext, im_end), json_schema=INTEGER)
    grammar.accept(im_end, 0.5)
    assert grammar.broken == f"token {im_end} is not one the json schema allows here"
    grammar = _grammar(tok, (endoftext, im_end), json_schema=INTEGER)
    grammar.accept(len(tok), 0.5)
    assert grammar.broken == f"token {len(tok)} is not one the json schema allows here"
    done = _grammar(tok, (endoftext, im_end), json_schema=ONLY_AB)
    for token in tok.encode('"ab"'):
        done.accept(token, 1.0)
    done.accept(im_end, 0.9)
    assert done.broken == "" and done.finished() == ("grammar", "the json schema is complete: nothing more can "
                                                                "follow")
    done.accept(digit, 0.1)
    assert done.broken == f"token {digit} is not one the json schema allows here"


def test_a_token_the_matcher_refuses_breaks_the_grammar_with_the_matchers_first_error_line(tiny_lm):
    """A model that also ends on a text token ("1"): where the grammar allows that token as text, Grammar's mask
    allows every end token, and the matcher refuses ``<|im_end|>`` as the integer has no digit yet. The reason is the
    first line of the matcher's own (many-line) error, read here from a fresh matcher fed the same token. (A real
    matcher that refuses a token always says why, so the fallback message for an empty error is not reached here.)"""
    import llguidance

    from playground.config.samplers.grammar import GrammarSettings, check_constraint
    from playground.engine.samplers.grammar import ll_tokenizer

    tok = tiny_lm.tokenizer
    _, im_end = _ends(tok)
    ends = (im_end, _token(tok, "1"))
    grammar = _grammar(tok, ends, json_schema=INTEGER)
    assert bool(grammar.allowed().mask[im_end])
    grammar.accept(im_end, 0.5)
    fresh = llguidance.LLMatcher(ll_tokenizer(tok, len(tok), ends),
                                 check_constraint(GrammarSettings(json_schema=INTEGER)), log_level=0)
    assert not fresh.consume_token(im_end)
    lines = fresh.get_error().strip().splitlines()
    assert len(lines) > 1 and lines[0]
    assert grammar.finished() == ("grammar_blocked", f"the constraint cannot follow: {lines[0]}")
