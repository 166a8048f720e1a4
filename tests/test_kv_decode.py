"""The ``kv-cache`` strategy: its tokens against ``model.generate``, its bytes against the formula and the cache
tensors counted here, the paged cache's block tables against a count by hand, and the end-of-run comparisons."""

from __future__ import annotations

import json
import math

import pytest
import torch

from playground.config import RunSettings
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events import PrefillDone, RunFinished, TokenStep, dumps_event, event_from_dict
from playground.events.kv import KVCompare, KVPhase, KVStarted, KVStep, KVSweep

PROMPT = "the cat sat on the mat"
NEW = 10


def run(lm, **settings) -> list:
    options = {"prompt": PROMPT, "chat": False, "strategy": "kv-cache", "max_new_tokens": NEW,
               "compare_no_cache": False, **settings}
    return list(run_strategy(lm, RunSettings.from_flat(**options)))


def of_type(events: list, cls: type) -> list:
    return [e for e in events if isinstance(e, cls)]


def reference(lm, n: int = NEW) -> tuple[list[int], list[int]]:
    ids = encode_prompt(lm, RunSettings(prompt=PROMPT, chat=False))[0]
    tensor = torch.tensor([ids])
    out = lm.model.generate(tensor, attention_mask=torch.ones_like(tensor), do_sample=False, max_new_tokens=n,
                            min_new_tokens=n, pad_token_id=lm.tokenizer.pad_token_id)
    return ids, out[0, len(ids):].tolist()


def per_token_per_layer(lm) -> int:
    config = lm.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    return 2 * config.num_key_value_heads * head_dim * 4  # keys and values, float32


@pytest.mark.parametrize("options", [{}, {"paged": True, "block_size": 3}, {"no_cache": True}, {"attn": "eager"}],
                         ids=["contiguous", "paged", "no-cache", "eager"])
def test_every_holder_decodes_plain_greedy(tiny_lm, options):
    events = run(tiny_lm, **options)
    _, expected = reference(tiny_lm)
    assert list(events[-1].token_ids) == expected
    assert tiny_lm.model.config._attn_implementation == "sdpa"  # the run put the attention back


def test_bytes_per_layer_equal_the_tensors_and_the_formula(tiny_lm):
    events = run(tiny_lm)
    prompt, _ = reference(tiny_lm)
    layers = tiny_lm.model.config.num_hidden_layers
    per_layer = per_token_per_layer(tiny_lm)
    steps, tokens = of_type(events, KVStep), of_type(events, TokenStep)
    assert [s.step for s in steps] == [t.step for t in tokens] == list(range(NEW))
    for i, (step, token) in enumerate(zip(steps, tokens, strict=True)):
        held = len(prompt) + i  # the newest token is read by the next step
        assert step.tokens == held
        assert step.layer_bytes == (held * per_layer,) * layers
        assert step.total_bytes == step.formula_bytes == token.kv_cache_bytes == held * per_layer * layers
        assert step.process_bytes > 0 and step.blocks is None
    start = of_type(events, KVStarted)[0]
    assert (start.holder, start.formula_bytes_per_token) == ("contiguous", per_layer * layers)
    assert start.weights_bytes == sum(p.numel() * p.element_size() for p in tiny_lm.model.parameters()) + sum(
        b.numel() * b.element_size() for b in tiny_lm.model.buffers())
    assert start.peak_flops > 0 and start.peak_bytes_per_s > 0


@pytest.mark.parametrize("block", [1, 3, 16])
def test_the_paged_cache_holds_whole_blocks(tiny_lm, block):
    events = run(tiny_lm, paged=True, block_size=block)
    prompt, _ = reference(tiny_lm)
    layers = tiny_lm.model.config.num_hidden_layers
    for i, step in enumerate(of_type(events, KVStep)):
        held = len(prompt) + i
        blocks = math.ceil(held / block)
        assert len(step.blocks.tables) == 1 and len(step.blocks.tables[0]) == blocks
        assert (step.blocks.slots_used, step.blocks.slots_allocated) == (held, blocks * block)
        assert step.blocks.fragmentation == pytest.approx(1 - held / (blocks * block))
        assert step.formula_bytes == held * per_token_per_layer(tiny_lm) * layers
        # Whole blocks are held: the measured bytes count the empty slots of the last one too.
        assert step.total_bytes == blocks * block * per_token_per_layer(tiny_lm) * layers


def test_no_cache_holds_nothing_and_recomputes(tiny_lm):
    events = run(tiny_lm, no_cache=True)
    assert all(s.total_bytes == 0 and s.tokens == 0 for s in of_type(events, KVStep))
    assert of_type(events, KVStarted)[0].holder == "none"
    assert all(t.kv_cache_bytes == 0 for t in of_type(events, TokenStep))


def test_a_quantized_cache_holds_fewer_bytes(tiny_lm):
    plain = of_type(run(tiny_lm), KVStep)[-1].total_bytes
    int8 = of_type(run(tiny_lm, kv_dtype="int8"), KVStep)[-1].total_bytes
    int4 = of_type(run(tiny_lm, kv_dtype="int4-per-token"), KVStep)[-1].total_bytes
    head_dim = tiny_lm.model.config.hidden_size // tiny_lm.model.config.num_attention_heads
    # Per head and token: head_dim codes of 1 byte (int8) or half a byte (int4), plus a float32 step and offset.
    assert int8 == plain * (head_dim + 8) // (4 * head_dim)
    assert int4 == plain * (head_dim // 2 + 8) // (4 * head_dim)


def test_phases_compare_and_sweep(tiny_lm):
    events = run(tiny_lm, compare_no_cache=True, batch_sweep="1,2,3")
    prompt, expected = reference(tiny_lm)
    phases = {p.phase: p for p in of_type(events, KVPhase)}
    # The first token comes from the prefill's logits: the decode phase is one forward pass fewer.
    assert phases["prefill"].tokens == len(prompt) and phases["decode"].tokens == NEW - 1
    assert phases["prefill"].intensity > phases["decode"].intensity  # prefill reuses each weight per prompt token
    assert events.index(phases["prefill"]) < events.index(of_type(events, PrefillDone)[0])
    (compare,) = of_type(events, KVCompare)
    assert compare.identical and len(compare.cached_ms) == len(compare.uncached_ms) == NEW
    (sweep,) = of_type(events, KVSweep)
    assert sweep.batch_sizes == (1, 2, 3) and all(t > 0 for t in sweep.tokens_per_s)
    assert isinstance(events[-1], RunFinished) and list(events[-1].token_ids) == expected
    for event in events:
        assert event_from_dict(json.loads(dumps_event(event))) == event


def test_parallel_samples_share_the_prompts_blocks_and_copy_on_write(tiny_lm):
    block, samples = 5, 3
    prompt, _ = reference(tiny_lm)
    n = len(prompt)
    assert n % block, "precondition: the prompt ends inside a block, so the first write copies it"
    paged = run(tiny_lm, paged=True, block_size=block, samples=samples, seed=7)
    contiguous = run(tiny_lm, samples=samples, seed=7)
    # The cache's layout changes no logit: the same seed samples the same tokens.
    assert paged[-1].token_ids == contiguous[-1].token_ids
    assert of_type(paged, KVStarted)[0].sequences == samples
    per_token = per_token_per_layer(tiny_lm) * tiny_lm.model.config.num_hidden_layers
    shared_full = n // block
    for s, (step, flat) in enumerate(zip(of_type(paged, KVStep), of_type(contiguous, KVStep), strict=True)):
        held = n + s
        tables = step.blocks.tables
        assert len(tables) == samples and all(len(t) == math.ceil(held / block) for t in tables)
        if s == 0:  # nothing written since the prefill: every block is the prompt's, held by all
            assert step.blocks.blocks_allocated == math.ceil(n / block)
            assert set(step.blocks.shared) == set(tables[0])
        else:  # the prompt's full blocks stay shared; each sequence has its own from the partial one on
            own = math.ceil(held / block) - shared_full
            assert set(step.blocks.shared) == set(tables[0][:shared_full])
            assert step.blocks.blocks_allocated == shared_full + samples * own
        assert step.total_bytes == step.blocks.blocks_allocated * block * per_token
        # A contiguous cache holds a copy of the prompt for every sequence.
        assert flat.total_bytes == flat.formula_bytes == samples * held * per_token


def test_beams_on_a_paged_cache_share_blocks_and_keep_their_own_tokens(tiny_lm):
    from playground.events import BeamStep

    block, beams = 5, 3
    prompt, _ = reference(tiny_lm)
    paged = run(tiny_lm, strategy="beam", num_beams=beams, paged=True, block_size=block, max_new_tokens=8)
    plain = run(tiny_lm, strategy="beam", num_beams=beams, max_new_tokens=8)
    # Copy-on-write keeps every beam's keys its own: the same beams and scores as with one tensor per beam.
    assert paged[-1].sequences == plain[-1].sequences
    start = of_type(paged, KVStarted)[0]
    assert (start.holder, start.sequences) == ("paged", beams)
    per_token = per_token_per_layer(tiny_lm) * tiny_lm.model.config.num_hidden_layers
    steps = of_type(paged, KVStep)
    assert [s.step for s in steps] == [b.step for b in of_type(paged, BeamStep)]
    for s, step in enumerate(steps):
        held = len(prompt) + s
        assert step.tokens == held and len(step.blocks.tables) == beams
        assert set(tuple(t[: len(prompt) // block]) for t in step.blocks.tables) == {
            tuple(step.blocks.tables[0][: len(prompt) // block])}  # the prompt's full blocks: one copy, shared
        assert step.formula_bytes == beams * held * per_token  # what a tensor per beam holds
        assert step.total_bytes == step.blocks.blocks_allocated * block * per_token < step.formula_bytes


@pytest.mark.parametrize("dtype", ["int8", "int4-per-token", "int4"])
def test_a_quantized_cache_reports_where_it_leaves_full_precision(tiny_lm, dtype):
    events = run(tiny_lm, kv_dtype=dtype, max_new_tokens=30)
    _, full = reference(tiny_lm, 30)
    same = [a == b for a, b in zip(events[-1].token_ids, full, strict=True)]
    figures = events[-1].figures
    assert figures["first_divergence"] == (same.index(False) if False in same else -1)
    assert figures["identical_fraction"] == sum(same) / 30


def fed_rows(model, run_it) -> list[list[int]]:
    """The token ids every batched decode pass fed the model, one list per pass (a forward pre-hook: what each
    parallel sequence really continued with; the events carry only the run's own row)."""
    fed: list[list[int]] = []

    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[0] > 1 and ids.shape[1] == 1:
            fed.append(ids[:, 0].tolist())

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        run_it()
    finally:
        handle.remove()
    return fed


@pytest.mark.parametrize("options", [{}, {"paged": True, "block_size": 4}], ids=["contiguous", "paged"])
def test_each_parallel_sample_draws_from_its_own_row(tiny_lm, options):
    """top-k 1 makes every draw its row's own argmax. The run's row is forced to another first token than the
    greedy one, so it parts from the other rows at once: those must go on as plain greedy from the prompt
    (generate() here), the run's row as greedy after its forced token; a row drawn from another row's logits
    would follow that row instead."""
    prompt, greedy = reference(tiny_lm, NEW)
    forced = next(t for t in range(5, 300) if t != greedy[0])
    tensor = torch.tensor([[*prompt, forced]])
    after_forced = tiny_lm.model.generate(tensor, attention_mask=torch.ones_like(tensor), do_sample=False,
                                          max_new_tokens=NEW - 1, min_new_tokens=NEW - 1,
                                          pad_token_id=tiny_lm.tokenizer.pad_token_id)[0, tensor.shape[1]:].tolist()
    assert after_forced[: NEW - 2] != greedy[1 : NEW - 1], "precondition: the rows part"
    events: list = []
    fed = fed_rows(tiny_lm.model, lambda: events.extend(run(tiny_lm, samples=3, top_k=1, seed=3,
                                                            forced_token_ids=(forced,), **options)))
    assert list(events[-1].token_ids) == [forced, *after_forced]
    assert len(fed) == NEW - 1  # steps 1 .. NEW - 1 read the tokens of steps 0 .. NEW - 2
    for row in (1, 2):
        assert [tokens[row] for tokens in fed] == greedy[: NEW - 1], f"row {row}"
    assert [tokens[0] for tokens in fed] == [forced, *after_forced[: NEW - 2]]
