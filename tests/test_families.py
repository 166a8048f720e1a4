"""The model-families matrix: every capability that opens a model up, on a tiny random model of each family's real
transformers class (Llama, Qwen2, Qwen3, Mistral, Gemma 2, Gemma 3, Phi-3, GPT-2, GPT-NeoX), against references
computed here: ``generate()``, cache-free forward passes with ``output_hidden_states``, the model run with a layer
replaced by the identity, and each attention module's own keys and values.

Prompt + output are longer than the tiny window (``TINY_WINDOW``), so sliding-window layers (Mistral, Gemma 2/3)
pass their window in every run.
"""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from support.tiny_models import FAMILIES, TINY_WINDOW, build_tiny_lm
from transformers import DynamicCache

from playground.config import ConfigError, RunSettings
from playground.engine.layers.loop import LayerLoop, skip_rule
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep
from playground.events.contrastive import ContrastStep
from playground.events.layers import LayerStep
from playground.events.speculative import SpeculativeRound
from playground.models.anatomy import anatomy_of, family_name

LAYERS = 4
NEW = 14
PROMPT = "Speculative decoding drafts tokens and verifies them. Beam search keeps several hypotheses"
ATOL = 2e-4


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return build_tiny_lm(seed=3, layers=LAYERS, family=request.param)


def settings(**flat) -> RunSettings:
    return RunSettings.from_flat(**{"prompt": PROMPT, "chat": False, "max_new_tokens": NEW, **flat})


def run(lm, **flat) -> list:
    return list(run_strategy(lm, settings(**flat)))


def done(events: list) -> RunFinished:
    assert isinstance(events[-1], RunFinished), events[-1]
    return events[-1]


def prompt_ids(lm) -> list[int]:
    ids = encode_prompt(lm, settings())[0]
    assert len(ids) + NEW > TINY_WINDOW + 4, "the run must pass the sliding window"
    return ids


def generate(lm, ids: list[int], n: int = NEW, **kwargs) -> list[int]:
    tensor = torch.tensor([ids])
    with torch.inference_mode():
        out = lm.model.generate(tensor, attention_mask=torch.ones_like(tensor), do_sample=False, max_new_tokens=n,
                                pad_token_id=lm.tokenizer.pad_token_id, **kwargs)
    return out[0, len(ids):].tolist()


def cache_free_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()


def greedy_without_cache(model, ids: list[int], n: int, eos: set[int]) -> list[int]:
    out: list[int] = []
    for _ in range(n):
        token = int(cache_free_logits(model, ids + out).argmax())
        out.append(token)
        if token in eos:
            break
    return out


# ------------------------------------------------------------------------------------------- plain decoding


def test_greedy_equals_generate(lm):
    ids = prompt_ids(lm)
    assert list(done(run(lm, strategy="greedy")).token_ids) == generate(lm, ids)


def test_sampled_tokens_carry_the_model_probabilities_and_a_seed_repeats_them(lm):
    ids = prompt_ids(lm)
    events = run(lm, strategy="sample", temperature=1.0, seed=11)
    tokens = [e for e in events if isinstance(e, TokenStep)]
    context = list(ids)
    for token in tokens:
        probs = cache_free_logits(lm.model, context).double().softmax(-1)
        assert token.raw_prob == pytest.approx(float(probs[token.token_id]), abs=ATOL)
        assert token.prob == pytest.approx(float(probs[token.token_id]), abs=ATOL)  # T = 1, no cut: processed = raw
        context.append(token.token_id)
    assert list(done(run(lm, strategy="sample", temperature=1.0, seed=11)).token_ids) == [t.token_id for t in tokens]


def test_beam_search_equals_generate(lm):
    ids = prompt_ids(lm)
    finished = done(run(lm, strategy="beam", num_beams=3, max_new_tokens=8, early_stopping="never"))
    tensor = torch.tensor([ids])
    with torch.inference_mode():
        out = lm.model.generate(tensor, attention_mask=torch.ones_like(tensor), do_sample=False, num_beams=3,
                                max_new_tokens=8, early_stopping="never", output_scores=True,
                                return_dict_in_generate=True, pad_token_id=lm.tokenizer.pad_token_id)
    best = finished.sequences[0]
    length = int((out.beam_indices[0] != -1).sum())
    assert list(best.token_ids) == out.sequences[0, len(ids):len(ids) + length].tolist()
    assert best.score == pytest.approx(float(out.sequences_scores[0]), abs=1e-4)


# ------------------------------------------------------------------------------------------------- the lens


def hand_lens(model, ids: list[int]) -> list[torch.Tensor]:
    """Every layer's lens at the last position, written out: the final norm, the LM head and the family's logit
    transform on ``output_hidden_states`` (the last entry is already normed by the model: its logits are the
    model's own)."""
    anatomy = anatomy_of(model)
    config = model.config
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        rows = []
        for hidden in out.hidden_states[1:-1]:
            logits = anatomy.lm_head(anatomy.final_norm(hidden[0, -1]))
            cap = getattr(config, "final_logit_softcapping", None)
            if cap:
                logits = torch.tanh(logits / cap) * cap
            rows.append(logits.float().log_softmax(-1))
        rows.append(out.logits[0, -1].float().log_softmax(-1))
    return rows


def entropy_bits(logprobs: torch.Tensor) -> float:
    return float(-(logprobs.exp() * logprobs).sum() / math.log(2))


def test_the_lens_of_every_layer_equals_norm_and_head_on_the_hidden_states(lm):
    ids = prompt_ids(lm)
    events = run(lm, strategy="greedy", lens=True, lens_precision="model", max_new_tokens=NEW)
    steps = [e for e in events if isinstance(e, LayerStep)]
    tokens = list(done(events).token_ids)
    assert len(steps) == len(tokens)
    for k in (0, len(steps) // 2, len(steps) - 1):
        reference = hand_lens(lm.model, ids + tokens[:k])
        for layer, row in enumerate(reference):
            assert steps[k].layer_entropy[layer] == pytest.approx(entropy_bits(row), abs=1e-3)
            assert steps[k].layer_top[layer][0].token_id == int(row.argmax())


def test_soft_capping_is_part_of_the_lens_where_the_family_caps():
    lm = build_tiny_lm(seed=3, layers=LAYERS, family="gemma2")
    anatomy = anatomy_of(lm.model)
    assert anatomy.softcap == 30.0
    torch.manual_seed(0)
    hidden = torch.randn(3, 32)
    with torch.no_grad():
        anatomy.lm_head.weight.mul_(20)  # logits well past the cap
        uncapped = anatomy.lm_head(anatomy.final_norm(hidden))
        assert float(uncapped.abs().max()) > 30, "the test needs logits the cap changes"
        assert torch.allclose(anatomy.head_logits(hidden), torch.tanh(uncapped / 30) * 30)


# ------------------------------------------------------------------------------- early exit and layer skip


def test_early_exit_that_never_exits_equals_generate(lm):
    ids = prompt_ids(lm)
    events = run(lm, strategy="early-exit", exit_metric="entropy", exit_threshold=0.0, min_exit_layer=1,
                 lens_precision="model")
    steps = [e for e in events if isinstance(e, LayerStep)]
    assert all(s.exit_layer is None for s in steps)
    assert list(done(events).token_ids) == generate(lm, ids)


@contextlib.contextmanager
def without_layer(model, skipped: int):
    """The model with one layer (0-based) passing its input through, run cache-free: the reference of a fixed skip
    (a skipped layer's filled keys and values are read by no other layer). The layer's own forward is replaced on
    the instance, so the module stays where it is: transformers records ``output_hidden_states`` with hooks it puts
    on the layers at the first such call, and a module swapped in then would keep them after it is swapped out (every
    later reference's hidden states would be wrong)."""
    layer = anatomy_of(model).layers[skipped]
    layer.forward = lambda hidden, *args, **kwargs: hidden
    try:
        yield
    finally:
        del layer.forward


def skipped_greedy(model, ids: list[int], skipped: int, n: int, eos: set[int]) -> list[int]:
    """The reference of a fixed skip: the prompt read by every layer (all but its last token, as the strategy's
    prefill does), then each token through the model with layer ``skipped`` (0-based) replaced by the identity.
    The skipped layer's own cache entries are read by no other layer, so the identity leaves them stale."""
    cache = DynamicCache(config=model.config)
    out: list[int] = []
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids[:-1]]), cache=cache, use_cache=True)
        with without_layer(model, skipped):
            token = ids[-1]
            for _ in range(n):
                logits = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True).logits[0, -1]
                token = int(logits.argmax())
                out.append(token)
                if token in eos:
                    break
    return out


def test_a_fixed_skip_equals_the_other_layers_applied_over_many_tokens(lm):
    """Layer 3 is not the first of its attention type in any family: the masks come from the first layer of each
    type's cache, which the identity would leave stale."""
    ids = prompt_ids(lm)
    finished = done(run(lm, strategy="layer-skip", skip_layers="3", skip_threshold=0.0, lens_precision="model"))
    reference = skipped_greedy(lm.model, ids, 2, NEW, set(lm.eos_token_ids))
    assert len(reference) >= 8
    assert list(finished.token_ids) == reference


def attention_kv(model, layer: int, hidden_in: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values the layer's own attention module writes for the states ``hidden_in`` [1, n, hidden]
    entering the layer: its input norm and attention on a fresh cache, with the model's masks and rotary for
    that layer captured from a real forward pass (a pre-hook on the layer)."""
    anatomy = anatomy_of(model)
    block = anatomy.layer(layer).attention
    captured = {}

    def keep(_module, args, kwargs):
        captured.update(args=args, kwargs=kwargs)

    handle = anatomy.layers[layer].register_forward_pre_hook(keep, with_kwargs=True)
    try:
        with torch.inference_mode():
            model(inputs_embeds=None, input_ids=torch.zeros((1, hidden_in.shape[1]), dtype=torch.long),
                  use_cache=False)
    finally:
        handle.remove()
    cache = DynamicCache()
    import inspect

    bound = inspect.signature(anatomy.layers[layer].forward).bind(*captured["args"], **captured["kwargs"]).arguments
    passed = {}
    for name, value in list(bound.items())[1:]:
        if isinstance(value, dict) and name == "kwargs":
            passed.update(value)
        else:
            passed[name] = value
    for key in ("cache", "past_key_values", "layer_past"):
        if key in passed:
            passed[key] = cache
    passed["use_cache"] = True
    with torch.inference_mode():
        block.module(block.norm(hidden_in), **passed)
    entry = cache.layers[layer] if len(cache.layers) > layer else cache.layers[-1]
    return entry.keys, entry.values


def test_filled_keys_and_values_are_the_layers_own_over_many_tokens(lm):
    """Skip layer 2 for 10 tokens through ``LayerLoop``; its cache entries for those tokens equal what its own
    attention writes for its input states (the previous layer's outputs, from a cache-free pass)."""
    ids = prompt_ids(lm)
    model = lm.model
    loop = LayerLoop(model)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids[:-1]]), cache=cache, use_cache=True)
        rule = skip_rule((2,), 0.0, LAYERS)
        fed = list(ids)
        token = ids[-1]
        for _ in range(10):
            step = loop.run(token, cache, skip_rule=rule)
            assert step.skipped == (2,) and step.filled == [1]
            token = int(step.logits.argmax())
            fed.append(token)
    fed = fed[:-1]  # the last token was chosen, not read
    with without_layer(model, 1), torch.inference_mode():
        hidden = model(input_ids=torch.tensor([fed]), output_hidden_states=True, use_cache=False).hidden_states
    hidden_in = hidden[1]  # the state entering layer 2 (index 1): layer 1's output
    keys, values = attention_kv(model, 1, hidden_in)
    layer_cache = cache.layers[1]
    n = layer_cache.keys.shape[-2]  # a sliding layer holds only its window
    filled = len(fed) - len(ids) + 1  # positions read by the loop
    kept = min(n, filled)
    assert torch.allclose(layer_cache.keys[..., -kept:, :], keys[..., -kept:, :], atol=1e-5)
    assert torch.allclose(layer_cache.values[..., -kept:, :], values[..., -kept:, :], atol=1e-5)
    assert float(layer_cache.keys[..., -kept:, :].abs().max()) > 0, "a zero fill must not pass"


# ------------------------------------------------------------------------------------------- speculative


@pytest.mark.parametrize("draft", ["prompt-lookup", "layers", "jacobi", "quantized"])
def test_every_drafter_equals_plain_greedy_across_the_window(lm, draft):
    ids = prompt_ids(lm)
    extra = {"draft_layers": 2} if draft == "layers" else {}
    if draft == "quantized":
        extra = {"draft_quant": "rtn-int8"}
    events = run(lm, strategy="speculative", draft=draft, draft_k=4, max_new_tokens=NEW + 6, **extra)
    assert list(done(events).token_ids) == generate(lm, ids, NEW + 6)


@pytest.mark.parametrize("draft", ["prompt-lookup", "layers", "suffix"])
def test_every_tree_drafter_equals_plain_greedy_across_the_window(lm, draft):
    """Trees 3 wide, verified in one pass through the family's own masks (sliding layers: their window); the
    layers drafter's q at every node is the lens of layer 2 after the node's parent's path, computed here."""
    ids = prompt_ids(lm)
    extra = {"draft_layers": 2} if draft == "layers" else {}
    events = run(lm, strategy="speculative", draft=draft, draft_k=3, tree_width=3, tree_nodes=9,
                 max_new_tokens=NEW + 6, **extra)
    finished = done(events)
    assert list(finished.token_ids) == generate(lm, ids, NEW + 6)
    if draft != "layers":
        return
    full = ids + list(finished.token_ids)
    rounds = [e for e in events if isinstance(e, SpeculativeRound)]
    deep = 0
    for r in rounds[:4]:
        context = full[: len(ids) + r.first_step]
        paths: list[list[int]] = []
        for i, parent in enumerate(r.parents):
            before = paths[parent] if parent >= 0 else []
            q = hand_lens(lm.model, context + before)[1].exp()
            assert r.drafted[i].draft_prob == pytest.approx(float(q[r.drafted[i].token_id]), abs=2e-4)
            paths.append([*before, r.drafted[i].token_id])
            deep += parent >= 0
    assert deep > 0, "precondition: nodes below the first depth"


# ------------------------------------------------------------------------ contrastive and cascade variants


def test_a_layer_amateur_contrasts_with_the_lens_of_its_layer(lm):
    ids = prompt_ids(lm)
    events = run(lm, strategy="contrastive", amateur="layer", amateur_layer=2, alpha=0.1, max_new_tokens=6)
    steps = [e for e in events if isinstance(e, ContrastStep)]
    context = list(ids)
    for step in steps:
        expert = hand_lens(lm.model, context)
        lp_e, lp_a = expert[-1].double(), expert[1].double()
        plausible = (lp_e - lp_e.max()).exp() >= 0.1
        scores = torch.where(plausible, lp_e - lp_a, torch.tensor(-math.inf, dtype=torch.float64))
        assert step.contrast_token_id == int(scores.argmax())
        assert step.plausible_count == int(plausible.sum())
        context.append(step.token_id)


def test_a_first_layers_cheap_model_answers_with_its_layers(lm):
    """Threshold 0: the cheap model (the first 2 layers + final norm + head) answers every token; its greedy
    output equals the lens of layer 2 taken greedily, cache-free."""
    ids = prompt_ids(lm)
    finished = done(run(lm, strategy="cascade", cheap="layers", cheap_layers=2, cascade_threshold=0.0,
                        max_new_tokens=8))
    context, expected = list(ids), []
    for _ in range(len(finished.token_ids)):
        token = int(hand_lens(lm.model, context)[1].argmax())
        expected.append(token)
        context.append(token)
    assert list(finished.token_ids) == expected


# ------------------------------------------------------------------------------------------ the seam itself


def test_every_family_is_named_and_an_unknown_one_is_refused_by_name():
    for family in FAMILIES:
        lm = build_tiny_lm(seed=0, layers=2, family=family)
        assert anatomy_of(lm.model).family == family_name(lm.model)

    from transformers import BloomConfig, BloomForCausalLM

    bloom = BloomForCausalLM(BloomConfig(vocab_size=64, hidden_size=16, n_layer=1, n_head=2)).eval()
    with pytest.raises(ConfigError, match=r"BloomForCausalLM family \('bloom'\) is not in the model-anatomy"):
        anatomy_of(bloom)


def test_an_offset_norm_folds_exactly_in_bfloat16():
    """Gemma's (1 + w) norm in bfloat16: after dividing its output by a large s, the output still equals the
    original output / s to float32 precision (w is held in float32; Gemma's norm computes in float32)."""
    from playground.models.anatomy import RMS_OFFSET, scale_norm_output

    lm = build_tiny_lm(seed=1, layers=2, family="gemma2")
    norm = anatomy_of(lm.model).layer(0).attention.norm
    norm.to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32) * 0.3)
        x = torch.randn(4, 32, dtype=torch.bfloat16)
        before = norm(x.float())  # float32 out (the norm computes in float32 and returns x's dtype)
        s = torch.logspace(0, 2.5, 32)
        scale_norm_output(norm, RMS_OFFSET, s)
        after = norm(x.float()).float()
    assert torch.allclose(after, before / s, rtol=1e-5, atol=1e-6)
