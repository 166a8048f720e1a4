"""KV-cache measurements on tiny models: bytes against the formula and the tensors' storage, the machine's
ceilings and their file, phase estimates against hand-computed values, and the timed decodes (no cache, cached,
batched with left padding) against single-prompt greedy and ``model.generate``."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from support.tiny_models import build_tiny_lm
from transformers import DynamicCache, LlamaForCausalLM

from playground.engine.kv import batch, measure
from playground.engine.kv_cache import kv_bytes_per_token, kv_cache_bytes

TEXTS = ["The capital of France is", "Beam search keeps several hypotheses; sampling draws from", "I would"]
# The tiny config: 2 layers, hidden 32, 4 heads, 2 KV heads, head_dim 8, MLP 64.
KV_PER_TOKEN_FP32 = 2 * 2 * 2 * 8 * 4  # K and V x layers x kv_heads x head_dim x 4 bytes = 256


@pytest.fixture(scope="module")
def lm():
    """Our own tiny model: some tests switch its attention implementation."""
    return build_tiny_lm(seed=0)


@pytest.fixture(scope="module")
def prompts(lm):
    return [lm.tokenizer.encode(text) for text in TEXTS]


def filled_cache(model, batch_size: int, prompt_len: int, steps: int) -> DynamicCache:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(3, model.config.vocab_size, (batch_size, prompt_len), generator=generator)
    cache = DynamicCache(config=model.config)
    with torch.inference_mode():
        logits = model(input_ids=ids, cache=cache, use_cache=True).logits
        for _ in range(steps):
            logits = model(input_ids=logits[:, -1:].argmax(-1), cache=cache, use_cache=True).logits
    return cache


# ---- bytes ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype, element", [(torch.float32, 4), (torch.bfloat16, 2)])
def test_layer_bytes_equal_the_formula_and_the_tensors_storage(lm, dtype, element):
    model = lm.model if dtype == torch.float32 else copy.deepcopy(lm.model).to(dtype)
    cache = filled_cache(model, batch_size=3, prompt_len=10, steps=2)  # 12 positions, 3 rows
    sizes = measure.layer_bytes(cache)
    per_layer = 2 * 2 * 8 * 12 * element * 3  # K and V x kv_heads x head_dim x tokens x bytes x rows
    assert sizes == [per_layer, per_layer]
    assert sizes == [layer.keys.untyped_storage().nbytes() + layer.values.untyped_storage().nbytes()
                     for layer in cache.layers]
    assert sum(sizes) == measure.formula_bytes(model.config, 12, element, 3) == kv_cache_bytes(cache)
    assert measure.formula_bytes(model.config, 1, element) == kv_bytes_per_token(model.config, dtype)


def test_layer_bytes_count_every_tensor_a_layer_holds_and_let_a_cache_answer_for_itself():
    class QuantizedLikeLayer:
        def __init__(self):
            self.keys = torch.zeros(1, 2, 5, 8, dtype=torch.int8)  # 80 bytes
            self.values = torch.zeros(1, 2, 5, 8, dtype=torch.int8)  # 80
            self.scales = (torch.zeros(1, 2, 5, 1), torch.zeros(1, 2, 5, 1))  # 2 x 40
            self.alias = self.keys  # the same tensor object: counted once
            self.length = 5

    class Holder:
        def __init__(self):
            self.layers = [QuantizedLikeLayer(), QuantizedLikeLayer()]

    assert measure.layer_bytes(Holder()) == [240, 240]

    class OwnCache:
        def __init__(self):
            self.layers = [QuantizedLikeLayer()]

        def layer_bytes(self):
            return [7, 9]

    assert measure.layer_bytes(OwnCache()) == [7, 9]
    assert measure.layer_bytes(None) == []


def test_formula_bytes_by_hand(lm):
    assert measure.formula_bytes(lm.model.config, 10, 4) == 10 * KV_PER_TOKEN_FP32
    assert measure.formula_bytes(lm.model.config, 10, 0.5, 3) == 2 * 2 * 2 * 8 * 10 * 3 // 2  # int4: 960


def tiny_param_count(vocab: int, tied: bool) -> int:
    per_layer = 32 * 32 + 2 * 32 * 16 + 32 * 32 + 3 * 32 * 64 + 2 * 32  # q, k and v, o, gate/up/down, two norms
    return vocab * 32 * (1 if tied else 2) + 2 * per_layer + 32


@pytest.mark.parametrize("tied", [False, True])
def test_weights_bytes_count_each_parameter_once(lm, tied):
    model = lm.model
    if tied:
        config = copy.deepcopy(lm.model.config)
        config.tie_word_embeddings = True
        model = LlamaForCausalLM(config)
        assert model.lm_head.weight is model.model.embed_tokens.weight
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    assert measure.weights_bytes(model) == 4 * tiny_param_count(model.config.vocab_size, tied) + buffers


@pytest.mark.parametrize("tied", [False, True])
def test_forward_params_leave_out_the_embedding_lookup(lm, tied):
    model = lm.model
    if tied:
        config = copy.deepcopy(lm.model.config)
        config.tie_word_embeddings = True
        model = LlamaForCausalLM(config)
    vocab = model.config.vocab_size
    body, head = measure.forward_params(model)
    assert (body, head) == (tiny_param_count(vocab, tied=True) - vocab * 32, vocab * 32)
    assert body + head + (0 if tied else vocab * 32) == sum(p.numel() for p in model.parameters())


def test_process_memory_is_the_resident_set_and_follows_an_allocation():
    before, reserved = measure.process_memory("cpu")
    block = torch.ones(64 << 20)  # 256 MiB, every page written
    after, _ = measure.process_memory(torch.device("cpu"))
    assert before > 0 and reserved == 0
    assert after - before > 0.9 * block.numel() * 4
    del block


# ---- ceilings ---------------------------------------------------------------------------------------------------


@pytest.fixture
def ceilings_file(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "decoding-playground" / measure.CEILINGS_FILE


def test_ceilings_are_measured_once_then_read_from_the_file(ceilings_file, monkeypatch):
    first = measure.machine_ceilings("cpu")
    assert first.source == "measured" and first.peak_flops > 1e8 and first.peak_bytes_per_s > 1e8
    stored = json.loads(ceilings_file.read_text())
    assert list(stored) == [measure.ceilings_key(torch.device("cpu"))]
    assert f"{torch.get_num_threads()} threads" in next(iter(stored)) and torch.__version__ in next(iter(stored))

    def no_probe(*args, **kwargs):
        raise AssertionError("measured again although the file holds the ceilings")

    monkeypatch.setattr(measure, "measure_ceilings", no_probe)
    second = measure.machine_ceilings(torch.device("cpu"))
    assert second.source == "cached"
    assert (second.peak_flops, second.peak_bytes_per_s) == (first.peak_flops, first.peak_bytes_per_s)


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", '{"KEY": {"peak_flops": -1, "peak_bytes_per_s": 5}}',
                                     '{"KEY": "text"}', ""])
def test_a_corrupt_ceilings_file_is_measured_over(ceilings_file, monkeypatch, content):
    key = measure.ceilings_key(torch.device("cpu"))
    ceilings_file.parent.mkdir(parents=True)
    ceilings_file.write_text(content.replace("KEY", key))
    calls = []
    monkeypatch.setattr(measure, "measure_ceilings",
                        lambda device, dtype: calls.append(device) or measure.Ceilings(3e9, 2e9))
    assert measure.machine_ceilings("cpu") == measure.Ceilings(3e9, 2e9, "measured")
    assert len(calls) == 1
    assert json.loads(ceilings_file.read_text())[key]["peak_flops"] == 3e9
    assert measure.machine_ceilings("cpu").source == "cached"


def test_ceilings_depend_on_thread_count_and_dtype(ceilings_file, monkeypatch):
    calls = []
    monkeypatch.setattr(measure, "measure_ceilings",
                        lambda device, dtype: calls.append(dtype) or measure.Ceilings(1e9 * (len(calls)), 1e9))
    threads = torch.get_num_threads()
    try:
        measure.machine_ceilings("cpu")
        torch.set_num_threads(1 if threads > 1 else 2)
        measure.machine_ceilings("cpu")
    finally:
        torch.set_num_threads(threads)
    measure.machine_ceilings("cpu", torch.bfloat16)
    measure.machine_ceilings("cpu")  # the first key again: read
    assert calls == [torch.float32, torch.float32, torch.bfloat16]
    assert len(json.loads(ceilings_file.read_text())) == 3


# ---- phases -----------------------------------------------------------------------------------------------------


def counted_pairs(tokens: int, context: int) -> int:
    """Causal (query, key) pairs by enumeration: the i-th new token sees the context and new tokens 0..i."""
    return sum(1 for i in range(tokens) for _ in range(context + i + 1))


def test_phase_estimates_by_hand(lm):
    config = lm.model.config  # 2 layers, 4 heads x 8 = query width 32
    assert counted_pairs(10, 0) == 55 and counted_pairs(5, 10) == 65
    # prefill of 10 tokens: 2·1000·10 + 4·2·32·55 FLOPs; weights once (1000 x 4 B) + 10 entries of 128 B written
    assert measure.phase_estimate(config, 1000, "prefill", 10, 10, 4, 128) == (34080, 5280)
    # decode of 5 tokens after 10 (context 15 at the end): 2·1000·5 + 4·2·32·65; weights 5 times + 65 cache
    # entries read or written
    assert measure.phase_estimate(config, 1000, "decode", 5, 15, 4, 128) == (26640, 28320)
    # chunked prefill: 4 tokens after 6 cached: pairs 4·6 + 10 = 34; the 6 read once + 4 written
    assert measure.phase_estimate(config, 1000, "prefill", 4, 10, 2, 100) == (8000 + 256 * 34, 2000 + 1000)
    # the LM head apart (H = 500): a prefill computes the last position's logits only, decode every token's
    assert measure.phase_estimate(config, 1000, "prefill", 10, 10, 4, 128, head_params=500) == (
        34080 + 1000, 6000 + 1280)
    assert measure.phase_estimate(config, 1000, "decode", 5, 15, 4, 128, head_params=500) == (
        26640 + 5000, 5 * 6000 + 8320)
    # no cache: 3 passes after 2 positions run 3, 4 and 5 positions (12 in all; causal pairs 6 + 10 + 15 = 31);
    # weights read every pass, no cache traffic
    assert measure.phase_estimate(config, 1000, "decode", 3, 5, 4, 128, head_params=500, recompute=True) == (
        2 * 1000 * 12 + 2 * 500 * 3 + 4 * 2 * 32 * 31, 3 * 1500 * 4)
    assert sum(counted_pairs(s, 0) for s in (3, 4, 5)) == 31
    with pytest.raises(ValueError, match="phase"):
        measure.phase_estimate(config, 1000, "verify", 1, 1, 4, 128)
    with pytest.raises(ValueError, match="context"):
        measure.phase_estimate(config, 1000, "prefill", 10, 0, 4, 128)


def test_parameter_count_counts_a_tied_head_once(lm):
    config = copy.deepcopy(lm.model.config)
    config.tie_word_embeddings = True
    assert measure.parameter_count(lm.model) == tiny_param_count(config.vocab_size, tied=False)
    assert measure.parameter_count(LlamaForCausalLM(config)) == tiny_param_count(config.vocab_size, tied=True)


def test_decode_sits_left_of_prefill_on_the_roofline(lm):
    config = lm.model.config
    prefill = measure.phase_estimate(config, 135_000_000, "prefill", 200, 200, 4, 46080)
    decode = measure.phase_estimate(config, 135_000_000, "decode", 128, 328, 4, 46080)
    assert decode[0] / decode[1] < 1 < prefill[0] / prefill[1]
    ceilings = measure.Ceilings(peak_flops=1e11, peak_bytes_per_s=2e10)
    assert measure.attainable_flops(0.5, ceilings) == 1e10
    assert measure.attainable_flops(100, ceilings) == 1e11


# ---- decoding with and without the cache ------------------------------------------------------------------------


def test_no_cache_greedy_equals_cached_greedy_and_generate(lm, prompts):
    for prompt in prompts:
        cached, cached_ms = batch.cached_decode(lm, prompt, 16)
        uncached, uncached_ms = batch.no_cache_decode(lm, prompt, 16)
        ids = torch.tensor([prompt])
        reference = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                      max_new_tokens=16)[0, len(prompt):].tolist()
        assert len(reference) == 16  # no EOS on the way: the comparison covers all 16
        assert cached == uncached == reference
        assert len(cached_ms) == len(uncached_ms) == 16 and min(cached_ms + uncached_ms) > 0


def test_decodes_stop_after_a_stop_id(lm, prompts):
    full, _ = batch.cached_decode(lm, prompts[0], 8)
    for decode in (batch.cached_decode, batch.no_cache_decode):
        ids, times = decode(lm, prompts[0], 8, stop_ids={full[2]})
        assert ids == full[: full.index(full[2]) + 1] and len(times) == len(ids)


def test_left_pad_puts_padding_first_and_masks_it():
    ids, mask = batch.left_pad([[5, 6, 7], [8]], pad_id=0, device=torch.device("cpu"))
    assert ids.tolist() == [[5, 6, 7], [0, 0, 8]]
    assert mask is not None and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert batch.left_pad([[1, 2], [3, 4]], 0, torch.device("cpu"))[1] is None


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_batch_of_copies_and_of_left_padded_prompts_equals_single_prompt_greedy(lm, prompts, attn):
    lm.model.set_attn_implementation(attn)
    try:
        singles = [batch.cached_decode(lm, prompt, 12)[0] for prompt in prompts]
        copies = batch.batch_greedy(lm, [prompts[1]] * 3, 12)
        assert copies.tokens == [singles[1]] * 3
        mixed = batch.batch_greedy(lm, prompts, 12)  # lengths 5, 11, 2 (tokens): left-padded to the longest
        assert len({len(p) for p in prompts}) == 3
        assert mixed.tokens == singles
        longest = max(len(p) for p in prompts)
        assert mixed.kv_bytes == measure.formula_bytes(lm.model.config, longest + 11, 4, 3)
        assert len(mixed.step_ms) == 11 and mixed.prefill_ms > 0
    finally:
        lm.model.set_attn_implementation("sdpa")


def test_batch_without_the_mask_would_differ(lm, prompts):
    """The padded rows need their mask: the same padded ids without it choose other tokens (the test above can
    fail)."""
    ids, _ = batch.left_pad(prompts, lm.tokenizer.pad_token_id, lm.device)
    with torch.inference_mode():
        unmasked = lm.model(input_ids=ids).logits[:, -1].argmax(-1).tolist()
    singles = [batch.cached_decode(lm, prompt, 1)[0][0] for prompt in prompts]
    assert unmasked != singles


def test_batch_sweep_points(lm, prompts):
    points = batch.batch_sweep(lm, [prompts[0]], [1, 3], 6)
    assert [p.size for p in points] == [1, 3]
    for point in points:
        assert point.kv_bytes == measure.formula_bytes(lm.model.config, len(prompts[0]) + 5, 4, point.size)
        assert point.tokens_per_s == pytest.approx(point.size * 1000 / point.ms_per_step)
    mixed = batch.batch_sweep(lm, prompts, [4], 4)[0]  # rows: prompts 0, 1, 2, 0
    assert mixed.kv_bytes == measure.formula_bytes(lm.model.config, max(map(len, prompts)) + 3, 4, 4)
    with pytest.raises(ValueError):
        batch.batch_sweep(lm, [prompts[0]], [1], 1)


def test_attention_compare_on_cpu(lm):
    result = batch.attention_compare(lm, 128, repeats=1)
    variants = result["variants"]
    assert result["prompt_len"] == 128 and result["device"] == "cpu"
    for name in ("eager", "sdpa", "sdpa-math"):
        assert variants[name]["available"] and variants[name]["ms"] > 0
        assert variants[name]["max_logit_diff"] < 1e-3
    assert variants["eager"]["max_logit_diff"] == 0.0  # the reference
    # eager materialises the [heads, 128, 128] score matrix; PyTorch's CPU sdpa kernel works in blocks
    assert variants["eager"]["peak_bytes"] > variants["sdpa"]["peak_bytes"] > 0
    assert not variants["flash_attention_2"]["available"] and "CUDA" in variants["flash_attention_2"]["why"]
    assert lm.model.config._attn_implementation == "sdpa"  # restored

