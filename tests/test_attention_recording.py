"""The attention rows recorded during the real decode (``--record-attention``) against softmax(q kᵀ/√d + causal
mask) computed here from each layer's own norm output, q/k projections and rotary embedding (through the anatomy
seam), for two families and both attention implementations; every recorded row sums to 1."""

from __future__ import annotations

import pytest
import torch
from support.tiny_models import build_tiny_lm

from playground.config import RunSettings
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events.attention import AttentionRow, AttentionStarted
from playground.models.anatomy import anatomy_of

PROMPT = "the cat sat on the mat"
NEW = 5


def rotate(x, cos, sin):  # the rotary embedding's rotation, written out: x·cos + rotate_half(x)·sin
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


def reference_rows(lm, ids: list[int]) -> list[torch.Tensor]:
    """Per layer: [heads, positions, positions] attention of the whole sequence from the layer's projections."""
    anatomy = anatomy_of(lm.model)
    config = lm.model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    d = config.hidden_size // heads
    normed = {}
    hooks = [layer.attention.norm.register_forward_hook(lambda m, a, out, i=layer.index: normed.__setitem__(i, out))
             for layer in anatomy.all_layers()]
    x = torch.tensor([ids])
    with torch.inference_mode():
        lm.model(input_ids=x)
        cos, sin = anatomy.rotary(normed[0], torch.arange(len(ids))[None])
    for hook in hooks:
        hook.remove()
    rows = []
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    for layer in anatomy.all_layers():
        parts = {parts[0]: module for _, module, parts in layer.attention.inputs}
        with torch.inference_mode():
            q = parts["q"](normed[layer.index]).view(1, len(ids), heads, d).transpose(1, 2)
            k = parts["k"](normed[layer.index]).view(1, len(ids), kv_heads, d).transpose(1, 2)
        q, k = rotate(q, cos[:, None], sin[:, None]), rotate(k, cos[:, None], sin[:, None])
        k = k.repeat_interleave(heads // kv_heads, dim=1)
        scores = (q @ k.transpose(-1, -2)) / d**0.5
        rows.append(scores.masked_fill(~causal, float("-inf")).softmax(-1)[0])
    return rows


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_recorded_rows_equal_softmax_of_the_layers_own_q_and_k(family, attn):
    lm = build_tiny_lm(seed=0, family=family)
    events = list(run_strategy(lm, RunSettings.from_flat(
        prompt=PROMPT, chat=False, strategy="kv-cache", max_new_tokens=NEW, compare_no_cache=False, attn=attn,
        record_attention=True, attention_top=0)))
    start = next(e for e in events if isinstance(e, AttentionStarted))
    recorded = [e for e in events if isinstance(e, AttentionRow)]
    prompt = encode_prompt(lm, RunSettings(prompt=PROMPT, chat=False))[0]
    assert len(start.prompt_tokens) == len(prompt) and start.heads == lm.model.config.num_attention_heads
    generated = list(events[-1].token_ids)
    reference = reference_rows(lm, prompt + generated[:-1])
    assert [r.step for r in recorded] == list(range(NEW))
    for row in recorded:
        query = len(prompt) - 1 + row.step
        assert row.query_position == query
        for layer, expected in enumerate(reference):
            for head in range(start.heads):
                got = torch.zeros(query + 1)
                got[list(row.positions[layer][head])] = torch.tensor(row.weights[layer][head])
                assert torch.allclose(got, expected[head, query, : query + 1], atol=2e-6), (layer, head, row.step)
                assert abs(sum(row.weights[layer][head]) + row.rest[layer][head] - 1) < 1e-5


def test_top_positions_keep_the_largest_weights_and_the_rest_as_mass(tiny_lm):
    events = list(run_strategy(tiny_lm, RunSettings.from_flat(
        prompt=PROMPT, chat=False, strategy="kv-cache", max_new_tokens=3, compare_no_cache=False,
        record_attention=True, attention_top=3)))
    full = list(run_strategy(tiny_lm, RunSettings.from_flat(
        prompt=PROMPT, chat=False, strategy="kv-cache", max_new_tokens=3, compare_no_cache=False,
        record_attention=True, attention_top=0)))
    top = [e for e in events if isinstance(e, AttentionRow)]
    every = [e for e in full if isinstance(e, AttentionRow)]
    for short, whole in zip(top, every, strict=True):
        for layer in range(len(whole.weights)):
            for head in range(len(whole.weights[layer])):
                ranked = sorted(zip(whole.weights[layer][head], whole.positions[layer][head], strict=True),
                                reverse=True)[:3]
                assert list(short.positions[layer][head]) == [p for _, p in ranked]
                assert short.rest[layer][head] == pytest.approx(1 - sum(w for w, _ in ranked), abs=1e-5)


def test_evicted_positions_are_not_attended(tiny_lm):
    events = list(run_strategy(tiny_lm, RunSettings.from_flat(
        prompt=PROMPT, chat=False, strategy="kv-cache", max_new_tokens=4, compare_no_cache=False,
        record_attention=True, attention_top=0, kv_keep="sinks", kv_sinks=1, kv_window=3)))
    for row in [e for e in events if isinstance(e, AttentionRow)]:
        q = row.query_position
        # step 0: the prompt's last query read the whole prompt (eviction follows the pass); then the sink, the
        # window of 3 held, and the query's own key
        expected = set(range(q + 1)) if row.step == 0 else {0, *range(q - 3, q + 1)}
        assert {p for layer in row.positions for head in layer for p in head} == expected
