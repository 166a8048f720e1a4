"""Caches that keep less, on the real decode of two tiny families: a budget that holds the whole sequence equals
the full cache exactly; sinks + window and heavy hitters equal a decode by hand on a DynamicCache pruned to the
kept positions (kept sets computed here, H2O's scores from transformers' own ``output_attentions``); KIVI's bytes
equal its layout counted by hand; the quality event's KL equals one computed here."""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import build_tiny_lm
from transformers import DynamicCache

from playground.config import ConfigError, RunSettings
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events.kv import KVQuality, KVStep

PROMPT = "the cat sat on the mat"
NEW = 8
FAMILIES = ("llama", "qwen2")


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return build_tiny_lm(seed=0, family=request.param)


def run(lm, **settings) -> list:
    options = {"prompt": PROMPT, "chat": False, "strategy": "kv-cache", "max_new_tokens": NEW,
               "compare_no_cache": False, **settings}
    return list(run_strategy(lm, RunSettings.from_flat(**options)))


def prompt_ids(lm) -> list[int]:
    return encode_prompt(lm, RunSettings(prompt=PROMPT, chat=False))[0]


def generate(lm) -> list[int]:
    ids = torch.tensor([prompt_ids(lm)])
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW,
                            min_new_tokens=NEW, pad_token_id=lm.tokenizer.pad_token_id)
    return out[0, ids.shape[1]:].tolist()


def of_type(events, cls):
    return [e for e in events if isinstance(e, cls)]


@pytest.mark.parametrize("options", [
    {"kv_keep": "sinks", "kv_sinks": 4, "kv_window": 40},
    {"kv_keep": "h2o", "kv_window": 4, "kv_budget": 40},
    {"kv_dtype": "int2", "kivi_group": 8, "kivi_residual": 40},
], ids=["sinks", "h2o", "kivi"])
def test_a_budget_that_holds_everything_is_the_full_cache(lm, options):
    events = run(lm, **options)
    assert list(events[-1].token_ids) == generate(lm)
    quality = of_type(events, KVQuality)[0]
    assert quality.first_divergence == -1 and all(quality.top1_agree) and max(quality.kl) < 1e-5
    assert all(not step.evicted for step in of_type(events, KVStep))


def decode_by_hand(lm, keep_rule, n=NEW) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy on a DynamicCache pruned after every pass to ``keep_rule(layer, positions held, attentions)``'s
    positions, with the true position ids: the reference for the evicting caches."""
    model = lm.model
    ids = prompt_ids(lm)
    cache = DynamicCache(config=model.config)
    held = [list(range(len(ids))) for _ in range(model.config.num_hidden_layers)]
    scores = [None] * len(held)
    tokens, logprobs = [], []
    feed, position = ids, 0
    model.set_attn_implementation("eager")
    try:
        for _ in range(n):
            with torch.inference_mode():
                out = model(input_ids=torch.tensor([feed]), cache=cache, use_cache=True, output_attentions=True,
                            position_ids=torch.arange(position, position + len(feed))[None])
            position += len(feed)
            logits = out.logits[0, -1].float()
            logprobs.append(logits.log_softmax(-1))
            tokens.append(int(logits.argmax()))
            for i, layer in enumerate(cache.layers):
                keep, scores[i] = keep_rule(held[i], out.attentions[i], scores[i])
                layer.keys, layer.values = layer.keys[:, :, keep], layer.values[:, :, keep]
                held[i] = [held[i][k] for k in keep.flatten().tolist()] if keep.dim() == 1 else held[i]
            feed = [tokens[-1]]
            for i in range(len(held)):
                held[i] = held[i] + [position]
    finally:
        model.set_attn_implementation("sdpa")
    return tokens, logprobs


def test_sinks_and_window_decode_as_a_cache_pruned_by_hand(lm):
    sinks, window = 2, 5

    def keep(held, attentions, scores):  # held: positions; keep the first `sinks` and the newest `window`
        if len(held) <= sinks + window:
            return torch.arange(len(held)), None
        return torch.tensor(list(range(sinks)) + list(range(len(held) - window, len(held)))), None

    tokens, logprobs = decode_by_hand(lm, keep)
    events = run(lm, kv_keep="sinks", kv_sinks=sinks, kv_window=window)
    assert list(events[-1].token_ids) == tokens
    steps = of_type(events, KVStep)
    assert [s.tokens for s in steps] == [sinks + window] * NEW
    per_token = steps[0].total_bytes // (sinks + window)
    assert {s.total_bytes for s in steps} == {per_token * (sinks + window)}  # flat
    evicted = sorted(p for s in steps for p in s.evicted)
    total = len(prompt_ids(lm)) + NEW - 1  # positions fed by the last step
    assert evicted == list(range(sinks, total - window))
    # The quality: KL(full ‖ this) per token, the full model's distributions after the same tokens, computed here.
    full_ids = torch.tensor([prompt_ids(lm) + tokens[:-1]])
    with torch.inference_mode():
        full = lm.model(input_ids=full_ids).logits[0, -NEW:].float().log_softmax(-1)
    mine = torch.stack(logprobs)
    expected = (full.exp() * (full - mine)).sum(-1)
    quality = of_type(events, KVQuality)[0]
    assert torch.allclose(torch.tensor(quality.kl), expected.clamp_min(0), atol=1e-5)
    assert list(quality.top1_agree) == (full.argmax(-1) == mine.argmax(-1)).tolist()


def test_heavy_hitters_decode_as_a_cache_pruned_by_hand(lm):
    budget, recent = 6, 2
    groups = lm.model.config.num_attention_heads // lm.model.config.num_key_value_heads

    def keep(held, attentions, scores):
        # attentions: [1, q_heads, queries, keys] from transformers' eager attention; per key head, summed
        probs = attentions[0].float().sum(dim=1)  # [q_heads, keys]
        per_kv = probs.view(-1, groups, probs.shape[-1]).sum(dim=1)  # [kv_heads, keys]
        scores = per_kv if scores is None else torch.cat((scores, torch.zeros(scores.shape[0], 1)), 1) + per_kv
        keys = scores.shape[1]
        if keys <= budget:
            return torch.arange(keys), scores
        kept = []
        for head in scores:
            older = sorted(range(keys - recent), key=lambda j: (-float(head[j]), j))[: budget - recent]
            kept.append(sorted(older) + list(range(keys - recent, keys)))
        kept = torch.tensor(kept)  # [kv_heads, budget]
        return kept[None, :, :, None].expand(1, -1, -1, 1), torch.gather(scores, 1, kept)

    tokens = decode_per_head(lm, keep)
    events = run(lm, kv_keep="h2o", kv_window=recent, kv_budget=budget)
    assert list(events[-1].token_ids) == tokens
    assert [s.tokens for s in of_type(events, KVStep)] == [budget] * NEW


def decode_per_head(lm, keep_rule, n=NEW) -> list[int]:
    """Greedy with each layer's keys and values gathered per key head after every pass (H2O's kept sets)."""
    model = lm.model
    ids = prompt_ids(lm)
    cache = DynamicCache(config=model.config)
    scores = [None] * model.config.num_hidden_layers
    tokens, feed, position = [], ids, 0
    model.set_attn_implementation("eager")
    try:
        for _ in range(n):
            with torch.inference_mode():
                out = model(input_ids=torch.tensor([feed]), cache=cache, use_cache=True, output_attentions=True,
                            position_ids=torch.arange(position, position + len(feed))[None])
            position += len(feed)
            tokens.append(int(out.logits[0, -1].argmax()))
            for i, layer in enumerate(cache.layers):
                index, scores[i] = keep_rule(None, out.attentions[i], scores[i])
                if index.dim() == 1:
                    layer.keys, layer.values = layer.keys[:, :, index], layer.values[:, :, index]
                else:
                    d = layer.keys.shape[-1]
                    layer.keys = torch.gather(layer.keys, 2, index.expand(-1, -1, -1, d))
                    layer.values = torch.gather(layer.values, 2, index.expand(-1, -1, -1, d))
            feed = [tokens[-1]]
    finally:
        model.set_attn_implementation("sdpa")
    return tokens


def test_kivi_holds_its_layout_counted_by_hand(lm):
    group, residual, bits = 2, 4, 4
    events = run(lm, kv_dtype="int4", kivi_group=group, kivi_residual=residual)
    config = lm.model.config
    d = config.hidden_size // config.num_attention_heads
    heads = config.num_key_value_heads
    prompt = len(prompt_ids(lm))
    for i, step in enumerate(of_type(events, KVStep)):
        length = prompt + i
        keys_q = length // residual * residual
        values_q = max(0, length - residual)
        keys = keys_q * d * bits // 8 + keys_q // group * d * 8 + (length - keys_q) * d * 4
        values = values_q * d * bits // 8 + values_q * (d // group) * 8 + (length - values_q) * d * 4
        assert step.layer_bytes == ((keys + values) * heads,) * config.num_hidden_layers
        assert step.tokens == length


def test_kivi_int2_reads_keys_close_to_the_full_ones(lm):
    events = run(lm, kv_dtype="int2", kivi_group=2, kivi_residual=2)
    quality = of_type(events, KVQuality)[0]
    assert len(quality.kl) == NEW and quality.mean_kl > 0  # something was quantized, and it is measured


@pytest.mark.parametrize("options, why", [
    ({"kv_keep": "sinks", "kv_dtype": "int4"}, "combine it with --kv-dtype model"),
    ({"kv_keep": "h2o", "kv_window": 8, "kv_budget": 8}, "smaller than the budget"),
    ({"kv_dtype": "int4", "kivi_group": 4, "kivi_residual": 6}, "multiple of --kivi-group"),
    ({"kv_keep": "sinks", "paged": True}, "drop --paged"),
    ({"kv_dtype": "int4", "paged": True}, "use --kv-dtype int4-per-token or int8 with --paged"),
    ({"kv_dtype": "int2", "samples": 2}, "holds one sequence"),
])
def test_settings_that_cannot_work_are_refused(tiny_lm, options, why):
    with pytest.raises(ConfigError, match=why):
        run(tiny_lm, **options)
