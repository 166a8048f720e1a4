"""LayerStack (of, lens_logits, transform) and LayerOutputs (the hooks and the step events they make), checked
against references computed here: the model's own per-layer hidden states (``output_hidden_states``,
``use_cache=False``), its final norm and head applied by hand in float64, and toy stacks with exact values."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from playground.config import ConfigError
from playground.engine.layers.lens import LayerOutputs, LayerStack
from playground.models.loaded import LoadedModel

PROMPTS = ([5, 9, 17, 33, 61], [70, 12, 44, 3, 101])  # two prompts of the same length: a batch of 2, no padding


@pytest.fixture(autouse=True)
def _no_tuned_lens(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """An empty user cache: no tuned lens is found for the tiny models."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))


def _text(token: int) -> str:
    return f"<{token}>"


def _pass(lm: LoadedModel, prompts: tuple[list[int], ...], outputs: LayerOutputs) -> tuple[torch.Tensor, ...]:
    """One plain forward pass with the hooks active; the model's own hidden states (embeddings first, the last one
    after the final norm) and its logits last."""
    with torch.no_grad(), outputs:
        out = lm.model(torch.tensor(list(prompts)), output_hidden_states=True, use_cache=False)
    return (*out.hidden_states, out.logits)


def _rms_norm64(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    """Llama's RMSNorm by hand in float64: x / sqrt(mean(x²) + eps) · w."""
    x = x.double()
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight.double()


def _relative64(hidden_in: torch.Tensor, hidden_out: torch.Tensor) -> float:
    a, b = hidden_in.double(), hidden_out.double()
    return float((b - a).norm() / a.norm())


def test_whole_pass_hooks_keep_each_layers_input_and_output_as_the_model_computes_them(tiny_lm):
    """Layer i's input is hidden_states[i], its output hidden_states[i + 1] (the last one before the final
    norm). Catches a hook that drops the input (``args`` misread, the input never stored, ``kept(None)``)."""
    stack = LayerStack.of(tiny_lm.model)
    outputs = LayerOutputs(stack)
    *hidden, logits = _pass(tiny_lm, PROMPTS, outputs)
    n = stack.count
    assert len(hidden) == n + 1
    for i in range(n):
        assert outputs.inputs[i] is not None and torch.equal(outputs.inputs[i], hidden[i])
    for i in range(n - 1):
        assert torch.equal(outputs.outputs[i], hidden[i + 1])
    last = outputs.outputs[n - 1]
    assert last is not None and last.shape == hidden[n].shape
    torch.testing.assert_close(_rms_norm64(last, stack.norm), hidden[n].double(), rtol=1e-5, atol=1e-5)
    # the lens of the last layer is the model's own logits: the head by hand, in float64
    head = _rms_norm64(last, stack.norm) @ stack.lm_head.weight.double().T
    torch.testing.assert_close(head, logits.double(), rtol=1e-4, atol=1e-4)


def test_step_event_at_reads_the_asked_position_with_its_residual_updates_and_forward_time(tiny_lm):
    """Residual updates ‖h_out − h_in‖/‖h_in‖ of the kept position from the hidden states; forward_ms passed
    through (dropped, None), 0.0 when not given; the step and the lens kind. Catches updates never computed (a
    dropped input, a flipped ``is not None``) and a lost forward time."""
    stack = LayerStack.of(tiny_lm.model)
    outputs = LayerOutputs(stack)
    *hidden, logits = _pass(tiny_lm, PROMPTS, outputs)
    n = stack.count
    batch, position = 1, 2
    event = outputs.step_event_at(batch, position, 7, 3, _text, logits[batch, position], 12.5)
    assert event.step == 7 and event.forward_ms == 12.5 and event.lens_kind == "logit"
    assert event.layers_total == n and event.layers_computed == n
    last_out = outputs.outputs[n - 1][batch, position]
    expected = [_relative64(hidden[i][batch, position], hidden[i + 1][batch, position]) for i in range(n - 1)]
    expected.append(_relative64(hidden[n - 1][batch, position], last_out))
    assert event.residual_update == pytest.approx(expected, rel=1e-5)
    # the last layer's distribution is the model's own logits at (batch, position), in bits
    lp = logits[batch, position].double().log_softmax(-1)
    assert event.layer_entropy[n - 1] == pytest.approx(float(-(lp.exp() * lp).sum()) / math.log(2), rel=1e-5)
    # every other layer's lens at (batch, position): the final norm and head by hand on its output there
    for i in range(n - 1):
        with torch.no_grad():
            lens = _rms_norm64(hidden[i + 1][batch, position], stack.norm) @ stack.lm_head.weight.double().T
        lp = lens.log_softmax(-1)
        assert event.layer_entropy[i] == pytest.approx(float(-(lp.exp() * lp).sum()) / math.log(2), rel=1e-5), i
    assert len(event.kl_logit) == n and event.kl_tuned == ()  # the stack's default kind is "logit"
    assert [c.text for c in event.layer_top[n - 1]] == [_text(c.token_id) for c in event.layer_top[n - 1]]
    untimed = outputs.step_event_at(batch, position, 7, 3, _text, logits[batch, position])
    assert untimed.forward_ms == 0.0


# --- toy stacks: exact values, no anatomy -------------------------------------------------------------------------


class _Double(nn.Module):
    """out = 2·in + 1 (exact), as a tensor or as (tensor, extra) like older transformers layers."""

    def __init__(self, as_tuple: bool) -> None:
        super().__init__()
        self.as_tuple = as_tuple

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        out = 2 * hidden_states + 1
        return (out, torch.full_like(out, -100.0)) if self.as_tuple else out


class _Toy(nn.Module):
    """Two layers, called by keyword (``hidden_states=``) or positionally; identity norm; a 3-token head."""

    def __init__(self, *, by_keyword: bool, as_tuple: bool, bias: bool = False) -> None:
        super().__init__()
        self.by_keyword = by_keyword
        self.layers = nn.ModuleList([_Double(as_tuple), _Double(as_tuple)])
        self.norm = nn.Identity()
        self.head = nn.Linear(2, 3, bias=bias)
        with torch.no_grad():
            self.head.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
            if bias:
                self.head.bias.copy_(torch.tensor([0.5, -3.0, 8.0]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            out = layer(hidden_states=x) if self.by_keyword else layer(x)
            x = out[0] if isinstance(out, tuple) else out
        return self.head(self.norm(x))


def _toy_stack(model: _Toy, precision: str = "model") -> LayerStack:
    return LayerStack(model, model.layers, model.norm, model.head, precision)


def test_layers_called_by_keyword_keep_no_input_and_record_no_update():
    """No positional argument: the input is unknown (None), the output still kept, the update None; the lens of
    a stack without anatomy is the head's logits untransformed. Catches ``args[0]`` read regardless, an update
    computed from a missing input, and ``transform`` asking a missing anatomy."""
    model = _Toy(by_keyword=True, as_tuple=False)
    stack = _toy_stack(model)
    outputs = LayerOutputs(stack)
    x = torch.tensor([[[0.5, -1.0]]])  # [1, 1, 2]
    with torch.no_grad(), outputs:
        logits = model(x)
    assert outputs.inputs == [None, None]
    assert torch.equal(outputs.outputs[0], torch.tensor([[[2.0, -1.0]]]))  # 2·x + 1
    assert torch.equal(outputs.outputs[1], torch.tensor([[[5.0, -1.0]]]))
    event = outputs.step_event_at(0, 0, 0, 2, _text, logits[0, 0])
    assert event.residual_update == (None, None)
    # layer 0's lens: head([2, -1]) = [2, -1, 1] → top tokens 0 then 2, p = e² / (e² + e⁻¹ + e)
    z = math.exp(2) + math.exp(-1) + math.exp(1)
    assert [c.token_id for c in event.layer_top[0]] == [0, 2]
    assert event.layer_top_prob[0] == pytest.approx(math.exp(2) / z, rel=1e-6)
    assert torch.equal(stack.lens_logits(torch.tensor([[2.0, -1.0]])), torch.tensor([[2.0, -1.0, 1.0]]))


def test_layers_returning_tuples_keep_the_hidden_state_not_the_tuple_or_its_second_item():
    """A layer returning (hidden, extra): the kept output is the hidden state; updates from the positional
    input: ‖(2x + 1) − x‖ / ‖x‖."""
    model = _Toy(by_keyword=False, as_tuple=True)
    outputs = LayerOutputs(_toy_stack(model))
    x = torch.tensor([[[3.0, 4.0]]])
    with torch.no_grad(), outputs:
        logits = model(x)
    assert torch.equal(outputs.outputs[0], torch.tensor([[[7.0, 9.0]]]))
    assert torch.equal(outputs.outputs[1], torch.tensor([[[15.0, 19.0]]]))
    event = outputs.step_event_at(0, 0, 0, 1, _text, logits[0, 0])
    # layer 0: ‖[4, 5]‖ / ‖[3, 4]‖ = √41 / 5; layer 1: ‖[8, 10]‖ / ‖[7, 9]‖ = √164 / √130
    assert event.residual_update == pytest.approx((math.sqrt(41) / 5, math.sqrt(164 / 130)), rel=1e-6)


def test_a_layer_that_did_not_run_has_no_lens_and_no_update():
    """An output left None (the layer did not run) stays None in the event instead of being indexed."""
    model = _Toy(by_keyword=False, as_tuple=False)
    outputs = LayerOutputs(_toy_stack(model))
    with torch.no_grad(), outputs:
        logits = model(torch.tensor([[[3.0, 4.0]]]))
    outputs.outputs[0] = None
    event = outputs.step_event_at(0, 0, 0, 1, _text, logits[0, 0])
    assert event.layers_computed == 1 and event.layer_entropy[0] is None and event.layer_top[0] == ()
    assert event.residual_update[0] is None
    assert event.residual_update[1] == pytest.approx(math.sqrt(164 / 130), rel=1e-6)


def test_bfloat16_lens_adds_the_heads_bias():
    """precision "bfloat16" with a float32 head that has a bias: the bias is in the product (all values exact in
    bfloat16: [1, 2] → W·h = [1, 2, 3], + [0.5, −3, 8] = [1.5, −1, 11])."""
    stack = _toy_stack(_Toy(by_keyword=False, as_tuple=False, bias=True), precision="bfloat16")
    got = stack.lens_logits(torch.tensor([[1.0, 2.0]]))
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.tensor([[1.5, -1.0, 11.0]]))


def test_of_defaults_to_the_logit_lens_and_refuses_a_tuned_lens_never_trained(tiny_lm):
    """The default kind is "logit" (its KLs go to kl_logit); "tuned" without translators says how to get them."""
    assert LayerStack.of(tiny_lm.model).kind == "logit"
    with pytest.raises(ConfigError) as refused:
        LayerStack.of(tiny_lm.model, kind="tuned")
    assert str(refused.value) == ("no tuned lens trained for this model yet: train it once (`playground tune-lens`), "
                                  "or use --lens-kind logit")


