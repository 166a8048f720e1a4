"""The KV lab on every model family's tiny model (Llama, Qwen2/3, Mistral, Gemma 2/3, Phi-3, GPT-2, GPT-NeoX).

Every run crosses the tiny models' sliding window (``TINY_WINDOW`` tokens): Mistral slides every layer, Gemma 2/3
alternate sliding and full layers. References, computed here: ``model.generate(do_sample=False)`` for the greedy
tokens of the lossless holders (DynamicCache, paged with 1- and 16-token blocks); for the bytes, a formula written
out from the config (each layer's type and window, KV heads, head dim, dtype) against the tensors each cache holds,
read here at every step.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
import torch
from support.tiny_models import FAMILIES, TINY_WINDOW, build_tiny_lm
from transformers import DynamicCache

from playground.config import ConfigError, RunSettings
from playground.engine.kv import decode as kv_decode
from playground.engine.kv.paged import PagedCache
from playground.engine.kv.quantized import QuantizedKVCache
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep
from playground.events.kv import KVCompare, KVPhase, KVStarted, KVStep, KVSweep

SHORT = "the cat sat"  # 6 tokens: the prefill fits the window, decoding crosses it
LONG = "The weather in Shanghai is sunny"  # longer than the window: the prefill itself crosses it
NEW = 14
HOLDERS = {"dynamic": {}, "paged-1": {"paged": True, "block_size": 1}, "paged-16": {"paged": True, "block_size": 16},
           "int8": {"kv_dtype": "int8"}}
LOSSLESS = ("dynamic", "paged-1", "paged-16")
SLIDING_FAMILIES = {"mistral": "every", "gemma2": "alternate", "gemma3": "alternate"}


@pytest.fixture(scope="module", params=FAMILIES)
def lm(request):
    return build_tiny_lm(seed=0, family=request.param)


def family(lm) -> str:
    return lm.name.removeprefix("tiny-").rsplit("-", 1)[0]


# --- the reference formula, from the config alone --------------------------------------------------------------

def windows(config) -> list[int | None]:
    """Per layer: its sliding window, None for full attention (config.layer_types, else Mistral's rule: every
    layer slides when sliding_window is set)."""
    window = getattr(config, "sliding_window", None)
    types = getattr(config, "layer_types", None) or (["sliding_attention" if window else "full_attention"]
                                                     * config.num_hidden_layers)
    return [window if kind == "sliding_attention" else None for kind in types]


def vector_bytes(config, kv_dtype: str) -> tuple[int, int]:
    """(KV heads, bytes of one head's key or value of one token): float32 elements, or int8 codes + a float32
    step and offset."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return kv_heads, head_dim * 4 if kv_dtype == "model" else head_dim + 8


def held(window: int | None, tokens: int) -> int:
    """Positions a layer holds after ``tokens``: all, or a sliding layer's newest window − 1."""
    return tokens if window is None else min(tokens, window - 1)


def expected_layer_bytes(config, tokens: int, holder: str) -> list[int]:
    kv_heads, vector = vector_bytes(config, "int8" if holder == "int8" else "model")
    if not holder.startswith("paged"):
        return [2 * kv_heads * vector * held(w, tokens) for w in windows(config)]
    block = HOLDERS[holder]["block_size"]
    sizes = []
    for w in windows(config):  # blocks overlapping the held positions [tokens − held, tokens)
        first = tokens - held(w, tokens)
        sizes.append((math.ceil(tokens / block) - first // block) * block * 2 * kv_heads * vector)
    return sizes


def formula_bytes(config, tokens: int, holder: str) -> int:
    """The strategy's formula: positions held per layer × 2 × KV heads × head dim × bytes per element (int8: 1 B,
    scales left out)."""
    kv_heads, _ = vector_bytes(config, "model")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = 1 if holder == "int8" else 4
    return sum(2 * kv_heads * head_dim * element * held(w, tokens) for w in windows(config))


# --- what a cache holds, read from its tensors ---------------------------------------------------------------

def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def tensor_layer_bytes(cache) -> list[int]:
    """Per layer, from the cache's own tensors: a DynamicCache's keys and values; the quantized cache's codes,
    scales and tails; the paged cache's distinct held blocks × one block's bytes in the layer's pools."""
    if isinstance(cache, PagedCache):
        sizes = []
        for layer in cache.layers:
            blocks = {b for table in layer.group.tables for b in table if b >= 0}
            per_block = nbytes(pool[:, 0] for pool in (*layer.key_pools, *layer.value_pools))
            sizes.append(len(blocks) * per_block)
        return sizes
    if isinstance(cache, QuantizedKVCache):
        return [nbytes((*layer.key_parts, *layer.value_parts, layer.key_tail, layer.value_tail))
                for layer in cache.layers]
    return [nbytes((layer.keys, layer.values)) for layer in cache.layers]


def run_watching_the_cache(lm, monkeypatch, prompt: str, **options) -> Iterator[tuple[object, object]]:
    """The kv-cache strategy's events, each with the cache the run holds (None before it exists)."""
    made: list[object] = []
    original = kv_decode.new_cache

    def keep(lm_, kv):
        made.append(original(lm_, kv))
        return made[-1]

    monkeypatch.setattr(kv_decode, "new_cache", keep)
    settings = RunSettings.from_flat(prompt=prompt, chat=False, strategy="kv-cache", max_new_tokens=NEW,
                                     compare_no_cache=False, **options)
    for event in run_strategy(lm, settings):
        yield event, made[-1] if made else None


def reference(lm, prompt: str, new: int = NEW) -> tuple[list[int], list[int]]:
    ids = encode_prompt(lm, RunSettings(prompt=prompt, chat=False))[0]
    tensor = torch.tensor([ids])
    out = lm.model.generate(tensor, attention_mask=torch.ones_like(tensor), do_sample=False, max_new_tokens=new,
                            pad_token_id=lm.tokenizer.pad_token_id)
    return ids, out[0, len(ids):].tolist()


# --- the tests ---------------------------------------------------------------------------------------------------

def test_the_tiny_models_slide_where_their_family_does(lm):
    config = lm.model.config
    kind = SLIDING_FAMILIES.get(family(lm))
    expected = {None: [None] * config.num_hidden_layers, "every": [TINY_WINDOW] * config.num_hidden_layers,
                "alternate": [TINY_WINDOW if i % 2 == 0 else None for i in range(config.num_hidden_layers)]}[kind]
    assert windows(config) == expected
    for prompt in (SHORT, LONG):  # the runs below cross the window: while decoding, or already in the prefill
        ids, tokens = reference(lm, prompt)
        assert len(ids) + len(tokens) > TINY_WINDOW + 2
    assert len(reference(lm, SHORT)[0]) < TINY_WINDOW - 1 < len(reference(lm, LONG)[0])


@pytest.mark.parametrize("prompt", [SHORT, LONG], ids=["short-prompt", "long-prompt"])
@pytest.mark.parametrize("holder", list(HOLDERS))
def test_every_holder_holds_its_formula_and_the_lossless_ones_decode_generate(lm, monkeypatch, holder, prompt):
    config = lm.model.config
    ids, expected = reference(lm, prompt)
    steps = 0
    for event, cache in run_watching_the_cache(lm, monkeypatch, prompt, **HOLDERS[holder]):
        if isinstance(event, KVStarted):
            kv_heads, _ = vector_bytes(config, "model")
            assert (event.layers, event.kv_heads) == (config.num_hidden_layers, kv_heads)
            assert event.attn == config._attn_implementation  # the model's own: eager on Gemma 2
        if not isinstance(event, KVStep):
            continue
        tokens = len(ids) + event.step  # positions fed so far (the newest token is read by the next step)
        assert event.tokens == tokens
        own = tensor_layer_bytes(cache)
        assert own == expected_layer_bytes(config, tokens, holder), f"step {event.step}"
        assert list(event.layer_bytes) == own and event.total_bytes == sum(own)
        assert event.formula_bytes == formula_bytes(config, tokens, holder)
        if holder == "dynamic":  # a contiguous cache holds exactly the formula
            assert event.total_bytes == event.formula_bytes
        for layer, window in zip(cache.layers, windows(config), strict=True):  # [1, kv_heads, held, head_dim]
            assert layer.keys.shape[2] == layer.values.shape[2] == held(window, tokens)
            assert cache.get_seq_length() == tokens
        steps += 1
    finished = event
    assert isinstance(finished, RunFinished) and steps == len(finished.token_ids)
    if holder in LOSSLESS:
        assert list(finished.token_ids) == expected
    else:  # int8: not lossless; it runs to its end and says where it left full precision
        assert len(finished.token_ids) == len(expected) and "first_divergence" in finished.figures


def test_the_paged_and_quantized_caches_read_what_dynamic_cache_reads(lm):
    """Layer by layer: the keys a sliding layer keeps are the DynamicSlidingWindowLayer's, bit for bit (paged), and
    the mask sizes transformers asks for are the same (both caches)."""
    model, config = lm.model, lm.model.config
    ids = encode_prompt(lm, RunSettings(prompt=LONG, chat=False))[0]
    caches = {"dynamic": DynamicCache(config=config), "paged": PagedCache(config, block_size=5),
              "int8": QuantizedKVCache(config, kv_dtype="int8")}
    with torch.inference_mode():
        for cache in caches.values():
            model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
            for token in (5, 6, 7):
                model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
    reference_cache = caches["dynamic"]
    for i, theirs in enumerate(reference_cache.layers):
        for name in ("paged", "int8"):
            ours = caches[name].layers[i]
            assert ours.is_sliding == theirs.is_sliding
            assert ours.get_mask_sizes(1) == theirs.get_mask_sizes(1)
            assert ours.get_seq_length() == theirs.get_seq_length()
        assert torch.equal(caches["paged"].layers[i].keys, theirs.keys)
        assert torch.equal(caches["paged"].layers[i].values, theirs.values)


def test_gemma2_refuses_sdpa_by_name_and_every_other_family_runs_it(lm):
    settings = RunSettings.from_flat(prompt=SHORT, chat=False, strategy="kv-cache", max_new_tokens=4,
                                     compare_no_cache=False, attn="sdpa", paged=True)
    if family(lm) == "gemma2":
        with pytest.raises(ConfigError, match=r"Gemma 2.*SDPA.*soft-caps"):
            run_strategy(lm, settings)  # before the generator exists, so before any event
        return
    events = list(run_strategy(lm, settings))
    assert list(events[-1].token_ids) == reference(lm, SHORT, 4)[1]
    assert next(e for e in events if isinstance(e, KVStarted)).attn == "sdpa"


def ends_at_once(family_name: str):
    """A tiny model of the family whose greedy answer is EOS at once: the EOS row of the LM head is set to twice
    the row of the token it would choose first (``eos_bias`` adds a constant to the row, which moves the logit by
    that constant × the sum of the final hidden state: either way, and not at all after GPT-2's LayerNorm)."""
    lm = build_tiny_lm(seed=0, family=family_name)
    ids = torch.tensor([encode_prompt(lm, RunSettings(prompt=SHORT, chat=False))[0]])
    head = lm.model.get_output_embeddings()
    with torch.inference_mode():
        first = int(lm.model(input_ids=ids).logits[0, -1].argmax())
    with torch.no_grad():
        head.weight[lm.tokenizer.eos_token_id] = 2 * head.weight[first]
    out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=3,
                            pad_token_id=lm.tokenizer.pad_token_id)
    assert out[0, ids.shape[1]:].tolist() == [lm.tokenizer.eos_token_id], "precondition: EOS at once"
    return lm


@pytest.mark.parametrize("family_name", FAMILIES)
def test_an_answer_that_ends_at_its_first_token_runs_to_its_end(family_name):
    lm = ends_at_once(family_name)
    for options in ({"paged": True, "block_size": 4}, {"kv_dtype": "int8"}):
        events = list(run_strategy(lm, RunSettings.from_flat(
            prompt=SHORT, chat=False, strategy="kv-cache", max_new_tokens=NEW, compare_no_cache=True,
            batch_sweep="1,2", **options)))
        finished = events[-1]
        assert isinstance(finished, RunFinished) and finished.stop_reason == "eos"
        assert list(finished.token_ids) == [lm.tokenizer.eos_token_id]
        assert len([e for e in events if isinstance(e, TokenStep)]) == len([e for e in events
                                                                            if isinstance(e, KVStep)]) == 1
        assert [p.phase for p in events if isinstance(p, KVPhase)] == ["prefill"]  # no decode step to time
        (compare,) = [e for e in events if isinstance(e, KVCompare)]
        assert len(compare.cached_ms) == len(compare.uncached_ms) == 1 and compare.identical
        (sweep,) = [e for e in events if isinstance(e, KVSweep)]
        assert sweep.batch_sizes == (1, 2) and all(t > 0 for t in sweep.tokens_per_s)


@pytest.mark.parametrize("options", [{"paged": True, "block_size": 3}, {"kv_dtype": "int8"}], ids=["paged", "int8"])
def test_beam_search_on_a_paged_or_quantized_cache_across_the_window(lm, options):
    beams = 3
    flat = {"prompt": SHORT, "chat": False, "strategy": "beam", "num_beams": beams, "max_new_tokens": NEW}
    ours = list(run_strategy(lm, RunSettings.from_flat(**flat, **options)))
    steps = [e for e in ours if isinstance(e, KVStep)]
    assert isinstance(ours[-1], RunFinished) and len(steps) == NEW
    if options.get("paged"):  # copy-on-write keeps every beam's own keys: the same beams as one tensor per beam
        assert ours[-1].sequences == list(run_strategy(lm, RunSettings.from_flat(**flat)))[-1].sequences
    else:  # a quantized copy per beam, each holding its layers' formula
        last = steps[-1]
        assert last.total_bytes == beams * sum(expected_layer_bytes(lm.model.config, last.tokens, "int8"))


def test_the_view_says_the_formula_holds_past_the_window(qtbot):
    from playground.state import Run
    from playground.ui.style import configure_pyqtgraph
    from playground.ui.views.kv import KVView

    mistral = build_tiny_lm(seed=0, family="mistral")
    events = list(run_strategy(mistral, RunSettings.from_flat(prompt=LONG, chat=False, strategy="kv-cache",
                                                              max_new_tokens=4, compare_no_cache=False)))
    last = [e for e in events if isinstance(e, KVStep)][-1]
    assert last.tokens > TINY_WINDOW and last.total_bytes == last.formula_bytes
    configure_pyqtgraph()
    view = KVView()
    qtbot.addWidget(view)
    view.show_run(Run.from_events(events))
    per_token = last.formula_bytes / last.tokens
    figures = view.figures.text()
    assert f"{per_token:,.0f} B measured</b> ✓ {per_token:,.0f} B by the formula at {last.tokens:,} tokens" in figures
    assert "Measured = formula at every step ✓" in view.size_panel.caption.text()


def test_parallel_samples_on_a_paged_cache_sample_what_contiguous_caches_do(lm):
    """Samples fork the prompt's blocks (sliding groups too) and copy on write: the layout changes no logit."""
    flat = {"prompt": SHORT, "chat": False, "strategy": "kv-cache", "max_new_tokens": NEW, "compare_no_cache": False,
            "samples": 3, "seed": 7}
    paged = list(run_strategy(lm, RunSettings.from_flat(**flat, paged=True, block_size=5)))
    contiguous = list(run_strategy(lm, RunSettings.from_flat(**flat)))
    assert paged[-1].token_ids == contiguous[-1].token_ids
    last = [e for e in contiguous if isinstance(e, KVStep)][-1]
    assert last.total_bytes == last.formula_bytes == 3 * sum(expected_layer_bytes(lm.model.config, last.tokens,
                                                                                  "dynamic"))


def test_forked_sequences_continue_as_if_alone_past_the_window(lm):
    model, config = lm.model, lm.model.config
    ids = encode_prompt(lm, RunSettings(prompt=LONG, chat=False))[0]
    cache = PagedCache(config, block_size=4)
    continuations = [[40, 41, 42, 43], [50, 51, 52, 53]]
    with torch.inference_mode():
        model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True)
        assert cache.fork(0) == [1]
        for step in range(len(continuations[0])):
            ours = model(input_ids=torch.tensor([[c[step]] for c in continuations]), cache=cache,
                         use_cache=True).logits[:, -1]
            for row, c in enumerate(continuations):
                alone = model(input_ids=torch.tensor([ids + c[: step + 1]])).logits[0, -1]
                assert torch.allclose(ours[row], alone, rtol=0, atol=1e-4)
