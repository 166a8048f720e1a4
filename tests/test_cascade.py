"""Cascade inference on tiny models, against references computed here with plain forward passes (no KV cache).

Per token: threshold 0 never escalates and is the cheap model's own greedy decode; threshold 1 always escalates
and is the full model's greedy decode (transformers' ``generate``); a middle threshold picks, token by token, what
a re-implementation here picks, after many switches between the models (so both KV caches were kept in step: the
full model's catch-ups, and the caches' sizes, are checked too). Per response: the cheap response is kept or
rewritten by the full model exactly when its mean confidence is below the threshold.
"""

from __future__ import annotations

import copy
import itertools

import pytest
import torch

from playground.config import ConfigError, RunSettings
from playground.engine.strategies import run_strategy
from playground.engine.variants import quantized_copy
from playground.events import RunFinished, RunStarted, TokenStep
from playground.events.cascade import CHEAP, FORCED, FULL, CascadeResponse, CascadeStarted, CascadeStep
from playground.models.loaded import LoadedModel

PROMPT = "Hello"


def cascade(lm: LoadedModel, **options) -> list:
    options = {"strategy": "cascade", "prompt": PROMPT, "max_new_tokens": 24, "cascade_compare": False, **options}
    return list(run_strategy(lm, RunSettings.from_flat(**options)))


def of(events: list, kind: type) -> list:
    return [e for e in events if isinstance(e, kind)]


def output_steps(events: list) -> list[CascadeStep]:
    return [s for s in of(events, CascadeStep) if not s.draft]


def prompt_of(events: list) -> list[int]:
    return list(events[0].prompt_token_ids)


def generate(lm: LoadedModel, prompt_ids: list[int], tokens: int) -> list[int]:
    """transformers' greedy decode: the full model alone."""
    ids = torch.tensor([prompt_ids])
    with torch.no_grad():
        out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=lm.tokenizer.pad_token_id,
                                do_sample=False, max_new_tokens=tokens)
    return out[0, ids.shape[1] :].tolist()


def next_logits(model, ids: list[int], layers: int | None = None) -> torch.Tensor:
    """Raw logits [vocab] for the token after ``ids``: one plain forward pass over all of them, no cache. With
    ``layers``: the hidden state after that many layers, through the final norm and LM head (the layers model)."""
    with torch.no_grad():
        if layers is None:
            return model(torch.tensor([ids]), use_cache=False).logits[0, -1].float()
        out = model(torch.tensor([ids]), output_hidden_states=True, use_cache=False)
        return model.lm_head(model.model.norm(out.hidden_states[layers]))[0, -1].float()


class Cheap:
    """The cheap model, computed independently of the engine's cheap-model wrapper."""

    def __init__(self, lm: LoadedModel, kind: str) -> None:
        self.kind = kind
        self.model = quantized_copy(lm, "rtn-int4-head") if kind == "quantized" else lm.model
        self.layers = 1 if kind == "layers" else None
        self.options = {"cheap": kind, "cheap_layers": 1} if kind == "layers" else {"cheap": kind}

    def logits(self, ids: list[int]) -> torch.Tensor:
        return next_logits(self.model, ids, self.layers)


@pytest.fixture(scope="module", params=["quantized", "layers"])
def cheap(request, tiny_lm) -> Cheap:
    return Cheap(tiny_lm, request.param)


def reference_cascade(lm: LoadedModel, cheap: Cheap, prompt_ids: list[int], threshold: float, tokens: int,
                      forced: tuple[int, ...] = ()) -> dict:
    """Per-token cascade, written out: the cheap model's top token unless its probability is below the
    threshold, then the full model's top token. Also: how many positions the full model had not read yet when it
    was asked (its catch-up), and the decisions' margins from the threshold."""
    ids, full_read = list(prompt_ids), 0
    out = {"tokens": [], "producers": [], "cheap_probs": [], "cheap_tokens": [], "full_reads": [], "margins": []}
    eos = set(lm.eos_token_ids)
    for step in range(tokens):
        probs = cheap.logits(ids).softmax(-1)
        cheap_token = int(probs.argmax())
        p = float(probs[cheap_token])
        escalate = step >= len(forced) and (p < threshold or threshold >= 1)
        read = 0
        if step < len(forced):
            token, producer = forced[step], FORCED
        elif escalate:
            token, producer = int(next_logits(lm.model, ids).argmax()), FULL
            read, full_read = len(ids) - full_read, len(ids)
        else:
            token, producer = cheap_token, CHEAP
            out["margins"].append(abs(p - threshold))
        if escalate:
            out["margins"].append(abs(p - threshold))
        for key, value in (("tokens", token), ("producers", producer), ("cheap_probs", p),
                           ("cheap_tokens", cheap_token), ("full_reads", read)):
            out[key].append(value)
        ids.append(token)
        if token in eos:
            break
    return out


def kv_bytes_per_position(model_layers: int, lm: LoadedModel) -> int:
    """Keys and values of one position: layers × 2 × kv heads × head dim × 4 bytes (float32)."""
    config = lm.model.config
    head_dim = config.hidden_size // config.num_attention_heads
    return model_layers * 2 * config.num_key_value_heads * head_dim * 4


def macs_per_position(lm: LoadedModel, layers: int) -> int:
    """Weight multiply-adds of ``layers`` Llama decoder layers and the LM head, from the config."""
    c = lm.model.config
    kv = c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
    per_layer = 2 * c.hidden_size * c.hidden_size + 2 * c.hidden_size * kv + 3 * c.hidden_size * c.intermediate_size
    return layers * per_layer + c.hidden_size * c.vocab_size


# ------------------------------------------------------------------------------------------ per token


def test_threshold_zero_never_escalates_and_is_the_cheap_models_greedy(tiny_lm, cheap):
    events = cascade(tiny_lm, cascade_threshold=0.0, **cheap.options)
    steps = output_steps(events)
    reference = reference_cascade(tiny_lm, cheap, prompt_of(events), 0.0, 24)
    assert [s.token_id for s in steps] == reference["tokens"] == list(events[-1].token_ids)
    assert all(s.producer == CHEAP and not s.escalated and s.full_read == 0 and s.full_ms == 0 for s in steps)
    assert [s.cheap_prob for s in steps] == pytest.approx(reference["cheap_probs"], abs=1e-5)
    # The full model never ran: not even for the prompt.
    figures = events[-1].figures
    assert figures["full_passes"] == 0 and figures["full_positions"] == 0 and figures["full_share"] == 0


def test_threshold_one_always_escalates_and_is_the_full_models_greedy(tiny_lm, cheap):
    events = cascade(tiny_lm, cascade_threshold=1.0, **cheap.options)
    steps = output_steps(events)
    expected = generate(tiny_lm, prompt_of(events), 24)
    assert [s.token_id for s in steps] == expected == list(events[-1].token_ids)
    assert all(s.producer == FULL and s.escalated for s in steps)
    # The full model read the prompt at the first step, then one token a step.
    assert [s.full_read for s in steps] == [len(prompt_of(events))] + [1] * (len(steps) - 1)
    assert events[-1].figures["full_share"] == 1.0 and events[-1].figures["escalations"] == 1


@pytest.fixture(scope="module")
def middle(tiny_lm, cheap) -> tuple[float, list, dict]:
    """A threshold between the cheap model's median confidences: the run switches models many times."""
    prompt_ids = prompt_of(cascade(tiny_lm, max_new_tokens=1))
    probs = sorted(reference_cascade(tiny_lm, cheap, prompt_ids, 0.0, 40)["cheap_probs"])
    threshold = round((probs[len(probs) // 2 - 1] + probs[len(probs) // 2]) / 2, 6)
    events = cascade(tiny_lm, cascade_threshold=threshold, max_new_tokens=40, **cheap.options)
    return threshold, events, reference_cascade(tiny_lm, cheap, prompt_ids, threshold, 40)


def test_a_middle_threshold_picks_what_the_rule_picks_after_many_switches(tiny_lm, cheap, middle):
    _, events, reference = middle
    steps = output_steps(events)
    # Preconditions: many hand-overs both ways, catch-ups of several tokens, a decision the full model changed.
    switches = sum(a != b for a, b in itertools.pairwise(reference["producers"]))
    assert switches >= 6 and max(reference["full_reads"][1:]) >= 3
    # (The tiny model's quantized copy agrees with it everywhere; the first layer alone often does not.)
    assert cheap.kind == "quantized" or any(p == FULL and c != t for p, c, t in zip(
        reference["producers"], reference["cheap_tokens"], reference["tokens"], strict=True))
    assert min(reference["margins"]) > 1e-5  # no decision on the knife's edge of float rounding
    assert [s.token_id for s in steps] == reference["tokens"]
    assert [s.producer for s in steps] == reference["producers"]
    assert [s.cheap_token_id for s in steps] == reference["cheap_tokens"]
    assert [s.cheap_prob for s in steps] == pytest.approx(reference["cheap_probs"], abs=1e-5)
    assert [s.full_read for s in steps] == reference["full_reads"]
    # Every token event is from the distribution of the model that chose its token.
    ids = prompt_of(events)
    for step, token in zip(steps, of(events, TokenStep), strict=True):
        logits = next_logits(tiny_lm.model, ids) if step.producer == FULL else cheap.logits(ids)
        assert token.token_id == step.token_id and token.step == step.step
        assert token.raw_prob == pytest.approx(float(logits.softmax(-1)[step.token_id]), abs=1e-5)
        ids.append(step.token_id)


def test_both_caches_hold_exactly_the_positions_each_model_has_read(tiny_lm, cheap, middle):
    """The KV bytes after each step are the cheap model's prompt + every token but the newest, and the full
    model's positions up to its latest escalation: the caches' sizes, from the formula."""
    _, events, reference = middle
    prompt = len(prompt_of(events))
    cheap_layers = cheap.layers or tiny_lm.model.config.num_hidden_layers
    per_cheap = kv_bytes_per_position(cheap_layers, tiny_lm)
    per_full = kv_bytes_per_position(tiny_lm.model.config.num_hidden_layers, tiny_lm)
    full_len = 0
    for step, (token, producer) in enumerate(zip(of(events, TokenStep), reference["producers"], strict=True)):
        if producer == FULL:
            full_len = prompt + step
        assert token.kv_cache_bytes == (prompt + step) * per_cheap + full_len * per_full
    # The figures: positions read, and the multiply-adds saved against the full model alone.
    n = len(reference["tokens"])
    figures = events[-1].figures
    assert figures["cheap_positions"] == prompt + n - 1 and figures["full_positions"] == full_len
    assert figures["full_passes"] == sum(read > 0 for read in reference["full_reads"])
    assert figures["full_share"] == pytest.approx(reference["producers"].count(FULL) / n)
    full_macs = macs_per_position(tiny_lm, tiny_lm.model.config.num_hidden_layers)
    cheap_macs = macs_per_position(tiny_lm, cheap_layers)
    start = of(events, CascadeStarted)[0]
    assert (start.cheap_macs, start.full_macs) == (cheap_macs, full_macs)
    spent = cheap_macs * (prompt + n - 1) + full_macs * full_len
    assert figures["compute_saved"] == pytest.approx(1 - spent / (full_macs * (prompt + n - 1)))


def test_the_comparison_with_the_full_model_alone(tiny_lm):
    layers = Cheap(tiny_lm, "layers")
    events = cascade(tiny_lm, cascade_threshold=0.0, cascade_compare=True, max_new_tokens=16, **layers.options)
    tokens = list(events[-1].token_ids)
    alone = generate(tiny_lm, prompt_of(events), 16)
    same = [a == b for a, b in zip(tokens, alone, strict=True)]
    assert not all(same)  # precondition: the first layer alone decodes something else
    figures = events[-1].figures
    assert figures["identical_fraction"] == sum(same) / len(same)
    assert figures["first_divergence"] == same.index(False)
    done = events[-1]
    run_ms = done.prefill_ms + done.decode_ms
    assert figures["tokens_per_s_with_prompt"] == pytest.approx(len(tokens) / run_ms * 1000)
    assert figures["time_saved"] == pytest.approx(1 - figures["full_alone_tokens_per_s"]
                                                  / figures["tokens_per_s_with_prompt"])


def test_a_separate_small_model_as_the_cheap_one(tiny_lm, tmp_path):
    small = copy.deepcopy(tiny_lm.model)
    torch.manual_seed(4)
    with torch.no_grad():
        for p in small.parameters():
            p.add_(0.3 * p.std() * torch.randn_like(p))
    small.save_pretrained(tmp_path / "small")
    tiny_lm.tokenizer.save_pretrained(tmp_path / "small")
    events = cascade(tiny_lm, cheap="model", cheap_model=str(tmp_path / "small"), cascade_threshold=0.0)
    prompt_ids = prompt_of(events)
    ids = list(prompt_ids)  # the small model's own greedy decode
    for _ in range(24):
        ids.append(int(next_logits(small, ids).argmax()))
    assert list(events[-1].token_ids) == ids[len(prompt_ids) :] != generate(tiny_lm, prompt_ids, 24)
    assert of(events, CascadeStarted)[0].cheap == "model"


# ------------------------------------------------------------------------------------------ per response


def test_per_response_kept_is_the_cheap_response(tiny_lm, cheap):
    events = cascade(tiny_lm, cascade_unit="response", cascade_threshold=0.0, **cheap.options)
    reference = reference_cascade(tiny_lm, cheap, prompt_of(events), 0.0, 24)
    drafts = [s for s in of(events, CascadeStep) if s.draft]
    (verdict,) = of(events, CascadeResponse)
    assert [s.token_id for s in drafts] == reference["tokens"] == list(events[-1].token_ids)
    assert not verdict.escalated and verdict.tokens == verdict.drafted == len(drafts)
    assert verdict.mean_prob == pytest.approx(sum(reference["cheap_probs"]) / len(drafts), abs=1e-6)
    assert verdict.min_prob == pytest.approx(min(reference["cheap_probs"]), abs=1e-6)
    # The order: the whole response, the verdict, then the output's token events (the response itself).
    kinds = [type(e) for e in events if isinstance(e, (CascadeStep, CascadeResponse, TokenStep))]
    assert kinds == [CascadeStep] * len(drafts) + [CascadeResponse] + [TokenStep] * len(drafts)
    assert [t.token_id for t in of(events, TokenStep)] == reference["tokens"]
    assert events[-1].figures["full_passes"] == 0 and events[-1].figures["full_share"] == 0


def test_per_response_escalated_is_the_full_models_response(tiny_lm, cheap):
    events = cascade(tiny_lm, cascade_unit="response", cascade_threshold=1.0, **cheap.options)
    reference = reference_cascade(tiny_lm, cheap, prompt_of(events), 0.0, 24)
    drafts = [s for s in of(events, CascadeStep) if s.draft]
    assert [s.token_id for s in drafts] == reference["tokens"]  # the cheap response, thrown away
    (verdict,) = of(events, CascadeResponse)
    assert verdict.escalated
    expected = generate(tiny_lm, prompt_of(events), 24)
    assert [s.token_id for s in output_steps(events)] == expected == list(events[-1].token_ids)
    assert [t.token_id for t in of(events, TokenStep)] == expected
    assert all(s.producer == FULL and s.cheap_token_id is None for s in output_steps(events))
    figures = events[-1].figures
    prompt = len(prompt_of(events))
    assert figures["full_share"] == 1 and figures["full_positions"] == figures["cheap_positions"] == prompt + 23


@pytest.mark.parametrize("above", [True, False])
def test_per_response_escalates_exactly_below_the_mean(tiny_lm, above):
    cheap = Cheap(tiny_lm, "quantized")
    prompt_ids = prompt_of(cascade(tiny_lm, max_new_tokens=1))
    probs = reference_cascade(tiny_lm, cheap, prompt_ids, 0.0, 12)["cheap_probs"]
    mean = sum(probs) / len(probs)
    threshold = mean + 1e-4 if above else mean - 1e-4
    events = cascade(tiny_lm, cascade_unit="response", cascade_threshold=threshold, max_new_tokens=12,
                     **cheap.options)
    (verdict,) = of(events, CascadeResponse)
    assert verdict.escalated == above
    drafts = [s.token_id for s in of(events, CascadeStep) if s.draft]
    tokens = [t.token_id for t in of(events, TokenStep)]
    if above:  # the full model's own response, step by step
        assert [s.producer for s in output_steps(events)] == [FULL] * 12
        assert tokens == generate(tiny_lm, prompt_ids, 12)
    else:  # the cheap response is the output: no step of the full model
        assert not output_steps(events) and tokens == drafts and len(tokens) == 12


# ------------------------------------------------------------------------------------------ sampling, stops, errors


def test_sampling_draws_as_the_rule_written_out(tiny_lm):
    cheap = Cheap(tiny_lm, "layers")
    options = {"cascade_sample": True, "temperature": 0.8, "seed": 11, "cascade_threshold": 0.15,
               "max_new_tokens": 20, **cheap.options}
    events = cascade(tiny_lm, **options)
    assert events[-1].token_ids == cascade(tiny_lm, **options)[-1].token_ids  # reproducible with the seed
    generator = torch.Generator().manual_seed(11)
    ids, producers = prompt_of(events), []
    for _ in range(20):
        probs = (cheap.logits(ids) / 0.8).softmax(-1)
        token = int(torch.multinomial(probs[None], 1, generator=generator))
        if probs[token] < 0.15:  # the full model draws its own token
            token = int(torch.multinomial((next_logits(tiny_lm.model, ids) / 0.8).softmax(-1)[None], 1,
                                          generator=generator))
            producers.append(FULL)
        else:
            producers.append(CHEAP)
        ids.append(token)
    assert FULL in producers and CHEAP in producers
    assert list(events[-1].token_ids) == ids[len(prompt_of(events)) :]
    assert [s.producer for s in output_steps(events)] == producers


def test_eos_ends_the_run(tiny_lm_eos):
    events = cascade(tiny_lm_eos, cascade_threshold=1.0, max_new_tokens=40, cheap="layers", cheap_layers=1)
    expected = generate(tiny_lm_eos, prompt_of(events), 40)
    assert expected[-1] in tiny_lm_eos.eos_token_ids and len(expected) < 40  # precondition
    assert list(events[-1].token_ids) == expected and events[-1].stop_reason == "eos"


def test_a_stop_string_ends_the_run_where_it_completes(tiny_lm):
    plain = of(cascade(tiny_lm, cascade_threshold=0.0), TokenStep)
    texts = [t.text for t in plain]
    stop = "".join(texts[5:7]).strip()[:3]
    assert stop
    end = next(i for i in range(len(texts)) if stop in "".join(texts[: i + 1]))
    events = cascade(tiny_lm, cascade_threshold=0.0, stop_strings=(stop,))
    assert len(events[-1].token_ids) == end + 1 and events[-1].stop_reason == "stop_string"


@pytest.mark.parametrize("unit", ["token", "response"])
def test_stop_is_honoured_between_steps(tiny_lm, unit):
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return len(calls) > 5

    settings = RunSettings.from_flat(strategy="cascade", prompt=PROMPT, max_new_tokens=20, cascade_unit=unit,
                                     cascade_threshold=0.15, cheap="layers", cheap_layers=1)
    events = list(run_strategy(tiny_lm, settings, should_stop))
    assert events[-1].stop_reason == "stopped" and len(events[-1].token_ids) == 5  # polled before each step
    assert not of(events, CascadeResponse)  # no verdict on a response cut short


def test_forced_tokens_come_first_then_the_cascade_continues(tiny_lm):
    a, b = 100, 101
    events = cascade(tiny_lm, cascade_threshold=1.0, forced_token_ids=(a, b), max_new_tokens=10, cheap="layers",
                     cheap_layers=1)
    steps = output_steps(events)
    assert [s.producer for s in steps[:2]] == [FORCED, FORCED] and all(s.producer == FULL for s in steps[2:])
    expected = [a, b, *generate(tiny_lm, [*prompt_of(events), a, b], 8)]
    assert list(events[-1].token_ids) == expected
    assert [t.forced for t in of(events, TokenStep)] == [True, True] + [False] * 8


def test_the_start_event_describes_both_models(tiny_lm):
    events = cascade(tiny_lm, max_new_tokens=2, cheap="layers", cheap_layers=1, cascade_threshold=0.3)
    assert isinstance(events[0], RunStarted) and isinstance(events[-1], RunFinished)
    start = events[1]
    assert isinstance(start, CascadeStarted)
    assert (start.unit, start.threshold, start.cheap) == ("token", 0.3, "layers")
    assert "first 1 of 2 layers" in start.cheap_detail and "2 layers" in start.full_detail
    assert events[0].settings["cascade"]["cascade_threshold"] == 0.3


@pytest.mark.parametrize(("options", "message"), [
    ({"cheap": "model"}, "needs --cheap-model PATH"),
    ({"cheap": "layers", "cheap_layers": 2}, "cheap_layers must be between 1 and 1"),
    ({"cheap": "model", "cheap_model": "/nonexistent/folder"}, "the cheap model could not be loaded"),
])
def test_bad_settings_are_refused_before_the_first_event(tiny_lm, options, message):
    with pytest.raises(ConfigError, match=message):
        run_strategy(tiny_lm, RunSettings.from_flat(strategy="cascade", prompt=PROMPT, **options))
