"""The logit lens on a model copy whose LM head is quantized by the project's own quantizer
(``quantize_model(..., quantize_lm_head=True)``: the head becomes a ``QuantLinear``, codes and scales, no ``weight``).

The lens applies the head module itself: every layer's distribution equals the final norm and the dequantized head
applied by hand to that layer's output (one forward pass without a cache), at both lens precisions, and the last
layer's lens is the copy's own output. A lens that read ``lm_head.weight`` fails here (the quantized linear has none).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from playground.config import RunSettings
from playground.engine.layers.lens import LayerStack
from playground.engine.prompt import encode_prompt
from playground.engine.quant.linear import QuantLinear, quantize_model
from playground.engine.quant.rtn import dequantize
from playground.engine.strategies import run_strategy
from playground.events import TokenStep
from playground.events.layers import LayerStep

LAYERS = 4
PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def float_lm():
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=7, layers=LAYERS)


@pytest.fixture(scope="module")
def quantized_lm(float_lm):
    copy = quantize_model(float_lm.model, "rtn-int8", quantize_lm_head=True)
    return dataclasses.replace(float_lm, model=copy, name=f"{float_lm.name} · int8", base_name=float_lm.name)


def by_hand(model, float_model, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[layers, vocab] log-probs of each layer's lens at the last position through the copy's dequantized head
    (W = (codes − zero) · scale, group by group, written here), and the same through the float model's head."""
    head = model.lm_head
    with torch.no_grad():
        codes = head.qt.codes().float()  # [vocab, hidden] the int4 codes, unpacked
        groups = codes.shape[1] // head.group_size
        scale = head.scale.float().repeat_interleave(head.group_size, dim=1)[:, : codes.shape[1]]
        zero = head.zero.float().repeat_interleave(head.group_size, dim=1)[:, : codes.shape[1]]
        weight = (codes - zero) * scale
        assert groups >= 1 and weight.shape == (model.config.vocab_size, model.config.hidden_size)
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        layers = [model.model.norm(h[0, -1]) for h in out.hidden_states[1:-1]]
        rows = [F.linear(x, weight) for x in layers]
        rows.append(out.logits[0, -1])  # the copy's own output (transformers hands the last state back normed)
        float_rows = [float_model.lm_head(x) for x in layers]
    return torch.stack(rows).float().log_softmax(-1), torch.stack(float_rows).float().log_softmax(-1)


def test_the_copy_really_has_a_quantized_head_without_a_weight(quantized_lm):
    head = quantized_lm.model.get_output_embeddings()
    assert isinstance(head, QuantLinear) and head.bits == 4
    assert not hasattr(head, "weight")
    # The unpacking by hand above is the quantizer's own dequantization.
    codes = head.qt.codes().float()
    scale = head.scale.float().repeat_interleave(head.group_size, dim=1)
    zero = head.zero.float().repeat_interleave(head.group_size, dim=1)
    assert torch.allclose((codes - zero) * scale, dequantize(head.qt), atol=1e-6)


@pytest.mark.parametrize("precision", ["model", "bfloat16"])
def test_the_lens_on_a_quantized_head_applies_the_head_itself(quantized_lm, float_lm, precision):
    stack = LayerStack.of(quantized_lm.model, precision)
    assert stack.head_weight is None and stack.head_dtype == torch.float32
    settings = RunSettings.from_flat(prompt=PROMPT, chat=False, lens=True, lens_top=3, max_new_tokens=5,
                                     lens_precision=precision)
    events = list(run_strategy(quantized_lm, settings))
    steps = [e for e in events if isinstance(e, LayerStep)]
    tokens = [e for e in events if isinstance(e, TokenStep)]
    assert len(steps) == len(tokens) == 5
    context = encode_prompt(quantized_lm, settings)[0]
    differs = False
    for step, token in zip(steps, tokens, strict=True):
        expected, through_float_head = by_hand(quantized_lm.model, float_lm.model, context)
        entropy = (-(expected.exp() * expected).sum(-1) / torch.log(torch.tensor(2.0))).tolist()
        assert step.layer_entropy == pytest.approx(entropy, abs=1e-4)
        top_p, top_ids = expected.exp().topk(3, dim=-1)
        assert [[c.token_id for c in layer] for layer in step.layer_top] == top_ids.tolist()
        assert step.layer_top_prob == pytest.approx(top_p[:, 0].tolist(), abs=1e-5)
        differs |= not torch.allclose(expected[:-1], through_float_head, atol=1e-3)
        context.append(token.token_id)
    assert differs, "precondition: the quantized head gives other lens distributions than the float head"


def test_the_stacks_lens_logits_equal_the_copys_own_output_at_the_last_layer(quantized_lm):
    model = quantized_lm.model
    ids = torch.tensor([encode_prompt(quantized_lm, RunSettings.from_flat(prompt=PROMPT, chat=False))[0]])
    kept: list[torch.Tensor] = []
    last = model.model.layers[-1]
    handle = last.register_forward_hook(lambda _m, _a, out: kept.append(out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0]
    finally:
        handle.remove()
    for precision in ("model", "bfloat16"):
        stack = LayerStack.of(model, precision)
        with torch.no_grad():
            lens = stack.lens_logits(kept[0].reshape(-1, model.config.hidden_size))
        assert torch.allclose(lens, logits.float(), atol=1e-5), precision
