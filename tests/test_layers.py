"""The logit lens, early exit and layer skipping, against independent references: a full forward pass with
``output_hidden_states`` (the lens computed by hand), ``model.generate`` (greedy output), and the model's own
key/value projections (the filled cache entries)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import DynamicCache
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from playground.config import ConfigError, RunSettings
from playground.engine.kv_cache import kv_bytes_per_token
from playground.engine.layers.loop import ExitRule, LayerLoop
from playground.engine.prompt import encode_prompt
from playground.engine.strategies import run_strategy
from playground.events import RunFinished, TokenStep, dumps_event, event_from_dict
from playground.events.layers import LayersStarted, LayerStep

LAYERS = 6
PROMPT = "the cat sat on the mat"


@pytest.fixture(scope="module")
def deep_lm():
    from support.tiny_models import build_tiny_lm

    return build_tiny_lm(seed=5, layers=LAYERS)


def run(lm, **settings) -> list:
    settings.setdefault("prompt", PROMPT)
    settings.setdefault("chat", False)
    settings.setdefault("lens_precision", "model")  # exact comparisons (the bfloat16 lens has its own test)
    return list(run_strategy(lm, RunSettings.from_flat(**settings)))


def of_type(events: list, cls: type) -> list:
    return [e for e in events if isinstance(e, cls)]


def prompt_ids(lm, **settings) -> list[int]:
    return encode_prompt(lm, RunSettings.from_flat(prompt=PROMPT, chat=False, **settings))[0]


def generate(lm, ids: list[int], n: int, **kwargs) -> list[int]:
    tensor = torch.tensor([ids])
    out = lm.model.generate(tensor, attention_mask=torch.ones_like(tensor), do_sample=False, max_new_tokens=n,
                            min_new_tokens=n, pad_token_id=lm.tokenizer.pad_token_id, **kwargs)
    return out[0, len(ids):].tolist()


def reference_lens(model, ids: list[int]) -> torch.Tensor:
    """[layers, vocab] log-probs of every layer's lens at the last position, from one full forward pass without a
    cache: the final norm and LM head on each layer's hidden state, the model's own logits for the last layer
    (transformers hands the last hidden state back already normalised)."""
    with torch.no_grad():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
        rows = [model.lm_head(model.model.norm(h[0, -1])) for h in out.hidden_states[1:-1]]
        rows.append(out.logits[0, -1])
    return torch.stack(rows).float().log_softmax(dim=-1)


def bits(logprobs: torch.Tensor) -> list[float]:
    return (-(logprobs.exp() * logprobs).sum(dim=-1) / torch.log(torch.tensor(2.0))).tolist()


# ------------------------------------------------------------------------------------------------ the lens


def test_the_lens_of_every_layer_equals_a_full_forward_by_hand(deep_lm):
    events = run(deep_lm, lens=True, lens_top=3, max_new_tokens=6)
    start = of_type(events, LayersStarted)
    assert len(start) == 1 and start[0].mode == "lens" and start[0].layers == LAYERS
    steps = of_type(events, LayerStep)
    tokens = of_type(events, TokenStep)
    assert [s.step for s in steps] == [t.step for t in tokens] == list(range(6))
    # Every LayerStep comes right before the token event of its step.
    for i, event in enumerate(events):
        if isinstance(event, LayerStep):
            assert isinstance(events[i + 1], TokenStep) and events[i + 1].step == event.step
    context = prompt_ids(deep_lm)
    for step, token in zip(steps, tokens, strict=True):
        expected = reference_lens(deep_lm.model, context)  # [layers, vocab]
        assert step.layer_entropy == pytest.approx(bits(expected), abs=1e-4)
        top_p, top_ids = expected.exp().topk(3, dim=-1)
        assert [[c.token_id for c in layer] for layer in step.layer_top] == top_ids.tolist()
        got = [c.prob for layer in step.layer_top for c in layer]
        assert got == pytest.approx(top_p.flatten().tolist(), abs=1e-5)
        assert step.layer_top_prob == pytest.approx(top_p[:, 0].tolist(), abs=1e-5)
        final = int(top_ids[-1, 0])
        assert step.agrees_with_final == tuple(int(t) == final for t in top_ids[:, 0])
        assert (step.exit_layer, step.skipped, step.layers_computed, step.layers_total) == (None, (), LAYERS, LAYERS)
        context.append(token.token_id)


@pytest.mark.parametrize("precision", ["model", "bfloat16"])
def test_the_lens_at_the_last_layer_is_the_models_own_distribution(deep_lm, precision):
    events = run(deep_lm, lens=True, max_new_tokens=5, lens_precision=precision)
    for step, token in zip(of_type(events, LayerStep), of_type(events, TokenStep), strict=True):
        # The greedy token event's raw entropy and top candidate come from the model's logits.
        assert step.layer_entropy[-1] == pytest.approx(token.entropy, abs=1e-4)
        assert step.layer_top[-1][0].token_id == token.token_id == token.candidates[0].token_id
        assert step.layer_top_prob[-1] == pytest.approx(token.raw_prob, abs=1e-6)


def test_the_bfloat16_lens_is_close_to_the_exact_one(deep_lm):
    exact = of_type(run(deep_lm, lens=True, max_new_tokens=6), LayerStep)
    fast = of_type(run(deep_lm, lens=True, max_new_tokens=6, lens_precision="bfloat16"), LayerStep)
    for a, b in zip(exact, fast, strict=True):
        assert b.layer_entropy == pytest.approx(a.layer_entropy, abs=0.05)
        assert b.layer_top_prob == pytest.approx(a.layer_top_prob, abs=0.01)
        assert b.layer_entropy[-1] == a.layer_entropy[-1]  # the last layer is the model's own, exactly
    # A bfloat16 product really ran: some intermediate value differs from the exact one.
    assert any(a.layer_entropy[:-1] != b.layer_entropy[:-1] for a, b in zip(exact, fast, strict=True))


@pytest.mark.parametrize("strategy", ["greedy", "sample"])
def test_recording_the_lens_changes_no_token(deep_lm, strategy):
    options = {"strategy": strategy, "max_new_tokens": 10, "seed": 4, "repetition_penalty": 1.3}
    with_lens, without = run(deep_lm, lens=True, **options), run(deep_lm, **options)
    assert with_lens[-1].token_ids == without[-1].token_ids
    if strategy == "greedy":
        assert list(with_lens[-1].token_ids) == generate(deep_lm, prompt_ids(deep_lm), 10, repetition_penalty=1.3)
    assert not of_type(without, LayerStep) and len(of_type(with_lens, LayerStep)) == 10


def test_the_lens_of_a_speculative_run_is_each_emitted_tokens_own(deep_lm):
    """Several tokens come out of one verification pass: each one's lens is that of its own position."""
    events = run(deep_lm, strategy="speculative", draft="prompt-lookup", prompt=PROMPT + " the cat sat on",
                 lens=True, lens_top=2, max_new_tokens=16, baseline_tokens=0)
    rounds = [e for e in events if type(e).__name__ == "SpeculativeRound"]
    assert any(r.accepted > 0 for r in rounds), "precondition: a round that emitted several tokens"
    steps, tokens = of_type(events, LayerStep), of_type(events, TokenStep)
    assert [s.step for s in steps] == [t.step for t in tokens] == list(range(16))
    context = encode_prompt(deep_lm, RunSettings.from_flat(prompt=PROMPT + " the cat sat on", chat=False))[0]
    for step, token in zip(steps, tokens, strict=True):
        expected = reference_lens(deep_lm.model, context)
        assert step.layer_entropy == pytest.approx(bits(expected), abs=1e-4)
        assert [layer[0].token_id for layer in step.layer_top] == expected.argmax(dim=-1).tolist()
        context.append(token.token_id)


def test_a_strategy_without_the_lens_refuses_it_naming_who_records_it(deep_lm):
    with pytest.raises(ConfigError) as error:
        run_strategy(deep_lm, RunSettings.from_flat(strategy="kv-cache", lens=True))
    assert str(error.value) == ("--lens records each generated token's layers: kv-cache does not record them; use "
                                "greedy, sample, beam, speculative, early-exit, layer-skip")


def test_beam_search_records_the_lens_of_the_row_its_best_beam_grew_from(deep_lm):
    from playground.events import BeamStep

    events = run(deep_lm, strategy="beam", num_beams=3, lens=True, max_new_tokens=5)
    lens_steps, beam_steps = of_type(events, LayerStep), of_type(events, BeamStep)
    assert [s.step for s in lens_steps] == [b.step for b in beam_steps] and len(beam_steps) >= 3
    prompt = prompt_ids(deep_lm)
    beams: list[list[int]] = [[]]  # generated tokens of each running beam, rebuilt from the steps
    for lens, step in zip(lens_steps, beam_steps, strict=True):
        # The row the best new beam grew from (on a last step with no survivors, the best candidate's).
        parent = step.parents[0] if step.parents else step.candidates[0].beam
        context = prompt + beams[parent]
        assert lens.layer_entropy == pytest.approx(bits(reference_lens(deep_lm.model, context)), abs=1e-4)
        beams = [beams[p] + [t] for p, t in zip(step.parents, step.token_ids, strict=True)]
    # Recording changes no beam: the same choices at every step and the same sequences, token for token. Their
    # scores agree to float32 rounding, not bit for bit: the lens defers the prompt's last token to the first step
    # (whose layers it records), so that token is read through the cache instead of in the prefill, the same sums
    # in another order (candidates' scores differ by up to 1e-6 here; a final score was seen differing in its 7th
    # digit with OMP_NUM_THREADS=1, failing an exact comparison).
    plain = run(deep_lm, strategy="beam", num_beams=3, max_new_tokens=5)
    chosen = [(b.parents, b.token_ids) for b in of_type(plain, BeamStep)]
    assert [(b.parents, b.token_ids) for b in beam_steps] == chosen
    ours, theirs = events[-1].sequences, plain[-1].sequences
    assert [(s.token_ids, s.text) for s in ours] == [(s.token_ids, s.text) for s in theirs] and ours
    assert [v for s in ours for v in (s.score, s.sum_logprobs)] == pytest.approx(
        [v for s in theirs for v in (s.score, s.sum_logprobs)], rel=0, abs=1e-5)


def test_a_lens_trace_carries_layer_entropy_per_layer(model_folder, tmp_path):
    from playground.cli import main

    out = tmp_path / "lens.jsonl"
    assert main(["trace", "--model", str(model_folder), "--device", "cpu", "--lens", "--max-new-tokens", "3",
                 "--out", str(out)]) == 0
    lines = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    layers = [line for line in lines if line["type"] == "layers"]
    layer_count = json.loads((model_folder / "config.json").read_text())["num_hidden_layers"]
    assert len(layers) == 3 and all(len(line["layer_entropy"]) == layer_count for line in layers)
    assert all(isinstance(v, float) for line in layers for v in line["layer_entropy"])
    for line in lines:
        assert event_from_dict(line) is not None


# ------------------------------------------------------------------------------------------------ early exit


@pytest.mark.parametrize("penalties", [{}, {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2}])
@pytest.mark.parametrize("exit_settings", [
    {"exit_threshold": 0.0},  # no distribution has zero entropy: never exits
    {"exit_metric": "max-prob", "exit_threshold": 1.0},  # no top token has probability 1
    {"exit_threshold": 64.0, "min_exit_layer": LAYERS},  # every layer passes, but only the last may answer
], ids=["unreachable", "unreachable-max-prob", "forced-at-last"])
def test_early_exit_that_never_exits_is_plain_greedy(deep_lm, exit_settings, penalties):
    events = run(deep_lm, strategy="early-exit", max_new_tokens=12, **exit_settings, **penalties)
    steps = of_type(events, LayerStep)
    assert all(s.exit_layer is None and s.layers_computed == LAYERS for s in steps)
    assert list(events[-1].token_ids) == generate(deep_lm, prompt_ids(deep_lm), 12, **penalties)
    figures = events[-1].figures
    assert figures["compute_saved"] == 0.0
    assert figures["identical_fraction"] == 1.0 and figures["first_divergence"] == -1.0


def first_token_lens(lm) -> torch.Tensor:
    return reference_lens(lm.model, prompt_ids(lm))


@pytest.mark.parametrize("metric", ["entropy", "max-prob"])
def test_the_exit_layer_is_the_first_that_passes_the_threshold(deep_lm, metric):
    lens = first_token_lens(deep_lm)  # [layers, vocab]
    score = bits(lens) if metric == "entropy" else lens.exp().max(dim=-1).values.tolist()
    passes = (lambda v, t: v <= t) if metric == "entropy" else (lambda v, t: v >= t)
    checked = []
    for min_layer in range(1, LAYERS):
        for layer in range(min_layer + 1, LAYERS):  # 1-based; an exit at the last layer is no exit
            # A threshold this layer passes and no layer from min_layer on before it does: halfway to the nearest.
            target, earlier = score[layer - 1], score[min_layer - 1 : layer - 1]
            if any(passes(v, target) for v in earlier):
                continue
            nearest = min(earlier, key=lambda v: abs(v - target))
            threshold = target + (nearest - target) / 2
            events = run(deep_lm, strategy="early-exit", exit_metric=metric, exit_threshold=threshold,
                         min_exit_layer=min_layer, max_new_tokens=1, compare_full=False, lens=True)
            (step,) = of_type(events, LayerStep)
            assert step.exit_layer == layer, (score, min_layer, threshold)
            assert step.layers_computed == layer
            assert step.layer_entropy[layer:] == (None,) * (LAYERS - layer)
            # The token is the exit layer's own top token, and its lens matches the hand-computed one.
            assert events[-1].token_ids == (int(lens[layer - 1].argmax()),)
            assert step.layer_entropy[:layer] == pytest.approx(bits(lens)[:layer], abs=1e-4)
            checked.append((min_layer, layer))
    assert checked, f"the model's layers give no exit past a failing layer to test: {score}"


def test_without_the_lens_early_exit_records_only_the_layers_it_checks(deep_lm):
    lens = first_token_lens(deep_lm)
    events = run(deep_lm, strategy="early-exit", exit_threshold=0.0, min_exit_layer=4, max_new_tokens=3,
                 compare_full=False)  # never exits: layers 4 and 5 are checked, layer 6 answers
    for step in of_type(events, LayerStep):
        assert [v is not None for v in step.layer_entropy] == [False] * 3 + [True] * 3
        assert step.layers_computed == LAYERS and all(u is not None for u in step.residual_update)
    first = of_type(events, LayerStep)[0]
    assert first.layer_entropy[3:] == pytest.approx(bits(lens)[3:], abs=1e-4)


def test_saturation_exits_where_a_layer_first_barely_turns_the_stream(deep_lm):
    """Cosine similarity of each layer's output with its input at the last prompt position, from the full model's
    hidden states: the exit is the first layer from min_layer on at or above the threshold, with no LM head."""
    with torch.no_grad():
        hidden = deep_lm.model(input_ids=torch.tensor([prompt_ids(deep_lm)]), output_hidden_states=True).hidden_states
    cosine = [float(torch.cosine_similarity(hidden[i][0, -1], hidden[i + 1][0, -1], dim=0))
              for i in range(LAYERS - 1)]  # layers 1 … L-1 (the last entry is normalised: no exit there anyway)
    checked = 0
    for layer in range(2, LAYERS):
        earlier = cosine[1 : layer - 1]  # from min layer 2
        if any(c >= cosine[layer - 1] for c in earlier):
            continue
        threshold = (cosine[layer - 1] + max(earlier)) / 2 if earlier else cosine[layer - 1]
        events = run(deep_lm, strategy="early-exit", exit_metric="saturation", exit_threshold=threshold,
                     min_exit_layer=2, max_new_tokens=1, compare_full=False)
        (step,) = of_type(events, LayerStep)
        assert step.exit_layer == layer, (cosine, threshold)
        # No lens was needed to decide: only the answering layer's distribution is recorded.
        assert [v is not None for v in step.layer_entropy] == [i == layer - 1 for i in range(LAYERS)]
        checked += 1
    assert checked, f"no exit past a failing layer to test: {cosine}"


@pytest.mark.parametrize(("min_layer", "exit_layer"), [(1, 1), (2, 2), (3, 3), (0, 4)])  # 0: ⅔ of 6 layers
def test_min_exit_layer_holds_the_exit_back(deep_lm, min_layer, exit_layer):
    events = run(deep_lm, strategy="early-exit", exit_threshold=64.0, min_exit_layer=min_layer, max_new_tokens=4,
                 compare_full=False)
    assert events[1].min_exit_layer == exit_layer
    assert [s.exit_layer for s in of_type(events, LayerStep)] == [exit_layer] * 4
    assert events[-1].figures["compute_saved"] == pytest.approx(1 - exit_layer / LAYERS)


def test_filled_keys_and_values_are_the_projections_of_the_exit_state(deep_lm):
    model = deep_lm.model
    ids = prompt_ids(deep_lm)
    n = len(ids)
    loop = LayerLoop(model)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids[:-1]]), cache=cache, use_cache=True)
        # Every layer is sure enough at 64 bits: the exit is at layer 1.
        token_pass = loop.run(ids[-1], cache, exit_rule=ExitRule("entropy", 64.0, 1))
        assert token_pass.exit_layer == 1 and token_pass.filled == list(range(1, LAYERS))

        full = model(input_ids=torch.tensor([ids]), output_hidden_states=True, use_cache=True)
        exit_state = full.hidden_states[1][:, -1:]  # layer 1's output at the last prompt position [1, 1, hidden]
        cos, sin = model.model.rotary_emb(exit_state, position_ids=torch.tensor([[n - 1]]))
        for j in range(LAYERS):
            keys, values = cache.layers[j].keys, cache.layers[j].values
            head_dim = model.config.hidden_size // model.config.num_attention_heads
            assert keys.shape == values.shape == (1, model.config.num_key_value_heads, n, head_dim)
            # Earlier positions: exactly what the full model cached.
            torch.testing.assert_close(keys[:, :, : n - 1], full.cache.layers[j].keys[:, :, : n - 1])
            torch.testing.assert_close(values[:, :, : n - 1], full.cache.layers[j].values[:, :, : n - 1])
            if j == 0:  # layer 1 ran: its entry is the full model's
                torch.testing.assert_close(keys[:, :, -1], full.cache.layers[0].keys[:, :, -1])
                continue
            layer = model.model.layers[j]
            x = layer.input_layernorm(exit_state)
            k = layer.self_attn.k_proj(x).view(1, 1, -1, layer.self_attn.head_dim).transpose(1, 2)
            v = layer.self_attn.v_proj(x).view(1, 1, -1, layer.self_attn.head_dim).transpose(1, 2)
            _, k = apply_rotary_pos_emb(k, k, cos, sin)
            torch.testing.assert_close(keys[:, :, -1:], k)
            torch.testing.assert_close(values[:, :, -1:], v)
        # The answer is layer 1's lens.
        expected = model.lm_head(model.model.norm(exit_state[0]))
        torch.testing.assert_close(token_pass.logits, expected.float())


def test_generation_continues_after_exits_with_a_whole_cache(deep_lm):
    lens = first_token_lens(deep_lm)
    threshold = sorted(bits(lens))[1]  # some tokens exit early, not all at the first layer
    events = run(deep_lm, strategy="early-exit", exit_threshold=threshold, max_new_tokens=20)
    steps, tokens = of_type(events, LayerStep), of_type(events, TokenStep)
    assert len(tokens) == 20 and events[-1].stop_reason == "max_new_tokens"
    exits = {s.exit_layer for s in steps}
    assert len(exits) >= 2, f"precondition: a mix of exits, got {exits}"
    per_token = kv_bytes_per_token(deep_lm.model.config, torch.float32)
    n = len(prompt_ids(deep_lm))
    # Every layer holds every position after each step (filled or computed): the cache is never short.
    assert [t.kv_cache_bytes for t in tokens] == [(n + i) * per_token for i in range(20)]
    computed = sum(s.layers_computed for s in steps)
    figures = events[-1].figures
    assert figures["compute_saved"] == pytest.approx(1 - computed / (20 * LAYERS))
    assert figures["layers_computed"] == computed and figures["layers_total"] == 20 * LAYERS
    full = generate(deep_lm, prompt_ids(deep_lm), 20)
    same = [a == b for a, b in zip(events[-1].token_ids, full, strict=True)]
    assert figures["identical_fraction"] == sum(same) / 20
    assert figures["first_divergence"] == (same.index(False) if False in same else -1)
    assert figures["full_tokens_per_s"] > 0


# ------------------------------------------------------------------------------------------------ layer skip


def test_a_fixed_skip_set_is_skipped_for_every_token(deep_lm):
    events = run(deep_lm, strategy="layer-skip", skip_layers="2-3", skip_threshold=0.0, max_new_tokens=8,
                 lens=True)
    steps = of_type(events, LayerStep)
    assert [s.skipped for s in steps] == [(2, 3)] * 8
    assert all(s.layers_computed == LAYERS - 2 for s in steps)
    assert all(s.layer_entropy[1] is None and s.layer_entropy[2] is None for s in steps)
    assert all(s.layer_entropy[0] is not None and s.layer_entropy[3] is not None for s in steps)
    assert events[-1].figures["compute_saved"] == pytest.approx(2 / LAYERS)


def test_skipping_a_layer_feeds_its_input_to_the_next(deep_lm):
    """With layer 2 skipped, the first token's answer is layers 1, 3, 4 applied in a row to the last prompt
    position (the prompt itself read with every layer), computed here with the model's own layers."""
    model = deep_lm.model
    ids = prompt_ids(deep_lm)
    events = run(deep_lm, strategy="layer-skip", skip_layers="2", skip_threshold=0.0, max_new_tokens=1,
                 compare_full=False)
    with torch.no_grad():
        cache = DynamicCache(config=model.config)
        model(input_ids=torch.tensor([ids[:-1]]), cache=cache, use_cache=True)
        h = model.model.embed_tokens(torch.tensor([[ids[-1]]]))
        position = torch.tensor([[len(ids) - 1]])
        rope = model.model.rotary_emb(h, position_ids=position)
        for j, layer in enumerate(model.model.layers):
            if j == 1:
                continue  # its cache entry is not read by this token (only later ones attend to it)
            h = layer(h, position_ids=position, cache=cache, use_cache=True, position_embeddings=rope)
        expected = int(model.lm_head(model.model.norm(h))[0, -1].argmax())
    assert events[-1].token_ids == (expected,)


def test_the_dynamic_rule_skips_after_a_small_update(deep_lm):
    events = run(deep_lm, strategy="layer-skip", skip_threshold=1.0, max_new_tokens=10, compare_full=False)
    for step in of_type(events, LayerStep):
        last_update, previous_skipped = None, False
        for index in range(LAYERS):
            skipped = index + 1 in step.skipped
            should = (0 < index < LAYERS - 1 and not previous_skipped and last_update is not None
                      and last_update < 1.0)
            assert skipped == should, step
            if not skipped:
                last_update = step.residual_update[index]
            previous_skipped = skipped
    assert any(of_type(events, LayerStep)[i].skipped for i in range(10)), "precondition: the rule skipped some"


def test_a_threshold_no_update_falls_below_is_plain_greedy(deep_lm):
    events = run(deep_lm, strategy="layer-skip", skip_threshold=1e-6, max_new_tokens=10)
    assert all(s.skipped == () for s in of_type(events, LayerStep))
    assert list(events[-1].token_ids) == generate(deep_lm, prompt_ids(deep_lm), 10)


def reference_layer_skip(model, ids: list[int], n: int, threshold: float) -> dict:
    """Layer skipping written out here on the model's own layers: the prompt read whole but for its last token,
    then each token through the layers one by one; a layer is skipped after one whose ‖h_out − h_in‖ / ‖h_in‖
    was below ``threshold`` (never the first or last layer, never two in a row), and a skipped layer's keys and
    values for the token are its own k/v projections (rotary applied) of its input norm of the hidden state that
    reached it, written to the cache, so later tokens that run the layer attend to them."""
    layers = model.model.layers
    cache = DynamicCache(config=model.config)
    out = {"tokens": [], "skipped": [], "updates": [], "probs": []}
    with torch.no_grad():
        model(input_ids=torch.tensor([ids[:-1]]), cache=cache, use_cache=True)
        token, position = ids[-1], len(ids) - 1
        for _ in range(n):
            h = model.model.embed_tokens(torch.tensor([[token]]))
            pos = torch.tensor([[position]])
            cos, sin = model.model.rotary_emb(h, position_ids=pos)
            last, previous_skipped, skipped, updates = None, False, [], []
            for j, layer in enumerate(layers):
                if 0 < j < len(layers) - 1 and not previous_skipped and last is not None and last < threshold:
                    attention = layer.self_attn
                    x = layer.input_layernorm(h)
                    k = attention.k_proj(x).view(1, 1, -1, attention.head_dim).transpose(1, 2)
                    v = attention.v_proj(x).view(1, 1, -1, attention.head_dim).transpose(1, 2)
                    _, k = apply_rotary_pos_emb(k, k, cos, sin)
                    cache.update(k, v, j)
                    skipped.append(j + 1)
                    updates.append(None)
                    previous_skipped = True
                    continue
                h_out = layer(h, position_ids=pos, cache=cache, use_cache=True, position_embeddings=(cos, sin))
                last = float((h_out - h).norm() / h.norm())
                updates.append(last)
                h, previous_skipped = h_out, False
            probs = torch.softmax(model.lm_head(model.model.norm(h))[0, -1].double(), -1)
            token = int(probs.argmax())
            out["tokens"].append(token)
            out["skipped"].append(tuple(skipped))
            out["updates"].append(updates)
            out["probs"].append(float(probs[token]))
            position += 1
    return out


@pytest.mark.parametrize("threshold", [0.22, 0.25])
def test_layer_skip_over_several_tokens_equals_a_loop_written_here(deep_lm, threshold):
    """A layer skipped for some tokens and run for later ones: those later tokens attend to the keys and values
    filled for the skipped ones (zeros there, or no fill, change their hidden states, updates and tokens)."""
    n = 12
    events = run(deep_lm, strategy="layer-skip", skip_threshold=threshold, max_new_tokens=n, compare_full=False)
    expected = reference_layer_skip(deep_lm.model, prompt_ids(deep_lm), n, threshold)
    steps, tokens = of_type(events, LayerStep), of_type(events, TokenStep)
    skipped_then_run = [(a, b, layer) for a in range(n) for b in range(a + 1, n) for layer in expected["skipped"][a]
                        if layer not in expected["skipped"][b]]
    assert skipped_then_run, "precondition: a later token runs a layer an earlier one skipped"
    assert [s.skipped for s in steps] == expected["skipped"]
    for step, updates in zip(steps, expected["updates"], strict=True):
        assert [u is None for u in step.residual_update] == [u is None for u in updates]
        assert [u for u in step.residual_update if u is not None] == pytest.approx(
            [u for u in updates if u is not None], rel=1e-4)
    assert list(events[-1].token_ids) == expected["tokens"]
    assert [t.raw_prob for t in tokens] == pytest.approx(expected["probs"], rel=1e-4)


# ------------------------------------------------------------------------------------------------ settings


@pytest.mark.parametrize(("settings", "message"), [
    ({"strategy": "early-exit", "min_exit_layer": LAYERS + 1},
     f"min_exit_layer must be between 1 and {LAYERS} for this {LAYERS}-layer model (got {LAYERS + 1})"),
    ({"strategy": "layer-skip", "skip_layers": "2,9"},
     f"skip_layers names layer 9, but this model has {LAYERS} layers (1–{LAYERS})"),
    ({"strategy": "layer-skip", "skip_layers": f"1-{LAYERS}"}, "skip_layers skips every layer: leave at least one "
                                                               "to run"),
    ({"strategy": "layer-skip", "skip_threshold": 0.0},
     "layer-skip needs --skip-layers (e.g. 10-20) or a --skip-threshold above 0"),
    ({"strategy": "early-exit", "exit_metric": "max-prob", "exit_threshold": 2.0},
     "exit_threshold is a probability with --exit-metric max-prob: between 0 and 1 (got 2)"),
    ({"strategy": "early-exit", "exit_metric": "saturation", "exit_threshold": 1.5},
     "exit_threshold is a cosine similarity with --exit-metric saturation: between 0 and 1 (got 1.5)"),
    ({"strategy": "layer-skip", "skip_layers": "3-1"}, "skip_layers: '3-1': layers are numbered from 1, and a range "
                                                       "goes upwards"),
    ({"strategy": "layer-skip", "skip_layers": "two"}, "skip_layers: 'two' is not a layer number or a range such as "
                                                       "10-20"),
])
def test_impossible_layer_settings_are_refused_before_the_run(deep_lm, settings, message):
    with pytest.raises(ConfigError) as error:
        run_strategy(deep_lm, RunSettings.from_flat(prompt=PROMPT, **settings))
    assert str(error.value) == message


def test_layer_events_round_trip_through_json(deep_lm):
    events = run(deep_lm, strategy="early-exit", exit_threshold=sorted(bits(first_token_lens(deep_lm)))[1],
                 max_new_tokens=5)
    assert isinstance(events[1], LayersStarted) and events[1].mode == "early-exit"
    assert isinstance(events[-1], RunFinished)
    for event in events:
        assert event_from_dict(json.loads(dumps_event(event))) == event
