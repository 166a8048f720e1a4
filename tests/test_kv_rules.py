"""The papers' rules as pure functions, on hand-made tensors with the kept sets and values written out by hand:
StreamingLLM's sinks + window, H2O's heavy hitters + recent window (per key head, scores summed over each group of
query heads), KIVI's per-channel keys / per-token values with a full-precision residual."""

from __future__ import annotations

import pytest
import torch

from playground.engine.kv.evict import accumulate_attention, gather_positions, heavy_hitter_keep, sink_window_keep
from playground.engine.kv.kivi import (
    dequantize_keys,
    dequantize_values,
    kivi_counts,
    pack_codes,
    quantize_keys,
    quantize_values,
    unpack_codes,
)


def test_sinks_and_window_keep_the_first_and_the_newest():
    assert sink_window_keep(10, 2, 3).tolist() == [0, 1, 7, 8, 9]
    assert sink_window_keep(5, 2, 3).tolist() == [0, 1, 2, 3, 4]  # nothing to drop yet
    assert sink_window_keep(6, 2, 3).tolist() == [0, 1, 3, 4, 5]
    assert sink_window_keep(8, 0, 2).tolist() == [6, 7]  # a plain window


def test_heavy_hitters_keep_the_best_scored_older_positions_and_the_recent_ones():
    scores = torch.tensor([[5.0, 0.1, 3.0, 0.2, 4.0, 0.3, 0.0, 0.0],  # head 0: heavy at 0, 4, 2
                           [0.1, 9.0, 0.2, 8.0, 0.3, 0.4, 0.0, 0.0]])  # head 1: heavy at 1, 3, 5
    keep = heavy_hitter_keep(scores, budget=4, recent=2)
    assert keep.tolist() == [[0, 4, 6, 7], [1, 3, 6, 7]]
    assert heavy_hitter_keep(scores, budget=8, recent=2).tolist() == [list(range(8))] * 2  # under budget: all
    assert heavy_hitter_keep(scores, budget=3, recent=5).tolist() == [[5, 6, 7]] * 2  # recent capped at budget


def test_equal_scores_keep_the_older_position():
    assert heavy_hitter_keep(torch.tensor([1.0, 2.0, 2.0, 2.0, 0.0]), budget=3, recent=1).tolist() == [1, 2, 4]


def test_scores_add_each_group_of_query_heads_and_every_query():
    scores = torch.zeros(1, 2, 3)  # 2 key heads
    probs = torch.tensor([[[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]],  # query head 0 (key head 0), 2 queries
                           [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]],  # query head 1 (key head 0)
                           [[0.0, 1.0, 0.0], [0.0, 0.5, 0.5]],  # query head 2 (key head 1)
                           [[0.0, 0.0, 1.0], [0.1, 0.1, 0.8]]]])  # query head 3 (key head 1)
    got = accumulate_attention(scores, probs)
    assert torch.allclose(got, torch.tensor([[[1.7, 0.8, 1.5], [0.1, 1.6, 2.3]]]))


def test_gather_per_head_and_for_all_heads():
    x = torch.arange(2 * 4, dtype=torch.float32).view(1, 2, 4, 1)  # head 0: 0..3, head 1: 4..7
    assert gather_positions(x, torch.tensor([0, 3])).flatten().tolist() == [0, 3, 4, 7]
    assert gather_positions(x, torch.tensor([[0, 1], [2, 3]])).flatten().tolist() == [0, 1, 6, 7]
    assert gather_positions(x[..., 0], torch.tensor([[0, 1], [2, 3]])).flatten().tolist() == [0, 1, 6, 7]


def test_kivi_counts_whole_key_blocks_and_values_past_the_window():
    assert kivi_counts(10, 4) == (8, 6)
    assert kivi_counts(3, 4) == (0, 0)
    assert kivi_counts(8, 4) == (8, 4)


@pytest.mark.parametrize("bits", [2, 4])
def test_packing_round_trips(bits):
    codes = torch.randint(0, 1 << bits, (3, 16), dtype=torch.uint8)
    packed = pack_codes(codes, bits)
    assert packed.shape == (3, 16 * bits // 8)
    assert torch.equal(unpack_codes(packed, bits), codes)


def test_keys_get_a_step_per_channel_of_each_token_group():
    # 4 tokens, 4 channels (int2 packs 4 per byte), groups of 2 tokens; channels 1 and 3 are outliers (100×).
    pair = torch.tensor([[0.0, 0.0], [3.0, 300.0], [1.0, -300.0], [4.0, 0.0]])
    keys = torch.cat((pair, pair), dim=1).view(1, 1, 4, 4)
    codes, params = quantize_keys(keys, bits=2, group=2)
    step, low = params[0, 0, :, 0], params[0, 0, :, 1]  # [groups, channels]
    assert step.tolist() == [[1.0, 100.0] * 2, [1.0, 100.0] * 2]
    assert low.tolist() == [[0.0, 0.0] * 2, [1.0, -300.0] * 2]
    assert unpack_codes(codes, 2).view(4, 4).tolist() == [[0, 0] * 2, [3, 3] * 2, [0, 0] * 2, [3, 3] * 2]
    assert torch.equal(dequantize_keys(codes, params, 2, torch.float32), keys)  # exact on its grid
    # Per token instead, channel 0 of token 1 (3.0 next to 300) would round to 0: KIVI's reason for channels.
    assert (torch.tensor([3.0, 300.0]) / 100).round().mul(100)[0] == 0.0


def test_values_get_a_step_per_token_and_channel_group():
    values = torch.tensor([[0.0, 1.0, 2.0, 3.0], [10.0, 10.0, -5.0, 5.0]]).view(1, 1, 2, 4)
    codes, params = quantize_values(values, bits=2, group=2)  # groups of 2 channels
    # steps: a constant group (token 1's first two channels) gets step 1 and every code 0
    assert torch.allclose(params[0, 0, :, :, 0], torch.tensor([[1 / 3, 1 / 3], [1.0, 10 / 3]]))
    assert params[0, 0, :, :, 1].tolist() == [[0.0, 2.0], [10.0, -5.0]]  # offsets
    assert unpack_codes(codes, 2).view(2, 4).tolist() == [[0, 3, 0, 3], [0, 0, 0, 3]]
    assert torch.allclose(dequantize_values(codes, params, 2, torch.float32), values)


def test_int4_keys_are_within_half_a_step():
    torch.manual_seed(0)
    keys = torch.randn(1, 2, 8, 6) * torch.tensor([1.0, 1.0, 8.0, 1.0, 1.0, 1.0])  # one outlier channel
    codes, params = quantize_keys(keys, bits=4, group=4)
    error = (dequantize_keys(codes, params, 4, torch.float32) - keys).abs()
    step = params[:, :, :, 0].repeat_interleave(4, dim=2)  # [b, h, t, d]
    assert (error <= step / 2 + 1e-6).all()
    assert codes.dtype == torch.uint8 and codes.shape == (1, 2, 8, 3)
