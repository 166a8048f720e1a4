"""Direct logit attribution on tiny models of every family: the identity (components + frozen-norm bias = the
model's logit difference), each component against a hand computation from ``output_hidden_states`` and hooks
written here, and the wrapper's steps, words and refusals."""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import FAMILIES, build_tiny_lm

from playground.config import ConfigError
from playground.config.dla import parse_steps
from playground.engine.dla.attribute import Request, attribute
from playground.engine.dla.run import single_token, wanted_steps
from playground.models.anatomy import LAYERNORM, anatomy_of

IDS = [1, 40, 50, 60, 70, 80, 90, 100, 110]


@torch.no_grad()
def hand(model, ids: list[int], t: int, a: int, b: int) -> dict:
    """The attribution by hand: the residual's parts from hidden states and hooks on the attention modules, the
    final norm frozen as the map x -> x * (norm(h) − bias) / centre(h), its own output over its input."""
    anatomy = anatomy_of(model)
    attn: dict[int, torch.Tensor] = {}
    last: list[torch.Tensor] = []
    handles = [anatomy.layers[-1].register_forward_hook(lambda m, i, o: last.append(o[0] if isinstance(o, tuple)
                                                                                     else o))]
    for i in range(anatomy.count):
        layer = anatomy.layer(i)
        post = layer.module.get_submodule("post_attention_layernorm") if anatomy.row.post_norms else None

        def keep(_m, _i, out, i=i, post=post):
            value = out[0]
            attn[i] = post(value) if post is not None else value  # Gemma: the block's post-norm, the module's own

        handles.append(layer.attention.module.register_forward_hook(keep))
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    for handle in handles:
        handle.remove()
    states = [s[0, t].double() for s in out.hidden_states[: anatomy.count]] + [last[0][0, t].double()]
    h = states[-1]
    norm = anatomy.final_norm
    with torch.no_grad():
        normed = norm(h.float()).double()
    bias = norm.bias.double() if anatomy.norm_kind == LAYERNORM else torch.zeros_like(h)
    centred = h - h.mean() if anatomy.norm_kind == LAYERNORM else h
    ratio = (normed - bias) / centred
    u = (model.get_output_embeddings().weight[a] - model.get_output_embeddings().weight[b]).double()

    def dla(x: torch.Tensor) -> float:
        x = x - x.mean() if anatomy.norm_kind == LAYERNORM else x
        return float((x * ratio) @ u)

    attention = [dla(attn[i][0, t].double()) for i in range(anatomy.count)]
    mlp = [dla(states[i + 1] - states[i] - attn[i][0, t].double()) for i in range(anatomy.count)]
    return {"embeddings": dla(states[0]), "attention": attention, "mlp": mlp, "bias": float(bias @ u)}


@pytest.fixture(scope="module")
def models():
    return {family: build_tiny_lm(family=family, layers=2).model for family in FAMILIES}


@pytest.mark.parametrize("family", FAMILIES)
def test_identity_and_hand_computation(models, family):
    model = models[family]
    t, a, b = 6, 41, 57
    [r] = attribute(model, IDS, [Request(t, 0, a, b), ], str)
    with torch.no_grad():
        head_out: list[torch.Tensor] = []
        anatomy = anatomy_of(model)
        handle = anatomy.lm_head.register_forward_hook(lambda m, i, o: head_out.append(o))
        model(input_ids=torch.tensor([IDS[: t + 1]]))
        handle.remove()
    raw = head_out[0][0, -1].double()  # before soft-capping
    assert r.difference == pytest.approx(float(raw[a] - raw[b]), abs=1e-5)
    pieces = r.embeddings + r.norm_bias + sum(r.attention) + sum(r.mlp)
    assert pieces == pytest.approx(r.difference, abs=1e-5)  # the identity, without the per-layer remainder
    assert max(map(abs, r.other)) < 1e-5  # nothing else writes to the stream here
    for layer in range(anatomy.count):
        assert sum(r.heads[layer]) + r.attention_bias[layer] == pytest.approx(r.attention[layer], abs=1e-5)
    by_hand = hand(model, IDS, t, a, b)
    assert r.embeddings == pytest.approx(by_hand["embeddings"], abs=1e-4)
    assert r.attention == pytest.approx(by_hand["attention"], abs=1e-4)
    assert r.mlp == pytest.approx(by_hand["mlp"], abs=1e-4)
    assert r.norm_bias == pytest.approx(by_hand["bias"], abs=1e-5)
    assert r.lens[-1] == pytest.approx(r.difference, abs=1e-5)  # the last layer's lens is the model's output
    assert r.running[-1] == pytest.approx(r.difference, abs=1e-5)
    capped = anatomy.logit_transform(raw[[a, b]])
    assert r.capped_difference == pytest.approx(float(capped[0] - capped[1]), abs=1e-6)


def test_runner_up_by_default_and_refusals(models):
    model = models["llama"]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([IDS[:5]])).logits[0, -1]
    top, second = logits.topk(2).indices.tolist()
    [r] = attribute(model, IDS, [Request(4, 2, top)], str)
    assert (r.token_id, r.against_id, r.step, r.position) == (top, second, 2, 4)
    with pytest.raises(ConfigError, match="the token itself"):
        attribute(model, IDS, [Request(4, 2, top, top)], str)
    with pytest.raises(ConfigError, match="outside the sequence"):
        attribute(model, IDS, [Request(len(IDS), 0, top)], str)


def test_steps_words_and_single_tokens():
    assert parse_steps("0, 3-5") == (0, 3, 4, 5) and parse_steps("all") is None and parse_steps("") == ()
    for bad in ("x", "5-3", "1-"):
        with pytest.raises(ValueError):
            parse_steps(bad)

    class Step:
        def __init__(self, step, text):
            self.step, self.text = step, text

    steps = [Step(0, "The"), Step(1, " capital"), Step(2, " Paris"), Step(3, " Paris")]
    assert wanted_steps(steps, (0, 9), "Paris") == ([0, 2], ["step 9 (the run has 4 steps)"])
    assert wanted_steps(steps, None, "") == ([0, 1, 2, 3], [])
    assert wanted_steps(steps, (), "Lyon")[1] == ["the word 'Lyon' (not emitted in this run)"]
    lm = build_tiny_lm()
    word = lm.tokenizer.decode([lm.tokenizer.encode(" Paris", add_special_tokens=False)[0]])
    assert lm.tokenizer.encode(word, add_special_tokens=False) == [single_token(lm, word, "w")]
    with pytest.raises(ConfigError, match="tokens for this model"):
        single_token(lm, " Shanghai coffee", "--attribute-against")


def test_every_step_asked_costs_one_forward_pass_together():
    from playground.engine.dla.run import attribute_run

    lm = build_tiny_lm()

    class Step:
        def __init__(self, step, token_id):
            self.step, self.token_id, self.text = step, token_id, str(token_id)

    steps = [Step(i, t) for i, t in enumerate([60, 70, 80, 90])]
    calls = []
    handle = lm.model.register_forward_pre_hook(lambda m, a: calls.append(1))
    try:
        found = list(attribute_run(lm, [1, 40, 50], steps, None))
    finally:
        handle.remove()
    assert [a.step for a in found] == [0, 1, 2, 3] and len(calls) == 1
    assert [a.position for a in found] == [2, 3, 4, 5] and [a.token_id for a in found] == [60, 70, 80, 90]
