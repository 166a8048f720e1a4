"""KIVI is the plain quantized cache: ``--kv-dtype int4`` / ``int2`` are KIVI's, the per-token codes are
``int4-per-token`` (and ``int8``), the paged cache keeps those and refuses KIVI by name; saved runs of the older
names (``kivi-int4``, and ``int4`` from before KIVI came) still read as what they ran. KIVI's cache reorders its rows
for beam search (codes, scales and full-precision tails alike)."""

from __future__ import annotations

import json

import pytest
import torch

from playground.config import ConfigError, KVSettings, RunSettings
from playground.engine.kv.compressed import KIVILayer
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events import dumps_event, event_from_dict
from playground.events.kv import KVStarted, KVStep

PROMPT = "the cat sat on the mat"


def started(kv_dtype: str, kivi_group: int) -> KVStarted:
    return KVStarted(holder="contiguous", block_size=0, kv_dtype=kv_dtype, attn="sdpa", layers=2, kv_heads=2,
                     head_dim=8, bytes_per_element=0.5, formula_bytes_per_token=16.0, weights_bytes=1, max_length=9,
                     peak_flops=1.0, peak_bytes_per_s=1.0, kivi_group=kivi_group)


def test_saved_runs_of_the_older_names_read_as_what_they_ran():
    # A KV group saved before KIVI came: every field of then, int4 meaning per-token codes.
    before = {"no_cache": False, "paged": False, "block_size": 16, "kv_dtype": "int4", "attn": "model",
              "samples": 1, "compare_no_cache": True, "batch_sweep": ""}
    assert KVSettings.from_plain_dict(before)[0].kv_dtype == "int4-per-token"
    assert KVSettings.from_plain_dict({**before, "kivi_group": 32})[0].kv_dtype == "int4"  # saved since: KIVI
    assert KVSettings.from_plain_dict({"kv_dtype": "int4"})[0].kv_dtype == "int4"  # a preset's own group
    assert KVSettings.from_plain_dict({"kv_dtype": "kivi-int4"})[0].kv_dtype == "int4"
    assert KVSettings.from_plain_dict({"kv_dtype": "kivi-int2"})[0].kv_dtype == "int2"
    settings, unknown = RunSettings.from_plain_dict({"strategy": "kv-cache", "kv": {"kv_dtype": "kivi-int2"}})
    assert not unknown and settings.group(KVSettings).kv_dtype == "int2"
    settings.validate()  # a renamed saved run runs again

    def reread(event: KVStarted) -> str:
        return event_from_dict(json.loads(dumps_event(event))).kv_dtype

    assert reread(started("kivi-int4", 32)) == "int4"
    assert reread(started("int4", 0)) == "int4-per-token"  # no KIVI group: the per-token cache's run
    assert reread(started("int4", 32)) == "int4"
    assert reread(started("int8", 0)) == "int8"


def run(lm, options: dict) -> list:
    plain = {"prompt": PROMPT, "chat": False, "strategy": "kv-cache", "max_new_tokens": 6,
             "compare_no_cache": False, **options}
    return list(run_strategy(lm, RunSettings.from_flat(**plain)))


def test_int4_is_kivi_and_per_token_codes_keep_their_own_name(tiny_lm):
    config = tiny_lm.model.config
    d, heads = config.hidden_size // config.num_attention_heads, config.num_key_value_heads
    prompt = len(encode_prompt(tiny_lm, RunSettings(prompt=PROMPT, chat=False))[0])
    length = prompt + 5  # the last step's positions
    kivi = run(tiny_lm, {"kv_dtype": "int4", "kivi_group": 2, "kivi_residual": 2})
    keys_q, values_q = length // 2 * 2, length - 2  # KIVI's layout (group 2, residual 2), counted here
    kivi_bytes = (keys_q * d // 2 + keys_q // 2 * d * 8 + (length - keys_q) * d * 4
                  + values_q * d // 2 + values_q * (d // 2) * 8 + 2 * d * 4) * heads
    last = [e for e in kivi if isinstance(e, KVStep)][-1]
    assert last.layer_bytes == (kivi_bytes,) * config.num_hidden_layers
    for options in ({"kv_dtype": "int4-per-token"}, {"kv_dtype": "int4-per-token", "paged": True, "block_size": 1}):
        events = run(tiny_lm, options)
        last = [e for e in events if isinstance(e, KVStep)][-1]
        # Per token and head, keys and values: d codes of half a byte plus a float32 step and offset.
        assert last.total_bytes == 2 * length * heads * (d // 2 + 8) * config.num_hidden_layers
        assert next(e for e in events if isinstance(e, KVStarted)).kv_dtype == "int4-per-token"
    with pytest.raises(ConfigError, match="int4-per-token or int8 with --paged"):
        run(tiny_lm, {"kv_dtype": "int4", "paged": True})


def test_kivi_rows_reorder_as_beams_do():
    """A layer reordered after a step holds what a layer fed the reordered rows from the start holds: per-row
    quantization, so the codes, scales and tails of each row move with it."""
    torch.manual_seed(0)
    first, second = torch.randn(3, 2, 9, 8), torch.randn(3, 2, 4, 8)  # [beams, kv_heads, tokens, d]
    order = torch.tensor([2, 0, 0])
    moved, fed = KIVILayer(4, group=2, residual=4), KIVILayer(4, group=2, residual=4)
    moved.update(first, first * 2)
    moved.reorder_cache(order)
    fed.update(first[order], first[order] * 2)
    keys, values = moved.update(second, second * 2)
    expected_keys, expected_values = fed.update(second, second * 2)
    assert moved.key_codes.shape[-2] > 0 and moved.value_codes.shape[-2] > 0  # codes were reordered, not only tails
    assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)


def test_beam_search_runs_on_kivi(tiny_lm):
    """Beams on a KIVI cache whose residual holds the whole sequence (nothing quantized) are transformers' own
    beam search: its tails follow the beams."""
    ids = torch.tensor([encode_prompt(tiny_lm, RunSettings(prompt=PROMPT, chat=False))[0]])
    out = tiny_lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=3,
                                 max_new_tokens=8, min_new_tokens=8, early_stopping=False,
                                 pad_token_id=tiny_lm.tokenizer.pad_token_id)
    events = list(run_strategy(tiny_lm, RunSettings.from_flat(
        prompt=PROMPT, chat=False, strategy="beam", num_beams=3, max_new_tokens=8, kv_dtype="int4",
        kivi_group=32, kivi_residual=64)))
    assert next(e for e in events if isinstance(e, KVStarted)).kivi_group == 32
    assert list(events[-1].token_ids) == out[0, ids.shape[1]:].tolist()
