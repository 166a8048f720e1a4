"""The logit lens's module-level functions (``engine/layers/lens.py``: ``lens_step``, ``layer_kls``, ``bfloat16_copy``,
``relative_update``) against references written here: the final norm and LM head applied by hand to each layer's
output, log-softmaxes, entropies (bits) and KLs in float64, and hand-built rows with exact binary fractions.
Each test names the planted bugs (mutmut survivors) it catches."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest
import torch
from support.tiny_models import build_tiny_lm

from playground.engine.layers import lens as lens_module
from playground.engine.layers.lens import LayerStack, bfloat16_copy, lens_step, relative_update
from playground.engine.layers.tuned import TunedLens

LAYERS = 4


@pytest.fixture(scope="module")
def lm():
    return build_tiny_lm(seed=7, layers=LAYERS)


@pytest.fixture
def stack(lm, monkeypatch, tmp_path) -> LayerStack:
    """The logit-lens stack of the tiny model, with no tuned lens (an empty user cache)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    built = LayerStack.of(lm.model)
    assert built.tuned is None and built.kind == "logit"
    return built


def layer_outputs(model) -> list[torch.Tensor]:
    """Each decoder layer's output [hidden] at the last position of a short prompt, before the final norm: the
    hidden states transformers hands back for the layers below the last, the final norm's input for the last."""
    seen: list[torch.Tensor] = []
    handle = model.model.norm.register_forward_hook(lambda _m, args, _out: seen.append(args[0][0, -1].clone()))
    try:
        with torch.no_grad():
            out = model(input_ids=torch.tensor([[3, 9, 14, 5, 22]]), output_hidden_states=True, use_cache=False)
    finally:
        handle.remove()
    return [h[0, -1].clone() for h in out.hidden_states[1:-1]] + seen


def random_translators(hidden: int, seed: int = 1) -> TunedLens:
    g = torch.Generator().manual_seed(seed)
    return TunedLens(0.3 * torch.randn(LAYERS - 1, hidden, hidden, generator=g),
                     0.3 * torch.randn(LAYERS - 1, hidden, generator=g))


def by_hand(model, h: torch.Tensor, translators: TunedLens | None = None, layer: int = 0) -> torch.Tensor:
    """[vocab] float64 log-probabilities of the lens on one layer output: h (translated as h + h Wᵀ + b for a layer
    below the last when ``translators``), the model's final norm, its LM head."""
    with torch.no_grad():
        if translators is not None and layer < LAYERS - 1:
            h = h + h @ translators.weights[layer].T + translators.biases[layer]
        return model.lm_head(model.model.norm(h)).double().log_softmax(-1)


def kl(p: torch.Tensor, q: torch.Tensor) -> float:
    """KL(p || q) in nats of two float64 log-probability rows."""
    return float((p.exp() * (p - q)).sum())


def bits(lp: torch.Tensor) -> float:
    return float(-(lp.exp() * lp).sum()) / math.log(2)


def text(t: int) -> str:
    return f"<{t}>"


# ------------------------------------------------------------------------------------------- lens_step


def test_every_layers_lens_equals_the_norm_and_head_by_hand(lm, stack):
    """No known rows: every layer in one batched product (lens_step_28: stacking the empty list of known rows).
    Entropies, top candidates and the logit-lens KLs against float64 references; no tuned lens → kl_tuned empty
    (layer_kls_25/28/29/30: the logit stack's KLs filed as tuned)."""
    outputs = layer_outputs(lm.model)
    ref = [by_hand(lm.model, h) for h in outputs]
    event = lens_step(stack, 3, outputs, [None] * LAYERS, 3, text)
    for i in range(LAYERS):
        assert event.layer_entropy[i] == pytest.approx(bits(ref[i]), abs=1e-4)
        top_p, top_ids = ref[i].exp().topk(3)
        assert [c.token_id for c in event.layer_top[i]] == top_ids.tolist()
        assert [c.prob for c in event.layer_top[i]] == pytest.approx(top_p.tolist(), abs=1e-5)
        assert [c.text for c in event.layer_top[i]] == [text(t) for t in top_ids.tolist()]
    assert event.kl_tuned == ()
    assert event.kl_logit[-1] == 0.0
    assert list(event.kl_logit) == pytest.approx([kl(ref[-1], r) for r in ref], abs=1e-5)
    assert event.forward_ms == 0.0  # lens_step_1: the default forward time is 0, not 1 ms
    assert event.lens_kind == "logit"


def test_the_exit_layer_answers_not_the_last_that_ran(stack):
    """lens_step_8 (the exit layer ignored: the last layer that ran answers): agreement is with the exit layer's
    top token. Hand rows: layer 2 (exit_layer=2, 1-based) puts token 0 first, layer 4 token 3."""
    rows = {i: torch.tensor(p).log() for i, p in enumerate([[0.25, 0.5, 0.125, 0.125], [0.5, 0.25, 0.125, 0.125],
                                                              [0.5, 0.125, 0.25, 0.125], [0.125, 0.125, 0.25, 0.5]])}
    outputs = [torch.zeros(8)] * LAYERS
    event = lens_step(stack, 0, outputs, [None] * LAYERS, 2, text, exit_layer=2, known=rows)
    assert event.agrees_with_final == (False, True, True, False)
    assert event.exit_layer == 2
    # entropies of the hand rows: 1.75 bits each (1/2·1 + 1/4·2 + 2·1/8·3)
    assert list(event.layer_entropy) == pytest.approx([1.75] * LAYERS, abs=1e-6)


def test_lens_ms_is_the_elapsed_time_in_milliseconds(stack, monkeypatch):
    """lens_step_112/113/114 (÷ 1000, + start, × 1001): a clock that reads 2.0 s, then 2.5 s → 500 ms exactly."""
    clock = iter([2.0, 2.5])
    monkeypatch.setattr(lens_module, "time", SimpleNamespace(perf_counter=lambda: next(clock)))
    rows = {i: torch.tensor([0.5, 0.5]).log() for i in range(LAYERS)}
    event = lens_step(stack, 0, [torch.zeros(8)] * LAYERS, [None] * LAYERS, 1, text, known=rows)
    assert event.lens_ms == 500.0


# ------------------------------------------------------------------------------------------- layer_kls


@pytest.mark.parametrize("kind", ["logit", "tuned"])
def test_both_lenses_kls_against_translators_applied_by_hand(lm, stack, kind):
    """With translators, each layer's KL under the logit lens and under the tuned lens, filed under the right name
    whichever is the stack's own: layer_kls_34/40/41/57 (the other lens computed untranslated: "logit" for both
    kinds, "XXtunedXX", no layers passed), layer_kls_83/86/87 (the pair swapped for the logit kind), and the last
    layer's other-lens KL 0.0 (layer_kls_50/52/53: None, set at the layer below, 1.0)."""
    translators = random_translators(lm.model.config.hidden_size)
    tuned_stack = dataclasses.replace(stack, kind=kind, tuned=translators)
    outputs = layer_outputs(lm.model)
    logit_ref = [by_hand(lm.model, h) for h in outputs]
    tuned_ref = [by_hand(lm.model, h, translators, i) for i, h in enumerate(outputs)]
    assert kl(logit_ref[0], tuned_ref[0]) > 0.05  # the translators change the lens
    event = lens_step(tuned_stack, 0, outputs, [None] * LAYERS, 2, text)
    assert event.kl_logit[-1] == 0.0 and event.kl_tuned[-1] == 0.0
    final = logit_ref[-1]  # the last layer's lens is the same under both (it has no translator)
    assert list(event.kl_logit) == pytest.approx([kl(final, r) for r in logit_ref], abs=1e-5)
    assert list(event.kl_tuned) == pytest.approx([kl(final, r) for r in tuned_ref], abs=1e-5)
    own = tuned_ref if kind == "tuned" else logit_ref
    assert list(event.layer_entropy) == pytest.approx([bits(r) for r in own], abs=1e-4)
    assert event.lens_kind == kind


def test_the_other_lens_of_the_last_layer_is_not_recomputed(lm, stack):
    """layer_kls_43/46 (``or`` / ``n + 1`` in the row filter: the last layer's row goes through the other lens too):
    the last layer's known row is its distribution by definition, so its other-lens KL is 0.0, even when the row
    the caller hands in is not the lens of that layer's output (here uniform)."""
    translators = random_translators(lm.model.config.hidden_size)
    logit_stack = dataclasses.replace(stack, tuned=translators)
    outputs = layer_outputs(lm.model)
    vocab = lm.model.config.vocab_size
    uniform = torch.full((vocab,), -math.log(vocab))
    event = lens_step(logit_stack, 0, outputs, [None] * LAYERS, 1, text, known={LAYERS - 1: uniform})
    assert event.kl_tuned[-1] == 0.0 and event.kl_logit[-1] == 0.0
    final = uniform.double()
    tuned_ref = [by_hand(lm.model, h, translators, i) for i, h in enumerate(outputs)]
    assert list(event.kl_tuned[:-1]) == pytest.approx([kl(final, r) for r in tuned_ref[:-1]], abs=1e-5)


# ------------------------------------------------------------------------------------------- bfloat16_copy


def test_the_bfloat16_copy_is_made_once_and_again_after_an_in_place_change():
    """bfloat16_copy_1/2/3/10/11 (the copy never found again: made anew on every call) and bfloat16_copy_7 (``==``:
    remade while the weight is unchanged, kept stale after it changed)."""
    weight = torch.tensor([[1.0, 2.0], [0.5, -3.0]])
    first = bfloat16_copy(weight)
    assert first.dtype == torch.bfloat16 and first.tolist() == [[1.0, 2.0], [0.5, -3.0]]
    assert bfloat16_copy(weight) is first
    with torch.no_grad():
        weight.mul_(2.0)
    again = bfloat16_copy(weight)
    assert again.tolist() == [[2.0, 4.0], [1.0, -6.0]]
    assert bfloat16_copy(weight) is again


# ------------------------------------------------------------------------------------------- relative_update


def test_relative_update_by_hand_and_of_a_zero_input():
    """‖h_out − h_in‖ / ‖h_in‖: (3, 4) → (3, 5.25) is 1.25 / 5; a zero input gives 0.0 (relative_update_4/8:
    dividing by the zero norm; relative_update_10: 1.0)."""
    assert relative_update(torch.tensor([3.0, 4.0]), torch.tensor([3.0, 5.25])) == 0.25
    assert relative_update(torch.zeros(3), torch.ones(3)) == 0.0
