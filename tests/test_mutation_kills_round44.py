"""Tests written to kill the survivors of round 44's mutation run over DoLa (playground/engine/contrastive/dola.py)
and SuffixDecoding's drafter (playground/engine/speculative/suffix.py), issue 28, point 4. Each test names the bug
it catches; the references are written out here (4.46's float32 filter, the weighted trie by hand)."""

from __future__ import annotations

import math

import torch

from playground.engine.contrastive.dola import DolaAmateur
from playground.engine.layers.lens import LayerStack

# --- dola.py: which contrast each variant runs ----------------------------------------------------------------


def test_a_token_at_the_cut_is_kept_by_the_reference_as_4_46_keeps_it_and_dropped_by_the_formula(tiny_lm):
    """The two variants' plausible sets differ only where a token lies on the cut: 4.46's relative-top filter
    compares float32 log-probabilities with max + log α, the formula compares p / max p with α in float64. A logit
    of exactly top + log α (as float32 writes it) is kept by the first and not by the second; a variant running the
    other's contrast (``variant != "reference"``) is seen here."""
    alpha = 0.5
    logits = torch.tensor([0.0, math.log(alpha), -1.0, -2.0])  # token 1: the cut itself
    premature = torch.tensor([0.3, -0.2, 0.1, 0.0])
    lf = logits.log_softmax(-1)  # float32, as 4.46 computes it
    by_4_46 = ~(lf < lf.max() + math.log(alpha))
    ratio = (lf.double() - lf.double().max()).exp()
    by_formula = ratio >= alpha
    assert by_4_46.tolist() == [True, True, False, False] and by_formula.tolist() == [True, False, False, False]
    stack = LayerStack.of(tiny_lm.model)
    for variant, expected in (("reference", by_4_46), ("formula", by_formula)):
        contrast = DolaAmateur(stack, (0, 1), variant).contrast(logits, premature, alpha, 1.0)
        assert contrast.plausible.tolist() == expected.tolist(), variant
        scores = torch.where(expected, lf - premature.log_softmax(-1), torch.tensor(-math.inf))
        torch.testing.assert_close(contrast.scores, scores, atol=1e-6, rtol=0)
