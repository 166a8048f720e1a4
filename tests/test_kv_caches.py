"""The paged and the quantized KV caches on real (tiny, random-weight) Llama models.

References: transformers' DynamicCache (same tokens, same logits, same keys bit for bit), the arithmetic of block
tables and of quantization steps worked out by hand.
"""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache

from playground.engine.kv.paged import PagedCache
from playground.engine.kv.quantized import QuantizedKVCache, dequantize, pack_int4, quantize, unpack_int4
from playground.events.kv import KVBlocks

# The tiny model: 2 layers, 2 KV heads, head_dim 8, float32 -> one token slot is 2 (K, V) × 2 × 8 × 4 = 128 bytes
# per layer, 256 bytes over both layers.
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 8
SLOT_BYTES = 2 * KV_HEADS * HEAD_DIM * 4 * LAYERS


def prompt(n: int, offset: int = 5) -> list[int]:
    return [offset + (7 * i) % 200 for i in range(n)]


@torch.inference_mode()
def greedy(model, prompt_ids: list[int], new_tokens: int, cache) -> tuple[list[int], torch.Tensor]:
    """(tokens, logits [new_tokens, vocab]) of a manual greedy loop (EOS ignored)."""
    logits = model(input_ids=torch.tensor([prompt_ids]), cache=cache, use_cache=True).logits[:, -1]
    tokens, rows = [], [logits]
    for _ in range(new_tokens - 1):
        tokens.append(int(logits.argmax(-1)))
        logits = model(input_ids=torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True).logits[:, -1]
        rows.append(logits)
    tokens.append(int(logits.argmax(-1)))
    return tokens, torch.cat(rows)


@torch.inference_mode()
def feed(model, cache, ids: list[list[int]]) -> torch.Tensor:
    """One forward pass of ``ids`` [rows, tokens]; returns the last position's logits [rows, vocab]."""
    return model(input_ids=torch.tensor(ids), cache=cache, use_cache=True).logits[:, -1]


def assert_same_kv(cache, reference) -> None:
    """Every layer's keys and values bit-identical ([rows, kv_heads, seq, head_dim])."""
    assert len(cache.layers) == len(reference.layers)
    for ours, theirs in zip(cache.layers, reference.layers, strict=True):
        assert torch.equal(ours.keys, theirs.keys)
        assert torch.equal(ours.values, theirs.values)


@pytest.fixture(scope="module")
def model(tiny_lm):
    return tiny_lm.model


@pytest.fixture(scope="module")
def config(model):
    return model.config


def test_tiny_model_shape_matches_the_byte_constants(config):
    assert (config.num_hidden_layers, config.num_key_value_heads) == (LAYERS, KV_HEADS)
    assert config.hidden_size // config.num_attention_heads == HEAD_DIM


# --- paged: the same model outputs as DynamicCache -------------------------------------------------------------

@pytest.mark.parametrize("block_size", [1, 3, 16])
@pytest.mark.parametrize("prompt_len", [5, 16, 17])
def test_paged_greedy_equals_dynamic_cache(model, config, block_size, prompt_len):
    ids = prompt(prompt_len)
    expected, expected_logits = greedy(model, ids, 24, reference := DynamicCache(config=config))
    cache = PagedCache(config, block_size=block_size)
    tokens, logits = greedy(model, ids, 24, cache)
    assert tokens == expected
    assert torch.allclose(logits, expected_logits, rtol=0, atol=1e-5)
    assert_same_kv(cache, reference)
    held = prompt_len + 23  # the last token is never fed back
    assert cache.get_seq_length() == held
    assert cache.blocks().blocks_allocated == math.ceil(held / block_size)


def test_paged_greedy_equals_dynamic_cache_with_eager_attention():
    from support.tiny_models import build_tiny_lm

    eager = build_tiny_lm(seed=0).model
    eager.set_attn_implementation("eager")
    ids = prompt(11)
    expected, expected_logits = greedy(eager, ids, 20, DynamicCache(config=eager.config))
    tokens, logits = greedy(eager, ids, 20, PagedCache(eager.config, block_size=4))
    assert tokens == expected
    assert torch.allclose(logits, expected_logits, rtol=0, atol=1e-5)


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_beam_search_in_generate_equals_dynamic_cache(model, config, block_size):
    ids = torch.tensor([prompt(10)])
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, num_beams=3, num_return_sequences=3,
                  max_new_tokens=20, output_scores=True, return_dict_in_generate=True)
    with torch.inference_mode():
        expected = model.generate(ids, **kwargs)
        cache = PagedCache(config, block_size=block_size)
        out = model.generate(ids, cache=cache, **kwargs)
    assert torch.equal(out.sequences, expected.sequences)
    assert torch.allclose(out.sequences_scores, expected.sequences_scores, rtol=0, atol=1e-5)
    for ours, theirs in zip(out.scores, expected.scores, strict=True):
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-5)
    # The beams share their history: the cache holds fewer slots than three separate copies would.
    stats = cache.blocks()
    assert stats.shared and stats.slots_used < 3 * cache.get_seq_length()


@pytest.mark.parametrize("block_size", [1, 3, 16])
def test_paged_reorder_cache_matches_dynamic_cache_step_by_step(model, config, block_size):
    """Prefill once, expand to 3 rows, then random parents and tokens every step (beam search's cache traffic)."""
    gen = torch.Generator().manual_seed(block_size)
    paged, reference = PagedCache(config, block_size=block_size), DynamicCache(config=config)
    ids = [prompt(7)]
    assert torch.equal(feed(model, paged, ids), feed(model, reference, ids))
    expand = torch.zeros(3, dtype=torch.long)
    paged.reorder_cache(expand)
    reference.reorder_cache(expand)
    for _ in range(12):
        tokens = torch.randint(5, 200, (3, 1), generator=gen).tolist()
        ours, theirs = feed(model, paged, tokens), feed(model, reference, tokens)
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-5)
        parents = torch.randint(0, 3, (3,), generator=gen)
        paged.reorder_cache(parents)
        reference.reorder_cache(parents)
        assert_same_kv(paged, reference)
    refs = [0] * paged.capacity
    for table in paged.tables:
        for block in table:
            refs[block] += 1
    assert refs == paged.refs  # reference counts are the number of tables holding each block


def test_forked_samples_decode_like_separate_caches(model, config):
    """Parallel samples of one prompt: prefill once, fork, each row continues as if it had its own cache."""
    ids = prompt(13)
    cache = PagedCache(config, block_size=4)
    feed(model, cache, [ids])
    assert cache.fork(0, copies=2) == [1, 2]
    continuations = [[40, 41, 42, 43, 44], [50, 51, 52, 53, 54], [40, 41, 60, 61, 62]]
    for step in range(5):
        ours = feed(model, cache, [[c[step]] for c in continuations])
        for row, c in enumerate(continuations):
            alone = DynamicCache(config=config)
            feed(model, alone, [ids + c[:step]])
            assert torch.allclose(ours[row], feed(model, alone, [[c[step]]])[0], rtol=0, atol=1e-5)


# --- paged: copy-on-write, sharing, freeing ---------------------------------------------------------------------

def test_copy_on_write_never_changes_the_other_sequence(model, config):
    cache = PagedCache(config, block_size=4)
    feed(model, cache, [prompt(6)])  # blocks 0 (4 tokens) and 1 (2 of 4)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]  # [1, h, 6, d] each
    cache.fork(0)
    assert cache.blocks().shared == (0, 1)
    gen = torch.Generator().manual_seed(0)
    new = [(torch.randn(2, KV_HEADS, 1, HEAD_DIM, generator=gen), torch.randn(2, KV_HEADS, 1, HEAD_DIM, generator=gen))
           for _ in cache.layers]  # a different position-6 key and value for each row
    with torch.inference_mode():
        for i, (k, v) in enumerate(new):
            cache.update(k, v, i)
    for layer, (keys, values), (k, v) in zip(cache.layers, before, new, strict=True):
        for row in (0, 1):
            assert torch.equal(layer.keys[row, :, :6], keys[0]) and torch.equal(layer.values[row, :, :6], values[0])
            # Without the copy both rows write slot 6 of the shared block: the later write wins for both.
            assert torch.equal(layer.keys[row, :, 6], k[row, :, 0])
            assert torch.equal(layer.values[row, :, 6], v[row, :, 0])
    # Row 0 wrote first into the shared partial block: it got a copy (block 2); row 1 then owned block 1 alone.
    assert cache.blocks() == KVBlocks(tables=((0, 2), (0, 1)), shared=(0,), blocks_allocated=3, slots_allocated=12,
                                      slots_used=4 + 3 + 3, fragmentation=1 - 10 / 12)


def test_full_shared_blocks_are_never_copied(model, config):
    cache = PagedCache(config, block_size=4)
    feed(model, cache, [prompt(8)])  # two full blocks
    cache.fork(0)
    feed(model, cache, [[30], [31]])  # position 8 starts a new block for each row
    assert cache.blocks().tables == ((0, 1, 2), (0, 1, 3))
    assert cache.blocks().shared == (0, 1)


def test_shared_blocks_are_counted_once_and_freed_when_nobody_holds_them(model, config):
    cache = PagedCache(config, block_size=16)
    feed(model, cache, [prompt(20)])
    alone = cache.nbytes
    assert alone == 2 * 16 * SLOT_BYTES
    cache.fork(0, copies=3)
    assert cache.nbytes == alone  # four sequences, the same two blocks
    assert cache.blocks().blocks_allocated == 2 and cache.blocks().slots_used == 20
    feed(model, cache, [[30], [31], [32], [33]])  # rows 0-2 copy the shared partial block; row 3 keeps it
    assert cache.blocks().tables == ((0, 2), (0, 3), (0, 4), (0, 1))
    assert cache.nbytes == 5 * 16 * SLOT_BYTES
    cache.reorder_cache(torch.tensor([3, 3]))  # keep only the last sequence, twice
    assert cache.blocks().tables == ((0, 1), (0, 1))
    assert sorted(cache.free) == [2, 3, 4, *range(5, cache.capacity)]
    assert cache.blocks().blocks_allocated == 2 and cache.refs[:2] == [2, 2]
    cache.crop(-cache.get_seq_length())
    assert cache.blocks().blocks_allocated == 0 and len(cache.free) == cache.capacity
    assert cache.nbytes == 0


def test_block_arithmetic_and_bytes_on_hand_computed_cases(model, config):
    cache = PagedCache(config, block_size=16)
    feed(model, cache, [prompt(20)])
    assert cache.blocks() == KVBlocks(tables=((0, 1),), shared=(), blocks_allocated=2, slots_allocated=32,
                                      slots_used=20, fragmentation=0.375)
    assert cache.layer_bytes() == (32 * SLOT_BYTES // LAYERS,) * LAYERS
    assert (cache.nbytes, cache.used_bytes) == (32 * SLOT_BYTES, 20 * SLOT_BYTES)
    assert cache.reserved_bytes == 2 * 16 * SLOT_BYTES  # the pool grew 1 -> 2 blocks
    cache.fork(0)
    feed(model, cache, [[30], [31]])
    # Block 0: 16 used; row 0's copy of block 1 and row 1's block 1: 5 used each -> 26 of 48.
    assert cache.blocks() == KVBlocks(tables=((0, 2), (0, 1)), shared=(0,), blocks_allocated=3,
                                      slots_allocated=48, slots_used=26, fragmentation=1 - 26 / 48)
    assert cache.reserved_bytes == 4 * 16 * SLOT_BYTES  # grew 2 -> 4 blocks, one still free
    assert cache.free == [3]
    one = PagedCache(config, block_size=1)
    feed(model, one, [prompt(9)])
    assert one.blocks().fragmentation == 0.0 and one.blocks().slots_allocated == 9


def test_initial_blocks_reserve_the_pool_up_front(model, config):
    cache = PagedCache(config, block_size=4, initial_blocks=10)
    greedy(model, prompt(10), 8, cache)  # 17 positions -> 5 blocks
    assert cache.capacity == 10 and cache.reserved_bytes == 10 * 4 * SLOT_BYTES
    assert cache.blocks().blocks_allocated == 5 and cache.nbytes == 5 * 4 * SLOT_BYTES


def test_crop_rollback_equals_a_fresh_cache_of_the_kept_tokens(model, config):
    ids = prompt(7)
    cache = PagedCache(config, block_size=3)
    tokens, _ = greedy(model, ids, 9, cache)  # holds 7 + 8 = 15 positions, 5 blocks
    assert cache.blocks().blocks_allocated == 5
    cache.crop(-5)  # keep the prompt and 3 generated tokens: 10 positions, 4 blocks
    fresh = PagedCache(config, block_size=3)
    feed(model, fresh, [ids])
    for token in tokens[:3]:
        feed(model, fresh, [[token]])
    assert cache.get_seq_length() == fresh.get_seq_length() == 10
    assert_same_kv(cache, fresh)
    assert cache.blocks().blocks_allocated == 4 and cache.capacity - len(cache.free) == 4
    # Continuing from the rolled-back cache gives the same logits as continuing from the fresh one.
    for token in (tokens[3], 77, 78, 79):
        assert torch.allclose(feed(model, cache, [[token]]), feed(model, fresh, [[token]]), rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="negative"):
        cache.crop(2)


def test_crop_after_fork_keeps_blocks_another_sequence_holds(model, config):
    cache = PagedCache(config, block_size=4)
    feed(model, cache, [prompt(10)])  # blocks 0, 1, 2 (2 of 4)
    cache.fork(0)
    feed(model, cache, [[30], [31]])  # row 0 copies block 2 -> 3
    cache.crop(-6)  # 5 positions left: blocks 0, 1 each
    assert cache.blocks().tables == ((0, 1), (0, 1))
    assert sorted(cache.free) == [2, 3, *range(4, cache.capacity)]
    feed(model, cache, [[40], [41]])  # position 5 is in shared block 1: copied for row 0
    assert cache.blocks().tables == ((0, 2), (0, 1))


def test_the_batch_must_match_the_sequences(model, config):
    cache = PagedCache(config, block_size=4)
    feed(model, cache, [prompt(5)])
    with pytest.raises(ValueError, match="fork or reorder_cache"):
        feed(model, cache, [[1], [2]])


# --- quantized ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("bits", [8, 4])
def test_dequantization_error_is_within_half_a_step(bits):
    gen = torch.Generator().manual_seed(bits)
    x = torch.randn(2, 3, 40, 64, generator=gen) * torch.rand(2, 3, 40, 1, generator=gen) * 5
    x[0, 0, 0, 0] = 300.0  # an outlier spoils only its own vector's step
    x[1, 2, 3] = 1.5  # a constant vector comes back exactly
    codes, params = quantize(x, bits)
    assert codes.dtype == torch.uint8 and codes.shape == (2, 3, 40, 64 * bits // 8)
    assert params.dtype == torch.float32 and params.shape == (2, 3, 40, 2)
    back = dequantize(codes, params, bits, torch.float32)
    step = params[..., :1]
    assert bool(((back - x).abs() <= step / 2 * (1 + 1e-5) + 1e-6).all())
    assert torch.equal(back[1, 2, 3], x[1, 2, 3])
    full = codes if bits == 8 else unpack_int4(codes)  # asymmetric: every vector uses the lowest and highest code
    assert bool((full.amin(-1) == 0).all()) and bool((full[0, 0, 1:].amax(-1) == (1 << bits) - 1).all())
    assert float(step[0, 0, 0]) == pytest.approx((300.0 - float(x[0, 0, 0].min())) / ((1 << bits) - 1))


def test_int4_packing_round_trips_exactly():
    every_byte = torch.arange(256, dtype=torch.uint8)
    assert torch.equal(pack_int4(unpack_int4(every_byte)), every_byte)
    codes = torch.randint(0, 16, (3, 5, 64), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_int4(pack_int4(codes)), codes)
    assert pack_int4(torch.tensor([1, 2, 15, 0], dtype=torch.uint8)).tolist() == [0x21, 0x0F]  # low nibble first
    with pytest.raises(ValueError, match="even"):
        quantize(torch.zeros(3, 7), 4)


@pytest.mark.parametrize(("kv_dtype", "code_bytes"), [("int8", HEAD_DIM), ("int4", HEAD_DIM // 2)])
def test_quantized_bytes_equal_the_formula(model, config, kv_dtype, code_bytes):
    cache = QuantizedKVCache(config, kv_dtype=kv_dtype)
    greedy(model, prompt(9), 5, cache)  # 9 + 4 positions
    per_vector = code_bytes + 8  # codes + float32 step and offset
    assert cache.layer_bytes() == (2 * KV_HEADS * 13 * per_vector,) * LAYERS
    assert cache.nbytes == LAYERS * 2 * KV_HEADS * 13 * per_vector
    tail = QuantizedKVCache(config, kv_dtype=kv_dtype, residual_length=5)
    greedy(model, prompt(9), 5, tail)  # 8 quantized, the newest 5 in float32
    assert tail.nbytes == LAYERS * 2 * KV_HEADS * (8 * per_vector + 5 * HEAD_DIM * 4)


@pytest.mark.parametrize("kv_dtype", ["int8", "int4"])
def test_quantized_cache_stores_each_key_within_half_a_step(model, config, kv_dtype):
    cache, reference = QuantizedKVCache(config, kv_dtype=kv_dtype), DynamicCache(config=config)
    feed(model, cache, [prompt(12)])
    feed(model, reference, [prompt(12)])
    layer = cache.layers[0]  # layer 0's keys and values come from the embeddings: the same input in both caches
    for parts, ours, theirs in ((layer.key_parts, layer.keys, reference.layers[0].keys),
                                (layer.value_parts, layer.values, reference.layers[0].values)):
        step = parts[1][..., :1]  # [1, h, 12, 1]
        assert bool(((ours - theirs).abs() <= step / 2 * (1 + 1e-5) + 1e-6).all())
        assert not torch.equal(ours, theirs)


def test_quantized_cache_with_a_full_residual_window_is_exact(model, config):
    expected, expected_logits = greedy(model, prompt(9), 12, DynamicCache(config=config))
    tokens, logits = greedy(model, prompt(9), 12, QuantizedKVCache(config, kv_dtype="int4", residual_length=100))
    assert tokens == expected and torch.equal(logits, expected_logits)


def test_int8_cache_stays_close_to_full_precision(model, config):
    ids = prompt(20)
    _, expected_logits = greedy(model, ids, 16, DynamicCache(config=config))
    _, logits = greedy(model, ids, 16, QuantizedKVCache(config, kv_dtype="int8"))
    assert float((logits - expected_logits).abs().max()) < 0.05


@pytest.mark.parametrize("kv_dtype", ["int8", "int4"])
def test_paged_quantized_equals_contiguous_quantized(model, config, kv_dtype):
    expected, expected_logits = greedy(model, prompt(11), 16, QuantizedKVCache(config, kv_dtype=kv_dtype))
    cache = PagedCache(config, block_size=3, kv_dtype=kv_dtype)
    tokens, logits = greedy(model, prompt(11), 16, cache)
    assert tokens == expected
    assert torch.allclose(logits, expected_logits, rtol=0, atol=1e-6)
    per_vector = (HEAD_DIM * (8 if kv_dtype == "int8" else 4) // 8) + 8
    assert cache.nbytes == math.ceil(26 / 3) * 3 * LAYERS * 2 * KV_HEADS * per_vector


def test_quantized_crop_and_reorder_move_codes_exactly(model, config):
    cache = QuantizedKVCache(config, kv_dtype="int4")
    feed(model, cache, [prompt(6), prompt(6, offset=20)])
    snapshot = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]  # [2, h, 6, d]
    feed(model, cache, [[30, 31, 32], [33, 34, 35]])
    cache.crop(-3)
    for layer, (keys, values) in zip(cache.layers, snapshot, strict=True):
        assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
    cache.reorder_cache(torch.tensor([1, 0]))
    for layer, (keys, values) in zip(cache.layers, snapshot, strict=True):
        assert torch.equal(layer.keys, keys.flip(0)) and torch.equal(layer.values, values.flip(0))
